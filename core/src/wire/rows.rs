//! Values sent without their keys, and value compression (ARCHITECTURE.md §10).
//!
//! A [`RowValues`] carries the values of rows whose keys the receiver holds already, or the frame
//! carries beside them: those key caching sends without keys, and those of a range pull's answer
//! (`Message::PullRows`, which keeps its keys). Where the job compresses values
//! ([`crate::filter::Filters::compression`]) the sender packs them in an exact form, bit for bit,
//! that saves bytes, trying in turn:
//! - leaving out the rows that are all zero, with a bitmap of those that are not (a pull's answer
//!   under L1 regularization is mostly zero weights);
//! - of the rows left, a table of their distinct values and a short code per value
//!   ([`crate::wire::palette`]: a minibatch's gradient has about as many distinct values as the
//!   batch has rows);
//! - of the rows left, each value's sign and exponent as a code into a table of those that occur,
//!   and its mantissa as it is ([`crate::wire::exponents`]: weights and gradients of real sums are
//!   all different floats, but of a few powers of two);
//! - where none of those saves, an LZ4 block (`lz4_flex`: dense values that repeat in longer runs),
//!   or where it saves more than the exponents' table.
//!
//! A sample of 64 words decides whether values repeat at all before a palette or a block is tried,
//! since gradients and weights of real values never do.
//!
//! A packed form is unpacked only against the keys it belongs to ([`RowValues::with_keys`]), which
//! the receiver already holds or the frame carries: the rows a frame claims cannot make the decoder
//! allocate more than the frame's own size, and the unpacked values never exceed the keys held. A
//! table form's codes decode only if they are exactly as many as the rows, each names an entry, the
//! entries are distinct and in order of first use, and the padding is zero
//! (`crate::wire::first_use`), so that values have one packed form.

use core::fmt;
use std::sync::Arc;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::forms::seq;
use crate::key::Key;
use crate::kv::KvPairs;
use crate::value::Value;
use crate::wire::{exponents, palette};

/// Below this many bytes of values an LZ4 block is not tried: its framing eats the saving,
/// and trying costs time on every small slice.
const LZ4_MIN_BYTES: usize = 512;

/// The values of rows whose keys the receiver knows already: the key list named by a
/// [`crate::wire::PushCached`], or the keys a [`crate::wire::PullValues`] answers. Plain, it
/// is a [`KvPairs`] over the keys `0..rows` (one varint), so that its values travel in the
/// frame's trailer like every other, and are read where they arrived (ARCHITECTURE.md §5).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
pub struct RowValues<V: Value>(Packed<V>);

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: Value")]
enum Packed<V: Value> {
    /// Every value.
    Plain(KvPairs<V>),
    /// The rows not all zero, and one bit per row saying which those are.
    ZeroRows {
        rows: u32,
        #[serde(with = "seq")]
        nonzero: Vec<u8>,
        values: KvPairs<V>,
    },
    /// Every value, little-endian, as one LZ4 block.
    Lz4 {
        rows: u32,
        #[serde(with = "raw")]
        block: Vec<u8>,
    },
    /// The values of the rows not all zero (of every row, if `nonzero` is empty) as codes
    /// into a table of their distinct values.
    Palette {
        rows: u32,
        /// One bit per row, set for the rows coded; empty when every row is.
        #[serde(with = "seq")]
        nonzero: Vec<u8>,
        /// The distinct values, in order of first use, one a row.
        table: KvPairs<V>,
        /// Bits per code.
        bits: u8,
        #[serde(with = "raw")]
        codes: Vec<u8>,
    },
    /// The values of the rows not all zero (of every row, if `nonzero` is empty), each as a
    /// code for its head (sign and exponent) into a table of the heads that occur, and the
    /// rest of its bits.
    Exponents {
        rows: u32,
        /// One bit per row, set for the rows coded; empty when every row is.
        #[serde(with = "seq")]
        nonzero: Vec<u8>,
        /// The distinct heads, in order of first use.
        #[serde(with = "seq")]
        heads: Vec<u16>,
        /// Bits per code.
        bits: u8,
        /// Each value's tail and code ([`exponents::Coded::stream`]).
        #[serde(with = "raw")]
        stream: Vec<u8>,
    },
}

