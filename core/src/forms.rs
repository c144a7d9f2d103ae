//! Wire forms that postcard's defaults do not give: delta-varint keys, raw little-endian value
//! arrays, and sequences that never pre-allocate on a length read from the wire.
//!
//! Every decoder here checks a length against the bytes actually present before it allocates,
//! so a frame can never make the decoder allocate much more than the frame's own size.

use core::fmt;
use core::marker::PhantomData;

use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, SerializeTuple};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::key::{Key, MAX_KEY};
use crate::kv::{KvPairs, ValueStorage};
use crate::store::SharedRows;
use crate::value::Value;

use crate::trailer;

/// Appends `x` as an LEB128 varint.
fn put_varint(mut x: u64, out: &mut Vec<u8>) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

/// Reads one canonical LEB128 varint from the front of `bytes`; `None` if truncated, overlong
/// or above `u64::MAX`. Always inlined: called from two places, the compiler otherwise made
/// it a call per key in the key decoder's loop, a quarter of a sparse frame's decoding time.
#[inline(always)]
fn take_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut x = 0u64;
    for i in 0..10 {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        let part = u64::from(b & 0x7f);
        if i == 9 && b > 1 {
            return None;
        }
        x |= part << (7 * i);
        if b & 0x80 == 0 {
            // A trailing zero group means a longer encoding than needed.
            return (i == 0 || b != 0).then_some(x);
        }
    }
    None
}

/// Encodes strictly increasing keys as the first key, then each gap minus one.
///
/// A plain loop of varints: measured against writing a whole word per key with no branch on
/// the varint's length, it is the faster on sparse keys; consecutive keys of a `KvPairs` do not
/// come here at all (see [`PairKeys`]).
fn encode_keys(keys: &[Key]) -> Vec<u8> {
    let mut out = Vec::new();
    put_keys(keys, &mut out);
    out
}

/// As [`encode_keys`], appending to `out`.
fn put_keys(keys: &[Key], out: &mut Vec<u8>) {
    let Some((&first, rest)) = keys.split_first() else {
        return;
    };
    // Room for the mean gap's varint per key, so that the vector rarely grows.
    let mean_gap = keys[keys.len() - 1].saturating_sub(first) / (rest.len().max(1) as u64);
    let per_key = (64 - mean_gap.leading_zeros()).div_ceil(7).max(1) as usize;
    out.reserve(10 + rest.len() * per_key);
    put_varint(first, out);
    let mut prev = first;
    for &k in rest {
        put_varint(k - prev - 1, out);
        prev = k;
    }
}

thread_local! {
    /// Where this thread encodes the keys of pairs before they are written: kept from one
    /// pair to the next, so that a frame of many pairs (a replication batch, a step per shard)
    /// does not allocate for each.
    static KEY_BYTES: core::cell::RefCell<Vec<u8>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// Past this, the key buffer is let go after use rather than kept for the next pairs.
const KEY_BYTES_KEPT: usize = 1 << 20;

/// Decodes exactly `count` keys filling all of `blob`, refusing any that would pass the
/// reserved key. Every varint takes at least one byte, so `count` is checked against the blob's
/// length before anything is allocated.
fn decode_keys(blob: &[u8], count: usize) -> Result<Vec<Key>, &'static str> {
    let mut keys = Vec::new();
    decode_keys_into(blob, count, &mut keys)?;
    Ok(keys)
}

