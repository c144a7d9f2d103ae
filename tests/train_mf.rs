//! `pserver train mf` on ratings files, as a user runs it: MovieLens and CSV files written here
//! from a known low-rank model, and the errors a bad file gives.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A directory of its own for one test, removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("pserver-train-mf-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pserver(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pserver"))
        .args(args)
        .output()
        .unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// SplitMix64: the test's own seeded randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.unit(), self.unit());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// `n` ratings of `users` x `items` from a rank-3 model plus user and item biases and noise,
/// rounded to the stars 1 to 5 as MovieLens ratings are: (user, item, stars).
fn low_rank_ratings(users: usize, items: usize, n: usize, seed: u64) -> Vec<(usize, usize, u8)> {
    let mut rng = Rng(seed);
    let mut factors = |count: usize| -> Vec<[f64; 4]> {
        (0..count)
            .map(|_| {
                [
                    0.5 * rng.normal(),
                    0.6 * rng.normal(),
                    0.6 * rng.normal(),
                    0.6 * rng.normal(),
                ]
            })
            .collect()
    };
    let (p, q) = (factors(users), factors(items));
    (0..n)
        .map(|_| {
            let (u, i) = (
                (rng.next() % users as u64) as usize,
                (rng.next() % items as u64) as usize,
            );
            let taste: f64 = (1..4).map(|j| p[u][j] * q[i][j]).sum();
            let x = 3.5 + p[u][0] + q[i][0] + taste + 0.4 * rng.normal();
            (u, i, x.round().clamp(1.0, 5.0) as u8)
        })
        .collect()
}

/// A MovieLens `u.data`: `user item rating timestamp`, tab-separated, ids from 1.
fn movielens(ratings: &[(usize, usize, u8)]) -> String {
    ratings
        .iter()
        .enumerate()
        .map(|(t, (u, i, r))| format!("{}\t{}\t{r}\t{}\n", u + 1, i + 1, 874_724_710 + t))
        .collect()
}

/// `rows` in ml-latest's CSV layout, with string ids (`u7`, `m3`) and a header.
fn csv(rows: &[(usize, usize, u8)]) -> String {
    let mut text = String::from("userId,movieId,rating,timestamp\n");
    for (u, i, r) in rows {
        text += &format!("u{u},m{i},{r}.0,1112486027\n");
    }
    text
}

/// One `iter=` line of the output.
#[derive(Debug)]
struct Epoch {
    iter: u32,
    train_rmse: f64,
    test_rmse: f64,
    baseline_rmse: f64,
}

/// The epochs a successful run printed, and its stderr.
fn trained(args: &[&str]) -> (Vec<Epoch>, String) {
    let out = pserver(args);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{args:?}: {err}");
    let epochs = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let field = |name: &str| -> f64 {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_else(|| panic!("no {name} in {line}"))
                    .parse()
                    .unwrap()
            };
            for name in ["secs", "rows_per_sec"] {
                field(name);
            }
            Epoch {
                iter: field("iter") as u32,
                train_rmse: field("train_rmse"),
                test_rmse: field("test_rmse"),
                baseline_rmse: field("baseline_rmse"),
            }
        })
        .collect();
    eprintln!("{args:?}: {epochs:?}");
    (epochs, err)
}

