//! The LIBSVM / SVMlight text format: one example per line, `label index:value index:value ...`.
//!
//! The parser works on bytes, appends to one [`Examples`] buffer (compressed sparse rows) and
//! allocates nothing per line, so it runs at the speed of memory. Comments (`#` to the end of
//! the line) and `qid:N` tokens are skipped. Indices are zero- or one-based: a job decides
//! once, over every file it reads, which ([`IndexBase::resolve`]: any index 0 in any of them
//! means zero-based), or takes it as given; an index 0 in a file read as one-based is an error
//! naming its line. Labels are binary, as either convention writes them: 1 or +1 for a
//! positive example, 0 or -1 for a negative one; any other label (a third class, a real-valued
//! target) is an error naming its line, never mapped to a class. Bad input is a [`DataError`]
//! naming the file, the line, the column, what was expected and what was found.
//!
//! ```text
//! let text = b"+1 1:0.5 7:2 # a comment\n-1 qid:3 2:1\n";
//! let examples = parse("inline.svm", text, IndexBase::Auto)?;
//! assert_eq!(examples.len(), 2);
//! assert_eq!(examples.labels(), &[1.0, 0.0]);
//! assert!(examples.row(0).ids().eq([0, 6])); // one-based, detected
//! ```

use std::fmt;
use std::ops::Range;

use crate::seeded::{mix, unit};
use std::path::Path;

use pserver_core::MAX_KEY;

/// Whether feature indices count from 0 or from 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum IndexBase {
    /// Zero-based if any index of any file of the job is 0, one-based otherwise (the LIBSVM
    /// convention).
    #[default]
    Auto,
    /// Indices count from 0 and are used as they are.
    #[value(name = "0")]
    Zero,
    /// Indices count from 1; index `i` becomes feature `i - 1`.
    #[value(name = "1")]
    One,
}

/// Which rows are positive examples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) enum Labels {
    /// Labels are 1 (or +1) for a positive example, 0 or -1 for a negative one; any other
    /// label is refused.
    #[default]
    Binary,
    /// Rows labelled this value are positive, every other row negative: one class against
    /// the rest, of data of several classes or real-valued labels.
    Positive(f32),
}

/// How a line is read: its feature indices from 1 or from 0, and its label.
#[derive(Clone, Copy, Debug)]
struct Form {
    one_based: bool,
    labels: Labels,
}

/// Where an index 0 was found: the file, line and column.
pub(crate) type ZeroAt = (String, usize, usize);

impl IndexBase {
    /// The base a job reading `files` (name and text) uses: `self` unless it is `Auto`, which
    /// becomes `Zero` if any file holds an index 0, `One` otherwise. Also returns the first
    /// index 0 found, which explains the choice. Asked for `One`, a file holding an index 0
    /// is an error naming its line.
    pub(crate) fn resolve<'a>(
        self,
        files: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<(IndexBase, Option<ZeroAt>), DataError> {
        if self == IndexBase::Zero {
            return Ok((IndexBase::Zero, None));
        }
        for (name, text) in files {
            if let Some((line, column)) = first_index_zero(text) {
                if self == IndexBase::One {
                    return Err(zero_in_one_based(name, line, column));
                }
                return Ok((IndexBase::Zero, Some((name.to_owned(), line, column))));
            }
        }
        Ok((IndexBase::One, None))
    }

    /// As [`IndexBase::resolve`], over files read a few megabytes at a time instead of
    /// texts held whole.
    pub(crate) fn resolve_files<'a>(
        self,
        paths: impl IntoIterator<Item = &'a Path>,
    ) -> Result<(IndexBase, Option<ZeroAt>), DataError> {
        match self {
            IndexBase::Zero => return Ok((IndexBase::Zero, None)),
            // The parser refuses an index 0 itself, naming its line: no pass needed.
            IndexBase::One => return Ok((IndexBase::One, None)),
            IndexBase::Auto => {}
        }
        for path in paths {
            let name = path.display().to_string();
            let mut found = None;
            for_each_chunk(path, |text, lines| {
                if found.is_none() {
                    found = first_index_zero(text).map(|(line, col)| (lines + line, col));
                }
                Ok(())
            })?;
            if let Some((line, column)) = found {
                if self == IndexBase::One {
                    return Err(zero_in_one_based(&name, line, column));
                }
                return Ok((IndexBase::Zero, Some((name, line, column))));
            }
        }
        Ok((IndexBase::One, None))
    }

    /// The number this base counts from, as a saved model records it.
    pub(crate) fn first(self) -> Option<u8> {
        match self {
            IndexBase::Auto => None,
            IndexBase::Zero => Some(0),
            IndexBase::One => Some(1),
        }
    }
}

impl fmt::Display for IndexBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IndexBase::Auto => "auto",
            IndexBase::Zero => "0",
            IndexBase::One => "1",
        })
    }
}

const ZERO_IN_ONE_BASED: &str =
    "index 0 in a file read as one-based (give --index-base 0 if the files count from 0)";

fn zero_in_one_based(name: &str, line: usize, column: usize) -> DataError {
    DataError {
        path: name.to_owned(),
        line,
        column,
        message: ZERO_IN_ONE_BASED.into(),
    }
}

/// The lines of `text` as splitting it at each newline gives them (the piece after the last
/// newline included, empty or not), each newline found at `memchr`'s speed.
fn lines(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let text = rest?;
        Some(match memchr::memchr(b'\n', text) {
            Some(end) => {
                rest = Some(&text[end + 1..]);
                &text[..end]
            }
            None => {
                rest = None;
                text
            }
        })
    })
}

/// A line without its comment (`#` to the end).
fn without_comment(line: &[u8]) -> &[u8] {
    match memchr::memchr(b'#', line) {
        Some(p) => &line[..p],
        None => line,
    }
}

/// The feature indices a line (its comment removed) names, each with its token's column:
/// the tokens after the label that hold a `:`, `qid:` aside. Malformed ones are passed over;
/// the parser reports them, naming their line, when the rows are read.
fn indices(line: &[u8]) -> impl Iterator<Item = (usize, u64)> + '_ {
    (Tokens { line, at: 0 })
        .skip(1)
        .filter(|(_, token)| !token.starts_with(b"qid:"))
        .filter_map(|(col, token)| {
            let colon = token.iter().position(|&b| b == b':')?;
            Some((col, parse_u64(&token[..colon])?))
        })
}

/// The line and column (from 1) of the first index 0 in `text`, comments and `qid:` tokens
/// aside: the same tokens the parser reads as indices.
pub(crate) fn first_index_zero(text: &[u8]) -> Option<(usize, usize)> {
    for (n, line) in lines(text).enumerate() {
        let line = without_comment(line);
        // A line without `0:` cannot hold an index 0: most lines are passed over at memchr speed.
        if memchr::memmem::find(line, b"0:").is_none() {
            continue;
        }
        if let Some((col, _)) = indices(line).find(|&(_, index)| index == 0) {
            return Some((n + 1, col + 1));
        }
    }
    None
}