impl<V: Value> RowValues<V> {
    /// The values of `kvs`, without its keys, as they are; shares their storage.
    pub fn of(kvs: &KvPairs<V>) -> Self {
        RowValues(Packed::Plain(kvs.without_keys()))
    }

    /// The values of `kvs`, without its keys, in a smaller exact form where one pays.
    pub fn packed(kvs: &KvPairs<V>) -> Self {
        let width = kvs.width();
        let values = kvs.values();
        let rows = kvs.len();
        let Ok(rows32) = u32::try_from(rows) else {
            return Self::of(kvs);
        };
        let zero_row = |row: &[V]| row.iter().all(|v| v.to_bits() == 0);
        let zero_rows = if width == 1 {
            // A linear model's rows, counted in a loop the compiler unrolls.
            values.iter().filter(|v| v.to_bits() == 0).count()
        } else {
            values.chunks(width).filter(|r| zero_row(r)).count()
        };
        let bitmap = rows.div_ceil(8);
        let (nonzero, kept) = if zero_rows * width * V::SIZE > bitmap + 2 {
            let mut nonzero = vec![0u8; bitmap];
            let kept = if width == 1 {
                kept_values(values, values.len() - zero_rows, &mut nonzero)
            } else {
                let mut kept = Vec::with_capacity((rows - zero_rows) * width);
                for (i, row) in values.chunks(width).enumerate() {
                    if !zero_row(row) {
                        nonzero[i / 8] |= 1 << (i % 8);
                        kept.extend_from_slice(row);
                    }
                }
                kept
            };
            (nonzero, std::borrow::Cow::Owned(kept))
        } else {
            (Vec::new(), std::borrow::Cow::Borrowed(values))
        };
        if repeats(kept.len(), |i| kept[i].to_bits())
            && let Some(coded) = palette::encode(&kept)
        {
            return RowValues(Packed::Palette {
                rows: rows32,
                nonzero,
                table: KvPairs::from_run(0, coded.table, 1),
                bits: coded.bits,
                codes: coded.codes,
            });
        }
        let coded = exponents::encode(&kept);
        let raw: usize = values.len() * V::SIZE;
        // Dense values that repeat in runs a table of values could not hold: an LZ4 block,
        // where it beats the exponents' table.
        if nonzero.is_empty()
            && raw >= LZ4_MIN_BYTES
            && let Some(block) = lz4_block(kvs)
            && coded.as_ref().is_none_or(|c| block.len() < c.stream.len())
        {
            return RowValues(Packed::Lz4 {
                rows: rows32,
                block,
            });
        }
        if let Some(coded) = coded {
            return RowValues(Packed::Exponents {
                rows: rows32,
                nonzero,
                heads: coded.heads,
                bits: coded.bits,
                stream: coded.stream,
            });
        }
        if !nonzero.is_empty() {
            return RowValues(Packed::ZeroRows {
                rows: rows32,
                nonzero,
                values: KvPairs::from_run(0, kept.into_owned(), width),
            });
        }
        Self::of(kvs)
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        match &self.0 {
            Packed::Plain(kvs) => kvs.len(),
            Packed::ZeroRows { rows, .. }
            | Packed::Lz4 { rows, .. }
            | Packed::Palette { rows, .. }
            | Packed::Exponents { rows, .. } => *rows as usize,
        }
    }

    /// About how many bytes the values take on the wire.
    pub fn wire_bytes(&self) -> usize {
        match &self.0 {
            Packed::Plain(kvs) => kvs.values().len() * V::SIZE,
            Packed::ZeroRows {
                nonzero, values, ..
            } => nonzero.len() + values.values().len() * V::SIZE,
            Packed::Lz4 { block, .. } => block.len(),
            Packed::Palette {
                nonzero,
                table,
                codes,
                ..
            } => nonzero.len() + table.len() * V::SIZE + 1 + codes.len(),
            Packed::Exponents {
                nonzero,
                heads,
                stream,
                ..
            } => nonzero.len() + heads.len() * 2 + 1 + stream.len(),
        }
    }

