//! The values options take, each defined once (ARCHITECTURE.md §13): a type, the one check of
//! what it may mean, and its spelling on the command line. Clap parses a flag through the
//! type's `FromStr`; the cluster file reads the number or word and hands it to the same
//! constructor, so a value is refused alike wherever it is given, with one line that says what
//! it must be.
//!
//! `f64`'s own parser takes `NaN`, `inf` and negative numbers, which no option here can mean.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use pserver_core::filter::{KeyCaching, Threshold};
use pserver_core::pace::TauRange;
use pserver_core::slots::PushSlots;
use serde::Deserialize;

/// Declares a newtype over `f64` whose values pass `check`, with `new`, `get`, `FromStr` and
/// `Display`.
macro_rules! number {
    ($(#[$doc:meta])* $name:ident, $what:literal, |$x:ident| $check:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
        pub(crate) struct $name(f64);

        impl $name {
            /// The value, if it is one this type may hold.
            pub(crate) fn new($x: f64) -> Result<Self, String> {
                if $check {
                    Ok($name($x))
                } else {
                    Err(format!("{} is not {}", $x, $what))
                }
            }

            /// The number.
            pub(crate) fn get(self) -> f64 {
                self.0
            }
        }

        impl FromStr for $name {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                s.parse::<f64>()
                    .map_err(|_| format!("`{s}` is not {}", $what))
                    .and_then(|x| $name::new(x).map_err(|_| format!("`{s}` is not {}", $what)))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

number!(
    /// A probability in [0, 1): of losing a message, say.
    Probability,
    "a probability in [0, 1)",
    |x| (0.0..1.0).contains(&x)
);

number!(
    /// How many times slower something computes than it could: 1 to 1000.
    Factor,
    "a slowdown factor between 1 and 1000",
    |x| (1.0..=1000.0).contains(&x)
);

number!(
    /// A learning rate or its scale: a finite number above 0.
    Rate,
    "a finite number above 0",
    |x| x.is_finite() && x > 0.0
);

number!(
    /// A regularization strength: a finite number of at least 0.
    Strength,
    "a finite number of at least 0",
    |x| x.is_finite() && x >= 0.0
);

number!(
    /// A number strictly between 0 and 1: an error bound or a failure probability.
    Fraction,
    "a number strictly between 0 and 1",
    |x| x > 0.0 && x < 1.0
);

number!(
    /// A span of time in seconds: a finite number above 0.
    Seconds,
    "a finite number of seconds above 0",
    |x| x.is_finite() && x > 0.0
);

impl Probability {
    /// Never.
    pub(crate) const ZERO: Probability = Probability(0.0);
}

impl Factor {
    /// No slower than it can.
    pub(crate) const ONE: Factor = Factor(1.0);
}

impl Seconds {
    /// The span as a duration.
    pub(crate) fn duration(self) -> Duration {
        Duration::from_secs_f64(self.get())
    }
}

/// A whole number of at least 1, as a `usize`, which clap's ranged parsers do not give: a
/// batch size, a byte limit, a thread count.
/// A label as a LIBSVM file writes it (`--positive`): any finite number.
pub(crate) fn label(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!(
            "expected a label as the data writes it (a number), found '{s}'"
        )),
    }
}

pub(crate) fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a whole number of at least 1")),
    }
}

/// A file to write when the work is done: refused at once if it could never be written (its
/// directory missing, or a directory in its place), rather than after hours of training.
pub(crate) fn output_file(s: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::PathBuf::from(s);
    if path.is_dir() {
        return Err(format!("`{s}` is a directory"));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!("directory `{}` does not exist", dir.display()));
    }
    Ok(path)
}

/// `W:F`: worker `W` (from 0, in node order) computing `F` times slower than it can.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SlowWorker {
    /// Which worker, from 0.
    pub(crate) worker: usize,
    /// How many times slower.
    pub(crate) factor: Factor,
}

impl FromStr for SlowWorker {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "`{s}` is not W:F, a worker (from 0) and how many times slower it computes (1 to 1000), e.g. 0:4"
            )
        };
        let (worker, factor) = s.split_once(':').ok_or_else(bad)?;
        Ok(SlowWorker {
            worker: worker.parse().map_err(|_| bad())?,
            factor: factor.parse().map_err(|_| bad())?,
        })
    }
}

/// How often the KKT filter makes a full check: every EVERY-th push of a worker, at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KktEvery(u32);

