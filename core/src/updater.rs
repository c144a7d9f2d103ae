//! Server-side update rules (ARCHITECTURE.md §2): how a pushed value changes a stored parameter.

use core::fmt::Debug;
use core::hash::{Hash, Hasher};

use crate::value::Value;

/// A per-coordinate update rule run on servers. Implement it for rules of your own.
///
/// `aux` holds [`UpdateRule::aux_width`] values of per-coordinate state (accumulators), zero
/// for a coordinate never updated. A rule's parameters never change while a server runs, so the
/// model checker needs nothing of it beyond [`UpdateRule::fingerprint`], whose default feeds
/// nothing in.
///
/// ```
/// use pserver_core::{UpdateRule, Updater};
/// let rule = Updater::Sgd { lr: 0.5 };
/// let mut w = 1.0f32;
/// rule.apply(&mut w, &mut [], 2.0);
/// assert_eq!(w, 0.0);
/// ```
pub trait UpdateRule<V: Value>: Clone + Debug + PartialEq {
    /// Values of per-coordinate state the rule keeps.
    fn aux_width(&self) -> usize;

    /// Applies the (aggregated) pushed value `delta` to `weight`.
    fn apply(&self, weight: &mut V, aux: &mut [V], delta: V);

    /// Applies `deltas` to `weights` element by element, `aux` holding
    /// [`UpdateRule::aux_width`] values per weight. The default calls [`UpdateRule::apply`] per
    /// element; a rule may override it with a loop the compiler can vectorise.
    fn apply_all(&self, weights: &mut [V], aux: &mut [V], deltas: &[V]) {
        let aux_width = self.aux_width();
        for (j, (w, &d)) in weights.iter_mut().zip(deltas).enumerate() {
            self.apply(w, &mut aux[j * aux_width..(j + 1) * aux_width], d);
        }
    }

    /// Sets `aux`, zero on entry, to the state in which the rule holds `weight` as if it had
    /// learnt it, for a job that starts from a saved model (a warm start): the next update
    /// moves on from `weight`. The default leaves `aux` zero, right for rules whose weight is
    /// their state (a sum, SGD, AdaGrad's accumulator starting over).
    fn warm(&self, weight: V, aux: &mut [V]) {
        let _ = (weight, aux);
    }

    /// The rule for keys the job exempts from regularization (an intercept, say: see
    /// [`JobSpec::unregularized`](crate::JobSpec::unregularized)). The default is the rule
    /// itself, for rules without a regularizer.
    fn unregularized(&self) -> Self {
        self.clone()
    }

    /// Feeds the rule's parameters into `state`, so that servers running different rules hash
    /// apart.
    fn fingerprint(&self, state: &mut dyn Hasher) {
        let _ = state;
    }
}

/// The built-in update rules.
#[derive(Clone, Copy, Debug, Default)]
pub enum Updater {
    /// `w += delta`: pushes are increments (counts, sketches, the exact checks).
    #[default]
    Sum,
    /// `w -= lr * g`: pushes are gradients.
    Sgd {
        /// Learning rate.
        lr: f64,
    },
    /// AdaGrad: `n += g^2; w -= lr * g / (sqrt(n) + eps)`.
    AdaGrad {
        /// Learning rate.
        lr: f64,
        /// Added to the denominator for stability.
        eps: f64,
    },
    /// FTRL-Proximal (McMahan et al.), the paper's sparse logistic regression: keeps `z` and
    /// `n` per coordinate; L1 drives weights to exactly zero.
    FtrlProximal {
        /// Per-coordinate learning-rate scale.
        alpha: f64,
        /// Learning-rate smoothing.
        beta: f64,
        /// L1 regularization.
        l1: f64,
        /// L2 regularization.
        l2: f64,
    },
}

impl Updater {
    fn bits(&self) -> (u8, [u64; 4]) {
        match *self {
            Updater::Sum => (0, [0; 4]),
            Updater::Sgd { lr } => (1, [lr.to_bits(), 0, 0, 0]),
            Updater::AdaGrad { lr, eps } => (2, [lr.to_bits(), eps.to_bits(), 0, 0]),
            Updater::FtrlProximal {
                alpha,
                beta,
                l1,
                l2,
            } => (
                3,
                [alpha.to_bits(), beta.to_bits(), l1.to_bits(), l2.to_bits()],
            ),
        }
    }
}

