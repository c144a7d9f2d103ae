//! Parsers of option values that several commands share. Each refuses what the option cannot
//! mean, so that clap reports it as one line naming the flag, with exit status 2, before any
//! work starts: `f64`'s own parser takes `NaN`, `inf` and negative numbers.

/// A probability in [0, 1): of losing a message, say.
pub(super) fn probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..1.0).contains(&p) => Ok(p),
        _ => Err(format!("`{s}` is not a probability in [0, 1)")),
    }
}

/// A slowdown factor between 1 and 1000.
pub(super) fn factor(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (1.0..=1000.0).contains(&f) => Ok(f),
        _ => Err(format!("`{s}` is not a slowdown factor between 1 and 1000")),
    }
}

/// A finite number above 0: a learning rate, say.
pub(super) fn positive_finite(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("`{s}` is not a finite number above 0")),
    }
}

/// A finite number of at least 0: a regularization strength, say.
pub(super) fn non_negative_finite(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("`{s}` is not a finite number of at least 0")),
    }
}

/// A filter threshold: a finite number of at least 0.
pub(super) fn threshold(s: &str) -> Result<pserver_core::filter::Threshold, String> {
    s.parse::<f64>()
        .ok()
        .and_then(pserver_core::filter::Threshold::new)
        .ok_or_else(|| format!("`{s}` is not a finite number of at least 0"))
}

/// The KKT filter as BOUND:EVERY: a bound of at least 0, and a full check every EVERY (at
/// least 1) pushes.
pub(super) fn kkt(s: &str) -> Result<pserver_core::filter::Kkt, String> {
    let bad = || {
        format!(
            "`{s}` is not BOUND:EVERY, a number of at least 0 and a whole number of pushes of at least 1"
        )
    };
    let (bound, every) = s.split_once(':').ok_or_else(bad)?;
    let bound = threshold(bound).map_err(|_| bad())?;
    let every = every.parse::<u32>().map_err(|_| bad())?;
    pserver_core::filter::Kkt::new(bound, every).ok_or_else(bad)
}

/// Key caching's lists per peer: a whole number of at least 1.
pub(super) fn key_caching(s: &str) -> Result<pserver_core::filter::KeyCaching, String> {
    s.parse::<u32>()
        .ok()
        .and_then(pserver_core::filter::KeyCaching::new)
        .ok_or_else(|| format!("`{s}` is not a whole number of lists of at least 1"))
}

/// A number strictly between 0 and 1: an error bound or a failure probability.
pub(super) fn open_unit(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x < 1.0 => Ok(x),
        _ => Err(format!("`{s}` is not a number strictly between 0 and 1")),
    }
}

/// A range of staleness bounds, `MIN:MAX` with `MIN <= MAX`: where adaptive tau moves.
pub(super) fn tau_range(s: &str) -> Result<pserver_core::pace::TauRange, String> {
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
    Ok(pserver_core::pace::TauRange { min, max })
}

/// `W:F`: worker `W` (from 0) computing `F` times slower (see [`factor`]).
pub(super) fn slow_worker(s: &str) -> Result<crate::apps::lr::SlowWorker, String> {
    let bad = || {
        format!(
            "`{s}` is not W:F, a worker (from 0) and how many times slower it computes (1 to 1000), e.g. 0:4"
        )
    };
    let (worker, f) = s.split_once(':').ok_or_else(bad)?;
    let worker = worker.parse().map_err(|_| bad())?;
    let factor = factor(f).map_err(|_| bad())?;
    Ok(crate::apps::lr::SlowWorker { worker, factor })
}

/// A whole number of at least 1, as a `usize`, which clap's ranged parsers do not give: a
/// batch size, a byte limit, a thread count.
pub(super) fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a whole number of at least 1")),
    }
}

/// A file to write when the work is done: refused at once if it could never be written (its
/// directory missing, or a directory in its place), rather than after hours of training.
pub(super) fn output_file(s: &str) -> Result<std::path::PathBuf, String> {
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

/// `MIN_BYTES:AT_ONCE`: push slices of at least `MIN_BYTES` bytes wait for one of `AT_ONCE`
/// slots per server (ARCHITECTURE.md §9).
pub(super) fn push_slots(s: &str) -> Result<pserver_core::slots::PushSlots, String> {
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
    Ok(pserver_core::slots::PushSlots { min_bytes, at_once })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_infinity_and_out_of_range_numbers_are_refused() {
        for bad in ["NaN", "nan", "inf", "-inf", "-1", "x", ""] {
            assert!(positive_finite(bad).is_err(), "{bad}");
            assert!(non_negative_finite(bad).is_err(), "{bad}");
            assert!(open_unit(bad).is_err(), "{bad}");
        }
        assert!(positive_finite("0").is_err());
        assert_eq!(positive_finite("0.3"), Ok(0.3));
        assert_eq!(non_negative_finite("0"), Ok(0.0));
        assert_eq!(non_negative_finite("1e-3"), Ok(1e-3));
        assert!(open_unit("0").is_err() && open_unit("1").is_err());
        assert_eq!(open_unit("0.01"), Ok(0.01));
    }

    #[test]
    fn a_count_must_be_at_least_one() {
        for bad in ["0", "-1", "1.5", "x"] {
            assert!(at_least_one(bad).is_err(), "{bad}");
        }
        assert_eq!(at_least_one("100"), Ok(100));
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