/// The largest feature index `text` names, as written (before the index base is applied);
/// `None` for a text without features.
pub(crate) fn max_index(text: &[u8]) -> Option<u64> {
    lines(text)
        .flat_map(|line| indices(without_comment(line)))
        .map(|(_, index)| index)
        .max()
}

/// Feature ids: four bytes each while every id fits in four, eight once one does not.
#[derive(Clone, Debug, PartialEq)]
enum Ids {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

impl Default for Ids {
    fn default() -> Self {
        Ids::Narrow(Vec::new())
    }
}

impl Ids {
    fn len(&self) -> usize {
        match self {
            Ids::Narrow(v) => v.len(),
            Ids::Wide(v) => v.len(),
        }
    }

    fn push(&mut self, id: u64) {
        match self {
            Ids::Narrow(v) => match u32::try_from(id) {
                Ok(id) => v.push(id),
                Err(_) => {
                    let mut wide: Vec<u64> = Vec::with_capacity(v.capacity());
                    wide.extend(v.iter().map(|&k| u64::from(k)));
                    wide.push(id);
                    *self = Ids::Wide(wide);
                }
            },
            Ids::Wide(v) => v.push(id),
        }
    }

    fn truncate(&mut self, len: usize) {
        match self {
            Ids::Narrow(v) => v.truncate(len),
            Ids::Wide(v) => v.truncate(len),
        }
    }

    fn reserve(&mut self, n: usize) {
        match self {
            Ids::Narrow(v) => v.reserve(n),
            Ids::Wide(v) => v.reserve(n),
        }
    }

    fn slice(&self, r: Range<usize>) -> IdSlice<'_> {
        match self {
            Ids::Narrow(v) => IdSlice::Narrow(&v[r]),
            Ids::Wide(v) => IdSlice::Wide(&v[r]),
        }
    }

    /// The same kind of list, empty.
    fn empty_like(&self) -> Ids {
        match self {
            Ids::Narrow(_) => Ids::Narrow(Vec::new()),
            Ids::Wide(_) => Ids::Wide(Vec::new()),
        }
    }

    fn extend_from(&mut self, ids: IdSlice<'_>) {
        match (self, ids) {
            (Ids::Narrow(v), IdSlice::Narrow(s)) => v.extend_from_slice(s),
            (Ids::Wide(v), IdSlice::Wide(s)) => v.extend_from_slice(s),
            (this, ids) => {
                for id in ids.iter() {
                    this.push(id);
                }
            }
        }
    }
}

/// One example's feature ids, as stored.
#[derive(Clone, Copy, Debug, PartialEq)]
enum IdSlice<'a> {
    Narrow(&'a [u32]),
    Wide(&'a [u64]),
}

impl<'a> IdSlice<'a> {
    fn len(&self) -> usize {
        match self {
            IdSlice::Narrow(s) => s.len(),
            IdSlice::Wide(s) => s.len(),
        }
    }

    fn iter(self) -> impl Iterator<Item = u64> + 'a {
        let (narrow, wide): (&[u32], &[u64]) = match self {
            IdSlice::Narrow(s) => (s, &[]),
            IdSlice::Wide(s) => (&[], s),
        };
        narrow
            .iter()
            .map(|&k| u64::from(k))
            .chain(wide.iter().copied())
    }
}

/// One example: its features' ids in increasing order, and their values (none stored when
/// every value of the set is 1, as in click data). Rows are equal when their features are,
/// however they are stored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row<'a> {
    ids: IdSlice<'a>,
    values: Option<&'a [f32]>,
}

impl<'a> Row<'a> {
    /// Number of features.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    #[cfg(test)]
    /// True for an example without features.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The feature ids, increasing.
    pub(crate) fn ids(self) -> impl Iterator<Item = u64> + 'a {
        self.ids.iter()
    }

    /// The features' values; `None` when every value is 1.
    pub(crate) fn values(&self) -> Option<&'a [f32]> {
        self.values
    }

    /// The features' (id, value) pairs.
    pub(crate) fn iter(self) -> impl Iterator<Item = (u64, f32)> + 'a {
        let values = self.values;
        self.ids()
            .enumerate()
            .map(move |(i, k)| (k, values.map_or(1.0, |v| v[i])))
    }
}

/// Examples in compressed sparse rows: labels, and per example a run of feature ids and
/// values, held compactly: four-byte ids while every id fits (eight otherwise), and no values
/// at all while every value is 1, so that click-like data costs four bytes a feature. Sets
/// are equal when their labels and rows are, however they are stored.
#[derive(Clone, Debug, Default)]
pub(crate) struct Examples {
    labels: Vec<f32>,
    /// Start of each example's features in `ids`/`values`, plus the end.
    offsets: Vec<usize>,
    ids: Ids,
    /// `None` while every value is 1.
    values: Option<Vec<f32>>,
}

impl PartialEq for Row<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq for Examples {
    fn eq(&self, other: &Self) -> bool {
        self.labels == other.labels && (0..self.len()).all(|r| self.row(r) == other.row(r))
    }
}

impl Examples {
    /// No examples.
    pub(crate) fn new() -> Self {
        Examples {
            offsets: vec![0],
            ..Examples::default()
        }
    }

    /// Number of examples.
    pub(crate) fn len(&self) -> usize {
        self.labels.len()
    }

    /// Drops every example, keeping the memory for the next ones: a streamed file's window
    /// reuses the one before the last.
    pub(crate) fn clear(&mut self) {
        self.labels.clear();
        self.offsets.clear();
        self.offsets.push(0);
        match &mut self.ids {
            Ids::Narrow(v) => v.clear(),
            Ids::Wide(v) => v.clear(),
        }
        if let Some(values) = &mut self.values {
            values.clear();
        }
    }

    /// True when there are no examples.
    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Every label: 1 for a positive example (written 1 or +1), 0 for a negative one (0 or -1).
    pub(crate) fn labels(&self) -> &[f32] {
        &self.labels
    }