impl PartialEq for Updater {
    fn eq(&self, other: &Self) -> bool {
        self.bits() == other.bits()
    }
}

impl Eq for Updater {}

impl Hash for Updater {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.bits().hash(state);
    }
}

impl<V: Value> UpdateRule<V> for Updater {
    fn fingerprint(&self, mut state: &mut dyn Hasher) {
        self.bits().hash(&mut state);
    }

    fn unregularized(&self) -> Self {
        match *self {
            Updater::FtrlProximal { alpha, beta, .. } => Updater::FtrlProximal {
                alpha,
                beta,
                l1: 0.0,
                l2: 0.0,
            },
            rule => rule,
        }
    }

    /// FTRL-Proximal holds no weight but computes it from `z` and `n`: with `n` zero, `z` is
    /// the value from which the weight formula gives `weight` back.
    fn warm(&self, weight: V, aux: &mut [V]) {
        if let Updater::FtrlProximal {
            alpha,
            beta,
            l1,
            l2,
        } = *self
        {
            let w = weight.to_f64();
            if w != 0.0 {
                aux[0] = V::from_f64(-(w * (beta / alpha + l2) + w.signum() * l1));
            }
        }
    }

    fn aux_width(&self) -> usize {
        match self {
            Updater::Sum | Updater::Sgd { .. } => 0,
            Updater::AdaGrad { .. } => 1,
            Updater::FtrlProximal { .. } => 2,
        }
    }

    fn apply_all(&self, weights: &mut [V], aux: &mut [V], deltas: &[V]) {
        // The sum is the dense hot path: one tight loop with the rule decided outside it.
        if let Updater::Sum = self {
            for (w, &d) in weights.iter_mut().zip(deltas) {
                *w = w.add(d);
            }
        } else {
            let aux_width = UpdateRule::<V>::aux_width(self);
            for (j, (w, &d)) in weights.iter_mut().zip(deltas).enumerate() {
                self.apply(w, &mut aux[j * aux_width..(j + 1) * aux_width], d);
            }
        }
    }

