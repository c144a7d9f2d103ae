//! The checkers' integration tests, one module per file, in one binary.

mod cluster;
mod filters;
mod replication;
mod simulation;
mod slots;
mod stragglers;
