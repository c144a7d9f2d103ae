//! `pserver gen`: synthetic click-like data in LIBSVM form.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use super::CliError;
use crate::data::libsvm::IndexBase;
use crate::data::synthetic::{GenConfig, Shape, write};

/// Generate synthetic click-like data in LIBSVM form: binary features with power-law
/// frequencies, labels drawn from a known true logistic model. Indices count from 0 unless
/// --index-base 1 (what liblinear requires).
///
/// The same arguments always give the same file; a name ending in .gz is compressed.
#[derive(clap::Args, Debug)]
pub(crate) struct GenArgs {
    /// Rows to write.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    rows: u64,
    /// Features (the dimension of the problem).
    #[arg(long, default_value_t = 1 << 22, value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    features: u64,
    /// Distinct features per row.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    per_row: u32,
    /// Seed of the true model and of the rows.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Number of the first row: a test set is the same seed with rows after the training set's.
    #[arg(long, default_value_t = 0)]
    first_row: u64,
    /// Output file (.gz to compress).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// The index of the first feature: 0, or 1 for tools that require one-based files
    /// (liblinear). `auto` is for reading files, not writing them.
    #[arg(long, value_enum, default_value = "0")]
    index_base: IndexBase,
    /// What a row looks like: click (binary features) or text (words valued by TF-IDF, each
    /// row of length 1; use --features 100000 --per-row 90 for a set shaped like reviews).
    #[arg(long, value_enum, default_value = "click")]
    shape: Shape,
}

/// Runs `pserver gen`: writes the rows to the output file.
pub(crate) fn run(args: GenArgs) -> Result<(), CliError> {
    if args.index_base == IndexBase::Auto {
        return Err(CliError::input(
            "--index-base auto: a written file counts its indices from 0 or from 1; give --index-base 0 or 1",
        ));
    }
    let cfg = GenConfig {
        rows: args.rows,
        features: args.features,
        per_row: args.per_row as usize,
        seed: args.seed,
        first_row: args.first_row,
        one_based: args.index_base == IndexBase::One,
        shape: args.shape,
    };
    let out = args.out.display();
    let mut file = File::create(&args.out)
        .map(BufWriter::new)
        .map_err(|e| CliError::input(format!("{out}: cannot create: {e}")))?;
    let written = if args.out.extension().is_some_and(|e| e == "gz") {
        let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        write(&cfg, &mut gz).and_then(|()| gz.finish().map(drop))
    } else {
        write(&cfg, &mut file)
    };
    written.map_err(|e| CliError::input(format!("{out}: cannot write: {e}")))?;
    eprintln!("gen: {} rows to {out}", cfg.rows);
    Ok(())
}