    fn apply(&self, weight: &mut V, aux: &mut [V], delta: V) {
        match *self {
            Updater::Sum => *weight = weight.add(delta),
            Updater::Sgd { lr } => *weight = V::from_f64(weight.to_f64() - lr * delta.to_f64()),
            Updater::AdaGrad { lr, eps } => {
                let g = delta.to_f64();
                let n = aux[0].to_f64() + g * g;
                aux[0] = V::from_f64(n);
                *weight = V::from_f64(weight.to_f64() - lr * g / (n.sqrt() + eps));
            }
            Updater::FtrlProximal {
                alpha,
                beta,
                l1,
                l2,
            } => {
                let g = delta.to_f64();
                let (z, n) = (aux[0].to_f64(), aux[1].to_f64());
                let w = weight.to_f64();
                let n_new = n + g * g;
                let sigma = (n_new.sqrt() - n.sqrt()) / alpha;
                let z_new = z + g - sigma * w;
                aux[0] = V::from_f64(z_new);
                aux[1] = V::from_f64(n_new);
                *weight = V::from_f64(if z_new.abs() <= l1 {
                    0.0
                } else {
                    -(z_new - z_new.signum() * l1) / ((beta + n_new.sqrt()) / alpha + l2)
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rule: Updater, grads: &[f64]) -> (f64, Vec<f64>) {
        let mut w = 0.0f64;
        let mut aux = vec![0.0f64; UpdateRule::<f64>::aux_width(&rule)];
        for &g in grads {
            rule.apply(&mut w, &mut aux, g);
        }
        (w, aux)
    }

    /// Each built-in rule, with a regularizer where it has one.
    const EVERY_RULE: [Updater; 4] = [
        Updater::Sum,
        Updater::Sgd { lr: 0.1 },
        Updater::AdaGrad { lr: 0.5, eps: 1e-6 },
        Updater::FtrlProximal {
            alpha: 0.1,
            beta: 1.0,
            l1: 0.01,
            l2: 0.1,
        },
    ];

    /// A warm-started rule holds the weight it was given until an update moves it, and moves
    /// it as from there: a zero gradient changes nothing.
    #[test]
    fn a_warm_start_holds_the_weight_it_was_given() {
        for rule in EVERY_RULE {
            for start in [0.75f64, -0.3, 0.0] {
                let mut aux = vec![0.0f64; UpdateRule::<f64>::aux_width(&rule)];
                rule.warm(start, &mut aux);
                let mut w = start;
                rule.apply(&mut w, &mut aux, 0.0);
                assert!((w - start).abs() < 1e-12, "{rule:?} from {start}: {w}");
                // A positive gradient lowers the weight from where it started.
                rule.apply(&mut w, &mut aux, 1.0);
                if !matches!(rule, Updater::Sum) {
                    assert!(w < start, "{rule:?} from {start}: {w}");
                }
            }
        }
    }

    /// Every rule's batch form does what its per-element form does, bit for bit.
    #[test]
    fn applying_a_slice_matches_applying_each_element() {
        let deltas = [0.5f64, -1.5, 0.0, -0.25];
        for rule in EVERY_RULE {
            let aw = UpdateRule::<f64>::aux_width(&rule);
            let start = [0.3f64, 0.3, -0.0, 0.3];
            let (mut w, mut aux) = (start.to_vec(), vec![0.2f64; 4 * aw]);
            rule.apply_all(&mut w, &mut aux, &deltas);
            let (mut ew, mut eaux) = (start.to_vec(), vec![0.2f64; 4 * aw]);
            for (j, &d) in deltas.iter().enumerate() {
                rule.apply(&mut ew[j], &mut eaux[j * aw..(j + 1) * aw], d);
            }
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!((bits(&w), bits(&aux)), (bits(&ew), bits(&eaux)), "{rule:?}");
        }
    }

    #[test]
    fn sum_is_exact_on_integers() {
        let mut w = 5i64;
        Updater::Sum.apply(&mut w, &mut [], -7);
        assert_eq!(w, -2);
    }

    #[test]
    fn sgd_and_adagrad_step_against_the_gradient() {
        assert_eq!(run(Updater::Sgd { lr: 0.1 }, &[1.0, 1.0]).0, -0.2);
        let (w, aux) = run(Updater::AdaGrad { lr: 1.0, eps: 0.0 }, &[3.0, 4.0]);
        assert_eq!(aux, vec![25.0]);
        // Steps -3/3 then -4/5.
        assert!((w - (-1.8)).abs() < 1e-12);
    }

    #[test]
    fn ftrl_keeps_small_signals_exactly_zero_under_l1() {
        let ftrl = Updater::FtrlProximal {
            alpha: 0.1,
            beta: 1.0,
            l1: 1.0,
            l2: 0.0,
        };
        // |z| = 0.5 <= l1: the weight stays exactly 0.
        assert_eq!(run(ftrl, &[0.5]).0, 0.0);
        // A consistent gradient beyond l1 drives the weight negative.
        let (w, aux) = run(ftrl, &[2.0, 2.0]);
        assert!(w < 0.0, "w = {w}");
        assert_eq!(aux[1], 8.0);
    }

    /// Hand-computed from McMahan et al., "Ad Click Prediction: a View from the Trenches" (KDD
    /// 2013), Algorithm 1, with alpha 0.5, beta 1, l1 0.1, l2 0.2 and gradients 1 then -0.5:
    ///   step 1: n = 1, sigma = (1 - 0) / 0.5 = 2, z = 0 + 1 - 2 * 0 = 1,
    ///           w = -(1 - 0.1) / ((1 + 1) / 0.5 + 0.2) = -0.9 / 4.2;
    ///   step 2: n = 1.25, sigma = (sqrt 1.25 - 1) / 0.5, z = 1 - 0.5 - sigma * w,
    ///           w = -(z - 0.1) / ((1 + sqrt 1.25) / 0.5 + 0.2).
    #[test]
    fn ftrl_proximal_follows_algorithm_1_step_by_step() {
        let ftrl = Updater::FtrlProximal {
            alpha: 0.5,
            beta: 1.0,
            l1: 0.1,
            l2: 0.2,
        };
        let (w, aux) = run(ftrl, &[1.0]);
        assert_eq!(aux, vec![1.0, 1.0]);
        assert!((w - -0.9 / 4.2).abs() < 1e-15, "{w}");
        let (w, aux) = run(ftrl, &[1.0, -0.5]);
        let sigma = (1.25f64.sqrt() - 1.0) / 0.5;
        let z = 1.0 - 0.5 - sigma * (-0.9 / 4.2);
        assert!((aux[0] - z).abs() < 1e-15 && aux[1] == 1.25, "{aux:?}");
        let want = -(z - 0.1) / ((1.0 + 1.25f64.sqrt()) / 0.5 + 0.2);
        assert!((w - want).abs() < 1e-15, "{w} vs {want}");
        assert!((w - -0.10157328459887148).abs() < 1e-15);
    }

    /// The L1 dead zone: once |z| falls back to l1 or below, the weight is exactly zero again,
    /// and a negative gradient gives a positive weight (the sign of -z).
    #[test]
    fn ftrl_proximal_returns_to_exactly_zero_inside_the_dead_zone_and_keeps_the_sign() {
        let ftrl = Updater::FtrlProximal {
            alpha: 0.5,
            beta: 1.0,
            l1: 0.6,
            l2: 0.2,
        };
        // z = 1 > l1 after the first step, 0.5506 <= l1 after the second.
        assert!(run(ftrl, &[1.0]).0 < 0.0);
        assert_eq!(run(ftrl, &[1.0, -0.5]).0, 0.0);
        let (w, aux) = run(ftrl, &[-1.0]);
        assert_eq!(aux[0], -1.0);
        assert!((w - 0.4 / 4.2).abs() < 1e-15, "{w}");
    }

    /// AdaGrad with lr 0.5: w = -0.5 * 2 / sqrt(4) = -0.5, then -0.5 + 0.5 * 1 / sqrt(5).
    /// SGD with lr 0.1: -0.1 * 3, then + 0.1 * 1.
    #[test]
    fn adagrad_and_sgd_follow_their_definitions() {
        let (w, aux) = run(Updater::AdaGrad { lr: 0.5, eps: 0.0 }, &[2.0]);
        assert_eq!((w, aux[0]), (-0.5, 4.0));
        let (w, _) = run(Updater::AdaGrad { lr: 0.5, eps: 0.0 }, &[2.0, -1.0]);
        assert!((w - (-0.5 + 0.5 / 5f64.sqrt())).abs() < 1e-15, "{w}");
        let (w, _) = run(Updater::Sgd { lr: 0.1 }, &[3.0, -1.0]);
        assert!((w - -0.2).abs() < 1e-15, "{w}");
    }

    #[test]
    fn rules_compare_by_bits() {
        assert_eq!(Updater::Sgd { lr: 0.1 }, Updater::Sgd { lr: 0.1 });
        assert_ne!(Updater::Sgd { lr: 0.1 }, Updater::Sgd { lr: 0.2 });
        assert_ne!(Updater::Sum, Updater::Sgd { lr: 0.0 });
    }

    fn hash_of(rule: &Updater) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        rule.hash(&mut h);
        h.finish()
    }

    /// Every parameter of every rule takes part in equality and hashing.
    #[test]
    fn every_parameter_tells_rules_apart() {
        let ftrl = |alpha, beta, l1, l2| Updater::FtrlProximal {
            alpha,
            beta,
            l1,
            l2,
        };
        let rules = [
            Updater::Sum,
            Updater::Sgd { lr: 0.1 },
            Updater::Sgd { lr: 0.2 },
            Updater::AdaGrad { lr: 0.1, eps: 1.0 },
            Updater::AdaGrad { lr: 0.2, eps: 1.0 },
            Updater::AdaGrad { lr: 0.1, eps: 2.0 },
            ftrl(1.0, 2.0, 3.0, 4.0),
            ftrl(9.0, 2.0, 3.0, 4.0),
            ftrl(1.0, 9.0, 3.0, 4.0),
            ftrl(1.0, 2.0, 9.0, 4.0),
            ftrl(1.0, 2.0, 3.0, 9.0),
        ];
        for (i, a) in rules.iter().enumerate() {
            for (j, b) in rules.iter().enumerate() {
                assert_eq!(a == b, i == j, "{a:?} vs {b:?}");
                assert_eq!(hash_of(a) == hash_of(b), i == j, "{a:?} vs {b:?}");
            }
            assert_eq!(hash_of(a), hash_of(&a.clone()));
        }
    }

    /// AdaGrad's eps is added to the denominator: lr 1, eps 1, gradient 3 steps by -3 / (3 + 1).
    #[test]
    fn adagrad_adds_eps_to_the_denominator() {
        let (w, aux) = run(Updater::AdaGrad { lr: 1.0, eps: 1.0 }, &[3.0]);
        assert_eq!((w, aux[0]), (-0.75, 9.0));
    }
}