/// Runs `args`, expects exit status 2 and an error message holding every one of `what`.
fn refused(args: &[&str], what: &[&str]) {
    let out = pserver(args);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert_eq!(err.matches("error:").count(), 1, "{args:?}: {err}");
    for w in what {
        assert!(err.contains(w), "{args:?}: wanted {w:?} in {err}");
    }
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

/// Ratings shaped like MovieLens 100k: 943 users and 1,682 items, some users far more active
/// and some items far more popular than others, user and item biases, rank-3 taste, noise,
/// whole stars.
fn movielens_shaped(n: usize, seed: u64) -> Vec<(usize, usize, u8)> {
    let (users, items) = (943, 1682);
    let mut rng = Rng(seed);
    let mut factors = |count: usize| -> Vec<[f64; 4]> {
        (0..count)
            .map(|_| {
                [
                    0.4 * rng.normal(),
                    0.5 * rng.normal(),
                    0.5 * rng.normal(),
                    0.5 * rng.normal(),
                ]
            })
            .collect()
    };
    let (p, q) = (factors(users), factors(items));
    (0..n)
        .map(|_| {
            let u = ((users as f64 * rng.unit().powi(2)) as usize).min(users - 1);
            let i = ((items as f64 * rng.unit().powi(3)) as usize).min(items - 1);
            let taste: f64 = (1..4).map(|j| p[u][j] * q[i][j]).sum();
            let x = 3.5 + p[u][0] + q[i][0] + taste + 0.5 * rng.normal();
            (u, i, x.round().clamp(1.0, 5.0) as u8)
        })
        .collect()
}

/// The textbook biased model trained by per-rating SGD in one thread (Koren, Bell and
/// Volinsky), as its users run it: a tenth of `train` held out, up to `epochs` epochs, the
/// epoch of the lowest RMSE on those held-out ratings kept; its test RMSE. Rank 0 is the
/// bias-only model.
fn reference_rmse(
    train: &[(usize, usize, u8)],
    test: &[(usize, usize, u8)],
    rank: usize,
    epochs: usize,
) -> f64 {
    let (lr, l2) = (0.02, 0.05);
    let (held, fit) = train.split_at(train.len() / 10);
    let mean = fit.iter().map(|r| f64::from(r.2)).sum::<f64>() / fit.len() as f64;
    let mut rng = Rng(7);
    let mut factors = |n: usize| -> Vec<Vec<f64>> {
        (0..n)
            .map(|_| (0..rank).map(|_| 0.1 * rng.normal()).collect())
            .collect()
    };
    let (mut p, mut q) = (factors(943), factors(1682));
    let (mut bu, mut bi) = (vec![0.0; 943], vec![0.0; 1682]);
    let mut order: Vec<usize> = (0..fit.len()).collect();
    let mut rng = Rng(8);
    let (mut best_held, mut kept) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..epochs {
        for k in (1..order.len()).rev() {
            order.swap(k, (rng.next() % (k as u64 + 1)) as usize);
        }
        for &at in &order {
            let (u, i, r) = fit[at];
            let dot: f64 = p[u].iter().zip(&q[i]).map(|(a, b)| a * b).sum();
            let e = f64::from(r) - (mean + bu[u] + bi[i] + dot);
            bu[u] += lr * (e - l2 * bu[u]);
            bi[i] += lr * (e - l2 * bi[i]);
            for j in 0..rank {
                let (pj, qj) = (p[u][j], q[i][j]);
                p[u][j] += lr * (e * qj - l2 * pj);
                q[i][j] += lr * (e * pj - l2 * qj);
            }
        }
        let rmse = |ratings: &[(usize, usize, u8)]| {
            let squared: f64 = ratings
                .iter()
                .map(|&(u, i, r)| {
                    let dot: f64 = p[u].iter().zip(&q[i]).map(|(a, b)| a * b).sum();
                    (f64::from(r) - (mean + bu[u] + bi[i] + dot)).powi(2)
                })
                .sum();
            (squared / ratings.len() as f64).sqrt()
        };
        let on_held = rmse(held);
        if on_held < best_held {
            (best_held, kept) = (on_held, rmse(test));
        }
    }
    kept
}

/// The target for matrix factorization, on MovieLens-100k-shaped ratings split 90/10: with
/// its defaults (a tenth of the training ratings held out, early stopping on them, the best
/// epoch saved), `pserver train mf` beats a bias-only model and comes within 0.01 of the
/// textbook biased model trained per rating, both of those choosing their epoch of 30 on a
/// tenth of the training ratings as pserver does.
#[test]
fn defaults_beat_a_bias_only_model_and_come_within_0_01_of_a_reference_biased_mf() {
    let dir = Scratch::new("reference");
    let ratings = movielens_shaped(100_000, 5);
    let (test, train) = ratings.split_at(10_000);
    let train_file = dir.file("train.data", &movielens(train));
    let test_file = dir.file("test.data", &movielens(test));
    let model = dir.0.join("m.mf");
    let out = pserver(&[
        "train",
        "mf",
        "--data",
        path(&train_file),
        "--test",
        path(&test_file),
        "--save",
        path(&model),
    ]);
    let (stdout, stderr) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "{stderr}");
    let counted = |what: &str| -> usize {
        let at = stderr
            .find(what)
            .unwrap_or_else(|| panic!("no {what} in {stderr}"));
        stderr[..at].rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (kept, held) = (counted(" train ratings"), counted(" validation ratings"));
    assert_eq!(kept + held, 90_000, "{stderr}");
    assert!((8_000..10_000).contains(&held), "{stderr}");
    let field = |line: &str, name: &str| -> f64 {
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name} in {line}"))
            .parse()
            .unwrap()
    };
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("iter=")).collect();
    let valid: Vec<f64> = lines.iter().map(|l| field(l, "valid_rmse")).collect();
    let tests: Vec<f64> = lines.iter().map(|l| field(l, "test_rmse")).collect();
    // The run stopped early, three epochs after its lowest validation RMSE, and saved that
    // epoch.
    let chosen = (0..valid.len()).fold(0, |b, e| if valid[e] < valid[b] { e } else { b });
    eprintln!("test RMSE per epoch {tests:?}, validation {valid:?}");
    assert!(lines.len() < 20, "{stdout}");
    assert_eq!(chosen + 4, lines.len(), "{stdout}");
    assert!(
        stderr.contains("early stop: no lower validation RMSE"),
        "{stderr}"
    );
    let predicted = pserver(&[
        "predict",
        "--model",
        path(&model),
        "--data",
        path(&test_file),
    ]);
    let predicted = String::from_utf8(predicted.stdout).unwrap();
    let ours = field(predicted.trim(), "rmse");
    assert_eq!(ours, tests[chosen], "{predicted} {stdout}");
    let (bias_only, reference) = (
        reference_rmse(train, test, 0, 30),
        reference_rmse(train, test, 10, 30),
    );
    eprintln!("pserver {ours} bias-only {bias_only} reference {reference}");
    assert!(ours < bias_only, "pserver {ours}, bias-only {bias_only}");
    assert!(
        ours <= reference + 0.01,
        "pserver {ours}, reference {reference}"
    );
}

