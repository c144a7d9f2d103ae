//! The update rule simulated servers run, which the wrong-sign mutation wraps.

use core::hash::Hasher;

use pserver_core::{UpdateRule, Updater, Value};

/// The update rule the simulated servers run: the job's rule, or under
/// `SimMutation::WrongSign` that rule handed every delta negated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ServerRule {
    rule: Updater,
    negated: bool,
}

impl ServerRule {
    pub(crate) fn new(rule: Updater, negated: bool) -> Self {
        ServerRule { rule, negated }
    }
}

impl<V: Value> UpdateRule<V> for ServerRule {
    fn aux_width(&self) -> usize {
        UpdateRule::<V>::aux_width(&self.rule)
    }

    fn apply(&self, weight: &mut V, aux: &mut [V], delta: V) {
        // Adding the negation, not subtracting: the two differ on signed zeros.
        let delta = if self.negated {
            V::default().sub(delta)
        } else {
            delta
        };
        self.rule.apply(weight, aux, delta);
    }

    fn apply_all(&self, weights: &mut [V], aux: &mut [V], deltas: &[V]) {
        if self.negated {
            let negated: Vec<V> = deltas.iter().map(|&d| V::default().sub(d)).collect();
            self.rule.apply_all(weights, aux, &negated);
        } else {
            self.rule.apply_all(weights, aux, deltas);
        }
    }

    fn fingerprint(&self, state: &mut dyn Hasher) {
        UpdateRule::<V>::fingerprint(&self.rule, state);
        state.write_u8(u8::from(self.negated));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_negated_rule_moves_the_other_way() {
        let run = |negated, batch: bool| {
            let (mut w, rule) = (1.0f64, ServerRule::new(Updater::Sum, negated));
            if batch {
                rule.apply_all(core::slice::from_mut(&mut w), &mut [], &[2.0]);
            } else {
                rule.apply(&mut w, &mut [], 2.0);
            }
            w
        };
        assert_eq!([run(false, true), run(true, true)], [3.0, -1.0]);
        assert_eq!([run(false, false), run(true, false)], [3.0, -1.0]);
    }
}