    /// Example `i`.
    pub(crate) fn row(&self, i: usize) -> Row<'_> {
        let r = self.offsets[i]..self.offsets[i + 1];
        Row {
            ids: self.ids.slice(r.clone()),
            values: self.values.as_ref().map(|v| &v[r]),
        }
    }

    #[cfg(test)]
    /// Number of (index, value) pairs over all examples.
    pub(crate) fn nonzeros(&self) -> usize {
        self.ids.len()
    }

    /// Appends a feature to the example being read.
    fn push_feature(&mut self, id: u64, value: f32) {
        match &mut self.values {
            Some(values) => values.push(value),
            None if value == 1.0 => {}
            None => {
                // The first value that is not 1: from now on every value is kept.
                let mut values = Vec::with_capacity(self.ids.len() * 2 + 1);
                values.resize(self.ids.len(), 1.0);
                values.push(value);
                self.values = Some(values);
            }
        }
        self.ids.push(id);
    }

    /// Drops the features from `start` on (of an example that could not be read).
    fn truncate_features(&mut self, start: usize) {
        self.ids.truncate(start);
        if let Some(values) = &mut self.values {
            values.truncate(start);
        }
    }

    /// Ends the example being read.
    fn end_row(&mut self, label: f32) {
        self.labels.push(label);
        self.offsets.push(self.ids.len());
    }

    #[cfg(test)]
    /// The first `n` examples (all of them if there are fewer).
    pub(crate) fn head(&self, n: usize) -> Examples {
        self.select(&(0..n.min(self.len())).collect::<Vec<_>>())
    }

    /// The rows `order` names, in that order.
    pub(crate) fn select(&self, order: &[usize]) -> Examples {
        let mut out = Examples::new();
        out.ids = self.ids.empty_like();
        out.values = self.values.as_ref().map(|_| Vec::new());
        out.labels.reserve(order.len());
        out.offsets.reserve(order.len());
        for &i in order {
            let row = self.row(i);
            out.labels.push(self.labels[i]);
            out.ids.extend_from(row.ids);
            if let (Some(to), Some(from)) = (&mut out.values, row.values) {
                to.extend_from_slice(from);
            }
            out.offsets.push(out.ids.len());
        }
        out
    }

    /// Splits the rows into a training and a held-out set: each row is held out with
    /// probability `fraction`, decided by a hash of `seed` and its position, so that the same
    /// seed always holds out the same rows. Both keep the file's order.
    pub(crate) fn hold_out(&self, fraction: f64, seed: u64) -> (Examples, Examples) {
        let (mut kept, mut held) = (Vec::new(), Vec::new());
        for r in 0..self.len() {
            if held_out(r, fraction, seed) {
                held.push(r);
            } else {
                kept.push(r);
            }
        }
        (self.select(&kept), self.select(&held))
    }

    /// The largest feature index plus one (0 without features).
    pub(crate) fn dimensions(&self) -> u64 {
        let max = match &self.ids {
            Ids::Narrow(v) => v.iter().max().map(|&m| u64::from(m)),
            Ids::Wide(v) => v.iter().max().copied(),
        };
        max.map_or(0, |m| m + 1)
    }
}

/// Whether row `r` of a file (counted from 0 over the rows the parser makes, blank and comment
/// lines left out) is held out by [`Examples::hold_out`] with `fraction` and `seed`: a worker
/// that parses only its share of the file tells its held rows by their place in the file.
pub(crate) fn held_out(r: usize, fraction: f64, seed: u64) -> bool {
    unit(mix(seed ^ mix(r as u64 ^ 0x4e1d))) < fraction
}

/// Why a data file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DataError {
    /// The file.
    pub path: String,
    /// Line, from 1 (0 when the error is about the whole file).
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.path, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.path, self.line, self.column, self.message
            )
        }
    }
}

impl std::error::Error for DataError {}

/// The byte range of shard `shard` of `shards` of `text`, moved to line boundaries so that every
/// line belongs to exactly one shard (the paper's workers each read their own part).
pub(crate) fn shard(text: &[u8], shard: usize, shards: usize) -> Range<usize> {
    let shards = shards.max(1);
    let cut = |i: usize| -> usize {
        if i == 0 {
            return 0;
        }
        if i >= shards {
            return text.len();
        }
        let at = text.len() / shards * i;
        // The shard starts after the newline at or after `at - 1`, so a cut that lands on a
        // line's first byte keeps that line whole.
        match text[at.saturating_sub(1)..]
            .iter()
            .position(|&b| b == b'\n')
        {
            Some(p) => at.saturating_sub(1) + p + 1,
            None => text.len(),
        }
    };
    cut(shard)..cut(shard + 1).max(cut(shard))
}

/// An error about the whole file at `path`, not one of its lines.
fn file_error(path: &Path, message: String) -> DataError {
    DataError {
        path: path.display().to_string(),
        line: 0,
        column: 0,
        message,
    }
}

/// Reads the bytes of the file at `path`, decompressed if its name ends in `.gz`.
pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    let fail = |message: String| file_error(path, message);
    let raw = std::fs::read(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    if path.extension().is_none_or(|e| e != "gz") {
        return Ok(raw);
    }
    let mut text = Vec::with_capacity(raw.len() * 8);
    std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(&raw[..]), &mut text)
        .map_err(|e| fail(format!("not a valid gzip file: {e}")))?;
    Ok(text)
}

/// Reads and parses the whole file at `path` (gzip-compressed if its name ends in `.gz`).
/// `Auto` decides the base over this file alone: a job of several files decides once over
/// all of them ([`IndexBase::resolve`]) and passes the result.
pub(crate) fn read(path: &Path, base: IndexBase) -> Result<Examples, DataError> {
    let name = path.display().to_string();
    let text = read_bytes(path)?;
    parse_whole(&name, &text, base, Labels::Binary)
}

/// Parses the whole file `name` (text `text`), which must hold at least one example, with
/// binary labels or those `labels` names positive.
pub(crate) fn parse_whole(
    name: &str,
    text: &[u8],
    base: IndexBase,
    labels: Labels,
) -> Result<Examples, DataError> {
    let examples = parse_lines(name, text, base, 0, labels)?;
    if examples.is_empty() {
        return Err(no_examples(name.to_owned()));
    }
    Ok(examples)
}

/// Whether `text` holds at least one row, without parsing it: a process that parses only its
/// share of a file still needs to know that the whole file is not empty.
pub(crate) fn holds_rows(text: &[u8]) -> bool {
    count_rows(text) > 0
}

/// The rows `text` holds: its lines with anything besides blanks and a comment, which the
/// parser turns into one example each.
pub(crate) fn count_rows(text: &[u8]) -> usize {
    lines(text).filter(|line| is_row(line)).count()
}

/// The error for a file named `name` that holds no rows.
pub(crate) fn no_examples(name: String) -> DataError {
    DataError {
        path: name,
        line: 0,
        column: 0,
        message: "no examples: the file is empty or holds only comments".into(),
    }
}

/// Parses `text` (named `name` in errors); `Auto` decides the base over `text` alone.
pub(crate) fn parse(name: &str, text: &[u8], base: IndexBase) -> Result<Examples, DataError> {
    parse_lines(name, text, base, 0, Labels::Binary)
}

