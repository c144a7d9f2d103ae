//! The transports' integration tests, one module per file, in one binary.

mod checkpoints;
mod common;
mod durable;
mod runtime;
mod udp;
