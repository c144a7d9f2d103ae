//! The checkers' integration tests, one module per file, in one binary.

mod bounded;
mod cluster;
mod filters;
mod replication;
mod simulation;
mod slots;
mod stragglers;