#[test]
fn train_mf_on_a_movielens_file_beats_the_global_mean() {
    let dir = Scratch::new("movielens");
    let data = dir.file("u.data", &movielens(&low_rank_ratings(200, 150, 15_000, 1)));
    let (epochs, err) = trained(&[
        "train",
        "mf",
        "--data",
        path(&data),
        "--test-fraction",
        "0.2",
        "--epochs",
        "6",
    ]);
    assert!(err.contains("200 users, 150 items"), "{err}");
    let iters: Vec<u32> = epochs.iter().map(|e| e.iter).collect();
    assert_eq!(iters, [1, 2, 3, 4, 5, 6]);
    let last = epochs.last().unwrap();
    assert!(last.test_rmse < 0.95 * last.baseline_rmse, "{epochs:?}");
    assert!(last.train_rmse < epochs[0].train_rmse, "{epochs:?}");
}

#[test]
fn a_csv_file_with_a_header_and_a_separate_test_file_trains_on_shared_ids() {
    let dir = Scratch::new("csv");
    let ratings = low_rank_ratings(200, 150, 15_000, 2);
    // ml-latest's layout, with string ids: a user is known by name in both files.
    let train = dir.file("ratings.csv", &csv(&ratings[..13_500]));
    let mut test_rows = ratings[13_500..].to_vec();
    // A user no training rating knows: scored from its starting factors, and counted.
    test_rows.push((999, 0, 3));
    let test = dir.file("test.csv", &csv(&test_rows));
    let (epochs, err) = trained(&[
        "train",
        "mf",
        "--data",
        path(&train),
        "--test",
        path(&test),
        "--epochs",
        "6",
    ]);
    assert!(
        err.contains(
            "validation ratings, 1501 test ratings (1 with a user or item unseen in training)"
        ),
        "{err}"
    );
    let last = epochs.last().unwrap();
    assert!(last.test_rmse < 0.95 * last.baseline_rmse, "{epochs:?}");
}

