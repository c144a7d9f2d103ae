//! What only checkers need: the deterministic simulator and the model checker in
//! `pserver-models`, and the fuzz targets. Compiled with the `testing` feature; an embedder
//! builds none of it (ARCHITECTURE.md §7).

pub use crate::hash::{hash_words, mix64};
