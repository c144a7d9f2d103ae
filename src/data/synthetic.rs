//! Synthetic click-like data for scale tests: millions of binary features whose frequencies
//! follow a power law (feature `i` about as common as `1 / (i + 1)`), and labels drawn from a
//! known true logistic model, so that a trained model can be compared with the truth.
//!
//! Everything is a function of the seed and the row number: any row can be produced alone,
//! and the same arguments always give the same file.

use crate::seeded::{mix, unit};
use std::io::Write;

/// What to generate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GenConfig {
    /// Rows.
    pub rows: u64,
    /// Features (the dimension).
    pub features: u64,
    /// Distinct features per row.
    pub per_row: usize,
    /// Seed: of the true weights and of every row.
    pub seed: u64,
    /// The number of the first row written: rows `first_row..first_row + rows`. Two files of
    /// one seed and disjoint row numbers are a training set and a test set of one model.
    pub first_row: u64,
    /// Write feature `j` as index `j + 1`, the LIBSVM convention that liblinear requires,
    /// instead of `j`.
    pub one_based: bool,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            rows: 100_000,
            features: 1 << 22,
            per_row: 30,
            seed: 0,
            first_row: 0,
            one_based: false,
        }
    }
}

/// The true weight of feature `j`: most features carry no signal, one in eight a normal one.
pub(crate) fn true_weight(cfg: &GenConfig, j: u64) -> f64 {
    let h = mix(cfg.seed ^ 0x7777 ^ mix(j));
    if h % 8 != 0 {
        return 0.0;
    }
    let (u1, u2) = (unit(mix(h)), unit(mix(h ^ 0x5555)));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Row `r`: its label (0 or 1) and its sorted, distinct features (zero-based).
pub(crate) fn row(cfg: &GenConfig, r: u64, features: &mut Vec<u64>) -> u8 {
    features.clear();
    let harmonic = (cfg.features as f64).ln();
    let mut draw = 0u64;
    while features.len() < cfg.per_row.min(cfg.features as usize) {
        let u = unit(mix(cfg.seed
            ^ mix(r)
            ^ draw.wrapping_mul(0x2545_f491_4f6c_dd1d)));
        draw += 1;
        let f = ((u * harmonic).exp() - 1.0).floor() as u64;
        let f = f.min(cfg.features - 1);
        if !features.contains(&f) {
            features.push(f);
        }
    }
    features.sort_unstable();
    let z: f64 = features.iter().map(|&j| true_weight(cfg, j)).sum();
    let p = 1.0 / (1.0 + (-z).exp());
    u8::from(unit(mix(cfg.seed ^ 0x9999 ^ mix(r))) < p)
}

/// Writes `cfg.rows` rows in LIBSVM form to `out`, indices from 0 or, with
/// [`GenConfig::one_based`], from 1.
pub(crate) fn write(cfg: &GenConfig, out: &mut impl Write) -> std::io::Result<()> {
    let mut features = Vec::with_capacity(cfg.per_row);
    let mut line = String::with_capacity(cfg.per_row * 10 + 4);
    for r in cfg.first_row..cfg.first_row.saturating_add(cfg.rows) {
        let label = row(cfg, r, &mut features);
        line.clear();
        line.push_str(if label == 1 { "1" } else { "0" });
        for &f in &features {
            use std::fmt::Write as _;
            let _ = write!(line, " {}:1", f + u64::from(cfg.one_based));
        }
        line.push('\n');
        out.write_all(line.as_bytes())?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::libsvm::{IndexBase, parse};

    #[test]
    fn rows_are_reproducible_power_law_and_labelled_by_the_true_model() {
        let cfg = GenConfig {
            rows: 4_000,
            features: 100_000,
            per_row: 20,
            seed: 3,
            first_row: 0,
            one_based: false,
        };
        let mut a = Vec::new();
        write(&cfg, &mut a).unwrap();
        let mut b = Vec::new();
        write(&cfg, &mut b).unwrap();
        assert_eq!(a, b);
        let ex = parse("gen", &a, IndexBase::Zero).unwrap();
        assert_eq!(ex.len(), 4_000);
        assert!(ex.dimensions() <= 100_000);
        let mut counts = vec![0u32; 100_000];
        for i in 0..ex.len() {
            assert_eq!(ex.row(i).len(), 20);
            for f in ex.row(i).ids() {
                counts[f as usize] += 1;
            }
        }
        // Power law: the ten most common features appear in far more rows than ten from the
        // middle of the range.
        let head: u32 = counts[..10].iter().sum();
        let middle: u32 = counts[50_000..50_010].iter().sum();
        assert!(head > 50 * middle.max(1), "head {head} middle {middle}");
        // Labels follow the true weights: rows with a positive true score are mostly 1.
        let (mut agree, mut total) = (0, 0);
        for i in 0..ex.len() {
            let z: f64 = ex.row(i).ids().map(|j| true_weight(&cfg, j)).sum();
            if z.abs() > 2.0 {
                total += 1;
                agree += usize::from((z > 0.0) == (ex.labels()[i] > 0.5));
            }
        }
        assert!(agree * 10 > total * 8, "{agree} of {total}");
    }

    #[test]
    fn a_one_based_file_holds_the_same_rows_counted_from_one() {
        let zero = GenConfig {
            rows: 500,
            features: 1_000,
            per_row: 10,
            seed: 5,
            ..GenConfig::default()
        };
        let one = GenConfig {
            one_based: true,
            ..zero
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write(&zero, &mut a).unwrap();
        write(&one, &mut b).unwrap();
        let text = String::from_utf8(b.clone()).unwrap();
        assert!(text.lines().all(|l| !l.contains(" 0:")), "no index 0");
        assert_eq!(
            parse("zero", &a, IndexBase::Zero).unwrap(),
            parse("one", &b, IndexBase::One).unwrap()
        );
    }
}
