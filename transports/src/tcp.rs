//! TCP transport (being written).
