//! Seeded, platform-independent randomness for the applications' generators: every draw is a
//! pure function of its inputs, so that generated data and initial models replay exactly.

/// SplitMix64's output function: a bijective mix of `x`.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A number in (0, 1) from the top 53 bits of `x`.
pub(crate) fn unit(x: u64) -> f64 {
    ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// Puts `items` in an order drawn from `seed` (Fisher-Yates): the same seed, the same order.
pub(crate) fn shuffle<T>(items: &mut [T], seed: u64) {
    for i in (1..items.len()).rev() {
        let j = (mix(seed ^ mix(i as u64)) % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}
