//! Synthetic data for scale tests, in two shapes ([`Shape`]). Click-like: millions of binary
//! features whose frequencies follow a power law (feature `i` about as common as `1 / (i + 1)`).
//! Text-like: words of a vocabulary drawn by the same law, each valued by a TF-IDF weight, rows
//! scaled to length 1, as a bag of words of a review is. In both, labels are drawn from a known
//! true logistic model, so that a trained model can be compared with the truth.
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
    /// Binary click features or valued words.
    pub shape: Shape,
}

/// What a row looks like.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Shape {
    /// Binary features (`j:1`), as in click logs.
    #[default]
    Click,
    /// Words valued `(1 + ln tf) * idf`, each row scaled to Euclidean length 1: a document's
    /// bag of words, as text classification reads it.
    Text,
}

/// How strongly a text row's true score follows its words: rows have length 1, so without it
/// a score would rarely leave (-1, 1) and labels would be close to coin flips. At 30, on 20,000
/// rows of 90 words of 100,000, one pass of Vowpal Wabbit reaches a test AUC of 0.83.
const TEXT_SCALE: f64 = 30.0;
impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            rows: 100_000,
            features: 1 << 22,
            per_row: 30,
            seed: 0,
            first_row: 0,
            one_based: false,
            shape: Shape::Click,
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

/// Row `r` of a text-shaped set: its label (0 or 1), its sorted, distinct words (zero-based)
/// in `features` and their values in `values`.
pub(crate) fn text_row(
    cfg: &GenConfig,
    r: u64,
    features: &mut Vec<u64>,
    values: &mut Vec<f64>,
) -> u8 {
    draw_features(cfg, r, features);
    values.clear();
    // A word of rank j appears in about per_row / ((j + 1) ln F) of the rows: its idf.
    let spread = (cfg.features as f64).ln() / cfg.per_row as f64;
    for &j in features.iter() {
        let u = unit(mix(cfg.seed ^ 0x3333 ^ mix(r) ^ mix(j)));
        let tf: f64 = if u < 0.75 {
            1.0
        } else if u < 0.93 {
            2.0
        } else {
            3.0
        };
        let idf = ((j + 1) as f64 * spread).ln().max(0.1);
        values.push((1.0 + tf.ln()) * idf);
    }
    let length = values.iter().map(|v| v * v).sum::<f64>().sqrt();
    if length > 0.0 {
        // Written to four decimals: scaled first, so that what is read is what was scored.
        for v in values.iter_mut() {
            *v = (*v / length * 1e4).round() / 1e4;
        }
    }
    let z: f64 = features
        .iter()
        .zip(values.iter())
        .map(|(&j, &v)| text_weight(cfg, j) * v)
        .sum();
    label_of(cfg, r, TEXT_SCALE * z)
}

/// The true weight of word `j` of a text-shaped set: only the commoner words carry sentiment
/// (a twentieth of the vocabulary, three quarters of what is written), as "great" and "broke"
/// do in reviews; a rare word's weight could not be learnt from the rows it is in.
pub(crate) fn text_weight(cfg: &GenConfig, j: u64) -> f64 {
    if j < cfg.features.div_ceil(20) {
        true_weight(cfg, j)
    } else {
        0.0
    }
}

/// A label drawn for row `r` from its true score `z`.
fn label_of(cfg: &GenConfig, r: u64, z: f64) -> u8 {
    let p = 1.0 / (1.0 + (-z).exp());
    u8::from(unit(mix(cfg.seed ^ 0x9999 ^ mix(r))) < p)
}

/// Row `r`: its label (0 or 1) and its sorted, distinct features (zero-based).
pub(crate) fn row(cfg: &GenConfig, r: u64, features: &mut Vec<u64>) -> u8 {
    draw_features(cfg, r, features);
    let z: f64 = features.iter().map(|&j| true_weight(cfg, j)).sum();
    label_of(cfg, r, z)
}

/// Row `r`'s sorted, distinct features, drawn by the power law.
fn draw_features(cfg: &GenConfig, r: u64, features: &mut Vec<u64>) {
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
}

/// Writes `cfg.rows` rows in LIBSVM form to `out`, indices from 0 or, with
/// [`GenConfig::one_based`], from 1.
pub(crate) fn write(cfg: &GenConfig, out: &mut impl Write) -> std::io::Result<()> {
    use std::fmt::Write as _;
    let mut features = Vec::with_capacity(cfg.per_row);
    let mut values = Vec::with_capacity(cfg.per_row);
    let mut line = String::with_capacity(cfg.per_row * 16 + 4);
    for r in cfg.first_row..cfg.first_row.saturating_add(cfg.rows) {
        let label = match cfg.shape {
            Shape::Click => row(cfg, r, &mut features),
            Shape::Text => text_row(cfg, r, &mut features, &mut values),
        };
        line.clear();
        line.push_str(if label == 1 { "1" } else { "0" });
        let base = u64::from(cfg.one_based);
        match cfg.shape {
            Shape::Click => {
                for &f in &features {
                    let _ = write!(line, " {}:1", f + base);
                }
            }
            Shape::Text => {
                for (&f, &v) in features.iter().zip(&values) {
                    let _ = write!(line, " {}:{v}", f + base);
                }
            }
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
            shape: Shape::Click,
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
    fn text_rows_are_words_of_length_one_labelled_by_the_commoner_words() {
        let cfg = GenConfig {
            rows: 3_000,
            features: 20_000,
            per_row: 90,
            seed: 2,
            shape: Shape::Text,
            ..GenConfig::default()
        };
        let mut a = Vec::new();
        write(&cfg, &mut a).unwrap();
        let mut b = Vec::new();
        write(&cfg, &mut b).unwrap();
        assert_eq!(a, b);
        let ex = parse("text", &a, IndexBase::Zero).unwrap();
        assert_eq!(ex.len(), 3_000);
        let (mut agree, mut total) = (0, 0);
        for i in 0..ex.len() {
            let row = ex.row(i);
            assert_eq!(row.len(), 90);
            let length: f64 = row.iter().map(|(_, v)| f64::from(v * v)).sum();
            assert!((length - 1.0).abs() < 1e-3, "row {i}: length {length}");
            // A common word is worth less than a rare one in the same row.
            let first = row.iter().next().unwrap();
            let last = row.iter().last().unwrap();
            assert!(first.1 < last.1, "row {i}: {first:?} {last:?}");
            let z: f64 = row
                .iter()
                .map(|(j, v)| text_weight(&cfg, j) * f64::from(v))
                .sum::<f64>()
                * TEXT_SCALE;
            if z.abs() > 2.0 {
                total += 1;
                agree += usize::from((z > 0.0) == (ex.labels()[i] > 0.5));
            }
        }
        assert!(total > 300 && agree * 10 > total * 8, "{agree} of {total}");
        // Only the commoner twentieth of the words carries a weight.
        assert!((cfg.features / 20..cfg.features).all(|j| text_weight(&cfg, j) == 0.0));
        assert!((0..cfg.features / 20).any(|j| text_weight(&cfg, j) != 0.0));
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
