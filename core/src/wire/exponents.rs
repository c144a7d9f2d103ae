//! Exponent coding of values (ARCHITECTURE.md §10): each value's head, its sign and exponent,
//! as a code into a table of the heads that occur, and the rest of its bits as they are.
//!
//! A model's weights and a minibatch's gradient of sums are nearly all different floats, so
//! neither a table of values ([`crate::wire::palette`]) nor LZ4 finds anything to share. But
//! they span a few powers of two: a slice of them takes a handful of the 512 signs and
//! exponents an `f32` can have, and a code of 3 or 4 bits for those 9 bits takes about a
//! sixth off every value, exactly. Over a slice of weights the 9 bits become 2 to 4.

use crate::value::Value;
use crate::wire::first_use::FirstUse;
use crate::wire::palette::code_bits;

/// Below this many values no table is tried: what it saves is a few bytes.
const MIN_VALUES: usize = 16;

/// Bits of a value's head: an `f32`'s sign and 8 exponent bits; an `f64`'s sign and 11
/// exponent bits, and as many high bits of an `i64` (which small integers share).
pub(crate) fn head_bits<V: Value>() -> u32 {
    if V::SIZE == 4 { 9 } else { 12 }
}

/// Values coded against a table of their heads.
#[derive(Debug, PartialEq)]
pub(crate) struct Coded {
    /// The distinct heads, in order of first use.
    pub(crate) heads: Vec<u16>,
    /// Bits per code: [`code_bits`] of the table's length.
    pub(crate) bits: u8,
    /// Every value's tail (the bits below its head) and above it its code, least significant
    /// bit first, the first value's in the lowest bits of the first byte.
    pub(crate) stream: Vec<u8>,
}

/// `values` as codes into a table of their heads and their tails, if that takes a sixteenth
/// less than the values themselves; `None` otherwise.
pub(crate) fn encode<V: Value>(values: &[V]) -> Option<Coded> {
    let n = values.len();
    if n < MIN_VALUES {
        return None;
    }
    let tail = 8 * V::SIZE as u32 - head_bits::<V>();
    // Each head's code plus one, 0 for a head not seen: at most 4,096 heads, so a direct
    // table is smaller than the frames it serves.
    let mut index = vec![0u16; 1 << head_bits::<V>()];
    let mut heads: Vec<u16> = Vec::new();
    for &v in values {
        let head = (v.to_bits() >> tail) as usize;
        if index[head] == 0 {
            // A head is below 2^12: it and the table's length fit 16 bits.
            heads.push(head as u16);
            index[head] = heads.len() as u16;
        }
    }
    let bits = code_bits(heads.len());
    let per = u32::from(bits) + tail;
    let len = (n * per as usize).div_ceil(8);
    let raw = n * V::SIZE;
    // Only where it pays: a sixteenth off at least, the framing's varints included. A lower
    // bar than a palette's tenth: coding is two passes of direct lookups, no probing, and a
    // minibatch's gradient spans a few dozen heads, whose 5-bit codes save a tenth only just.
    if heads.len() * 2 + len + 6 >= raw - raw / 16 {
        return None;
    }
    let tail_mask = (1u64 << tail) - 1;
    let mut stream = Vec::with_capacity(len);
    let mut acc: u128 = 0;
    let mut filled: u32 = 0;
    for &v in values {
        let b = v.to_bits();
        let code = u64::from(index[(b >> tail) as usize] - 1);
        acc |= u128::from((b & tail_mask) | (code << tail)) << filled;
        filled += per;
        while filled >= 8 {
            stream.push(acc as u8);
            acc >>= 8;
            filled -= 8;
        }
    }
    if filled > 0 {
        stream.push(acc as u8);
    }
    Some(Coded {
        heads,
        bits,
        stream,
    })
}