/// Parses `text`, a part of the file `name` that starts after its first `lines_before`
/// lines, so that errors name the line of the whole file.
pub(crate) fn parse_lines(
    name: &str,
    text: &[u8],
    base: IndexBase,
    lines_before: usize,
    labels: Labels,
) -> Result<Examples, DataError> {
    // Only `Auto` needs a first pass; under `One` the parser itself refuses an index 0.
    let one_based = match base {
        IndexBase::Auto => first_index_zero(text).is_none(),
        IndexBase::Zero => false,
        IndexBase::One => true,
    };
    let mut out = Examples::new();
    // Every feature has a colon: room for them all at once, where growing by doubling would
    // hold the old and the new array together and leave up to half of the new one unused.
    out.ids.reserve(memchr::memchr_iter(b':', text).count());
    let form = Form { one_based, labels };
    parse_into(&mut out, name, text, form, lines_before)?;
    Ok(out)
}

/// Appends to `out` the rows of `text`, whole lines of the file `name` after its first
/// `lines_before`, with indices from 1 when `one_based` and binary labels or those `labels`
/// names positive: a window of a streamed file.
pub(crate) fn parse_part(
    out: &mut Examples,
    name: &str,
    text: &[u8],
    one_based: bool,
    labels: Labels,
    lines_before: usize,
) -> Result<(), DataError> {
    parse_into(out, name, text, Form { one_based, labels }, lines_before)
}

/// Whether `line` holds a row, as the parser reads it: anything besides blanks before a
/// comment.
pub(crate) fn is_row(line: &[u8]) -> bool {
    line.iter()
        .take_while(|&&b| b != b'#')
        .any(|b| !b.is_ascii_whitespace())
}

/// Opens `path` for reading a line at a time, decompressed if its name ends in `.gz`.
pub(crate) fn open_lines(path: &Path) -> Result<Box<dyn std::io::BufRead + Send>, DataError> {
    let file =
        std::fs::File::open(path).map_err(|e| file_error(path, format!("cannot read: {e}")))?;
    let gz = path.extension().is_some_and(|e| e == "gz");
    Ok(if gz {
        Box::new(std::io::BufReader::with_capacity(
            1 << 20,
            flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file)),
        ))
    } else {
        Box::new(std::io::BufReader::with_capacity(1 << 20, file))
    })
}

/// Appends the examples of `text`, whole lines of the file `name` after its first
/// `lines_before`, to `out`.
fn parse_into(
    out: &mut Examples,
    name: &str,
    text: &[u8],
    form: Form,
    lines_before: usize,
) -> Result<(), DataError> {
    for (n, line) in lines(text).enumerate() {
        parse_line(line, out, form).map_err(|(column, message)| DataError {
            path: name.to_owned(),
            line: lines_before + n + 1,
            column: column + 1,
            message,
        })?;
    }
    Ok(())
}

/// Bytes of a file read at a time by the streaming reader.
const CHUNK: usize = 4 << 20;

/// Calls `f` on the file at `path` (decompressed if its name ends in `.gz`) a few megabytes
/// of whole lines at a time, each with the number of lines before it, so that a file is
/// never held whole in memory.
fn for_each_chunk(
    path: &Path,
    f: impl FnMut(&[u8], usize) -> Result<(), DataError>,
) -> Result<(), DataError> {
    chunks_of(path, CHUNK, f)
}

/// [`for_each_chunk`] with `chunk` bytes read at a time.
fn chunks_of(
    path: &Path,
    chunk: usize,
    mut f: impl FnMut(&[u8], usize) -> Result<(), DataError>,
) -> Result<(), DataError> {
    use std::io::Read;
    let fail = |message: String| file_error(path, message);
    let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let gz = path.extension().is_some_and(|e| e == "gz");
    let mut reader: Box<dyn Read> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(
            file,
        )))
    } else {
        Box::new(file)
    };
    let mut buf = vec![0u8; chunk.max(1)];
    let (mut filled, mut lines) = (0, 0);
    loop {
        if filled == buf.len() {
            // A line longer than the buffer: make room for it.
            buf.resize(buf.len() * 2, 0);
        }
        // Fill the buffer (a decompressor returns a little at a time), so that `f` sees a
        // few megabytes a call and the last newline is looked for once per buffer.
        let mut n = 0;
        while filled < buf.len() {
            let read = match reader.read(&mut buf[filled..]) {
                Ok(read) => read,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(fail(if gz {
                        format!("not a valid gzip file: {e}")
                    } else {
                        format!("cannot read: {e}")
                    }));
                }
            };
            if read == 0 {
                break;
            }
            filled += read;
            n += read;
        }
        if n == 0 {
            if filled > 0 {
                f(&buf[..filled], lines)?;
            }
            return Ok(());
        }
        if let Some(last) = buf[..filled].iter().rposition(|&b| b == b'\n') {
            let whole = &buf[..=last];
            f(whole, lines)?;
            lines += memchr::memchr_iter(b'\n', whole).count();
            buf.copy_within(last + 1..filled, 0);
            filled -= last + 1;
        }
    }
}

/// Reads and parses the file at `path` as [`read`] does, but a few megabytes at a time, with
/// the rows `labels` says positive: the text is never held whole, so a run's memory is its
/// parsed rows. `base` must be decided
/// already (`Auto` is read as one-based unless the file holds an index 0, which this reader
/// cannot know before it ends: decide it first with [`IndexBase::resolve_files`]).
pub(crate) fn read_streaming(
    path: &Path,
    base: IndexBase,
    labels: Labels,
) -> Result<Examples, DataError> {
    read_in_chunks(path, base, labels, CHUNK)
}

/// [`read_streaming`] with `chunk` bytes read at a time.
fn read_in_chunks(
    path: &Path,
    base: IndexBase,
    labels: Labels,
    chunk: usize,
) -> Result<Examples, DataError> {
    let name = path.display().to_string();
    let base = match base {
        IndexBase::Auto => IndexBase::Auto.resolve_files([path])?.0,
        base => base,
    };
    let mut out = Examples::new();
    // Every feature takes at least four bytes ("1:1 "): room for them all, which costs
    // address space only until it is written, up to a bound past which the list grows as
    // it goes rather than ask for more address space than a machine may grant at once.
    const MOST: u64 = 1 << 26;
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    let gz = path.extension().is_some_and(|e| e == "gz");
    let room = if gz { len.saturating_mul(2) } else { len / 4 }.min(MOST);
    out.ids.reserve(usize::try_from(room).unwrap_or(0));
    let form = Form {
        one_based: base == IndexBase::One,
        labels,
    };
    chunks_of(path, chunk, |text, lines| {
        parse_into(&mut out, &name, text, form, lines)
    })?;
    if out.is_empty() {
        return Err(no_examples(name));
    }
    Ok(out)
}