impl KktEvery {
    /// The full check's period, if it is at least 1 push.
    pub(crate) fn new(every: u32) -> Result<Self, String> {
        if every >= 1 {
            Ok(KktEvery(every))
        } else {
            Err(format!(
                "{every} is not a whole number of pushes of at least 1"
            ))
        }
    }

    /// Pushes between full checks.
    pub(crate) fn get(self) -> u32 {
        self.0
    }
}

impl FromStr for KktEvery {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a whole number of pushes of at least 1");
        KktEvery::new(s.parse().map_err(|_| bad())?).map_err(|_| bad())
    }
}

/// A filter threshold from a number: finite and at least 0.
pub(crate) fn threshold_of(theta: f64) -> Result<Threshold, String> {
    Threshold::new(theta).ok_or_else(|| format!("{theta} is not a finite number of at least 0"))
}

/// A filter threshold from the command line: see [`threshold_of`].
pub(crate) fn threshold(s: &str) -> Result<Threshold, String> {
    s.parse::<f64>()
        .map_err(|_| format!("`{s}` is not a finite number of at least 0"))
        .and_then(|x| {
            threshold_of(x).map_err(|_| format!("`{s}` is not a finite number of at least 0"))
        })
}

/// Key caching's lists per peer from a number: at least 1.
pub(crate) fn key_caching_of(lists: u32) -> Result<KeyCaching, String> {
    KeyCaching::new(lists)
        .ok_or_else(|| format!("{lists} is not a whole number of lists of at least 1"))
}

/// Key caching's lists per peer from the command line: see [`key_caching_of`].
pub(crate) fn key_caching(s: &str) -> Result<KeyCaching, String> {
    let bad = || format!("`{s}` is not a whole number of lists of at least 1");
    key_caching_of(s.parse().map_err(|_| bad())?).map_err(|_| bad())
}

/// A range of staleness bounds, `MIN:MAX` with `MIN <= MAX`: where adaptive tau moves.
pub(crate) fn tau_range(s: &str) -> Result<TauRange, String> {
    let bad =
        || format!("`{s}` is not a range of tau MIN:MAX (whole numbers, MIN <= MAX), e.g. 1:8");
    let (min, max) = s.split_once(':').ok_or_else(bad)?;
    let (min, max) = (
        min.parse().map_err(|_| bad())?,
        max.parse().map_err(|_| bad())?,
    );
    if min > max {
        return Err(bad());
    }
    Ok(TauRange { min, max })
}

/// `MIN_BYTES:AT_ONCE`: push slices of at least `MIN_BYTES` bytes wait for one of `AT_ONCE`
/// slots per server (ARCHITECTURE.md §9).
pub(crate) fn push_slots(s: &str) -> Result<PushSlots, String> {
    let bad = || {
        format!(
            "`{s}` is not MIN_BYTES:AT_ONCE, the smallest push slice that waits for a slot and the slots a server grants at once (at least 1), e.g. 65536:1"
        )
    };
    let (min_bytes, at_once) = s.split_once(':').ok_or_else(bad)?;
    let (min_bytes, at_once) = (
        min_bytes.parse().map_err(|_| bad())?,
        at_once.parse().map_err(|_| bad())?,
    );
    if at_once == 0 {
        return Err(bad());
    }
    Ok(PushSlots { min_bytes, at_once })
}

// The variants below have no doc comment: clap would print it under the option, whose own
// help already explains each choice.

/// How nodes talk: channels inside one process, or authenticated TCP connections, or UDP
/// datagrams. The cluster file's `transport` and every command's `--transport` or
/// `--transports` take these names.
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Transport {
    #[value(help = None)]
    Mem,
    #[value(help = None)]
    Tcp,
    #[value(help = None)]
    Udp,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Mem => "mem",
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
        })
    }
}

/// The servers' update rule, as `--updater` and the cluster file's `job.updater` name it:
/// ftrl (FTRL-Proximal), adagrad, sgd, or sum (values added as they come, for checking).
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum UpdateRule {
    #[value(help = None)]
    Ftrl,
    #[value(help = None)]
    Adagrad,
    #[value(help = None)]
    Sgd,
    #[value(help = None)]
    Sum,
}

