//! Ratings files: one `(user, item, rating)` triple per line, for matrix factorization.
//!
//! Three layouts are read, told apart by the first line (and a `.csv` name):
//!
//! - MovieLens 100k `u.data`: `user item rating timestamp`, separated by tabs or spaces, no
//!   header; the fourth and later columns are ignored.
//! - MovieLens 1M/10M `ratings.dat`: `user::item::rating::timestamp`.
//! - CSV with a header line naming the columns, in any order, among others (MovieLens
//!   ml-latest `userId,movieId,rating,timestamp`). Names are matched case-insensitively:
//!   `user`, `userid` or `user_id`; `item`, `itemid`, `item_id`, `movie`, `movieid` or
//!   `movie_id`; `rating`. A CSV file without a header is read as `user,item,rating,...`.
//!
//! The first line is a header when its third field is not a number and one of its fields is a
//! column name above. Any layout may name its columns in a header this way.
//!
//! User and item ids are strings (`"7"` and `"07"` are two users), numbered densely in the
//! order they first appear, in an [`Ids`] that the caller keeps across files: reading the
//! training file and then the test file with the same `Ids` gives a user the same number in
//! both, and numbers the users only the test file knows after the training file's.
//!
//! Every line is a rating or an error naming the file, the line and the field
//! (`u.data:17: rating: expected a number, found 'x'`); blank lines are allowed only at the
//! end of the file, and a file without ratings is an error.
//!
//! ```text
//! let mut ids = Ids::new();
//! let train = parse("train.csv", b"userId,movieId,rating\n7,10,4.5\n8,10,3\n", &mut ids)?;
//! let test = parse("u.test", b"8\t11\t5\t881250949\n", &mut ids)?;
//! assert_eq!((train[1].user, train[1].item), (1, 0));
//! assert_eq!((test[0].user, test[0].item), (1, 1)); // user 8 again; item 11 is new
//! assert_eq!((ids.users(), ids.items()), (2, 2));
//! ```

use std::collections::HashMap;
use std::path::Path;

use thiserror::Error;

use crate::data::libsvm::{DataError, read_bytes};
use crate::seeded::{mix, unit};

/// One rating: dense user and item numbers from an [`Ids`], and the rating.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rating {
    /// The user's number, from 0 in order of first appearance.
    pub user: u32,
    /// The item's number, from 0 in order of first appearance.
    pub item: u32,
    /// The rating, a finite number.
    pub value: f32,
}

/// The dense numbers given to user and item ids so far. Keep one across the files of a job so
/// that they agree on who is who.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Ids {
    users: HashMap<Box<str>, u32>,
    items: HashMap<Box<str>, u32>,
}

impl Ids {
    /// No ids yet.
    pub(crate) fn new() -> Self {
        Ids::default()
    }

    /// Ids numbered in the order given: `users[n]` is user `n`, `items[n]` item `n`. A file
    /// read with them numbers the ids they know alike, and new ones after them.
    pub(crate) fn of_names<'a>(
        users: impl IntoIterator<Item = &'a str>,
        items: impl IntoIterator<Item = &'a str>,
    ) -> Ids {
        let mut ids = Ids::new();
        for user in users {
            number(&mut ids.users, user);
        }
        for item in items {
            number(&mut ids.items, item);
        }
        ids
    }

    /// The number of user `id`, if it was seen.
    pub(crate) fn user(&self, id: &str) -> Option<u32> {
        self.users.get(id).copied()
    }

    /// The number of item `id`, if it was seen.
    pub(crate) fn item(&self, id: &str) -> Option<u32> {
        self.items.get(id).copied()
    }

    /// Every user's id, by number.
    pub(crate) fn user_names(&self) -> Vec<Box<str>> {
        names(&self.users)
    }

    /// Every item's id, by number.
    pub(crate) fn item_names(&self) -> Vec<Box<str>> {
        names(&self.items)
    }

    #[cfg(test)]
    /// Distinct users seen: they are numbered `0..users()`.
    pub(crate) fn users(&self) -> usize {
        self.users.len()
    }

    #[cfg(test)]
    /// Distinct items seen: they are numbered `0..items()`.
    pub(crate) fn items(&self) -> usize {
        self.items.len()
    }
}

