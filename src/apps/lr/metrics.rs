//! The model's maths and its measures: the logistic function and the log loss a gradient is
//! computed from, the raw score of a row, and the test log loss and exact AUC every epoch's
//! report and `pserver predict` give.

use pserver_core::KvPairs;

use super::config::BIAS_KEY;
use crate::data::libsvm::Examples;

/// The logistic function, its argument clamped so that it never saturates to exactly 0 or 1.
pub(crate) fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z.clamp(-35.0, 35.0)).exp())
}

/// The log loss of predicting probability `p` for label `y` (positive above one half), `p`
/// kept off 0 and 1 so that the loss stays finite.
pub(crate) fn logloss(p: f64, y: f32) -> f64 {
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    if y > 0.5 { -p.ln() } else { -(1.0 - p).ln() }
}

/// Exact area under the ROC curve: the probability that a random positive scores above a
/// random negative (ties count half), by sorting.
pub(crate) fn auc(scores: &[f64], labels: &[f32]) -> f64 {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut positives) = (0.0, 0.0);
    let mut i = 0;
    while i < order.len() {
        // Tied scores share the mean of their ranks.
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            if labels[k] > 0.5 {
                rank_sum += mean_rank;
                positives += 1.0;
            }
        }
        i = j + 1;
    }
    let negatives = scores.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return 0.5;
    }
    (rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives)
}

/// Test log loss and AUC of the model `weights` (sorted keys with their weights).
pub(crate) fn evaluate(weights: &KvPairs<f32>, test: &Examples) -> (f64, f64) {
    let scores = scores(weights, test);
    let loss: f64 = scores
        .iter()
        .zip(test.labels())
        .map(|(&z, &y)| logloss(sigmoid(z), y))
        .sum();
    (loss / test.len().max(1) as f64, auc(&scores, test.labels()))
}

/// The raw score (log-odds) of every example of `data` under `model`, its intercept (the
/// weight at [`BIAS_KEY`], if any) included.
pub(crate) fn scores(model: &KvPairs<f32>, data: &Examples) -> Vec<f64> {
    (0..data.len()).map(|i| score(model, data, i)).collect()
}

/// The raw score of example `i` of `data` under `model`, as [`scores`] gives it.
pub(crate) fn score(model: &KvPairs<f32>, data: &Examples, i: usize) -> f64 {
    let intercept = model.get(BIAS_KEY).map_or(0.0, |w| f64::from(w[0]));
    intercept
        + data
            .row(i)
            .iter()
            .map(|(k, v)| model.get(k).map_or(0.0, |w| f64::from(w[0]) * f64::from(v)))
            .sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::libsvm::IndexBase;

    #[test]
    fn scores_are_the_log_odds_with_the_intercept() {
        let data = crate::data::libsvm::parse("t", b"1 0:1 2:3\n0\n", IndexBase::Zero).unwrap();
        let model = KvPairs::new(vec![0, 2, BIAS_KEY], vec![0.5f32, 0.25, -1.0], 1).unwrap();
        assert_eq!(scores(&model, &data), vec![-1.0 + 0.5 + 0.75, -1.0]);
    }

    #[test]
    fn auc_is_exact_and_handles_ties() {
        assert_eq!(auc(&[0.1, 0.9], &[0.0, 1.0]), 1.0);
        assert_eq!(auc(&[0.9, 0.1], &[0.0, 1.0]), 0.0);
        assert_eq!(auc(&[0.5, 0.5], &[0.0, 1.0]), 0.5);
        // 2 positives, 2 negatives: pairs (p, n) ordered right in 3 of 4.
        assert_eq!(auc(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]), 0.75);
    }
}