/// As [`decode_keys`], appending to `out`; on an error, `out` may hold some of them.
fn decode_keys_into(blob: &[u8], count: usize, out: &mut Vec<Key>) -> Result<(), &'static str> {
    if count > blob.len() {
        return Err("key count exceeds the bytes present");
    }
    let at = out.len();
    out.resize(at + count, 0);
    let keys = &mut out[at..];
    let mut rest = blob;
    let mut prev: Key = 0;
    // Overflow and the reserved key are gathered over the loop and checked once after it: a
    // branch per key less on the decoder's hottest loop.
    let mut beyond = false;
    for (i, slot) in keys.iter_mut().enumerate() {
        let d = take_varint(&mut rest).ok_or("malformed key varint")?;
        // The first key is itself; every other is the one before, plus its gap, plus one.
        let (k, over_gap) = prev.overflowing_add(d);
        let (k, over_one) = k.overflowing_add(u64::from(i > 0));
        beyond |= over_gap | over_one | (k > MAX_KEY);
        *slot = k;
        prev = k;
    }
    if beyond {
        return Err("key overflow or reserved key u64::MAX");
    }
    if !rest.is_empty() {
        return Err("trailing bytes after keys");
    }
    Ok(())
}

struct KeysSeed(usize);

impl<'de> DeserializeSeed<'de> for KeysSeed {
    type Value = Vec<Key>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Key>, D::Error> {
        d.deserialize_bytes(self)
    }
}

impl Visitor<'_> for KeysSeed {
    type Value = Vec<Key>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} delta-encoded keys", self.0)
    }
    fn visit_bytes<E: de::Error>(self, blob: &[u8]) -> Result<Vec<Key>, E> {
        decode_keys(blob, self.0).map_err(E::custom)
    }
}

/// The keys of a [`KvPairs`] on the wire: consecutive keys are written as the first key alone
/// (the delta form of two or more keys always takes more than one varint, so the forms cannot
/// be confused), anything else in the delta form.
enum PairKeys {
    Run(Key),
    List(Vec<Key>),
    /// In the open key arena of a batch ([`crate::arena`]), from this position, its stand-in
    /// held until the arena closes.
    Arena(usize, std::sync::Arc<Vec<Key>>),
}

/// The keys of `count` pairs; into the open key arena, if any, when the flag says so.
struct PairKeysSeed(usize, bool);

impl<'de> DeserializeSeed<'de> for PairKeysSeed {
    type Value = PairKeys;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<PairKeys, D::Error> {
        d.deserialize_bytes(self)
    }
}

impl Visitor<'_> for PairKeysSeed {
    type Value = PairKeys;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} keys: a run's first key, or delta-encoded", self.0)
    }
    fn visit_bytes<E: de::Error>(self, blob: &[u8]) -> Result<PairKeys, E> {
        decode_pair_keys(blob, self.0, self.1).map_err(E::custom)
    }
}

/// Encodes the keys of `count` pairs, [`decode_pair_keys`]' counterpart, and hands them to
/// `write`: consecutive keys from `run_from` as that first key alone, any others as `keys()`
/// delta-encoded.
fn with_pair_keys<'a, R>(
    count: usize,
    run_from: Option<Key>,
    keys: impl FnOnce() -> &'a [Key],
    write: impl FnOnce(&[u8]) -> R,
) -> R {
    // Taken out of the slot while in use: a pair serialized inside `write` (none is) would
    // find the slot empty and use a buffer of its own rather than fail.
    let mut buf = KEY_BYTES.with_borrow_mut(core::mem::take);
    buf.clear();
    match run_from {
        Some(first) if count > 1 => put_varint(first, &mut buf),
        _ => put_keys(keys(), &mut buf),
    }
    let out = write(&buf);
    if buf.capacity() <= KEY_BYTES_KEPT {
        KEY_BYTES.with_borrow_mut(|slot| *slot = buf);
    }
    out
}

/// A row width read from the wire: at least one value.
fn width_of<E: de::Error>(width: u64) -> Result<usize, E> {
    usize::try_from(width)
        .ok()
        .filter(|&w| w > 0)
        .ok_or_else(|| E::custom("width must be at least 1"))
}

