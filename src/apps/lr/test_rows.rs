//! The rows a model is measured on after each epoch: held in memory, or read from their file
//! a few megabytes at a time when the training rows are streamed (`pserver train --stream`),
//! so that a streamed run's memory is the model and its windows, whatever the length of
//! either file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pserver_core::KvPairs;

use super::metrics::{auc, logloss, score, sigmoid};
use crate::data::libsvm::{DataError, Examples, Labels, for_each_part, held_out};

/// Test rows, held or streamed.
#[derive(Clone, Debug)]
pub(crate) enum TestRows {
    /// Parsed and held.
    Held(Arc<Examples>),
    /// Read from a file each time the model is measured.
    Streamed(StreamedTest),
}

/// A test file read a part at a time, counted once when it was opened.
#[derive(Clone, Debug)]
pub(crate) struct StreamedTest {
    path: PathBuf,
    one_based: bool,
    labels: Labels,
    /// Only the rows of the file [`held_out`] names with this fraction and seed, if given: the
    /// rows a streamed training file holds out of training.
    only: Option<(f64, u64)>,
    rows: usize,
    positives: usize,
    dimensions: u64,
}

impl StreamedTest {
    /// Reads the file at `path` once, a part at a time, to count its rows and classes and find
    /// its dimension; each line is parsed, so that a bad one is an error naming it before
    /// training starts. A file without rows is an error.
    pub(crate) fn open(path: &Path, one_based: bool, labels: Labels) -> Result<Self, DataError> {
        Self::open_rows(path, one_based, labels, None)
    }

    /// The rows of the training file at `path` that [`held_out`] names with `fraction` and
    /// `seed` (those a streamed file opened with them leaves out of training), read from it a
    /// part at a time as [`StreamedTest::open`] reads a test file.
    pub(crate) fn held(
        path: &Path,
        one_based: bool,
        labels: Labels,
        (fraction, seed): (f64, u64),
    ) -> Result<Self, DataError> {
        Self::open_rows(path, one_based, labels, Some((fraction, seed)))
    }

    /// The rows there are.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    fn open_rows(
        path: &Path,
        one_based: bool,
        labels: Labels,
        only: Option<(f64, u64)>,
    ) -> Result<Self, DataError> {
        let mut test = StreamedTest {
            path: path.to_path_buf(),
            one_based,
            labels,
            only,
            rows: 0,
            positives: 0,
            dimensions: 0,
        };
        let (mut rows, mut positives, mut dimensions) = (0, 0, 0);
        test.for_each_row(|part, r| {
            rows += 1;
            positives += usize::from(part.labels()[r] > 0.0);
            dimensions = dimensions.max(part.row(r).ids().max().map_or(0, |k| k + 1));
        })?;
        if rows == 0 {
            return Err(match only {
                None => crate::data::libsvm::no_examples(path.display().to_string()),
                Some((fraction, _)) => DataError {
                    path: path.display().to_string(),
                    line: 0,
                    column: 0,
                    message: format!(
                        "holding out {fraction} of its rows leaves none to measure the model on: give more rows or a larger fraction"
                    ),
                },
            });
        }
        (test.rows, test.positives, test.dimensions) = (rows, positives, dimensions);
        Ok(test)
    }

    /// Calls `f` with each row of the test set: the part of the file that holds it and its
    /// place there.
    fn for_each_row(&self, mut f: impl FnMut(&Examples, usize)) -> Result<(), DataError> {
        let mut row = 0;
        for_each_part(&self.path, self.one_based, self.labels, |part| {
            for r in 0..part.len() {
                if self
                    .only
                    .is_none_or(|(fraction, seed)| held_out(row + r, fraction, seed))
                {
                    f(part, r);
                }
            }
            row += part.len();
            Ok(())
        })
    }
}

impl From<Examples> for TestRows {
    fn from(rows: Examples) -> Self {
        TestRows::Held(Arc::new(rows))
    }
}

