//! The core's integration tests, one module per file, in one binary. `decode_alloc` stays
//! apart: it installs a counting global allocator.

mod checkpoints;
mod codec;
mod common;
mod driver;
mod filters;
mod frames;
mod nodes;
mod replication;
mod ring;
mod sans_io;
mod server;
mod slots;
mod standby;
mod stragglers;
mod worker;