/// Decodes the keys of `count` pairs: a run when `blob` is one varint and `count > 1`. A run
/// allocates nothing; its count is bounded by the values that must follow.
fn decode_pair_keys(blob: &[u8], count: usize, arena: bool) -> Result<PairKeys, &'static str> {
    if count > 1 {
        let mut rest = blob;
        if let Some(first) = take_varint(&mut rest) {
            if rest.is_empty() {
                return first
                    .checked_add(count as Key - 1)
                    .filter(|&last| last <= MAX_KEY)
                    .map(|_| PairKeys::Run(first))
                    .ok_or("reserved key u64::MAX");
            }
        }
    }
    let placed = arena
        .then(|| crate::arena::append(|keys| decode_keys_into(blob, count, keys)))
        .flatten();
    match placed {
        Some(placed) => placed.map(|(from, stand_in)| PairKeys::Arena(from, stand_in)),
        None => decode_keys(blob, count).map(PairKeys::List),
    }
}

struct ValuesSeed<V> {
    count: usize,
    _v: PhantomData<V>,
}

impl<'de, V: Value> DeserializeSeed<'de> for ValuesSeed<V> {
    type Value = Vec<V>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<V>, D::Error> {
        d.deserialize_bytes(self)
    }
}

impl<V: Value> Visitor<'_> for ValuesSeed<V> {
    type Value = Vec<V>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} little-endian {} values", self.count, V::NAME)
    }
    fn visit_bytes<E: de::Error>(self, blob: &[u8]) -> Result<Vec<V>, E> {
        if self.count.checked_mul(V::SIZE) != Some(blob.len()) {
            return Err(E::custom("value bytes do not match keys x width"));
        }
        if cfg!(target_endian = "little") {
            // One copy of the whole array; the blob may not be aligned for `V`.
            let mut values = vec![V::default(); self.count];
            bytemuck::cast_slice_mut::<V, u8>(&mut values).copy_from_slice(blob);
            Ok(values)
        } else {
            Ok(blob.chunks_exact(V::SIZE).map(V::from_le_slice).collect())
        }
    }
}

/// Serializes the values as one byte string; on little-endian machines without a copy.
fn serialize_values<V: Value, S: SerializeTuple>(values: &[V], t: &mut S) -> Result<(), S::Error> {
    if cfg!(target_endian = "little") {
        t.serialize_element(&ByteStr(bytemuck::cast_slice(values)))
    } else {
        let mut raw = Vec::with_capacity(values.len() * V::SIZE);
        for &v in values {
            v.extend_le(&mut raw);
        }
        t.serialize_element(&ByteStr(&raw))
    }
}

/// A byte slice that serializes as bytes (not as a sequence of `u8`).
struct ByteStr<'a>(&'a [u8]);

impl Serialize for ByteStr<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// Wire form of [`KvPairs`]: `(width, count, keys as bytes, values as bytes)`; consecutive
/// keys travel as their first key alone, any others as delta varints. Inside a frame the
/// values leave the tuple for the frame's trailer (ARCHITECTURE.md §5).
impl<V: Value> Serialize for KvPairs<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let in_trailer = trailer::is_encoding();
        let mut t = s.serialize_tuple(if in_trailer { 3 } else { 4 })?;
        t.serialize_element(&(self.width() as u64))?;
        t.serialize_element(&(self.len() as u64))?;
        let run_from = self.key_range().map(|range| range.start());
        with_pair_keys(
            self.len(),
            run_from,
            || self.keys(),
            |keys| t.serialize_element(&ByteStr(keys)),
        )?;
        if !(in_trailer && trailer::put(|| self.le_values())) {
            serialize_values(self.values(), &mut t)?;
        }
        t.end()
    }
}