    /// Whether the values are packed (not plain).
    pub fn is_packed(&self) -> bool {
        !matches!(self.0, Packed::Plain(_))
    }

    /// The rows under `keys`, `width` values each, if there are as many keys as rows and
    /// the packed form is whole; plain values share their storage.
    pub fn with_keys(&self, keys: &Arc<Vec<Key>>, width: usize) -> Option<KvPairs<V>> {
        if self.rows() != keys.len() {
            return None;
        }
        let rows = keys.len();
        let unpacked = match &self.0 {
            Packed::Plain(kvs) => return kvs.rekeyed(keys).filter(|k| k.width() == width),
            Packed::ZeroRows {
                nonzero, values, ..
            } => {
                if values.width() != width {
                    return None;
                }
                spread(nonzero, values.values().to_vec(), rows, width)?
            }
            Packed::Palette {
                nonzero,
                table,
                bits,
                codes,
                ..
            } => {
                let count = coded_rows(nonzero, rows).checked_mul(width)?;
                let kept = palette::decode(table.values(), *bits, codes, count)?;
                with_zero_rows(nonzero, kept, rows, width)?
            }
            Packed::Exponents {
                nonzero,
                heads,
                bits,
                stream,
                ..
            } => {
                let count = coded_rows(nonzero, rows).checked_mul(width)?;
                let kept = exponents::decode(heads, *bits, stream, count)?;
                with_zero_rows(nonzero, kept, rows, width)?
            }
            Packed::Lz4 { block, .. } => {
                let mut bytes = vec![0u8; rows.checked_mul(width)?.checked_mul(V::SIZE)?];
                if lz4_flex::block::decompress_into(block, &mut bytes).ok() != Some(bytes.len()) {
                    return None;
                }
                bytes.chunks_exact(V::SIZE).map(V::from_le_slice).collect()
            }
        };
        KvPairs::from_run(0, unpacked, width).rekeyed(keys)
    }
}

/// The `kept` values of `values` that are not zero, a row each, in order, with their bits
/// set in `nonzero`. Without a branch on each value: in a pull's answer zero and non-zero
/// weights come in no order a predictor learns, and the branch cost more than the rest of
/// packing the rows.
fn kept_values<V: Value>(values: &[V], kept: usize, nonzero: &mut [u8]) -> Vec<V> {
    // One value of room past the last kept, which every value is written to before it is
    // known whether it stays.
    let mut out = vec![V::default(); kept + 1];
    let mut at = 0;
    for (byte, eight) in nonzero.iter_mut().zip(values.chunks(8)) {
        let mut bits = 0u8;
        for (i, &v) in eight.iter().enumerate() {
            let set = v.to_bits() != 0;
            bits |= u8::from(set) << i;
            out[at.min(kept)] = v;
            at += usize::from(set);
        }
        *byte = bits;
    }
    out.truncate(kept);
    out
}

/// Rows a table form codes: those whose bit is set in `nonzero`, or all `rows` if it is
/// empty.
fn coded_rows(nonzero: &[u8], rows: usize) -> usize {
    if nonzero.is_empty() {
        rows
    } else {
        nonzero.iter().map(|b| b.count_ones() as usize).sum()
    }
}

/// The `rows` rows a table form's `kept` values stand for: as they are if `nonzero` is empty,
/// otherwise spread over the rows whose bit is set ([`spread`]).
fn with_zero_rows<V: Value>(
    nonzero: &[u8],
    kept: Vec<V>,
    rows: usize,
    width: usize,
) -> Option<Vec<V>> {
    if nonzero.is_empty() {
        Some(kept)
    } else {
        spread(nonzero, kept, rows, width)
    }
}