/// The ids of `map` in the order of their numbers.
fn names(map: &HashMap<Box<str>, u32>) -> Vec<Box<str>> {
    let mut named: Vec<(u32, &Box<str>)> = map.iter().map(|(id, &n)| (n, id)).collect();
    named.sort_unstable();
    named.into_iter().map(|(_, id)| id.clone()).collect()
}

/// The number of `id` in `map`, giving it the next one if it is new; `None` once every `u32`
/// is taken.
fn number(map: &mut HashMap<Box<str>, u32>, id: &str) -> Option<u32> {
    if let Some(&n) = map.get(id) {
        return Some(n);
    }
    let n = u32::try_from(map.len()).ok()?;
    map.insert(id.into(), n);
    Some(n)
}

/// Why a ratings file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum RatingsError {
    /// The file could not be read or decompressed.
    #[error(transparent)]
    Read(#[from] DataError),
    /// A field of a line is missing or wrong.
    #[error("{path}:{line}: {field}: {message}")]
    Field {
        /// The file.
        path: String,
        /// The line, from 1.
        line: usize,
        /// The field: `user`, `item`, `rating` or `header`.
        field: &'static str,
        /// What was expected and what was found.
        message: String,
    },
    /// A line is not a rating at all.
    #[error("{path}:{line}: {message}")]
    Line {
        /// The file.
        path: String,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The file holds no ratings.
    #[error("{path}: no ratings")]
    Empty {
        /// The file.
        path: String,
    },
}

/// What separates the fields of a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Separator {
    Whitespace,
    Comma,
    DoubleColon,
}

impl Separator {
    /// The separator of a file whose first non-blank line is `first`; a `.csv` file is
    /// comma-separated whatever its first line says.
    fn of(first: &str, csv_name: bool) -> Self {
        if csv_name || (first.contains(',') && !first.contains("::")) {
            Separator::Comma
        } else if first.contains("::") {
            Separator::DoubleColon
        } else {
            Separator::Whitespace
        }
    }

    /// The fields `user`, `item` and `rating` (at `columns`) of `line`, `None` where the line
    /// is too short.
    fn pick<'a>(self, line: &'a str, columns: &Columns) -> [Option<&'a str>; 3] {
        match self {
            Separator::Whitespace => columns.pick(line.split_ascii_whitespace()),
            Separator::Comma => columns.pick(line.split(',').map(unquote)),
            Separator::DoubleColon => columns.pick(line.split("::").map(str::trim)),
        }
    }

    /// Every field of `line`.
    fn fields(self, line: &str) -> Vec<&str> {
        match self {
            Separator::Whitespace => line.split_ascii_whitespace().collect(),
            Separator::Comma => line.split(',').map(unquote).collect(),
            Separator::DoubleColon => line.split("::").map(str::trim).collect(),
        }
    }
}

/// A CSV field without the spaces and the double quotes around it.
fn unquote(field: &str) -> &str {
    let field = field.trim();
    field
        .strip_prefix('"')
        .and_then(|f| f.strip_suffix('"'))
        .unwrap_or(field)
}

/// Where the user, item and rating fields are in a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Columns {
    user: usize,
    item: usize,
    rating: usize,
}

/// The names a header may give each column, lower-case.
const USER_NAMES: &[&str] = &["user", "userid", "user_id"];
const ITEM_NAMES: &[&str] = &["item", "itemid", "item_id", "movie", "movieid", "movie_id"];
const RATING_NAMES: &[&str] = &["rating"];

/// The fields in the order `Columns::pick` returns them, with the names a header may use.
const FIELDS: [(&str, &[&str]); 3] = [
    ("user", USER_NAMES),
    ("item", ITEM_NAMES),
    ("rating", RATING_NAMES),
];

impl Columns {
    /// Without a header: `user item rating ...`.
    const POSITIONAL: Columns = Columns {
        user: 0,
        item: 1,
        rating: 2,
    };

