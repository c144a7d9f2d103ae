//! `pserver predict`: scores a LIBSVM data set with a saved logistic-regression model, or a
//! ratings file with a saved factorization.

use std::io::Write;
use std::path::PathBuf;

use super::CliError;
use crate::apps::lr::{auc, load_model, scores};
use crate::apps::mf_file::{is_mf, load_mf};
use crate::data::libsvm::{IndexBase, Labels, read_streaming};
use crate::data::ratings::{Ids, read as read_ratings};

/// Score a LIBSVM data set with a model saved by `pserver train --save`, or a ratings file
/// with one saved by `pserver train mf --save` (printing `predict rows=N rmse=R unseen=U`, or
/// one predicted rating per line with --scores).
///
/// The data is read with the index base the model was trained with (recorded in the model
/// file), and scored with the model's intercept. Prints `predict rows=N logloss=L auc=A`, or
/// with --scores one probability per row.
#[derive(clap::Args, Debug)]
pub(crate) struct PredictArgs {
    /// The model file.
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// The data to score (LIBSVM, optionally .gz; a ratings file for a factorization model).
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
    /// Rows labelled LABEL are positive and every other row negative, as `pserver train
    /// --positive` trained them; without it labels must be 0/1 or -1/+1.
    #[arg(long, value_name = "LABEL", allow_negative_numbers = true)]
    positive: Option<f32>,
}

/// Runs `pserver predict`.
pub(crate) fn run(args: PredictArgs) -> Result<(), CliError> {
    if starts_like_mf(&args.model) {
        return run_mf(&args);
    }
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
    let labels = args.positive.map_or(Labels::Binary, Labels::Positive);
    let data = read_streaming(&args.data, base, labels).map_err(CliError::input)?;
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

/// Whether the file at `path` begins like a factorization model (unreadable: no, and reading
/// it as a logistic-regression model says why).
fn starts_like_mf(path: &std::path::Path) -> bool {
    let mut head = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|()| is_mf(&head))
}

/// Predicts the ratings of `args.data` with a factorization model: `predict rows=N rmse=R
/// unseen=U` (ratings whose user or item the model does not hold, predicted from the mean and
/// what it does hold), or one predicted rating per line with --scores.
fn run_mf(args: &PredictArgs) -> Result<(), CliError> {
    if args.index_base.is_some() {
        return Err(CliError::input(format!(
            "--index-base is for LIBSVM data; {} is a factorization model, which reads ratings files",
            args.model.display()
        )));
    }
    let model = load_mf(&args.model).map_err(CliError::Input)?;
    // Numbered as the model's rows are: a known id's number is its row.
    let mut ids = Ids::of_names(
        model.users.iter().map(|(id, _)| id.as_ref()),
        model.items.iter().map(|(id, _)| id.as_ref()),
    );
    let ratings = read_ratings(&args.data, &mut ids).map_err(CliError::input)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let (mut squared, mut unseen) = (0.0, 0usize);
    for r in &ratings {
        let (user, item) = (row(&model.users, r.user), row(&model.items, r.item));
        unseen += usize::from(user.is_none() || item.is_none());
        let predicted = model.predict(user, item);
        if args.scores {
            let _ = writeln!(out, "{predicted:.4}");
        }
        squared += (predicted - f64::from(r.value)).powi(2);
    }
    if !args.scores {
        let rmse = (squared / ratings.len().max(1) as f64).sqrt();
        let _ = writeln!(
            out,
            "predict rows={} rmse={rmse:.4} unseen={unseen}",
            ratings.len()
        );
    }
    out.flush()
        .map_err(|e| CliError::Failed(format!("cannot write the predictions: {e}")))?;
    Ok(())
}

/// The row of number `n` in `rows`, if the model holds it.
fn row(rows: &[(Box<str>, Vec<f32>)], n: u32) -> Option<&[f32]> {
    rows.get(n as usize).map(|(_, r)| &r[..])
}