/// The `rows` rows of `width` values each, `kept` holding those of the rows whose bit is set
/// in `nonzero` and the rest zero; `None` unless there is one bit per row (none set past the
/// last) and one row kept per bit set. In `kept`'s own storage: a row only ever moves to a
/// later place, so going from the last row back overwrites nothing unread.
fn spread<V: Value>(nonzero: &[u8], mut kept: Vec<V>, rows: usize, width: usize) -> Option<Vec<V>> {
    if !bitmap_fits(nonzero, rows, kept.len(), width)? {
        return None;
    }
    let mut next = kept.len();
    kept.resize(rows * width, V::default());
    // Only the set bits, last first: most rows of a model's answer are zero.
    for (byte_at, &byte) in nonzero.iter().enumerate().rev() {
        let mut bits = byte;
        while bits != 0 {
            let bit = 7 - bits.leading_zeros() as usize;
            bits &= !(1 << bit);
            let at = (byte_at * 8 + bit) * width;
            next -= width;
            if next != at {
                kept.copy_within(next..next + width, at);
                kept[next..next + width].fill(V::default());
            }
        }
    }
    Some(kept)
}

/// Whether `nonzero` has one bit per row, none set past the last, and one row of `width`
/// values of the `kept` values per bit set; `None` if those overflow.
fn bitmap_fits(nonzero: &[u8], rows: usize, kept: usize, width: usize) -> Option<bool> {
    let ones: usize = nonzero.iter().map(|b| b.count_ones() as usize).sum();
    let tail_clear = rows % 8 == 0 || nonzero.last().is_some_and(|b| b >> (rows % 8) == 0);
    let whole = nonzero.len() == rows.div_ceil(8) && tail_clear;
    Some(whole && ones.checked_mul(width)? == kept)
}

/// The values of `kvs` as an LZ4 block, if they look like they repeat and the block saves a
/// tenth of them at least, its length varint included.
fn lz4_block<V: Value>(kvs: &KvPairs<V>) -> Option<Vec<u8>> {
    let raw = kvs.values().len() * V::SIZE;
    let bytes = kvs.le_values();
    let word = |i: usize| {
        let at = 4 * i;
        u64::from(u32::from_le_bytes([
            bytes[at],
            bytes[at + 1],
            bytes[at + 2],
            bytes[at + 3],
        ]))
    };
    if !repeats(bytes.len() / 4, word) {
        return None;
    }
    let block = lz4_flex::block::compress(&bytes);
    (block.len() + 4 < raw - raw / 10).then_some(block)
}

