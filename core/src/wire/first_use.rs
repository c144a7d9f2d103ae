//! The check the table forms' decoders share (ARCHITECTURE.md §10): codes name a table's
//! entries in the order of their first use ([`crate::wire::palette`],
//! [`crate::wire::exponents`]).

/// Codes seen so far, checked against first use: a code is an entry used before or the next
/// one. A code past that is noted and judged at the end ([`FirstUse::all_used`]), rather
/// than with a branch out of the decoder's loop per value.
#[derive(Default)]
pub(crate) struct FirstUse {
    used: usize,
    past: bool,
}

impl FirstUse {
    /// Notes `code`.
    #[inline(always)]
    pub(crate) fn see(&mut self, code: usize) {
        self.past |= code > self.used;
        self.used += usize::from(code == self.used);
    }

    /// Whether every code named an entry in first use's order, and all `entries` were used.
    pub(crate) fn all_used(&self, entries: usize) -> bool {
        !self.past && self.used == entries
    }
}