impl<'de, V: Value> Deserialize<'de> for KvPairs<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// Whether the values are in the frame's trailer.
        struct KvVisitor<V>(bool, PhantomData<V>);
        impl<'de, V: Value> Visitor<'de> for KvVisitor<V> {
            type Value = KvPairs<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("key-value pairs")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KvPairs<V>, A::Error> {
                let missing = || de::Error::custom("truncated key-value pairs");
                let width: u64 = seq.next_element()?.ok_or_else(missing)?;
                let count: u64 = seq.next_element()?.ok_or_else(missing)?;
                let width = width_of(width)?;
                let count = usize::try_from(count)
                    .map_err(|_| de::Error::custom("key count exceeds the bytes present"))?;
                let keys = seq
                    .next_element_seed(PairKeysSeed(count, true))?
                    .ok_or_else(missing)?;
                let slots = count
                    .checked_mul(width)
                    .ok_or_else(|| de::Error::custom("keys x width overflows"))?;
                // The values' length is checked against the bytes present before anything is
                // allocated, which bounds a run's count too.
                let values = if self.0 {
                    let len = slots
                        .checked_mul(V::SIZE)
                        .ok_or_else(|| de::Error::custom("keys x width overflows"))?;
                    trailer::take(len)
                        .and_then(ValueStorage::from_le_bytes)
                        .ok_or_else(|| de::Error::custom("values beyond the frame's trailer"))?
                } else {
                    let values = seq
                        .next_element_seed(ValuesSeed::<V> {
                            count: slots,
                            _v: PhantomData,
                        })?
                        .ok_or_else(missing)?;
                    ValueStorage::owned(values)
                };
                Ok(match keys {
                    PairKeys::Run(first) => KvPairs::run_of(first, values, width),
                    PairKeys::List(keys) => KvPairs::from_stored(keys, values, width),
                    PairKeys::Arena(from, stand_in) => {
                        KvPairs::in_arena(stand_in, from, values, width)
                    }
                })
            }
        }
        // Inside a frame being decoded, the values are in its trailer.
        let in_trailer = trailer::is_decoding();
        d.deserialize_tuple(
            if in_trailer { 3 } else { 4 },
            KvVisitor(in_trailer, PhantomData),
        )
    }
}

/// Form of [`SharedRows`] (a checkpoint's rows): `(width, aux_width, runs)`, each run
/// `(count, keys as bytes, values as bytes, update-rule state as bytes)`, its keys as a
/// [`KvPairs`]' are. Written run by run from the store's own leaves, so that a checkpoint
/// never holds a copy of the model (ARCHITECTURE.md §11).
impl<V: Value> Serialize for SharedRows<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Runs<'a, V>(&'a SharedRows<V>);
        impl<V: Value> Serialize for Runs<'_, V> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                // Counted first: the encoding puts the number of runs before them.
                let mut seq = s.serialize_seq(Some(self.0.runs().count()))?;
                for (keys, values, aux) in self.0.runs() {
                    seq.serialize_element(&RunForm { keys, values, aux })?;
                }
                seq.end()
            }
        }
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&(self.width() as u64))?;
        t.serialize_element(&(self.aux_width() as u64))?;
        t.serialize_element(&Runs(self))?;
        t.end()
    }
}

/// One run of [`SharedRows`] on its way out.
struct RunForm<'a, V> {
    keys: &'a [Key],
    values: &'a [V],
    aux: &'a [V],
}

impl<V: Value> Serialize for RunForm<'_, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let n = self.keys.len();
        let mut t = s.serialize_tuple(4)?;
        t.serialize_element(&(n as u64))?;
        let run_from = match (self.keys.first(), self.keys.last()) {
            (Some(&first), Some(&last)) if last - first == n as Key - 1 => Some(first),
            _ => None,
        };
        with_pair_keys(
            n,
            run_from,
            || self.keys,
            |keys| t.serialize_element(&ByteStr(keys)),
        )?;
        serialize_values(self.values, &mut t)?;
        serialize_values(self.aux, &mut t)?;
        t.end()
    }
}

