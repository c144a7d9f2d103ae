//! Training rows streamed from a file a window at a time (`pserver train --stream`), so that a
//! run holds the model and a window of rows per share, not the file: a file larger than the
//! machine's memory trains as one that fits does.
//!
//! One pass before training counts the file's rows and finds its largest index, without
//! keeping any. Share `s` is then rows `s * per..(s + 1) * per` of the file, in file order, and
//! each epoch a worker reads its share's windows of `window_rows` rows in turn, each shuffled
//! within itself ([`super::batch::visiting_order`]), as Vowpal Wabbit shuffles within the
//! buffer it streams through. A window is a whole number of minibatches, so that the steps of
//! an epoch fall into windows the same way on every worker (ARCHITECTURE.md §12).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pserver_runtime::RuntimeError;

use super::config::{LrConfig, config_error};
use super::worker::ShareRows;
use crate::data::libsvm::{
    DataError, Examples, Labels, held_out, is_row, max_index, open_lines, parse_part,
};

/// A training file read a window at a time.
#[derive(Clone, Debug)]
pub(crate) struct StreamedFile {
    path: PathBuf,
    one_based: bool,
    labels: Labels,
    /// Rows the file holds.
    rows: usize,
    /// Its largest feature index, if it has a feature.
    largest: Option<u64>,
    /// Rows in each share (the last one shorter).
    per: usize,
    /// Rows in each window of a share: a whole number of the job's share minibatches.
    window_rows: usize,
    /// The fraction and seed of the rows held out of training to measure the model on
    /// ([`held_out`]), if any.
    held: Option<(f64, u64)>,
    /// Per share, the rows it trains: all of its rows but those held out.
    trained: Vec<usize>,
}

impl StreamedFile {
    /// Reads `path` once to count its rows and find its largest index, for a job of `cfg`
    /// whose windows hold about `window` rows each; `one_based` and `labels` say how its lines
    /// read. Every line is parsed as it is counted, so that a bad one is an error naming its
    /// line before training starts, not a failure of one worker mid-epoch while the others
    /// wait for it; so is a file without rows, and with `labels` naming a positive label, a
    /// file without a row of it.
    ///
    /// With `held`, a fraction and a seed, the rows [`held_out`] names are left out of
    /// training: a run without a test file measures its model on them
    /// ([`StreamedTest::held`](super::StreamedTest::held)).
    pub(crate) fn open(
        path: &Path,
        one_based: bool,
        labels: Labels,
        cfg: &LrConfig,
        window: usize,
        held: Option<(f64, u64)>,
    ) -> Result<Self, DataError> {
        let name = path.display().to_string();
        let mut lines = open_lines(path)?;
        let (mut rows, mut largest, mut line) = (0usize, None, Vec::new());
        let (mut number, mut positives, mut scratch) = (0, 0usize, Examples::new());
        loop {
            line.clear();
            let read = lines.read_until(b'\n', &mut line).map_err(|e| DataError {
                path: name.clone(),
                line: 0,
                column: 0,
                message: format!("cannot read: {e}"),
            })?;
            if read == 0 {
                break;
            }
            if is_row(&line) {
                rows += 1;
                largest = largest.max(max_index(&line));
                parse_part(&mut scratch, &name, &line, one_based, labels, number)?;
                positives += scratch.labels().iter().filter(|&&l| l > 0.0).count();
                scratch.clear();
            }
            number += 1;
        }
        if rows == 0 {
            return Err(crate::data::libsvm::no_examples(name));
        }
        if let (Labels::Positive(label), 0) = (labels, positives) {
            // One class is nothing to learn: most likely a label mistyped.
            return Err(DataError {
                path: name,
                line: 0,
                column: 0,
                message: format!("no row is labelled {label}, the label --positive names"),
            });
        }
        let batch = cfg.share_batch().max(1);
        let mut file = StreamedFile {
            path: path.to_path_buf(),
            one_based,
            labels,
            rows,
            largest,
            per: cfg.share_rows(rows),
            window_rows: window.max(1).div_ceil(batch) * batch,
            held,
            trained: Vec::new(),
        };
        let shares = rows.div_ceil(file.per.max(1));
        file.trained = (0..shares)
            .map(|share| {
                let (first, last) = file.share(share);
                (first..last).filter(|&r| !file.is_held(r)).count()
            })
            .collect();
        if file.trained.iter().sum::<usize>() == 0 {
            return Err(DataError {
                path: name,
                line: 0,
                column: 0,
                message: format!(
                    "holding out a fraction of its {rows} rows leaves none to train on: give more rows or a smaller fraction"
                ),
            });
        }
        Ok(file)
    }