impl UpdateRule {
    /// The rule of a logistic-regression job, which learns by ftrl, adagrad or sgd; `sum`
    /// would add the gradients to the weights as they come and learn nothing.
    pub(crate) fn lr_rule(self) -> Result<crate::apps::lr::Rule, String> {
        use crate::apps::lr::Rule;
        match self {
            UpdateRule::Ftrl => Ok(Rule::Ftrl),
            UpdateRule::Adagrad => Ok(Rule::Adagrad),
            UpdateRule::Sgd => Ok(Rule::Sgd),
            UpdateRule::Sum => Err(
                "sum adds gradients to the weights as they come and learns nothing: logistic regression takes ftrl, adagrad or sgd".to_owned(),
            ),
        }
    }
}

impl fmt::Display for UpdateRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UpdateRule::Ftrl => "ftrl",
            UpdateRule::Adagrad => "adagrad",
            UpdateRule::Sgd => "sgd",
            UpdateRule::Sum => "sum",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_infinity_and_out_of_range_numbers_are_refused() {
        for bad in ["NaN", "nan", "inf", "-inf", "-1", "x", ""] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
            assert!(bad.parse::<Strength>().is_err(), "{bad}");
            assert!(bad.parse::<Fraction>().is_err(), "{bad}");
            assert!(bad.parse::<Seconds>().is_err(), "{bad}");
            assert!(bad.parse::<Probability>().is_err(), "{bad}");
            assert!(bad.parse::<Factor>().is_err(), "{bad}");
        }
        assert!("0".parse::<Rate>().is_err());
        assert_eq!("0.3".parse::<Rate>().map(Rate::get), Ok(0.3));
        assert_eq!("0".parse::<Strength>().map(Strength::get), Ok(0.0));
        assert_eq!("1e-3".parse::<Strength>().map(Strength::get), Ok(1e-3));
        assert!("0".parse::<Fraction>().is_err() && "1".parse::<Fraction>().is_err());
        assert_eq!("0.01".parse::<Fraction>().map(Fraction::get), Ok(0.01));
        assert!("1".parse::<Probability>().is_err());
        assert!("0.5".parse::<Factor>().is_err() && "1001".parse::<Factor>().is_err());
    }

    #[test]
    fn the_command_line_and_the_cluster_file_refuse_a_value_alike() {
        // The same constructor sits behind both; the command line quotes what was typed.
        assert_eq!(
            Rate::new(-1.0).unwrap_err(),
            "-1 is not a finite number above 0"
        );
        assert_eq!(
            "-1".parse::<Rate>().unwrap_err(),
            "`-1` is not a finite number above 0"
        );
        assert!(threshold_of(f64::NAN).is_err() && threshold("NaN").is_err());
        assert!(key_caching_of(0).is_err() && key_caching("0").is_err());
        assert!(KktEvery::new(0).is_err() && "0".parse::<KktEvery>().is_err());
        assert_eq!("500".parse::<KktEvery>().map(KktEvery::get), Ok(500));
    }

    #[test]
    fn a_slow_worker_is_a_worker_and_a_factor() {
        let slow: SlowWorker = "1:4".parse().unwrap();
        assert_eq!((slow.worker, slow.factor.get()), (1, 4.0));
        for bad in ["4", "1:0.5", "x:4", "1:", ":4"] {
            assert!(bad.parse::<SlowWorker>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_count_must_be_at_least_one() {
        for bad in ["0", "-1", "1.5", "x"] {
            assert!(at_least_one(bad).is_err(), "{bad}");
        }
        assert_eq!(at_least_one("100"), Ok(100));
    }

    #[test]
    fn a_range_of_tau_and_push_slots_are_refused_when_they_cannot_mean_anything() {
        assert_eq!(tau_range("1:8"), Ok(TauRange { min: 1, max: 8 }));
        assert!(tau_range("8:1").is_err() && tau_range("1").is_err());
        assert!(push_slots("65536:0").is_err());
        assert_eq!(
            push_slots("65536:2"),
            Ok(PushSlots {
                min_bytes: 65536,
                at_once: 2
            })
        );
    }

    #[test]
    fn an_output_file_that_could_never_be_written_is_refused() {
        assert!(output_file("model.bin").is_ok());
        let tmp = std::env::temp_dir();
        assert!(output_file(&tmp.join("m.bin").display().to_string()).is_ok());
        let e = output_file("/nonexistent-pserver-dir/m.bin").unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        let e = output_file(&tmp.display().to_string()).unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
    }
}
