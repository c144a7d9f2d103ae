//! Palette coding of values (ARCHITECTURE.md §10): the distinct values once, in a table, and
//! every value as a code of as few bits as the table needs.
//!
//! A minibatch's gradient has few distinct values: a feature seen in one row of the batch
//! has that row's residual for gradient (times its value, 1 for a binary feature), so a
//! push of thousands of rows carries about as many distinct values as the batch has rows.
//! A table of those and a 7-bit code a row take a fifth of the plain values, where an LZ4
//! block, which pays 3 bytes for every 4-byte repeat it finds, took about three quarters. A code
//! takes 7 to 10 bits where an `f32` value took 32.

use crate::value::Value;
use crate::wire::first_use::FirstUse;

/// Most entries a table may have: codes fit 16 bits.
pub(crate) const MOST_ENTRIES: usize = 1 << 16;

/// Below this many values a table is not tried: what it saves is a few bytes.
const MIN_VALUES: usize = 16;

/// Values coded against a table of their distinct values.
#[derive(Debug, PartialEq)]
pub(crate) struct Coded<V> {
    /// The distinct values, in order of first use.
    pub(crate) table: Vec<V>,
    /// Bits per code: [`code_bits`] of the table's length.
    pub(crate) bits: u8,
    /// The codes, `bits` each, the first value's in the lowest bits of the first byte.
    pub(crate) codes: Vec<u8>,
}

/// Bits a code into a table of `entries` takes: none for one entry.
pub(crate) fn code_bits(entries: usize) -> u8 {
    if entries <= 1 {
        0
    } else {
        (usize::BITS - (entries - 1).leading_zeros()) as u8
    }
}

/// `values` against a table of their distinct values (bit for bit: `-0.0` and `0.0` are two
/// entries), if that takes a tenth less than the values themselves; `None` otherwise, or as
/// soon as the table grows past what could pay.
pub(crate) fn encode<V: Value>(values: &[V]) -> Option<Coded<V>> {
    let n = values.len();
    // A table of d entries and codes of at most 16 bits save a tenth of n values of S bytes
    // only while d * S < n * (0.9 * S - 2): past that many entries, give up.
    // At least 16 values of 4 bytes or more: at least 6 entries.
    let most = (n * (9 * V::SIZE).saturating_sub(20) / (10 * V::SIZE)).min(MOST_ENTRIES);
    if n < MIN_VALUES {
        return None;
    }
    // Open addressing, at most half full: a slot holds an entry's value bits and its code,
    // or `EMPTY` for its code. Beside each other rather than looked up in the table, so that
    // a probe reads one small array.
    const EMPTY: u32 = u32::MAX;
    let slots = (2 * most).next_power_of_two();
    let shift = u64::BITS - slots.trailing_zeros();
    let mut index: Vec<(u64, u32)> = vec![(0, EMPTY); slots];
    let mut table: Vec<V> = Vec::new();
    let mut codes: Vec<u16> = Vec::with_capacity(n);
    // The value before, whose code a run of equal values takes without a probe.
    let mut last: Option<(u64, u16)> = None;
    for &v in values {
        let bits = v.to_bits();
        if let Some((b, code)) = last
            && b == bits
        {
            codes.push(code);
            continue;
        }
        // Fibonacci hashing: the high bits of the product spread values that differ only
        // in their low bits, as nearby floats do.
        let mut slot = (bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize;
        let code = loop {
            let (at_bits, at) = index[slot];
            if at == EMPTY {
                if table.len() == most {
                    return None;
                }
                let code = table.len() as u32;
                index[slot] = (bits, code);
                table.push(v);
                break code;
            }
            if at_bits == bits {
                break at;
            }
            slot = (slot + 1) & (slots - 1);
        };
        // At most `MOST_ENTRIES` entries: every code fits.
        let code = code as u16;
        last = Some((bits, code));
        codes.push(code);
    }
    let bits = code_bits(table.len());
    let packed = (n * bits as usize).div_ceil(8);
    let raw = n * V::SIZE;
    // Only where it pays: a tenth off at least, the framing's varints included.
    if table.len() * V::SIZE + packed + 6 >= raw - raw / 10 {
        return None;
    }
    let mut out = Vec::with_capacity(packed);
    let mut acc: u32 = 0;
    let mut filled: u32 = 0;
    for code in codes {
        acc |= u32::from(code) << filled;
        filled += u32::from(bits);
        while filled >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            filled -= 8;
        }
    }
    if filled > 0 {
        out.push(acc as u8);
    }
    Some(Coded {
        table,
        bits,
        codes: out,
    })
}

