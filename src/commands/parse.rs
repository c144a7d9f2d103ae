//! Parsers of option values that several commands share.

/// A probability in [0, 1): of losing a message, say.
pub(super) fn probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..1.0).contains(&p) => Ok(p),
        _ => Err(format!("`{s}` is not a probability in [0, 1)")),
    }
}

/// A slowdown factor between 1 and 1000.
pub(super) fn factor(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (1.0..=1000.0).contains(&f) => Ok(f),
        _ => Err(format!("`{s}` is not a slowdown factor between 1 and 1000")),
    }
}