/// Calls `f` on the rows of the file at `path` a few megabytes at a time, each part parsed
/// into the same reused [`Examples`] (indices from 1 when `one_based`, the labels `labels`
/// says), so that a pass over a file of any length holds one part of it.
pub(crate) fn for_each_part(
    path: &Path,
    one_based: bool,
    labels: Labels,
    mut f: impl FnMut(&Examples) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let name = path.display().to_string();
    let form = Form { one_based, labels };
    let mut part = Examples::new();
    for_each_chunk(path, |text, lines| {
        part.clear();
        parse_into(&mut part, &name, text, form, lines)?;
        f(&part)
    })
}

/// The lines of `text` before byte `at`.
pub(crate) fn lines_before(text: &[u8], at: usize) -> usize {
    memchr::memchr_iter(b'\n', &text[..at.min(text.len())]).count()
}

type LineError = (usize, String);

/// A token as an error message shows it: quoted, cut at 40 bytes.
fn shown(token: &[u8]) -> String {
    format!(
        "'{}'",
        String::from_utf8_lossy(&token[..token.len().min(40)])
    )
}

fn found(token: &[u8]) -> String {
    format!("found {}", shown(token))
}

/// Appends the example on `line` (if any) to `out`. Errors carry the 0-based column.
fn parse_line(line: &[u8], out: &mut Examples, form: Form) -> Result<(), LineError> {
    let one_based = form.one_based;
    let line = match memchr::memchr(b'#', line) {
        Some(p) => &line[..p],
        None => line,
    };
    let mut tokens = Tokens { line, at: 0 };
    let Some((col, label)) = tokens.next() else {
        return Ok(());
    };
    let written = label;
    let label = parse_f32(written)
        .ok_or_else(|| (col, format!("expected a numeric label, {}", found(written))))?;
    // Binary labels as either convention writes them; nothing else is guessed at.
    let label = if let Labels::Positive(positive) = form.labels {
        if label == positive { 1.0 } else { 0.0 }
    } else if label == 1.0 {
        1.0
    } else if label == 0.0 || label == -1.0 {
        0.0
    } else {
        return Err((
            col,
            format!(
                "expected a binary label, 0 or 1 (or -1 or +1), {}: logistic regression does not train on other classes or on real-valued targets (--positive LABEL trains one label against the rest)",
                found(written)
            ),
        ));
    };
    let start = out.ids.len();
    let mut last: Option<u64> = None;
    loop {
        // Most tokens are plain `index:count` pairs: read those in one pass over their bytes,
        // and hand anything else (a decimal value, `qid:`, a malformed token) to the full
        // reader below, which says what is wrong with it.
        let (col, index, value) = match plain_pair(line, tokens.at) {
            Some((col, index, value, end)) => {
                tokens.at = end;
                (col, index, value)
            }
            None => {
                let Some((col, token)) = tokens.next() else {
                    break;
                };
                match feature(token, col, last) {
                    Ok(Some((index, value))) => (col, index, value),
                    Ok(None) => continue,
                    Err(e) => return Err(rollback(out, start, e.0, e.1)),
                }
            }
        };
        if last.is_some_and(|l| index <= l) {
            return Err(rollback(out, start, col, out_of_order(index, last)));
        }
        last = Some(index);
        let index = match (one_based, index) {
            (false, i) => i,
            (true, 0) => return Err(rollback(out, start, col, ZERO_IN_ONE_BASED.into())),
            (true, i) => i - 1,
        };
        out.push_feature(index, value);
    }
    out.end_row(label);
    Ok(())
}

/// The error for `index` after `last` on one line.
fn out_of_order(index: u64, last: Option<u64>) -> String {
    format!(
        "indices must increase along a line; {index} follows {}",
        last.unwrap_or(0)
    )
}

/// The token at or after byte `at` of `line` (its comment removed) when it is a plain
/// `index:value` pair (an index below [`MAX_KEY`] in decimal digits, a [`plain_value`])
/// ended by a blank or the line's end: its column, index, value and the byte after it.
/// `None` for anything else, and at the line's end.
fn plain_pair(line: &[u8], at: usize) -> Option<(usize, u64, f32, usize)> {
    let mut i = at;
    while i < line.len() && line[i].is_ascii_whitespace() {
        i += 1;
    }
    let col = i;
    // At most 18 digits: no overflow to check, and larger indices take the full reader.
    let (index, i) = digits(line, i, 18)?;
    if index >= MAX_KEY || line.get(i) != Some(&b':') {
        return None;
    }
    let (value, end) = plain_value(line, i + 1)?;
    if line.get(end).is_some_and(|b| !b.is_ascii_whitespace()) {
        return None;
    }
    Some((col, index, value, end))
}

/// Powers of ten an `f32` holds exactly (5^10 < 2^24).
const EXACT_TENS: [f64; 11] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10];

/// The value written at byte `at` of `line` when it is digits, or digits, a point and digits,
/// whose digits read as an integer `m` below 2^24 with at most 10 after the point, and the
/// byte after it. Such a value is `m / 10^k` with both `m` and `10^k` exact in an `f32`, so
/// dividing in `f64` and rounding to `f32` gives the correctly rounded value (double rounding
/// is innocuous for a quotient when the wider format has at least 2p + 2 bits, Figueroa 1995),
/// the one `str::parse::<f32>` gives. Anything else is left to the full parser.
fn plain_value(line: &[u8], at: usize) -> Option<(f32, usize)> {
    let (whole, i) = digits(line, at, 18)?;
    if line.get(i) != Some(&b'.') {
        return (whole < 1 << 24).then_some((whole as f32, i));
    }
    let (fraction, end) = digits(line, i + 1, 18 - (i - at))?;
    let places = end - (i + 1);
    let m = whole * 10u64.pow(u32::try_from(places).ok()?) + fraction;
    if m >= 1 << 24 || places >= EXACT_TENS.len() {
        return None;
    }
    Some(((m as f64 / EXACT_TENS[places]) as f32, end))
}

/// The decimal number of 1 to `most` digits at byte `at` of `line`, and the byte after it.
fn digits(line: &[u8], at: usize, most: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    let mut i = at;
    while let Some(d) = line
        .get(i)
        .map(|b| b.wrapping_sub(b'0'))
        .filter(|&d| d <= 9)
    {
        if i - at == most {
            return None;
        }
        value = value * 10 + u64::from(d);
        i += 1;
    }
    (i > at).then_some((value, i))
}