    fn pick<'a>(&self, fields: impl Iterator<Item = &'a str>) -> [Option<&'a str>; 3] {
        let mut picked = [None; 3];
        for (i, field) in fields.enumerate() {
            for (slot, column) in [self.user, self.item, self.rating].into_iter().enumerate() {
                if i == column {
                    picked[slot] = Some(field);
                }
            }
        }
        picked
    }

    /// The columns a header line names, `Err` saying which one it lacks.
    fn from_header(fields: &[&str]) -> Result<Columns, String> {
        let mut found = [0; 3];
        for (slot, (field, names)) in FIELDS.into_iter().enumerate() {
            found[slot] = fields
                .iter()
                .position(|f| names.iter().any(|n| f.eq_ignore_ascii_case(n)))
                .ok_or_else(|| {
                    format!(
                        "no {field} column (expected one named {})",
                        names.join(", ")
                    )
                })?;
        }
        Ok(Columns {
            user: found[0],
            item: found[1],
            rating: found[2],
        })
    }
}

/// Whether `fields` is a header: its third field is not a number and one of its fields is a
/// column name. A first line that is neither a header nor a rating is reported as a bad rating.
fn is_header(fields: &[&str]) -> bool {
    let numeric = fields.get(2).is_some_and(|f| f.parse::<f64>().is_ok());
    !numeric
        && fields.iter().any(|f| {
            FIELDS
                .iter()
                .any(|(_, names)| names.iter().any(|n| f.eq_ignore_ascii_case(n)))
        })
}

/// `field` if it holds something, else what is wrong with it.
fn present(field: Option<&str>) -> Result<&str, String> {
    match field {
        Some(f) if !f.is_empty() => Ok(f),
        Some(_) => Err("empty".to_owned()),
        None => Err("missing (a line needs a user, an item and a rating)".to_owned()),
    }
}

/// Parses the ratings in `text`, numbering new ids in `ids`; `name` names the file in errors.
/// A name ending in `.csv` (or `.csv.gz`) makes the file comma-separated.
pub(crate) fn parse(name: &str, text: &[u8], ids: &mut Ids) -> Result<Vec<Rating>, RatingsError> {
    let csv_name = name.ends_with(".csv") || name.ends_with(".csv.gz");
    let field_error = |line: usize, field: &'static str, message: String| RatingsError::Field {
        path: name.to_owned(),
        line,
        field,
        message,
    };
    let line_error = |line: usize, message: &str| RatingsError::Line {
        path: name.to_owned(),
        line,
        message: message.to_owned(),
    };
    let mut layout: Option<(Separator, Columns)> = None;
    let mut header = false;
    // The first blank line since the last rating: an error if another rating follows, since a
    // blank line inside a file more likely means a damaged file than nothing.
    let mut blank: Option<usize> = None;
    let mut ratings = Vec::new();
    for (index, bytes) in text.split(|&b| b == b'\n').enumerate() {
        let line_no = index + 1;
        let line = std::str::from_utf8(bytes)
            .map_err(|_| line_error(line_no, "not UTF-8 text"))?
            .trim_end_matches('\r');
        if line.trim().is_empty() {
            blank.get_or_insert(line_no);
            continue;
        }
        if let Some(at) = blank {
            return Err(line_error(at, "blank line before more ratings"));
        }
        let (separator, columns) = match layout {
            Some(layout) => layout,
            None => {
                let separator = Separator::of(line, csv_name);
                let fields = separator.fields(line);
                if is_header(&fields) {
                    let columns = Columns::from_header(&fields)
                        .map_err(|message| field_error(line_no, "header", message))?;
                    layout = Some((separator, columns));
                    header = true;
                    continue;
                }
                *layout.insert((separator, Columns::POSITIONAL))
            }
        };
        let [user, item, value] = separator.pick(line, &columns);
        let required =
            |field, what| present(field).map_err(|message| field_error(line_no, what, message));
        let (user, item, value) = (
            required(user, "user")?,
            required(item, "item")?,
            required(value, "rating")?,
        );
        let rating = match value.parse::<f32>() {
            Ok(r) if r.is_finite() => r,
            Ok(_) => {
                return Err(field_error(
                    line_no,
                    "rating",
                    format!("expected a finite number, found '{value}'"),
                ));
            }
            Err(_) => {
                // A header whose names were not recognized fails here, on its first line.
                let hint = if ratings.is_empty() && !header {
                    " (a header line names its columns user, item and rating)"
                } else {
                    ""
                };
                return Err(field_error(
                    line_no,
                    "rating",
                    format!("expected a number, found '{value}'{hint}"),
                ));
            }
        };
        let too_many = |what: &'static str| {
            field_error(
                line_no,
                what,
                format!("more than {} distinct {what}s", u32::MAX),
            )
        };
        ratings.push(Rating {
            user: number(&mut ids.users, user).ok_or_else(|| too_many("user"))?,
            item: number(&mut ids.items, item).ok_or_else(|| too_many("item"))?,
            value: rating,
        });
    }
    if ratings.is_empty() {
        return Err(RatingsError::Empty {
            path: name.to_owned(),
        });
    }
    Ok(ratings)
}

