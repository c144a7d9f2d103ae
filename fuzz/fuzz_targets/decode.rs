//! Arbitrary bytes into the envelope decoder, for every value type. Whatever decodes must
//! re-encode, and the re-encoding must decode to the same envelope.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pserver_core::{Codec, Value};

fn check<V: Value>(codec: &Codec, data: &[u8]) {
    if let Ok(env) = codec.decode::<V>(data) {
        let frame = codec
            .encode(&env)
            .expect("a decoded envelope re-encodes within the same limit");
        let again = codec
            .decode::<V>(&frame)
            .expect("a re-encoded envelope decodes");
        assert_eq!(again, env, "decode(encode(decode(x))) == decode(x)");
    }
}

fuzz_target!(|data: &[u8]| {
    let codec = Codec::new(1 << 20);
    check::<f32>(&codec, data);
    check::<f64>(&codec, data);
    check::<i64>(&codec, data);
});
