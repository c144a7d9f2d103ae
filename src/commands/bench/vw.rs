//! Vowpal Wabbit as a baseline of `pserver bench --train`: one pass of logistic regression
//! over the same rows, run as the `vw` command or, without one, as the `vowpalwabbit` Python
//! module, and measured from outside (wall clock, the child's CPU time and peak RSS).

use std::ffi::OsString;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use super::BenchError;
use super::child::{Scratch, run};
use super::reached::Reached;
use crate::apps::lr::auc;
use crate::data::libsvm::Examples;

/// How to run VW here: the `vw` command, or Python running the module; `None` when neither
/// is installed.
pub(super) fn command() -> Option<Vec<OsString>> {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("vw").is_file()));
    if on_path {
        return Some(vec!["vw".into()]);
    }
    let python = Command::new("python3")
        .args(["-c", "import vowpalwabbit"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    python.then(|| vec!["python3".into(), "-m".into(), "vowpalwabbit".into()])
}

/// Writes `data` in VW's text form: labels -1 and +1, every feature in one namespace under
/// its own index, so that VW trains on exactly the features pserver does.
fn write_vw(data: &Examples, path: &Path) -> Result<(), BenchError> {
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    for r in 0..data.len() {
        let label = if data.labels()[r] > 0.0 { "1" } else { "-1" };
        write!(out, "{label} |f")?;
        for (k, v) in data.row(r).iter() {
            write!(out, " {k}:{v}")?;
        }
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}

/// One pass of VW with logistic loss over `train`, its test AUC on `test`.
pub(super) fn reached(
    vw: &[OsString],
    train: &Examples,
    test: &Examples,
) -> Result<Reached, BenchError> {
    let dir = Scratch::new("vw")?;
    let (train_file, test_file) = (dir.0.join("train.vw"), dir.0.join("test.vw"));
    let (model, predictions) = (dir.0.join("vw.model"), dir.0.join("vw.predictions"));
    write_vw(train, &train_file)?;
    write_vw(test, &test_file)?;
    // Indices are numbers, which VW keeps modulo 2^b: one bit above what the largest needs
    // gives every feature a weight of its own.
    let dims = train.dimensions().max(test.dimensions()).max(1);
    let bits = (64 - dims.leading_zeros() + 1).max(18);
    let os = |s: &str| OsString::from(s);
    let (secs, cpu, peak, _) = run(
        vw,
        &[
            os("-d"),
            train_file.into(),
            os("-f"),
            model.clone().into(),
            os("--loss_function"),
            os("logistic"),
            os("-b"),
            os(&bits.to_string()),
            os("--quiet"),
        ],
        &dir.0.join("train.log"),
    )?;
    run(
        vw,
        &[
            os("-t"),
            os("-i"),
            model.into(),
            os("-d"),
            test_file.into(),
            os("-p"),
            predictions.clone().into(),
            os("--quiet"),
        ],
        &dir.0.join("test.log"),
    )?;
    let scores: Vec<f64> = std::fs::read_to_string(&predictions)?
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    if scores.len() != test.len() {
        return Err(BenchError::Inexact(format!(
            "vw predicted {} of {} test rows",
            scores.len(),
            test.len()
        )));
    }
    let auc = auc(&scores, test.labels());
    Ok(Reached::one_pass(train.len(), secs, cpu, peak, auc))
}