#[test]
fn a_bad_line_is_refused_naming_file_line_and_field() {
    let dir = Scratch::new("bad");
    let good = dir.file("good.data", "1\t1\t4\t0\n2\t1\t3\t0\n1\t2\t5\t0\n");
    let bad = dir.file("bad.data", "1\t1\t4\t0\n2\t1\t3\t0\n1\t2\tx\t0\n");
    refused(
        &["train", "mf", "--data", path(&bad)],
        &["bad.data:3: rating: expected a number, found 'x'"],
    );
    refused(
        &["train", "mf", "--data", path(&good), "--test", path(&bad)],
        &["bad.data:3: rating"],
    );
    let nan = dir.file("nan.data", "1 1 NaN 0\n");
    refused(
        &["train", "mf", "--data", path(&nan)],
        &["nan.data:1: rating: expected a finite number, found 'NaN'"],
    );
    let short = dir.file("short.csv", "user,item,rating\n1,2\n");
    refused(
        &["train", "mf", "--data", path(&short)],
        &["short.csv:2: rating: missing"],
    );
}

#[test]
fn a_missing_or_empty_ratings_file_is_refused_naming_it() {
    let dir = Scratch::new("empty");
    let missing = dir.0.join("missing.data");
    refused(
        &["train", "mf", "--data", path(&missing)],
        &["missing.data", "cannot read"],
    );
    let empty = dir.file("empty.data", "");
    refused(
        &["train", "mf", "--data", path(&empty)],
        &["empty.data: no ratings"],
    );
    let header_only = dir.file("header.csv", "userId,movieId,rating,timestamp\n\n");
    refused(
        &["train", "mf", "--data", path(&header_only)],
        &["header.csv: no ratings"],
    );
}

#[test]
fn test_options_without_data_and_meaningless_values_are_refused_naming_the_flag() {
    refused(&["train", "mf", "--test", "t.data"], &["--data"]);
    refused(&["train", "mf", "--test-fraction", "0.2"], &["--data"]);
    for (flag, bad) in [
        ("--test-fraction", "1"),
        ("--test-fraction", "0"),
        ("--lr", "NaN"),
        ("--lr", "0"),
        ("--l2", "-1"),
        ("--rank", "0"),
        ("--batch", "0"),
        ("--epochs", "0"),
    ] {
        refused(&["train", "mf", "--data", "u.data", flag, bad], &[flag]);
    }
}

#[test]
fn rank_and_batch_show_in_the_summary_line() {
    let dir = Scratch::new("shape");
    let data = dir.file("u.data", &movielens(&low_rank_ratings(50, 40, 2_000, 3)));
    let (_, err) = trained(&[
        "train",
        "mf",
        "--data",
        path(&data),
        "--rank",
        "2",
        "--batch",
        "100",
        "--workers",
        "2",
        "--epochs",
        "1",
    ]);
    // 2,000 ratings less about a tenth held out: about 900 per worker, 9 or 10 steps of 100.
    let summary = err.lines().find(|l| l.starts_with("mf: ")).unwrap();
    assert!(summary.contains(", rank 2, 2 workers x "), "{summary}");
    assert!(
        summary.contains(" steps of 100 ratings per epoch"),
        "{summary}"
    );
}

#[test]
fn a_tiny_learning_rate_or_a_strong_l2_keeps_the_model_at_the_global_mean() {
    let dir = Scratch::new("rates");
    let data = dir.file("u.data", &movielens(&low_rank_ratings(200, 150, 15_000, 4)));
    let run = |extra: &[&str]| {
        let mut args = vec!["train", "mf", "--data", path(&data), "--epochs", "4"];
        args.extend_from_slice(extra);
        let (epochs, _) = trained(&args);
        let last = epochs.last().unwrap();
        last.test_rmse / last.baseline_rmse
    };
    let learned = run(&[]);
    assert!(learned < 0.95, "{learned}");
    // Factors that hardly move from their small starting point predict the mean.
    let still = run(&["--lr", "1e-6"]);
    assert!((still - 1.0).abs() < 0.01, "{still}");
    // L2 shrinks a bias to 1/(1 + l2) of what the ratings around it say, and factors to 0.
    let shrunk = run(&["--l2", "20", "--lr", "0.005"]);
    assert!(shrunk > 0.98, "{shrunk}");
}