/// Reads and parses the ratings file at `path` (gzip-compressed if its name ends in `.gz`),
/// numbering new ids in `ids`.
pub(crate) fn read(path: &Path, ids: &mut Ids) -> Result<Vec<Rating>, RatingsError> {
    let text = read_bytes(path)?;
    parse(&path.display().to_string(), &text, ids)
}

/// Splits `ratings` into a training and a test set: each rating goes to the test set with
/// probability `test_fraction`, decided by a hash of `seed` and its position, so the same
/// seed always holds out the same ratings. Both sets keep the file's order.
pub(crate) fn split(
    ratings: &[Rating],
    test_fraction: f64,
    seed: u64,
) -> (Vec<Rating>, Vec<Rating>) {
    let mut train = Vec::with_capacity(ratings.len());
    let mut test = Vec::new();
    for (t, &rating) in ratings.iter().enumerate() {
        if unit(mix(seed ^ mix(t as u64 ^ 0x5e1f))) < test_fraction {
            test.push(rating);
        } else {
            train.push(rating);
        }
    }
    (train, test)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example in the module's documentation, which rustdoc does not run in a binary.
    #[test]
    fn the_module_example_numbers_ids_across_files() -> Result<(), Box<dyn std::error::Error>> {
        let mut ids = Ids::new();
        let train = parse(
            "train.csv",
            b"userId,movieId,rating\n7,10,4.5\n8,10,3\n",
            &mut ids,
        )?;
        let test = parse("u.test", b"8\t11\t5\t881250949\n", &mut ids)?;
        assert_eq!((train[1].user, train[1].item), (1, 0));
        assert_eq!((test[0].user, test[0].item), (1, 1)); // user 8 again; item 11 is new
        assert_eq!((ids.users(), ids.items()), (2, 2));
        Ok(())
    }

    fn ok(name: &str, text: &str, ids: &mut Ids) -> Vec<(u32, u32, f32)> {
        parse(name, text.as_bytes(), ids)
            .unwrap()
            .into_iter()
            .map(|r| (r.user, r.item, r.value))
            .collect()
    }

    fn err(name: &str, text: &str) -> String {
        parse(name, text.as_bytes(), &mut Ids::new())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn movielens_u_data_is_read_tab_or_space_separated() {
        let mut ids = Ids::new();
        let text = "196\t242\t3\t881250949\n186  302 3 891717742\r\n196\t302\t1\t878887116\n\n";
        let got = ok("u.data", text, &mut ids);
        assert_eq!(got, [(0, 0, 3.0), (1, 1, 3.0), (0, 1, 1.0)]);
        assert_eq!((ids.users(), ids.items()), (2, 2));
    }

    #[test]
    fn csv_columns_are_found_by_header_name_in_any_order_and_case() {
        let mut ids = Ids::new();
        let text = "timestamp,movieId,Rating,userId\n9,m1,4.5,u1\n9,m2,3,u1\n";
        let got = ok("ratings.csv", text, &mut ids);
        assert_eq!(got, [(0, 0, 4.5), (0, 1, 3.0)]);
        let snake = ok(
            "x",
            "user_id,item_id,rating\n\"a\", \"b\" ,2\n",
            &mut Ids::new(),
        );
        assert_eq!(snake, [(0, 0, 2.0)]);
    }

    #[test]
    fn a_header_is_told_from_ratings_by_its_first_line() {
        // Comma-separated without a header: positional, like u.data.
        let got = ok("r.txt", "1,2,5\n2,2,4\n", &mut Ids::new());
        assert_eq!(got, [(0, 0, 5.0), (1, 0, 4.0)]);
        // A .csv name with a numeric first line has no header either.
        assert_eq!(ok("r.csv", "1,2,5\n", &mut Ids::new()), [(0, 0, 5.0)]);
        // A whitespace-separated header counts too.
        let got = ok(
            "r.txt",
            "user item rating\nalice matrix 5\n",
            &mut Ids::new(),
        );
        assert_eq!(got, [(0, 0, 5.0)]);
        // MovieLens 1M.
        let got = ok("ratings.dat", "1::1193::5::978300760\n", &mut Ids::new());
        assert_eq!(got, [(0, 0, 5.0)]);
    }

    #[test]
    fn ids_are_shared_between_train_and_test_files() {
        let mut ids = Ids::new();
        let train = ok("train", "10 100 1\n20 200 2\n10 200 3\n", &mut ids);
        let test = ok("test", "20 100 4\n30 100 5\n10 300 1\n", &mut ids);
        assert_eq!(train, [(0, 0, 1.0), (1, 1, 2.0), (0, 1, 3.0)]);
        // Known ids keep their numbers; unseen ones come after the training file's.
        assert_eq!(test, [(1, 0, 4.0), (2, 0, 5.0), (0, 2, 1.0)]);
        assert_eq!((ids.users(), ids.items()), (3, 3));
    }

    #[test]
    fn bad_lines_are_errors_naming_file_line_and_field() {
        let text = "1\t2\t3\t0\n1\t2\tx\t0\n";
        assert_eq!(
            err("u.data", text),
            "u.data:2: rating: expected a number, found 'x'"
        );
        for bad in ["NaN", "inf", "-inf"] {
            let e = err("u.data", &format!("1 2 {bad}\n"));
            assert_eq!(
                e,
                format!("u.data:1: rating: expected a finite number, found '{bad}'")
            );
        }
        assert!(err("u.data", "1 2 3\n4 5\n").starts_with("u.data:2: rating: missing"));
        assert!(err("u.data", "1\n").starts_with("u.data:1: item: missing"));
        assert_eq!(
            err("r.csv", "user,item,rating\n,2,3\n"),
            "r.csv:2: user: empty"
        );
        assert_eq!(
            err("r.csv", "uid,iid,score\n1,2,3\n"),
            "r.csv:1: rating: expected a number, found 'score' \
             (a header line names its columns user, item and rating)"
        );
        let missing = err("r.csv", "userId,rating\n1,2\n");
        assert!(
            missing.starts_with("r.csv:1: header: no item column"),
            "{missing}"
        );
        assert_eq!(
            err("u.data", "1 2 3\n\n4 5 6\n"),
            "u.data:2: blank line before more ratings"
        );
        assert_eq!(
            parse("u.data", b"1 2 3\n\xff 2 3\n", &mut Ids::new())
                .unwrap_err()
                .to_string(),
            "u.data:2: not UTF-8 text"
        );
    }

    #[test]
    fn a_file_without_ratings_is_an_error_naming_it() {
        for empty in ["", "\n\n", "userId,movieId,rating,timestamp\n"] {
            assert_eq!(
                err("empty.csv", empty),
                "empty.csv: no ratings",
                "{empty:?}"
            );
        }
    }

    #[test]
    fn a_split_is_seeded_and_keeps_every_rating_once() {
        let ratings: Vec<Rating> = (0..1000)
            .map(|t| Rating {
                user: t,
                item: 0,
                value: 1.0,
            })
            .collect();
        let (train, test) = split(&ratings, 0.1, 7);
        assert_eq!(train.len() + test.len(), 1000);
        assert!((60..140).contains(&test.len()), "{}", test.len());
        let mut users: Vec<u32> = train.iter().chain(&test).map(|r| r.user).collect();
        users.sort_unstable();
        assert_eq!(users, (0..1000).collect::<Vec<_>>());
        assert_eq!(split(&ratings, 0.1, 7), (train.clone(), test.clone()));
        assert_ne!(split(&ratings, 0.1, 8).1, test);
    }
}