impl<'de, V: Value> Deserialize<'de> for SharedRows<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct RowsVisitor<V>(PhantomData<V>);
        impl<'de, V: Value> Visitor<'de> for RowsVisitor<V> {
            type Value = SharedRows<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a checkpoint's rows")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SharedRows<V>, A::Error> {
                let missing = || de::Error::custom("truncated rows");
                let width: u64 = seq.next_element()?.ok_or_else(missing)?;
                let aux_width: u64 = seq.next_element()?.ok_or_else(missing)?;
                let width = width_of(width)?;
                let aux_width = usize::try_from(aux_width)
                    .ok()
                    .filter(|&a| a.checked_mul(width).is_some())
                    .ok_or_else(|| de::Error::custom("update-rule state too wide"))?;
                seq.next_element_seed(RunsSeed(SharedRows::new(width, aux_width)))?
                    .ok_or_else(missing)
            }
        }
        d.deserialize_tuple(3, RowsVisitor(PhantomData))
    }
}

/// The runs of [`SharedRows`], appended to the rows given. Each costs a leaf's few
/// allocations beyond its bytes, more than the module's bound for frames: the rows come only
/// from a server's own checksummed checkpoint files, never from the network.
struct RunsSeed<V>(SharedRows<V>);

impl<'de, V: Value> DeserializeSeed<'de> for RunsSeed<V> {
    type Value = SharedRows<V>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<SharedRows<V>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, V: Value> Visitor<'de> for RunsSeed<V> {
    type Value = SharedRows<V>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("runs of rows")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SharedRows<V>, A::Error> {
        let mut rows = self.0;
        let shape = (rows.width(), rows.aux_width());
        while let Some((keys, values, aux)) =
            seq.next_element_seed(RunSeed::<V>(shape, PhantomData))?
        {
            if keys.first().is_some_and(|&k| !rows.follows(k)) {
                return Err(de::Error::custom("runs of rows out of key order"));
            }
            rows.push_owned(keys, values, aux);
        }
        Ok(rows)
    }
}

/// One run of [`SharedRows`]: `(width, aux_width)` and the value type.
struct RunSeed<V>((usize, usize), PhantomData<V>);

impl<'de, V: Value> DeserializeSeed<'de> for RunSeed<V> {
    type Value = (Vec<Key>, Vec<V>, Vec<V>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_tuple(4, self)
    }
}

impl<'de, V: Value> Visitor<'de> for RunSeed<V> {
    type Value = (Vec<Key>, Vec<V>, Vec<V>);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a run of rows")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let missing = || de::Error::custom("truncated run of rows");
        let too_many = || de::Error::custom("row count exceeds the bytes present");
        let (width, aux_width) = self.0;
        let count: u64 = seq.next_element()?.ok_or_else(missing)?;
        let count = usize::try_from(count).map_err(|_| too_many())?;
        let keys = seq
            .next_element_seed(PairKeysSeed(count, false))?
            .ok_or_else(missing)?;
        // The values are checked against the bytes present before a run's keys are laid
        // out, which bounds its count.
        let slots = count.checked_mul(width).ok_or_else(too_many)?;
        let values = seq
            .next_element_seed(ValuesSeed::<V> {
                count: slots,
                _v: PhantomData,
            })?
            .ok_or_else(missing)?;
        let aux = seq
            .next_element_seed(ValuesSeed::<V> {
                count: slots.checked_mul(aux_width).ok_or_else(too_many)?,
                _v: PhantomData,
            })?
            .ok_or_else(missing)?;
        let keys = match keys {
            PairKeys::Run(first) => (first..first + count as Key).collect(),
            PairKeys::List(keys) => keys,
            // Never asked for here: rows of a copy keep their own keys.
            PairKeys::Arena(..) => return Err(de::Error::custom("rows decoded into an arena")),
        };
        Ok((keys, values, aux))
    }
}