/// `--save` keeps the users' and items' factors under the ids of the ratings files:
/// `pserver predict` scores the test file as training measured it, and `--init` starts a run
/// where the saved one ended.
#[test]
fn a_saved_factorization_predicts_as_trained_and_starts_a_run_where_it_ended() {
    let dir = Scratch::new("save");
    let ratings = low_rank_ratings(200, 150, 15_000, 3);
    let train = dir.file("ratings.csv", &csv(&ratings[..13_500]));
    let test = dir.file("test.csv", &csv(&ratings[13_500..]));
    let model = dir.0.join("m.mf");
    let run = |more: &[&str]| {
        let mut args = vec!["train", "mf", "--data", path(&train), "--test", path(&test)];
        args.extend_from_slice(more);
        trained(&args).0
    };
    let saved = run(&["--epochs", "6", "--save", path(&model)]);
    let last = saved.last().unwrap().test_rmse;
    let out = pserver(&["predict", "--model", path(&model), "--data", path(&test)]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("predict rows=1500 rmse="), "{stdout}");
    let rmse: f64 = stdout
        .split_whitespace()
        .find_map(|f| f.strip_prefix("rmse="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (rmse - last).abs() < 1e-3,
        "predict {rmse}, training measured {last}"
    );
    let scores = pserver(&[
        "predict",
        "--model",
        path(&model),
        "--data",
        path(&test),
        "--scores",
    ]);
    assert_eq!(
        String::from_utf8(scores.stdout).unwrap().lines().count(),
        1500
    );
    let warm = run(&["--epochs", "1", "--init", path(&model)]);
    assert!(
        warm[0].test_rmse < saved[0].test_rmse && warm[0].test_rmse < last + 0.005,
        "first epoch {} from the model, {} from the start; the model's {last}",
        warm[0].test_rmse,
        saved[0].test_rmse
    );
    refused(
        &[
            "train",
            "mf",
            "--data",
            path(&train),
            "--rank",
            "3",
            "--init",
            path(&model),
        ],
        &["m.mf: the model has rank 10, but the run's is 3"],
    );
}

/// A run that writes checkpoints can be stopped and resumed: `--resume` trains only the epochs
/// after the newest good checkpoint and ends where an uninterrupted run ends; a torn newest
/// checkpoint is said and passed over for the one before it.
#[test]
fn a_resumed_run_trains_the_epochs_after_its_last_good_checkpoint_and_ends_as_one_run_does() {
    let dir = Scratch::new("resume");
    let data = dir.file("u.data", &movielens(&low_rank_ratings(200, 150, 15_000, 4)));
    let ckpt = dir.0.join("ckpt");
    let run = |more: &[&str]| {
        let mut args = vec![
            "train",
            "mf",
            "--data",
            path(&data),
            "--consistency",
            "sequential",
            "--workers",
            "2",
        ];
        args.extend_from_slice(more);
        trained(&args)
    };
    let iters = |epochs: &[Epoch]| epochs.iter().map(|e| e.iter).collect::<Vec<_>>();
    let (whole, _) = run(&["--epochs", "6"]);
    let (first, _) = run(&["--epochs", "4", "--checkpoint-dir", path(&ckpt)]);
    assert_eq!(iters(&first), [1, 2, 3, 4]);
    // Not resumed by mistake, nor overwritten.
    refused(
        &[
            "train",
            "mf",
            "--data",
            path(&data),
            "--checkpoint-dir",
            path(&ckpt),
        ],
        &["holds checkpoints up to epoch 4: give --resume"],
    );
    let (rest, err) = run(&["--epochs", "6", "--checkpoint-dir", path(&ckpt), "--resume"]);
    assert!(err.contains("resume: epochs 1 to 4 from "), "{err}");
    assert_eq!(iters(&rest), [5, 6]);
    let (end, resumed_end) = (whole[5].test_rmse, rest[1].test_rmse);
    assert!(
        (end - resumed_end).abs() < 2e-4,
        "uninterrupted {end}, resumed {resumed_end}"
    );
    // The newest checkpoint (epoch 6) torn: the one of epoch 5 is used.
    let newest = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
    let (again, err) = run(&["--epochs", "6", "--checkpoint-dir", path(&ckpt), "--resume"]);
    assert!(err.contains("refused, torn"), "{err}");
    assert!(err.contains("resume: epochs 1 to 5 from "), "{err}");
    assert_eq!(iters(&again), [6]);
}
