//! `pserver predict`: scores a LIBSVM data set with a saved logistic-regression model.

use std::io::Write;
use std::path::PathBuf;

use super::CliError;
use crate::apps::lr::{auc, load_model, scores};
use crate::data::libsvm::{IndexBase, read};

/// Score a LIBSVM data set with a model saved by `pserver train --save`.
///
/// Prints `predict rows=N logloss=L auc=A`, or with --scores one probability per row.
#[derive(clap::Args, Debug)]
pub struct PredictArgs {
    /// The model file.
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// The data to score (LIBSVM, optionally .gz).
    #[arg(long, value_name = "FILE")]
    data: PathBuf,
    /// Print one probability per row instead of the summary.
    #[arg(long)]
    scores: bool,
}

/// Runs `pserver predict`.
pub fn run(args: PredictArgs) -> Result<(), CliError> {
    let model = load_model(&args.model).map_err(CliError::input)?;
    let data = read(&args.data, IndexBase::Auto).map_err(CliError::input)?;
    let s = scores(&model, &data);
    if args.scores {
        print_probabilities(&s);
        return Ok(());
    }
    let logloss: f64 = s
        .iter()
        .zip(data.labels())
        .map(|(&z, &y)| {
            let p = sigmoid(z).clamp(1e-12, 1.0 - 1e-12);
            if y > 0.5 { -p.ln() } else { -(1.0 - p).ln() }
        })
        .sum::<f64>()
        / data.len() as f64;
    println!(
        "predict rows={} logloss={logloss:.4} auc={:.4}",
        data.len(),
        auc(&s, data.labels())
    );
    Ok(())
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// One probability per line on stdout.
fn print_probabilities(scores: &[f64]) {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for &z in scores {
        // A closed pipe (`| head`) ends the output quietly.
        if writeln!(out, "{:.6}", sigmoid(z)).is_err() {
            return;
        }
    }
    let _ = out.flush();
}
