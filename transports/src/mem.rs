//! In-memory transport (being written).