/// Writes `keys` (strictly increasing) as `(count, key deltas as bytes)`: the wire form of a
/// key list.
pub(crate) fn serialize_keys<S: Serializer>(keys: &[Key], s: S) -> Result<S::Ok, S::Error> {
    let mut t = s.serialize_tuple(2)?;
    t.serialize_element(&(keys.len() as u64))?;
    t.serialize_element(&ByteStr(&encode_keys(keys)))?;
    t.end()
}

/// Reads what [`serialize_keys`] wrote. The keys come back strictly increasing: the deltas
/// cannot say otherwise.
pub(crate) fn deserialize_keys<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Key>, D::Error> {
    struct KeysVisitor;
    impl<'de> Visitor<'de> for KeysVisitor {
        type Value = Vec<Key>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a key list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Key>, A::Error> {
            let missing = || de::Error::custom("truncated key list");
            let count: u64 = seq.next_element()?.ok_or_else(missing)?;
            let count = usize::try_from(count)
                .map_err(|_| de::Error::custom("key count exceeds the bytes present"))?;
            seq.next_element_seed(KeysSeed(count))?.ok_or_else(missing)
        }
    }
    d.deserialize_tuple(2, KeysVisitor)
}

/// `#[serde(with = "seq")]` for `Vec<T>` and `SmallVec` fields of messages: the usual
/// encoding, but decoding grows the collection as elements actually arrive instead of
/// reserving what the length prefix claims.
pub(crate) mod seq {
    use super::*;

    /// Reserved up front at most; the vector doubles from there as elements decode.
    const INITIAL: usize = 16;

    /// A collection a sequence decodes into.
    pub(crate) trait Grow<T>: Default {
        /// Makes room for `n` elements.
        fn reserve_for(&mut self, n: usize);
        /// Adds one at the end.
        fn push_one(&mut self, x: T);
    }

    impl<T> Grow<T> for Vec<T> {
        fn reserve_for(&mut self, n: usize) {
            self.reserve(n);
        }
        fn push_one(&mut self, x: T) {
            self.push(x);
        }
    }

    impl<A: smallvec::Array> Grow<A::Item> for smallvec::SmallVec<A> {
        fn reserve_for(&mut self, n: usize) {
            self.reserve(n);
        }
        fn push_one(&mut self, x: A::Item) {
            self.push(x);
        }
    }