/// Reads one feature token (at column `col`, after index `last` on its line): its index as
/// written and its value, `None` for a `qid:` token, or the column and message of what is
/// wrong with it.
fn feature(token: &[u8], col: usize, last: Option<u64>) -> Result<Option<(u64, f32)>, LineError> {
    if token.starts_with(b"qid:") {
        return Ok(None);
    }
    let Some(colon) = token.iter().position(|&b| b == b':') else {
        return Err((col, format!("expected 'index:value', {}", found(token))));
    };
    let (idx, val) = (&token[..colon], &token[colon + 1..]);
    let index = match parse_u64(idx) {
        Some(i) if i < MAX_KEY => i,
        Some(_) | None if !idx.is_empty() && idx.iter().all(u8::is_ascii_digit) => {
            return Err((
                col,
                format!(
                    "index {} is out of range (at most {})",
                    shown(idx),
                    MAX_KEY - 1
                ),
            ));
        }
        _ => return Err((col, format!("expected an index, {}", found(idx)))),
    };
    // An index out of order is said before a bad value, as a reader going left to right
    // meets them.
    if last.is_some_and(|l| index <= l) {
        return Err((col, out_of_order(index, last)));
    }
    let value = parse_f32(val).ok_or_else(|| {
        (
            col + colon + 1,
            format!("expected a numeric value after ':', {}", found(val)),
        )
    })?;
    Ok(Some((index, value)))
}

/// Undoes a half-parsed line before reporting it.
fn rollback(out: &mut Examples, start: usize, col: usize, message: String) -> LineError {
    out.truncate_features(start);
    (col, message)
}

/// Whitespace-separated tokens of a line, with their starting column.
struct Tokens<'a> {
    line: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Tokens<'a> {
    type Item = (usize, &'a [u8]);

    fn next(&mut self) -> Option<(usize, &'a [u8])> {
        let rest = &self.line[self.at..];
        let skip = rest.iter().position(|b| !b.is_ascii_whitespace())?;
        let start = self.at + skip;
        let len = self.line[start..]
            .iter()
            .position(u8::is_ascii_whitespace)
            .unwrap_or(self.line.len() - start);
        self.at = start + len;
        Some((start, &self.line[start..start + len]))
    }
}

fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &d| {
        let d = d.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(d))
    })
}