/// The `count` values `codes` stand for in `table`; `None` unless the table is the one the
/// encoder would have built (distinct values, bit for bit, in order of first use, each
/// used), `bits` is what it needs, and the codes are exactly `count` of them (the last byte's
/// unused bits clear): one coding per values.
pub(crate) fn decode<V: Value>(
    table: &[V],
    bits: u8,
    codes: &[u8],
    count: usize,
) -> Option<Vec<V>> {
    if table.is_empty() || table.len() > MOST_ENTRIES || bits != code_bits(table.len()) {
        return None;
    }
    let bits = u32::from(bits);
    if codes.len() != count.checked_mul(bits as usize)?.div_ceil(8) || !distinct(table) {
        return None;
    }
    if bits == 0 {
        return (count > 0).then(|| vec![table[0]; count]);
    }
    let mask = (1u64 << bits) - 1;
    let last = table.len() - 1;
    let mut out = Vec::with_capacity(count);
    let mut order = FirstUse::default();
    let mut acc: u64 = 0;
    let mut filled: u32 = 0;
    let mut at = 0usize;
    for _ in 0..count {
        if filled < bits {
            // Four bytes at a time while four are left (fewer than 16 bits are waiting, so
            // they fit); every byte read holds codes, as there are no more bytes than codes.
            if let Some(&[a, b, c, d]) = codes.get(at..at + 4) {
                acc |= u64::from(u32::from_le_bytes([a, b, c, d])) << filled;
                filled += 32;
                at += 4;
            } else {
                while filled < bits {
                    acc |= u64::from(*codes.get(at)?) << filled;
                    filled += 8;
                    at += 1;
                }
            }
        }
        let code = (acc & mask) as usize;
        order.see(code);
        out.push(table[code.min(last)]);
        acc >>= bits;
        filled -= bits;
    }
    // What is left of the last byte is padding, and padding is zero.
    (order.all_used(table.len()) && acc == 0 && at == codes.len()).then_some(out)
}