    /// Whether row `r` of the file is held out of training.
    fn is_held(&self, r: usize) -> bool {
        self.held
            .is_some_and(|(fraction, seed)| held_out(r, fraction, seed))
    }

    /// Rows the file holds.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Rows an epoch trains: the file's rows but those held out.
    pub(crate) fn trained_rows(&self) -> usize {
        self.trained.iter().sum()
    }

    /// Rows in each window of a share, rounded up to whole minibatches.
    pub(crate) fn window_rows(&self) -> usize {
        self.window_rows
    }

    /// The keys below which every feature of the file lies.
    pub(crate) fn dimensions(&self) -> u64 {
        match self.largest {
            Some(i) if self.one_based => i.max(1),
            Some(i) => i.saturating_add(1),
            None => 0,
        }
    }

    /// Steps of an epoch in each window.
    pub(crate) fn window_steps(&self, cfg: &LrConfig) -> usize {
        self.window_rows / cfg.share_batch().max(1)
    }

    /// The rows of share `share`: `start..end` of the file.
    fn share(&self, share: usize) -> (usize, usize) {
        let start = (share * self.per).min(self.rows);
        (start, (start + self.per).min(self.rows))
    }
}

/// Where one worker has read to in each share it trains.
struct Cursor {
    lines: Box<dyn BufRead + Send>,
    /// The file's row the next line that holds one is.
    row: usize,
    /// Lines read so far.
    line: usize,
}

/// One worker's reader of a streamed file: the windows of the shares it trains, read in turn,
/// a cursor per share kept between windows so that each epoch reads the file once.
///
/// The memory of a window is reused two windows on, when no minibatch of it is left: a new
/// window's rows in freshly allocated memory each time, freed on whichever thread trained the
/// last of them, grew the process by most of a window per window under mimalloc.
pub(crate) struct WindowReader {
    file: Arc<StreamedFile>,
    cursors: BTreeMap<usize, Cursor>,
    line: Vec<u8>,
    /// The text of the window being read.
    text: Vec<u8>,
    /// Per share, the rows of its last windows, reused once nothing else holds them.
    kept: BTreeMap<usize, Vec<Arc<Examples>>>,
}

/// Windows of a share whose memory is kept for reuse: the one being trained and the one
/// before, which pulled-ahead minibatches may still hold.
const KEPT_WINDOWS: usize = 2;

impl WindowReader {
    /// A reader of `file`, positioned nowhere yet.
    pub(crate) fn new(file: Arc<StreamedFile>) -> Self {
        WindowReader {
            file,
            cursors: BTreeMap::new(),
            line: Vec::new(),
            text: Vec::new(),
            kept: BTreeMap::new(),
        }
    }

    /// Window `window` of share `share` (every row of it trained but those held out), and the
    /// rows the share trains in all.
    pub(crate) fn window(
        &mut self,
        share: usize,
        window: usize,
    ) -> Result<(ShareRows, usize), RuntimeError> {
        self.read(share, window).map_err(config_error)
    }