fn parse_f32(token: &[u8]) -> Option<f32> {
    let token = token.strip_prefix(b"+").unwrap_or(token);
    // Plain small integers (labels, binary features) are the common case: skip the float parser.
    if let Some(v) = parse_u64(token).filter(|&v| v < 1 << 24) {
        return Some(v as f32);
    }
    let text = std::str::from_utf8(token).ok()?;
    text.parse::<f32>().ok().filter(|v| v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_index_is_found_past_comments_and_qids() {
        let text = b"+1 3:1 17:0.5 # 99:1 in a comment\n-1 qid:500 4:2\n\n+1\n";
        assert_eq!(max_index(text), Some(17));
        assert_eq!(max_index(b"+1\n-1 # 5:1\n"), None);
    }

    /// The example in the module's documentation, which rustdoc does not run in a binary.
    #[test]
    fn the_module_example_reads_comments_qids_and_one_based_indices()
    -> Result<(), Box<dyn std::error::Error>> {
        let text = b"+1 1:0.5 7:2 # a comment\n-1 qid:3 2:1\n";
        let examples = parse("inline.svm", text, IndexBase::Auto)?;
        assert_eq!(examples.len(), 2);
        assert_eq!(examples.labels(), &[1.0, 0.0]);
        assert!(examples.row(0).ids().eq([0, 6])); // one-based, detected
        Ok(())
    }

    fn pairs(row: Row<'_>) -> Vec<(u64, f32)> {
        row.iter().collect()
    }

    /// Read a few bytes at a time, lines cut anywhere (even longer than a chunk), a file
    /// parses to what it parses to whole, and an error names its line in the whole file.
    #[test]
    fn a_file_read_in_chunks_reads_as_it_does_whole() {
        let dir = std::env::temp_dir().join(format!("pserver-chunks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = b"# head\n1 1:1 4:0.5\n\n0 2:1 3:1 9:1 12:1 30:1 31:1\n1 5:2\n0\n1 7:1";
        let path = dir.join("t.svm");
        std::fs::write(&path, text).unwrap();
        let whole = parse("t", text, IndexBase::One).unwrap();
        for chunk in [1, 2, 5, 7, 13, 64, 1 << 20] {
            let read = read_in_chunks(&path, IndexBase::One, Labels::Binary, chunk).unwrap();
            assert_eq!(read.len(), whole.len(), "chunk {chunk}");
            for r in 0..whole.len() {
                assert_eq!(pairs(read.row(r)), pairs(whole.row(r)), "chunk {chunk}");
            }
            assert_eq!(read.labels(), whole.labels());
        }
        let bad = b"1 1:1\n0 2:1\n\n1 3:x\n";
        std::fs::write(&path, bad).unwrap();
        for chunk in [3, 1 << 20] {
            let e = read_in_chunks(&path, IndexBase::One, Labels::Binary, chunk).unwrap_err();
            assert_eq!((e.line, e.column), (4, 5), "chunk {chunk}: {e}");
        }
        // The base found over files read in chunks names the line of the whole file.
        std::fs::write(&path, b"1 1:1\n0 2:1\n1 0:1\n").unwrap();
        let (base, why) = IndexBase::Auto.resolve_files([path.as_path()]).unwrap();
        assert_eq!(base, IndexBase::Zero);
        assert_eq!(why.map(|(_, line, col)| (line, col)), Some((3, 3)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Click data costs four bytes a feature: four-byte ids and no values while every value
    /// is 1; a value that is not 1, or an id past four bytes, changes the layout and nothing
    /// read before it.
    #[test]
    fn rows_are_held_compactly_and_read_back_as_written() {
        let ex = parse("t", b"1 3:1 7:1\n0 2:1\n", IndexBase::Zero).unwrap();
        assert!(matches!(ex.ids, Ids::Narrow(_)) && ex.values.is_none());
        assert_eq!(ex.row(0).values(), None);
        assert_eq!(pairs(ex.row(0)), [(3, 1.0), (7, 1.0)]);
        let ex = parse(
            "t",
            b"1 3:1 7:1\n0 2:0.5 5000000000:1\n1 4:1\n",
            IndexBase::Zero,
        )
        .unwrap();
        assert!(matches!(ex.ids, Ids::Wide(_)) && ex.values.is_some());
        assert_eq!(pairs(ex.row(0)), [(3, 1.0), (7, 1.0)]);
        assert_eq!(pairs(ex.row(1)), [(2, 0.5), (5_000_000_000, 1.0)]);
        assert_eq!(pairs(ex.row(2)), [(4, 1.0)]);
        assert_eq!(ex.dimensions(), 5_000_000_001);
        // Stored differently, the same rows are equal.
        let narrow = parse("t", b"1 3:1 7:1\n", IndexBase::Zero).unwrap();
        assert_eq!(narrow.row(0), ex.row(0));
        assert_eq!(narrow, ex.head(1));
        assert_ne!(narrow.row(0), ex.row(2));
        // A line refused halfway leaves nothing of itself behind.
        let err = parse("t", b"1 3:1\n0 2:0.5 9:x\n", IndexBase::Zero);
        assert!(err.is_err());
        let mut part = Examples::new();
        let form = Form {
            one_based: false,
            labels: Labels::Binary,
        };
        parse_line(b"1 3:1", &mut part, form).unwrap();
        assert!(parse_line(b"0 2:0.5 9:x", &mut part, form).is_err());
        parse_line(b"1 4:1", &mut part, form).unwrap();
        assert_eq!(part.nonzeros(), 2);
        assert_eq!(pairs(part.row(1)), [(4, 1.0)]);
    }

    fn err(text: &str) -> String {
        parse("t.svm", text.as_bytes(), IndexBase::Auto)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_label_that_is_not_binary_is_refused_naming_its_line() {
        // Three classes: the second line's is the first that is neither 0/1 nor -1/+1.
        let e = err("1 1:1\n2 1:1\n3 2:1\n");
        assert_eq!(
            e.lines().next().unwrap_or_default(),
            "t.svm:2:1: expected a binary label, 0 or 1 (or -1 or +1), found '2': logistic regression does not train on other classes or on real-valued targets (--positive LABEL trains one label against the rest)"
        );
        assert!(err("0.5 1:1\n").contains("found '0.5'"));
        let both = parse(
            "t.svm",
            b"+1 1:1\n-1 1:1\n1.0 2:1\n0 2:1\n",
            IndexBase::Auto,
        )
        .unwrap();
        assert_eq!(both.labels(), &[1.0, 0.0, 1.0, 0.0]);
    }

    #[test]
    fn a_label_named_positive_is_one_class_against_the_rest() {
        let dir = std::env::temp_dir().join(format!("pserver-positive-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("classes.svm");
        std::fs::write(&path, "1 1:1\n2 1:1\n3 2:1\n2.5 3:1\n-1 2:1\n2 4:1\n").unwrap();
        let read = |labels| read_streaming(&path, IndexBase::One, labels);
        let two = read(Labels::Positive(2.0)).unwrap();
        assert_eq!(two.labels(), &[0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
        let half = read(Labels::Positive(2.5)).unwrap();
        assert_eq!(half.labels(), &[0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
        // Even 1 is positive only where it is named: -1 is a class like another.
        let minus = read(Labels::Positive(-1.0)).unwrap();
        assert_eq!(minus.labels(), &[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
        let none = read(Labels::Positive(7.0)).unwrap();
        assert!(none.labels().iter().all(|&l| l == 0.0));
        assert!(
            read(Labels::Binary).is_err(),
            "without it, three classes are refused"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_labels_features_comments_and_qids() {
        let ex = parse(
            "t.svm",
            b"# header\n1 3:1.5 10:-2e-3\n\n0 qid:7 1:1 # tail\n-1\n",
            IndexBase::Auto,
        )
        .unwrap();
        assert_eq!(ex.len(), 3);
        assert_eq!(ex.labels(), &[1.0, 0.0, 0.0]);
        assert_eq!(pairs(ex.row(0)), [(2, 1.5), (9, -2e-3)]);
        assert_eq!(pairs(ex.row(1)), [(0, 1.0)]);
        assert!(ex.row(2).is_empty());
        assert_eq!(ex.dimensions(), 10);
    }

    #[test]
    fn select_takes_the_rows_named_in_that_order() {
        let ex = parse("t", b"1 1:1\n0 2:2 3:3\n1 4:4\n", IndexBase::Zero).unwrap();
        let picked = ex.select(&[2, 0]);
        assert_eq!(picked.len(), 2);
        assert_eq!(picked.labels(), &[1.0, 1.0]);
        assert_eq!(pairs(picked.row(0)), [(4, 4.0)]);
        assert_eq!(pairs(picked.row(1)), [(1, 1.0)]);
        assert_eq!(ex.select(&[1]).row(0), ex.row(1));
    }

    #[test]
    fn a_file_of_blank_lines_and_comments_holds_no_rows() {
        assert!(!holds_rows(b""));
        assert!(!holds_rows(b"\n  \t\n# header\n   # note\r\n"));
        assert!(holds_rows(b"# header\n-1\n"));
        assert!(holds_rows(b"1 3:1"));
        let text = b"# header\n1 1:1\n\n0 2:1 # tail\n  # note\n1\n";
        assert_eq!(count_rows(text), 3);
        assert_eq!(parse("t", text, IndexBase::One).unwrap().len(), 3);
    }

    #[test]
    fn a_zero_index_means_zero_based_unless_told_otherwise() {
        let ex = parse("t", b"1 0:1 4:1\n", IndexBase::Auto).unwrap();
        assert!(ex.row(0).ids().eq([0, 4]));
        let ex = parse("t", b"1 1:1 4:1\n", IndexBase::Zero).unwrap();
        assert!(ex.row(0).ids().eq([1, 4]));
        let e = parse("t", b"1 0:1\n", IndexBase::One).unwrap_err();
        assert!(e.to_string().contains("index 0"), "{e}");
    }

    #[test]
    fn one_base_is_decided_over_every_file_of_a_job() {
        let with_zero: &[u8] = b"1 0:1 3:1\n";
        let without: &[u8] = b"# 0:1 in a comment\n0 qid:0 2:1 5:1\n";
        let (base, why) = IndexBase::Auto
            .resolve([("train", with_zero), ("test", without)])
            .unwrap();
        assert_eq!((base, why), (IndexBase::Zero, Some(("train".into(), 1, 3))));
        let (base, _) = IndexBase::Auto.resolve([("test", without)]).unwrap();
        assert_eq!(base, IndexBase::One);
        let e = IndexBase::One
            .resolve([("test", without), ("train", with_zero)])
            .unwrap_err();
        assert_eq!((e.path.as_str(), e.line, e.column), ("train", 1, 3));
        // Read with the job's base, the file without index 0 keeps its indices.
        let read = parse("test", without, IndexBase::Zero).unwrap();
        assert!(read.row(0).ids().eq([2, 5]));
    }

    #[test]
    fn index_zero_in_a_one_based_file_names_its_line_in_the_whole_file() {
        let e = parse_lines(
            "big.svm",
            b"1 2:1\n0 0:1\n",
            IndexBase::One,
            40,
            Labels::Binary,
        )
        .unwrap_err();
        assert_eq!((e.line, e.column), (42, 3), "{e}");
        assert!(e.message.contains("index 0"), "{e}");
        assert_eq!(lines_before(b"a\nb\nc", 4), 2);
        assert_eq!(lines_before(b"ab\ncd\n", 6), 2);
        assert_eq!(lines_before(b"ab\ncd\n", 2), 0);
        assert_eq!(first_index_zero(b"1 1:1\n1 00:1\n"), Some((2, 3)));
        assert_eq!(first_index_zero(b"0 1:0 10:1 20:0\n"), None);
    }

    #[test]
    fn bad_input_names_file_line_column_and_what_was_expected() {
        assert_eq!(
            err("1 1:1\n1 2:1 abc\n"),
            "t.svm:2:7: expected 'index:value', found 'abc'"
        );
        assert_eq!(
            err("yes 1:1\n"),
            "t.svm:1:1: expected a numeric label, found 'yes'"
        );
        assert_eq!(
            err("1 2:x\n"),
            "t.svm:1:5: expected a numeric value after ':', found 'x'"
        );
        assert!(
            err("1 18446744073709551616:1\n")
                .starts_with("t.svm:1:3: index '18446744073709551616' is out of range")
        );
        assert!(err("1 18446744073709551615:1\n").contains("out of range"));
        // MAX_KEY itself is the intercept's, never a feature's.
        assert!(err("1 18446744073709551614:1\n").contains("out of range"));
        assert!(parse("t", b"1 18446744073709551613:1\n", IndexBase::Zero).is_ok());
        assert!(err("1 5:1 3:1\n").contains("indices must increase"));
        assert_eq!(err("1 a:1\n"), "t.svm:1:3: expected an index, found 'a'");
        assert!(err("1 1:inf\n").contains("expected a numeric value"));
    }

    #[test]
    fn missing_and_empty_files_are_errors_naming_the_file() {
        let e = read(Path::new("/nonexistent/x.svm"), IndexBase::Auto).unwrap_err();
        assert!(
            e.to_string().starts_with("/nonexistent/x.svm: cannot read"),
            "{e}"
        );
        let dir = std::env::temp_dir().join(format!("pserver-libsvm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.svm");
        std::fs::write(&empty, "# only a comment\n").unwrap();
        let e = read(&empty, IndexBase::Auto).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("no examples: the file is empty or holds only comments")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_shipped_adult_data_reads_whole() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/adult");
        let train = read(&dir.join("adult.train.svm.gz"), IndexBase::Auto).unwrap();
        let test = read(&dir.join("adult.test.svm.gz"), IndexBase::Auto).unwrap();
        assert_eq!((train.len(), test.len()), (39_073, 9_769));
        assert!(train.dimensions() <= 1 << 20);
        let positive = train.labels().iter().sum::<f32>() / train.len() as f32;
        assert!((0.2..0.3).contains(&positive), "{positive}");
        assert!((30..40).contains(&(train.nonzeros() / train.len())));
    }

    #[test]
    fn a_corrupt_gzip_file_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("pserver-gz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.svm.gz");
        std::fs::write(&bad, b"\x1f\x8bnot really gzip").unwrap();
        let e = read(&bad, IndexBase::Auto).unwrap_err().to_string();
        assert!(e.contains("bad.svm.gz: not a valid gzip file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn shards_cut_at_line_boundaries_and_cover_every_line_once() {
        let text: Vec<u8> = (0..997)
            .flat_map(|i| format!("{} {}:1\n", i % 2, i + 1).into_bytes())
            .collect();
        for shards in 1..9 {
            let mut total = 0;
            let mut end = 0;
            for s in 0..shards {
                let r = shard(&text, s, shards);
                assert_eq!(r.start, end, "shards {shards} leave a gap or overlap");
                assert!(r.start == 0 || text[r.start - 1] == b'\n');
                end = r.end;
                total += parse("t", &text[r], IndexBase::Zero).unwrap().len();
            }
            assert_eq!(end, text.len());
            assert_eq!(total, 997);
        }
    }

    /// The reader of each token in full: what every feature token read before the one-pass
    /// reader of plain pairs, and still reads the rest.
    fn by_tokens(line: &[u8]) -> Result<Vec<(u64, f32)>, LineError> {
        let mut last = None;
        let mut read = Vec::new();
        for (col, token) in (Tokens { line, at: 0 }).skip(1) {
            if let Some((index, value)) = feature(token, col, last)? {
                last = Some(index);
                read.push((index, value));
            }
        }
        Ok(read)
    }

    fn by_parser(line: &[u8]) -> Result<Vec<(u64, f32)>, LineError> {
        let mut out = Examples::new();
        parse_line(
            line,
            &mut out,
            Form {
                one_based: false,
                labels: Labels::Binary,
            },
        )?;
        Ok(out.row(0).iter().collect())
    }

    /// Plain pairs are read in one pass for speed: every token reads as the full reader of
    /// each token reads it, to the bit of each value, and whatever is wrong with a line is said
    /// as it was, at the same column.
    #[test]
    fn plain_pairs_read_in_one_pass_as_each_token_reads_in_full() {
        let edge = [
            "1 3:1 7:0.5 9:+1 10:1e3 11:.5 12:5. 13:007 014:1",
            "1 3:16777215 4:16777216 5:16777217 6:0.0000000001 7:0.00000000001",
            "1 3:1.6777215 4:1.6777217 5:123456789.5 6:0.1 7:0.3 8:2.675 9:1.1754944",
            "1 3:1\t4:2\r",
            "1 999999999999999999:1",
            "1 9999999999999999999:1",
            "1 99999999999999999999:1",
            "1 3:1x 4:1",
            "1 3:1:2",
            "1 3:- 4:1",
            "1 4:1 3:1",
            "1 4:1 3:x",
            "1 4:1 4:1",
            "1 qid:7 3:1",
            "1 3:1 qid:9 4:1",
            "1 a:1",
            "1 3",
            "1 3: 4:1",
        ];
        for line in edge {
            assert_eq!(
                by_parser(line.as_bytes()),
                by_tokens(line.as_bytes()),
                "{line}"
            );
        }
        proptest::proptest!(|(m in 0u64..1 << 25, places in 0usize..13, index in 0u64..1 << 40)| {
            let digits = format!("{m:0width$}", width = places + 1);
            let (whole, fraction) = digits.split_at(digits.len() - places);
            let value = if places == 0 { whole.to_owned() } else { format!("{whole}.{fraction}") };
            let line = format!("0 {index}:{value} {}:{value}", index + 1);
            let read = by_parser(line.as_bytes()).unwrap();
            let expect: f32 = value.parse().unwrap();
            proptest::prop_assert_eq!(read[0].1.to_bits(), expect.to_bits(), "{}", line);
            proptest::prop_assert_eq!(read, by_tokens(line.as_bytes()).unwrap());
        });
    }
}