/// Whether `words` words, the `i`th read by `word`, look like they repeat, which is what
/// both a table of distinct values and an LZ4 block live on: among 64 words spread over them,
/// an eighth or more are repeats. Gradients of real-valued features and weights, all
/// different floats, have none, and trying to compress every one of them cost a twentieth of
/// a training step on the shipped data; a minibatch's gradient of binary features, small
/// integers (their zero high words) and repeated values have many.
fn repeats(words: usize, word: impl Fn(usize) -> u64) -> bool {
    const SAMPLE: usize = 64;
    // A set of the sample, at most half full: sorting the sample instead took a seventh of
    // all packing and unpacking in a profile of the shipped data.
    const SLOTS: usize = 2 * SAMPLE;
    let step = (words / SAMPLE).max(1);
    let mut slots = [(0u64, false); SLOTS];
    let (mut taken, mut repeated) = (0usize, 0usize);
    for w in (0..words).step_by(step).take(SAMPLE).map(word) {
        taken += 1;
        let mut slot = (w.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as usize;
        loop {
            match slots[slot] {
                (_, false) => {
                    slots[slot] = (w, true);
                    break;
                }
                (seen, true) if seen == w => {
                    repeated += 1;
                    break;
                }
                _ => slot = (slot + 1) % SLOTS,
            }
        }
    }
    repeated * 8 >= taken
}

/// A byte string, as postcard's bytes: a length and the bytes, read in one piece.
mod raw {
    use super::*;

    pub(super) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Raw;
        impl Visitor<'_> for Raw {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
        }
        d.deserialize_bytes(Raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bits(kvs: &KvPairs<f32>) -> Vec<u32> {
        kvs.values().iter().map(|v| v.to_bits()).collect()
    }

    fn keys(n: usize) -> Arc<Vec<Key>> {
        Arc::new((0..n as Key).map(|k| k * 3 + 1).collect())
    }

    proptest! {
        /// Whatever form the values are packed in, the receiver gets them back bit for bit,
        /// under the keys it holds, through the codec.
        #[test]
        fn packed_values_come_back_exactly(
            width in 1usize..4,
            raw in proptest::collection::vec(
                prop_oneof![
                    3 => Just(0u32),
                    1 => Just(0x8000_0000u32),
                    2 => Just(0x3f80_0000u32),
                    2 => any::<u32>(),
                ],
                0..400,
            ),
        ) {
            let rows = raw.len() / width;
            let values: Vec<f32> = raw[..rows * width].iter().map(|&b| f32::from_bits(b)).collect();
            let list = keys(rows);
            let kvs = KvPairs::new(list.to_vec(), values, width).unwrap();
            let packed = RowValues::packed(&kvs);
            prop_assert!(packed.wire_bytes() <= rows * width * 4);
            let env = crate::wire::Envelope::new(
                crate::NodeId(1),
                crate::NodeId(2),
                1,
                crate::wire::Message::PullValues(crate::wire::PullValues {
                    slice: crate::wire::SliceRef { request: 1, slice: 0 },
                    complete_below: 0,
                    values: packed,
                }),
            );
            let codec = crate::wire::Codec::default();
            let got = codec.decode::<f32>(&codec.encode(&env).unwrap()).unwrap();
            let crate::wire::Message::PullValues(reply) = got.body else {
                panic!("a PullValues");
            };
            let back = reply.values.with_keys(&list, width).unwrap();
            prop_assert_eq!(back.keys(), kvs.keys());
            prop_assert_eq!(bits(&back), bits(&kvs));
            // Another number of keys, or another width, is refused.
            prop_assert!(reply.values.with_keys(&keys(rows + 1), width).is_none());
            if rows > 0 {
                prop_assert!(reply.values.with_keys(&list, width + 1).is_none());
            }
        }
    }

    #[test]
    fn each_packed_form_is_chosen_where_it_saves_bytes() {
        let list = keys(200);
        let sparse: Vec<f32> = (0..200)
            .map(|i| if i % 5 == 0 { i as f32 + 1.0 } else { 0.0 })
            .collect();
        let kvs = KvPairs::new(list.to_vec(), sparse, 1).unwrap();
        let packed = RowValues::packed(&kvs);
        assert!(matches!(packed.0, Packed::ZeroRows { .. }));
        // A bit a row and the 40 rows kept.
        assert_eq!(packed.wire_bytes(), 25 + 40 * 4);
        // Few distinct values: a table of 4 and two bits a row.
        let repeating: Vec<f32> = (0..200).map(|i| (i % 4) as f32 + 0.5).collect();
        let kvs = KvPairs::new(list.to_vec(), repeating, 1).unwrap();
        let packed = RowValues::packed(&kvs);
        assert!(
            matches!(packed.0, Packed::Palette { bits: 2, .. }),
            "{packed:?}"
        );
        assert_eq!(packed.wire_bytes(), 4 * 4 + 1 + 50);
        // Few distinct values among rows mostly zero: the bitmap, then the table.
        let held: Vec<f32> = (0..200)
            .map(|i| if i % 3 == 0 { 0.0 } else { (i % 4) as f32 })
            .collect();
        let kvs = KvPairs::new(list.to_vec(), held, 1).unwrap();
        let packed = RowValues::packed(&kvs);
        let Packed::Palette { nonzero, bits, .. } = &packed.0 else {
            panic!("{packed:?}");
        };
        assert_eq!((nonzero.len(), *bits), (25, 2));
        // Too many distinct values for a table, repeated in a long run: an LZ4 block.
        let list = keys(384);
        let twice: Vec<f32> = (0..384).map(|i| (i % 192) as f32 + 0.5).collect();
        let kvs = KvPairs::new(list.to_vec(), twice, 1).unwrap();
        let packed = RowValues::packed(&kvs);
        assert!(matches!(packed.0, Packed::Lz4 { .. }), "{packed:?}");
        assert!(packed.wire_bytes() < 384 * 4 * 3 / 5);
        let list = keys(200);
        // Weights, all different, of 2 signs and 1 exponent, among rows mostly zero: the
        // bitmap, then a 1-bit code for the head and the 23 bits below it, 3 bytes a value.
        let weights: Vec<f32> = (0..200)
            .map(|i| match i % 3 {
                0 => 0.0,
                1 => 0.25 + i as f32 / 1000.0,
                _ => -0.25 - i as f32 / 1000.0,
            })
            .collect();
        let kvs = KvPairs::new(list.to_vec(), weights, 1).unwrap();
        let packed = RowValues::packed(&kvs);
        let Packed::Exponents {
            nonzero,
            heads,
            bits,
            ..
        } = &packed.0
        else {
            panic!("{packed:?}");
        };
        assert_eq!((nonzero.len(), heads.len(), *bits), (25, 2, 1));
        assert_eq!(packed.wire_bytes(), 25 + 2 * 2 + 1 + 133 * 3);
        // Values of every exponent that do not repeat stay plain: packing them would not pay.
        let mut x = 0x1234_5678u32;
        let noise: Vec<f32> = (0..200)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                f32::from_bits((x & 0x3fff_ffff) | 0x0080_0000)
            })
            .collect();
        let kvs = KvPairs::new(list.to_vec(), noise, 1).unwrap();
        assert!(!RowValues::packed(&kvs).is_packed());
    }

    #[test]
    fn a_bitmap_that_does_not_match_its_rows_is_refused() {
        let list = keys(10);
        let form = |nonzero: Vec<u8>, kept: usize| {
            RowValues::<f32>(Packed::ZeroRows {
                rows: 10,
                nonzero,
                values: KvPairs::from_run(0, vec![1.0; kept], 1),
            })
        };
        assert!(form(vec![0b11, 0], 2).with_keys(&list, 1).is_some());
        // A bit past the tenth row, a byte too many, a row kept too many.
        assert!(form(vec![0b11, 0b100], 3).with_keys(&list, 1).is_none());
        assert!(form(vec![0b11, 0, 0], 2).with_keys(&list, 1).is_none());
        assert!(form(vec![0b11, 0], 3).with_keys(&list, 1).is_none());
    }

    #[test]
    fn rows_coded_by_exponents_come_back_in_their_places_among_zero_rows() {
        // 300 rows of two values, all different floats of two exponents, every third row
        // zero: packed as a bitmap and exponent codes, and spread back row by row.
        let rows = 300;
        let values: Vec<f32> = (0..rows * 2)
            .map(|i| {
                if (i / 2) % 3 == 0 {
                    0.0
                } else {
                    0.25 + (i as f32) * 1e-4 * if i % 2 == 0 { 1.0 } else { -1.0 }
                }
            })
            .collect();
        let list = keys(rows);
        let kvs = KvPairs::new(list.to_vec(), values, 2).unwrap();
        let packed = RowValues::packed(&kvs);
        assert!(matches!(
            &packed.0,
            Packed::Exponents { nonzero, .. } if !nonzero.is_empty()
        ));
        let back = packed.with_keys(&list, 2).unwrap();
        assert_eq!(bits(&back), bits(&kvs));
    }

    #[test]
    fn values_repeat_when_an_eighth_of_a_sample_does() {
        // 64 words sampled: 8 repeats are enough, 7 are not.
        assert!(repeats(64, |i| (i as u64).min(55)));
        assert!(!repeats(64, |i| (i as u64).min(56)));
        assert!(!repeats(1000, |i| i as u64 * 0x9E37_79B9));
        assert!(repeats(1000, |i| i as u64 % 50));
    }
}