/// The `count` values `stream` codes against `heads`; `None` unless the table is the one the
/// encoder would have built (distinct heads that fit, in order of first use, each used),
/// `bits` is what it needs, and the stream holds exactly `count` values (the last byte's
/// unused bits clear): one coding per values.
pub(crate) fn decode<V: Value>(
    heads: &[u16],
    bits: u8,
    stream: &[u8],
    count: usize,
) -> Option<Vec<V>> {
    let head_bits = head_bits::<V>();
    let tail = 8 * V::SIZE as u32 - head_bits;
    if heads.is_empty() || heads.len() > 1 << head_bits || bits != code_bits(heads.len()) {
        return None;
    }
    let per = u32::from(bits) + tail;
    if stream.len() != count.checked_mul(per as usize)?.div_ceil(8) {
        return None;
    }
    let mask = (1u128 << per) - 1;
    let tail_mask = (1u64 << tail) - 1;
    let last = heads.len() - 1;
    let mut out = Vec::with_capacity(count);
    let mut order = FirstUse::default();
    let mut acc: u128 = 0;
    let mut filled: u32 = 0;
    let mut at = 0usize;
    for _ in 0..count {
        if filled < per {
            // Eight bytes at a time while eight are left (fewer than 64 bits are waiting, so
            // they fit); every byte read holds values, as there are no more bytes than values.
            if let Some(eight) = stream.get(at..at + 8) {
                let mut word = [0u8; 8];
                word.copy_from_slice(eight);
                acc |= u128::from(u64::from_le_bytes(word)) << filled;
                filled += 64;
                at += 8;
            } else {
                while filled < per {
                    acc |= u128::from(*stream.get(at)?) << filled;
                    filled += 8;
                    at += 1;
                }
            }
        }
        let word = (acc & mask) as u64;
        acc >>= per;
        filled -= per;
        let code = (word >> tail) as usize;
        order.see(code);
        let head = u64::from(heads[code.min(last)]);
        let value = head << tail | (word & tail_mask);
        out.push(V::from_le_slice(&value.to_le_bytes()[..V::SIZE]));
    }
    // In first-use order every head was checked once against those before it.
    let mut seen = vec![false; 1 << head_bits];
    for &head in heads {
        let slot = seen.get_mut(usize::from(head))?;
        if *slot {
            return None;
        }
        *slot = true;
    }
    (order.all_used(heads.len()) && acc == 0 && at == stream.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Weights spread over (-0.5, -0.125] and [0.125, 0.5): all different, of 4 signs and
    /// exponents between them.
    fn weights(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (((i as u64 + 1) * 2_654_435_761) % 1_000_003) as f32 / 1_000_003.0 - 0.5;
                if x.abs() < 0.125 {
                    x + 0.25f32.copysign(x)
                } else {
                    x
                }
            })
            .collect()
    }

    #[test]
    fn weights_of_a_few_exponents_take_short_codes_and_their_mantissas() {
        let values = weights(1000);
        let coded = encode(&values).expect("pays");
        // [0.125, 0.5) on either side: exponents of 0.125 and 0.25 of each sign.
        assert_eq!(coded.heads.len(), 4);
        assert_eq!(coded.bits, 2);
        assert_eq!(coded.stream.len(), 1000 * 25 / 8);
        let back: Vec<f32> = decode(&coded.heads, coded.bits, &coded.stream, 1000).expect("whole");
        assert_eq!(back, values);
    }

    #[test]
    fn values_of_every_exponent_or_too_few_are_not_coded() {
        // 600 distinct heads of 512: 9-bit codes save nothing.
        let spread: Vec<f32> = (0..600u32)
            .map(|i| f32::from_bits(((i % 512) << 23) | i))
            .collect();
        assert_eq!(encode(&spread), None);
        // Four heads: 22 values take 8 bytes of table, 69 of codes and tails and 6 of
        // framing, 83 bytes, not under the 83 that save a sixteenth of 88; 23 take 86 of 87.
        assert_eq!(encode(&weights(22)).map(|c| c.heads.len()), None);
        assert_eq!(encode(&weights(23)).map(|c| c.heads.len()), Some(4));
    }

    #[test]
    fn a_table_goes_only_where_it_saves_a_sixteenth() {
        // 1,000 f32 values of 4,000 bytes: with 32 heads, 28-bit codes and tails take 3,500
        // bytes and the table 64, under the 3,750 that save a sixteenth; with 64 heads, 29
        // bits take 3,625, the table 128 and the framing 6: 3,759.
        let with_heads = |heads: u32| -> Vec<f32> {
            (0..1000u32)
                .map(|i| f32::from_bits(((100 + i % heads) << 23) | (i * 7919 % (1 << 23))))
                .collect()
        };
        assert_eq!(encode(&with_heads(8)).map(|c| c.bits), Some(3));
        assert_eq!(encode(&with_heads(32)).map(|c| c.bits), Some(5));
        assert_eq!(encode(&with_heads(64)), None);
    }

    /// A stream of 1-bit codes: each value in 3 bytes, its 23-bit tail and its code above.
    fn one_bit_codes(codes: &[u32]) -> Vec<u8> {
        codes
            .iter()
            .enumerate()
            .flat_map(|(i, &code)| ((code << 23) | i as u32).to_le_bytes()[..3].to_vec())
            .collect()
    }

    #[test]
    fn malformed_codings_are_refused() {
        let ok = |heads: &[u16], bits: u8, stream: &[u8], count: usize| {
            decode::<f32>(heads, bits, stream, count).is_some()
        };
        let heads = [250u16, 251];
        let mut codes = [0u32; MIN_VALUES];
        codes[3] = 1;
        let good = one_bit_codes(&codes);
        assert!(ok(&heads, 1, &good, MIN_VALUES));
        // The wrong code width; a value too many or too few.
        assert!(!ok(&heads, 2, &good, MIN_VALUES));
        assert!(!ok(&heads, 1, &good, MIN_VALUES - 1));
        assert!(!ok(&heads, 1, &good[..good.len() - 1], MIN_VALUES));
        let mut longer = good.clone();
        longer.push(0);
        assert!(!ok(&heads, 1, &longer, MIN_VALUES));
        // A code past a table of three: 2-bit codes name a fourth entry that is not there.
        let coded = |codes: &[u32]| {
            let mut stream = Vec::new();
            let (mut acc, mut filled) = (0u64, 0u32);
            for (i, &code) in codes.iter().enumerate() {
                acc |= u64::from((code << 23) | i as u32) << filled;
                filled += 25;
                while filled >= 8 {
                    stream.push(acc as u8);
                    acc >>= 8;
                    filled -= 8;
                }
            }
            if filled > 0 {
                stream.push(acc as u8);
            }
            stream
        };
        let three = [250u16, 251, 252];
        let mut in_table = [2u32; MIN_VALUES];
        (in_table[0], in_table[1]) = (0, 1);
        assert!(ok(&three, 2, &coded(&in_table), MIN_VALUES));
        let mut past = in_table;
        past[5] = 3;
        assert!(!ok(&three, 2, &coded(&past), MIN_VALUES));
        // Codes wider than the table needs, in a stream of that width: every value decodes,
        // but the encoder would have used 1-bit codes.
        assert!(!ok(&heads, 2, &coded(&codes), MIN_VALUES));
        // No table; a head that does not fit 9 bits; the same head twice.
        assert!(!ok(&[], 0, &[], 0));
        assert!(!ok(&[250, 512], 1, &good, MIN_VALUES));
        assert!(!ok(&[250, 250], 1, &good, MIN_VALUES));
        // A head never used, and heads out of their first use's order.
        assert!(!ok(&heads, 1, &one_bit_codes(&[0; MIN_VALUES]), MIN_VALUES));
        codes[0] = 1;
        assert!(!ok(&heads, 1, &one_bit_codes(&codes), MIN_VALUES));
        // Padding set: 1,001 values of 2-bit codes take 25,025 bits, the last byte's 7 high
        // bits are padding.
        let values = weights(1001);
        let coded = encode(&values).expect("pays");
        assert_eq!((coded.bits, coded.stream.len()), (2, 3129));
        let mut padded = coded.stream.clone();
        padded[3128] |= 0x80;
        assert!(ok(&coded.heads, coded.bits, &coded.stream, 1001));
        assert!(!ok(&coded.heads, coded.bits, &padded, 1001));
    }

    proptest! {
        /// Whatever is coded decodes to the same values, bit for bit.
        #[test]
        fn coded_values_come_back_exactly(
            raw in proptest::collection::vec(
                prop_oneof![
                    4 => (0u32..4, any::<u32>()).prop_map(|(h, m)| ((120 + h) << 23) | (m >> 9)),
                    1 => any::<u32>(),
                ],
                0..300,
            ),
            wide in proptest::collection::vec(
                prop_oneof![
                    4 => (0u64..3, any::<u64>()).prop_map(|(h, m)| ((1020 + h) << 52) | (m >> 12)),
                    1 => any::<u64>(),
                ],
                0..300,
            ),
        ) {
            let narrow: Vec<f32> = raw.iter().map(|&b| f32::from_bits(b)).collect();
            if let Some(c) = encode(&narrow) {
                let back: Vec<f32> = decode(&c.heads, c.bits, &c.stream, narrow.len()).unwrap();
                prop_assert_eq!(
                    back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    raw
                );
            }
            let doubles: Vec<f64> = wide.iter().map(|&b| f64::from_bits(b)).collect();
            if let Some(c) = encode(&doubles) {
                let back: Vec<f64> = decode(&c.heads, c.bits, &c.stream, doubles.len()).unwrap();
                prop_assert_eq!(back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), wide.clone());
            }
            let ints: Vec<i64> = wide.iter().map(|&b| (b >> 40) as i64 - (1 << 23)).collect();
            if let Some(c) = encode(&ints) {
                let back: Vec<i64> = decode(&c.heads, c.bits, &c.stream, ints.len()).unwrap();
                prop_assert_eq!(back, ints);
            }
        }
    }
}