/// Whether no two of `table`'s values have the same bits: a set at most half full, where
/// sorting a copy took a third as long as decoding the codes.
fn distinct<V: Value>(table: &[V]) -> bool {
    let slots = (2 * table.len()).next_power_of_two();
    let shift = u64::BITS - slots.trailing_zeros();
    let mut set: Vec<Option<u64>> = vec![None; slots];
    for v in table {
        let bits = v.to_bits();
        let mut slot = (bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize;
        loop {
            match set[slot] {
                None => {
                    set[slot] = Some(bits);
                    break;
                }
                Some(seen) if seen == bits => return false,
                Some(_) => slot = (slot + 1) & (slots - 1),
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn code_bits_cover_every_entry() {
        assert_eq!(code_bits(1), 0);
        assert_eq!(code_bits(2), 1);
        assert_eq!(code_bits(3), 2);
        assert_eq!(code_bits(4), 2);
        assert_eq!(code_bits(5), 3);
        assert_eq!(code_bits(128), 7);
        assert_eq!(code_bits(129), 8);
        assert_eq!(code_bits(MOST_ENTRIES), 16);
    }

    #[test]
    fn a_gradient_of_few_residuals_takes_a_table_and_short_codes() {
        // 3,000 rows of 100 distinct values: a table of 400 bytes and 7-bit codes.
        let values: Vec<f32> = (0..3000).map(|i| (i * 37 % 100) as f32 - 50.0).collect();
        let coded = encode(&values).expect("pays");
        assert_eq!(coded.table.len(), 100);
        assert_eq!(coded.bits, 7);
        assert_eq!(coded.codes.len(), (3000 * 7usize).div_ceil(8));
        assert_eq!(coded.table[..2], [-50.0, -13.0]);
        let back = decode(&coded.table, coded.bits, &coded.codes, 3000).expect("whole");
        assert_eq!(back, values);
    }

    #[test]
    fn values_that_seldom_repeat_are_not_coded() {
        let distinct: Vec<f32> = (0..400).map(|i| i as f32).collect();
        assert_eq!(encode(&distinct), None);
        // Too few to pay for a table; as many as pay, a table of one and no codes.
        assert_eq!(encode(&[1.0f32; MIN_VALUES - 1]), None);
        let one = encode(&[1.0f32; MIN_VALUES]).expect("pays");
        assert_eq!((one.table, one.bits, one.codes), (vec![1.0], 0, vec![]));
    }

    #[test]
    fn a_table_goes_only_where_it_saves_a_tenth() {
        // 163,840 values of 4 bytes (655,360), of which a tenth off is 589,824 bytes. A table
        // of 65,535 entries and 16-bit codes take 262,140 + 327,680 + 6: just too many.
        let n = 163_840u32;
        let spread =
            |distinct: u32| -> Vec<f32> { (0..n).map(|i| f32::from_bits(i % distinct)).collect() };
        assert_eq!(encode(&spread(65_535)), None);
        // Half the entries, 15-bit codes: 131,072 + 307,200 + 6 bytes.
        let coded = encode(&spread(32_768)).expect("pays");
        assert_eq!((coded.table.len(), coded.bits), (32_768, 15));
        assert_eq!(coded.codes.len(), 307_200);
    }

    #[test]
    fn malformed_codes_are_refused() {
        let table = [1.0f32, 2.0, 3.0];
        // Two bits a code: codes 0, 1, 2 of three values in one byte.
        assert_eq!(
            decode(&table, 2, &[0b10_01_00], 3),
            Some(vec![1.0, 2.0, 3.0])
        );
        // A code past the table, the wrong width, a byte too many or too few, padding set.
        assert_eq!(decode(&table, 2, &[0b11_01_00], 3), None);
        assert_eq!(decode(&table, 3, &[0b10_01_00, 0], 3), None);
        // Codes wider than the table needs, in a stream of that width: codes 0, 1, 2 in 3
        // bits each decode, but the encoder would have used 2.
        assert_eq!(decode(&table, 3, &[0b10_001_000, 0], 3), None);
        assert_eq!(decode(&table, 2, &[0b10_01_00, 0], 3), None);
        assert_eq!(decode(&table, 2, &[], 3), None);
        assert_eq!(decode(&table, 2, &[0b01_10_01_00], 3), None);
        assert_eq!(decode::<f32>(&[], 0, &[], 0), None);
        // No table for values that need none of its bits: still no table.
        assert_eq!(decode::<f32>(&[], 0, &[], 3), None);
        assert_eq!(decode(&[7.0f32], 0, &[], 4), Some(vec![7.0; 4]));
        // The same value twice, an entry never used, entries out of first use's order.
        assert_eq!(decode(&[1.0f32, 1.0], 1, &[0b10], 2), None);
        assert_eq!(decode(&[1.0f32, 2.0], 1, &[0b00], 2), None);
        assert_eq!(decode(&[1.0f32, 2.0], 1, &[0b01], 2), None);
        assert_eq!(decode(&[1.0f32, 2.0], 1, &[0b10], 2), Some(vec![1.0, 2.0]));
        // Every entry used, but the third before the second: codes 0, 2, 1, 2.
        assert_eq!(decode(&table, 2, &[0b10_01_10_00], 4), None);
        assert_eq!(
            decode(&table, 2, &[0b10_10_01_00], 4),
            Some(vec![1.0, 2.0, 3.0, 3.0])
        );
        assert_eq!(decode(&[7.0f32], 0, &[], 0), None);
        // The largest table codes in 16 bits; one entry more is refused, codes of 17 bits
        // and all.
        let most: Vec<f32> = (0..MOST_ENTRIES).map(|i| i as f32).collect();
        let codes: Vec<u8> = (0..MOST_ENTRIES as u32)
            .flat_map(|i| (i as u16).to_le_bytes())
            .collect();
        assert_eq!(decode(&most, 16, &codes, MOST_ENTRIES), Some(most.clone()));
        let mut past = most.clone();
        past.push(-1.0);
        let codes17 = vec![0u8; ((MOST_ENTRIES + 1) * 17).div_ceil(8)];
        assert_eq!(decode(&past, 17, &codes17, MOST_ENTRIES + 1), None);
    }

    proptest! {
        /// Whatever the values, a coding decodes to them bit for bit.
        #[test]
        fn coded_values_come_back_exactly(
            raw in proptest::collection::vec(
                prop_oneof![4 => 0u64..40, 1 => any::<u64>()],
                0..600,
            ),
        ) {
            let values: Vec<f64> = raw.iter().map(|&b| f64::from_bits(b)).collect();
            if let Some(coded) = encode(&values) {
                prop_assert!(coded.table.len() * 8 + coded.codes.len() < values.len() * 8);
                let back = decode(&coded.table, coded.bits, &coded.codes, values.len()).unwrap();
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&back), bits(&values));
            }
        }
    }
}