    fn read(&mut self, share: usize, window: usize) -> Result<(ShareRows, usize), DataError> {
        let file = Arc::clone(&self.file);
        let (first, last) = file.share(share);
        let start = (first + window * file.window_rows).min(last);
        let end = (start + file.window_rows).min(last);
        let name = file.path.display().to_string();
        let behind = self.cursors.get(&share).is_none_or(|c| c.row > start);
        if behind {
            // A new epoch, or a share new to this worker: from the top of the file.
            self.cursors.insert(
                share,
                Cursor {
                    lines: open_lines(&file.path)?,
                    row: 0,
                    line: 0,
                },
            );
        }
        let Some(cursor) = self.cursors.get_mut(&share) else {
            unreachable!("a cursor was just made for the share");
        };
        let failed = |e: std::io::Error| DataError {
            path: name.clone(),
            line: 0,
            column: 0,
            message: format!("cannot read: {e}"),
        };
        // Past the rows before the window, without parsing them.
        while cursor.row < start {
            self.line.clear();
            if cursor
                .lines
                .read_until(b'\n', &mut self.line)
                .map_err(failed)?
                == 0
            {
                break;
            }
            cursor.line += 1;
            cursor.row += usize::from(is_row(&self.line));
        }
        // The window's lines, blank and comment lines between its rows included, so that
        // the parser numbers every line as the file does.
        let lines_before = cursor.line;
        let text = &mut self.text;
        text.clear();
        while cursor.row < end {
            let at = text.len();
            if cursor.lines.read_until(b'\n', text).map_err(failed)? == 0 {
                break;
            }
            cursor.line += 1;
            cursor.row += usize::from(is_row(&text[at..]));
        }
        let kept = self.kept.entry(share).or_default();
        let mut rows = match kept.iter().position(|w| Arc::strong_count(w) == 1) {
            Some(free) => {
                let mut rows = kept.remove(free);
                if let Some(examples) = Arc::get_mut(&mut rows) {
                    examples.clear();
                }
                rows
            }
            None => Arc::new(Examples::new()),
        };
        let Some(examples) = Arc::get_mut(&mut rows) else {
            unreachable!("a window nothing else holds");
        };
        parse_part(
            examples,
            &name,
            text,
            file.one_based,
            file.labels,
            lines_before,
        )?;
        if rows.len() != end - start {
            // The file changed since it was counted: its rows are no longer the ones shared.
            return Err(DataError {
                path: name,
                line: cursor.line,
                column: 0,
                message: format!(
                    "changed while training: expected rows {}..{end} here, read {}",
                    start + 1,
                    rows.len()
                ),
            });
        }
        let trained = (0..rows.len())
            .filter(|&i| !file.is_held(start + i))
            .collect();
        kept.push(Arc::clone(&rows));
        if kept.len() > KEPT_WINDOWS {
            kept.remove(0);
        }
        let share_trains = file.trained.get(share).copied().unwrap_or(0);
        Ok(((rows, trained), share_trains))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(text: &str, name: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("pserver-stream-{name}-{}.svm", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    fn cfg(workers: usize, batch: usize) -> LrConfig {
        let mut cfg = LrConfig {
            batch,
            ..LrConfig::default()
        };
        cfg.job.workers = workers;
        cfg
    }

    #[test]
    fn each_share_is_read_a_window_at_a_time_and_every_row_once_an_epoch() {
        // Ten rows with a comment and a blank line among them.
        let mut text = String::new();
        for r in 0..10 {
            text += &format!("{} {}:1\n", r % 2, r + 1);
            if r == 3 {
                text += "# a comment\n\n";
            }
        }
        let path = file_of(&text, "windows");
        let cfg = cfg(2, 2);
        let file =
            Arc::new(StreamedFile::open(&path, true, Labels::Binary, &cfg, 3, None).unwrap());
        assert_eq!((file.rows(), file.dimensions()), (10, 10));
        // Windows round up to whole minibatches: 4 rows, 2 steps.
        assert_eq!(file.window_steps(&cfg), 2);
        let mut reader = WindowReader::new(Arc::clone(&file));
        let ids = |reader: &mut WindowReader, share, window| -> Vec<u64> {
            let ((rows, trained), len) = reader.window(share, window).unwrap();
            assert_eq!(len, 5);
            trained
                .iter()
                .flat_map(|&r| rows.row(r).ids().collect::<Vec<_>>())
                .collect()
        };
        for _epoch in 0..2 {
            assert_eq!(ids(&mut reader, 0, 0), [0, 1, 2, 3]);
            assert_eq!(ids(&mut reader, 0, 1), [4]);
            assert_eq!(ids(&mut reader, 1, 0), [5, 6, 7, 8]);
            assert_eq!(ids(&mut reader, 1, 1), [9]);
        }
        // A bad line is said with its line of the file, counting the comment and the blank.
        std::fs::write(&path, text.replace("0 9:1", "0 9:x")).unwrap();
        let e = WindowReader::new(file)
            .window(1, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains(":11:"), "{e}");
        let _ = std::fs::remove_file(&path);
    }

    /// A worker that fails ends the run with its error: the others, waiting for it at the
    /// consistency bound, are not left to wait for ever.
    #[test]
    fn a_file_cut_short_while_training_ends_the_run_with_the_worker_s_error() {
        let mut text = String::new();
        for r in 0..400 {
            text += &format!("{} {}:1 {}:1\n", r % 2, r % 7 + 1, r % 11 + 8);
        }
        let path = file_of(&text, "cut");
        let mut cfg = cfg(2, 10);
        cfg.job.consistency = pserver_core::Consistency::BoundedDelay(1);
        cfg.epochs = 3;
        let file = StreamedFile::open(&path, true, Labels::Binary, &cfg, 50, None).unwrap();
        // The second worker's share is gone by the time it reads it.
        std::fs::write(&path, &text[..text.len() / 3]).unwrap();
        let test =
            crate::data::libsvm::parse("t", b"1 1:1\n0 8:1\n", crate::data::libsvm::IndexBase::One)
                .unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let trained = rt.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_secs(60),
                super::super::train_local(&cfg, Default::default(), file, test, |_| {}),
            )
            .await
        });
        let e = match trained {
            Err(_) => panic!("the run hung after a worker failed"),
            Ok(Ok(_)) => panic!("a run on a file cut short ended well"),
            Ok(Err(e)) => e.to_string(),
        };
        assert!(e.contains("changed while training"), "{e}");
        let _ = std::fs::remove_file(&path);
    }
}