impl From<Arc<Examples>> for TestRows {
    fn from(rows: Arc<Examples>) -> Self {
        TestRows::Held(rows)
    }
}

impl TestRows {
    /// The rows there are.
    pub(crate) fn len(&self) -> usize {
        match self {
            TestRows::Held(rows) => rows.len(),
            TestRows::Streamed(file) => file.rows,
        }
    }

    /// The rows labelled positive.
    pub(crate) fn positives(&self) -> usize {
        match self {
            TestRows::Held(rows) => rows.labels().iter().filter(|&&l| l > 0.0).count(),
            TestRows::Streamed(file) => file.positives,
        }
    }

    /// The keys below which every feature of the rows lies.
    pub(crate) fn dimensions(&self) -> u64 {
        match self {
            TestRows::Held(rows) => rows.dimensions(),
            TestRows::Streamed(file) => file.dimensions,
        }
    }

    /// The mean log loss and the AUC of `model` over the rows. A streamed file is read again,
    /// a part at a time; one that no longer holds the rows counted is an error.
    pub(crate) fn evaluate(&self, model: &KvPairs<f32>) -> Result<(f64, f64), DataError> {
        let file = match self {
            TestRows::Held(rows) => return Ok(super::metrics::evaluate(model, rows)),
            TestRows::Streamed(file) => file,
        };
        let (mut all, mut labels) = (Vec::with_capacity(file.rows), Vec::new());
        labels.reserve(file.rows);
        file.for_each_row(|part, r| {
            all.push(score(model, part, r));
            labels.push(part.labels()[r]);
        })?;
        if all.len() != file.rows {
            return Err(DataError {
                path: file.path.display().to_string(),
                line: 0,
                column: 0,
                message: format!(
                    "changed while training: held {} test rows, now {}",
                    file.rows,
                    all.len()
                ),
            });
        }
        let loss: f64 = all
            .iter()
            .zip(&labels)
            .map(|(&z, &y)| logloss(sigmoid(z), y))
            .sum();
        Ok((loss / all.len().max(1) as f64, auc(&all, &labels)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::libsvm::{IndexBase, parse};

    /// A test file measured a part at a time gives the log loss and AUC of the same rows held
    /// whole, and says so when it changed under the run.
    #[test]
    fn a_streamed_test_file_measures_as_the_same_rows_held() {
        let mut text = String::new();
        for r in 0..3000u64 {
            // Labelled by the first feature, one row in five the other way.
            let label = u64::from(r % 17 < 8) ^ u64::from(r % 5 == 0);
            text += &format!("{label} {}:1 {}:0.5\n", r % 17 + 1, r % 29 + 20);
        }
        let path =
            std::env::temp_dir().join(format!("pserver-test-rows-{}.svm", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let model = KvPairs::new(
            (0..60).collect(),
            (0..60)
                .map(|k| if k < 8 { 1.0 } else { (k % 3) as f32 / -4.0 })
                .collect(),
            1,
        )
        .unwrap();
        let held = TestRows::from(parse("t", text.as_bytes(), IndexBase::One).unwrap());
        let streamed = TestRows::Streamed(StreamedTest::open(&path, true, Labels::Binary).unwrap());
        assert_eq!(streamed.len(), 3000);
        assert_eq!(streamed.positives(), held.positives());
        assert_eq!(streamed.dimensions(), held.dimensions());
        let (a, b) = (
            held.evaluate(&model).unwrap(),
            streamed.evaluate(&model).unwrap(),
        );
        assert!(
            (a.0 - b.0).abs() < 1e-12 && (a.1 - b.1).abs() < 1e-12,
            "{a:?} {b:?}"
        );
        assert!(a.1 > 0.5 && a.1 < 1.0, "{a:?}");
        let half = text[..text.len() / 2].rfind('\n').unwrap() + 1;
        std::fs::write(&path, &text[..half]).unwrap();
        let e = streamed.evaluate(&model).unwrap_err().to_string();
        assert!(e.contains("changed while training"), "{e}");
        let _ = std::fs::remove_file(&path);
    }
}
