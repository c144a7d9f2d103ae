//! What only checkers need: the deterministic simulator and the model checker in
//! `pserver-models`, and the fuzz targets. Compiled with the `testing` feature; an embedder
//! builds none of it (ARCHITECTURE.md §7).

/// The seeded, platform-independent hash the ring places servers with, for checkers that
/// draw their own choices from a seed the same way on every platform.
pub fn hash_words(seed: u64, words: &[u64]) -> u64 {
    crate::hash::hash_words(seed, words)
}

/// SplitMix64's output function, the mixer under [`hash_words`].
pub fn mix64(x: u64) -> u64 {
    crate::hash::mix64(x)
}