    pub(crate) fn serialize<T: Serialize, S: Serializer>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v)
    }

    pub(crate) fn deserialize<'de, T, C, D>(d: D) -> Result<C, D::Error>
    where
        T: Deserialize<'de>,
        C: Grow<T>,
        D: Deserializer<'de>,
    {
        struct SeqVisitor<T, C>(PhantomData<(T, C)>);
        impl<'de, T: Deserialize<'de>, C: Grow<T>> Visitor<'de> for SeqVisitor<T, C> {
            type Value = C;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<C, A::Error> {
                let mut v = C::default();
                v.reserve_for(seq.size_hint().unwrap_or(0).min(INITIAL));
                while let Some(x) = seq.next_element()? {
                    v.push_one(x);
                }
                Ok(v)
            }
        }
        d.deserialize_seq(SeqVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn varints_refuse_overlong_and_overflowing_forms() {
        assert_eq!(take_varint(&mut &[0x80, 0x00][..]), None);
        assert_eq!(
            take_varint(&mut &[0xff; 9].iter().chain(&[0x02]).copied().collect::<Vec<_>>()[..]),
            None
        );
        assert_eq!(take_varint(&mut &[0xff, 0x01][..]), Some(255));
        assert_eq!(take_varint(&mut &[0x80][..]), None);
    }

    #[test]
    fn dense_keys_cost_one_byte_each() {
        let keys: Vec<Key> = (1_000_000..1_001_000).collect();
        assert_eq!(encode_keys(&keys).len(), 3 + 999);
    }

    #[test]
    fn a_run_of_consecutive_keys_may_not_pass_the_reserved_key() {
        let mut blob = Vec::new();
        put_varint(MAX_KEY - 2, &mut blob);
        blob.extend_from_slice(&[0, 0]);
        assert_eq!(
            decode_keys(&blob, 3),
            Ok(vec![MAX_KEY - 2, MAX_KEY - 1, MAX_KEY])
        );
        blob.push(0);
        assert!(decode_keys(&blob, 4).is_err());
    }

    #[test]
    fn a_key_count_beyond_the_bytes_is_refused() {
        assert!(decode_keys(&[1, 2, 3], 1 << 40).is_err());
        assert!(decode_keys(&[1, 2, 3], 2).is_err());
    }

    /// Rows of two runs, keys `first..first + n` and `more`, one value and one of state each.
    fn two_runs(first: Key, n: u64, more: &[Key]) -> SharedRows<f32> {
        let mut rows = SharedRows::new(1, 1);
        let run: Vec<Key> = (first..first + n).collect();
        let values = vec![1.0; run.len()];
        rows.push_owned(run, values.clone(), values);
        rows.push_owned(more.to_vec(), vec![2.0; more.len()], vec![3.0; more.len()]);
        rows
    }

    #[test]
    fn checkpoint_rows_read_back_and_refuse_runs_out_of_order_or_cut_short() {
        let rows = two_runs(5, 100, &[200, 7_000, 7_001]);
        let bytes = postcard::to_allocvec(&rows).unwrap();
        assert_eq!(postcard::from_bytes::<SharedRows<f32>>(&bytes), Ok(rows));
        // A consecutive run costs its first key alone.
        let keys_bytes = bytes.len() - 2 * 4 * (100 + 3);
        assert!(keys_bytes < 20, "{keys_bytes} bytes of keys and counts");
        let overlapping = postcard::to_allocvec(&two_runs(5, 100, &[50, 60])).unwrap();
        assert!(postcard::from_bytes::<SharedRows<f32>>(&overlapping).is_err());
        for cut in [1, bytes.len() / 2, bytes.len() - 1] {
            assert!(postcard::from_bytes::<SharedRows<f32>>(&bytes[..cut]).is_err());
        }
    }

    proptest! {
        #[test]
        fn varints_round_trip(x in any::<u64>()) {
            let mut out = Vec::new();
            put_varint(x, &mut out);
            let mut s = &out[..];
            prop_assert_eq!(take_varint(&mut s), Some(x));
            prop_assert!(s.is_empty());
        }

        /// Key lists with runs and gaps round-trip, and their bytes are exactly one varint
        /// per key.
        #[test]
        fn key_runs_round_trip_in_the_one_varint_per_key_form(
            start in prop_oneof![0u64..1000, (MAX_KEY - 5000)..MAX_KEY],
            runs in proptest::collection::vec((0u64..300, 1usize..200), 0..8),
        ) {
            let mut keys = Vec::new();
            let mut next = start;
            for (gap, len) in runs {
                for _ in 0..len {
                    if next <= MAX_KEY {
                        keys.push(next);
                    }
                    next = next.saturating_add(1);
                }
                next = next.saturating_add(gap);
            }
            let mut naive = Vec::new();
            let mut prev: Option<Key> = None;
            for &k in &keys {
                put_varint(prev.map_or(k, |p| k - p - 1), &mut naive);
                prev = Some(k);
            }
            let encoded = encode_keys(&keys);
            prop_assert_eq!(&encoded, &naive);
            prop_assert_eq!(decode_keys(&encoded, keys.len()), Ok(keys.clone()));
            if !keys.is_empty() {
                prop_assert!(decode_keys(&encoded, keys.len() - 1).is_err());
            }
        }

        #[test]
        fn keys_round_trip(keys in proptest::collection::btree_set(any::<u64>().prop_map(|k| k % MAX_KEY), 0..50)) {
            let keys: Vec<Key> = keys.into_iter().collect();
            prop_assert_eq!(decode_keys(&encode_keys(&keys), keys.len()), Ok(keys));
        }
    }
}
