//! `pserver predict`: scores a LIBSVM data set with a saved logistic-regression model.

use std::io::Write;
use std::path::PathBuf;

use super::CliError;
use crate::apps::lr::{auc, load_model, scores};
use crate::data::libsvm::{IndexBase, read};

/// Score a LIBSVM data set with a model saved by `pserver train --save`.
///
/// The data is read with the index base the model was trained with (recorded in the model
/// file), and scored with the model's intercept. Prints `predict rows=N logloss=L auc=A`, or
/// with --scores one probability per row.
#[derive(clap::Args, Debug)]
pub(crate) struct PredictArgs {
    /// The model file.
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// The data to score (LIBSVM, optionally .gz).
    #[arg(long, value_name = "FILE")]
    data: PathBuf,
    /// Print one probability per row instead of the summary.
    #[arg(long)]
    scores: bool,
    /// How the data counts its feature indices: 0, 1, or auto (decided from the data). Only
    /// for models saved before the model file recorded it; for the others it must agree, and
    /// auto means the model's.
    #[arg(long, value_enum)]
    index_base: Option<IndexBase>,
}

/// Runs `pserver predict`.
pub(crate) fn run(args: PredictArgs) -> Result<(), CliError> {
    let model = load_model(&args.model).map_err(CliError::input)?;
    let base = match (model.base, args.index_base) {
        (IndexBase::Auto, asked) => {
            let asked = asked.unwrap_or(IndexBase::Auto);
            eprintln!(
                "{}: the model does not record its index base; reading {} with --index-base {asked}",
                args.model.display(),
                args.data.display()
            );
            asked
        }
        (recorded, Some(asked)) if asked != recorded && asked != IndexBase::Auto => {
            return Err(CliError::input(format!(
                "--index-base {asked} contradicts {}, trained on data read with index base {recorded}",
                args.model.display()
            )));
        }
        (recorded, _) => recorded,
    };
    let data = read(&args.data, base).map_err(CliError::input)?;
    let s = scores(&model.weights, &data);
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
