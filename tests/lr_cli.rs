//! `pserver train` and `pserver predict` on a user's own files: the intercept, the index base,
//! the visiting order and how a run ends. Each test writes its data to a directory of its
//! own and runs the binary as a user would.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

fn pserver() -> Command {
    Command::cargo_bin("pserver").unwrap()
}

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pserver-lr-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs pserver, expecting success; returns stdout and stderr.
fn run_ok(args: &[&str]) -> (String, String) {
    let out = pserver().args(args).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "{args:?}: {stderr}");
    (stdout, stderr)
}

/// The value of `key=` in `line`.
fn field(line: &str, key: &str) -> f64 {
    let prefix = format!("{key}=");
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
        .parse()
        .unwrap()
}

/// The epoch lines of a training run's output.
fn epochs_of(stdout: &str) -> Vec<&str> {
    stdout.lines().filter(|l| l.starts_with("iter=")).collect()
}

/// A seeded pseudo-random number in [0, 1).
fn unit(seed: u64) -> f64 {
    let mut x = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((x ^ (x >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// `rows` rows whose label is positive with probability 0.8 whatever the features, which are
/// noise: the best a model can do is learn the base rate, through its intercept.
fn base_rate_file(path: &Path, rows: u64, seed: u64) {
    let text: String = (0..rows)
        .map(|r| {
            let label = u8::from(unit(seed ^ (r * 2)) < 0.8);
            let feature = 1 + (unit(seed ^ (r * 2 + 1)) * 50.0) as u64;
            format!("{label} {feature}:1\n")
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

#[test]
fn the_intercept_is_unregularized_saved_with_the_model_and_used_by_predict() {
    let dir = scratch("intercept");
    let (train, test, model) = (dir.join("train.svm"), dir.join("test.svm"), dir.join("m"));
    base_rate_file(&train, 2000, 1);
    base_rate_file(&test, 1000, 2);
    // An L1 this strong keeps every regularized weight at exactly zero: only an exempt
    // intercept can learn the base rate.
    let common = [
        "train",
        "--data",
        s(&train),
        "--test",
        s(&test),
        "--epochs",
        "3",
        "--l1",
        "1000000",
        "--workers",
        "2",
    ];
    let (with, _) = run_ok(&[&common[..], &["--save", s(&model)]].concat());
    let (without, _) = run_ok(&[&common[..], &["--no-bias"]].concat());
    let loss = |out: &str| field(epochs_of(out).last().unwrap(), "test_logloss");
    // The entropy of a 0.8 coin is 0.500 nats; a model without intercept predicts 0.5 (0.693).
    assert!(loss(&with) < 0.53, "{with}");
    assert!(
        (loss(&without) - std::f64::consts::LN_2).abs() < 1e-3,
        "{without}"
    );
    assert_eq!(
        field(epochs_of(&with).last().unwrap(), "nnz"),
        1.0,
        "{with}"
    );
    // The model saved is the best epoch's, intercept included.
    let best = epochs_of(&with)
        .iter()
        .map(|l| field(l, "test_logloss"))
        .fold(f64::INFINITY, f64::min);
    let (predicted, _) = run_ok(&["predict", "--model", s(&model), "--data", s(&test)]);
    assert_eq!(field(&predicted, "logloss"), best, "{predicted}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rows whose label is decided by feature `0` or `1` (zero-based): with the indices shifted
/// by one, the model reads the wrong feature.
fn zero_based_file(path: &Path, rows: u64, seed: u64, with_index_zero: bool) {
    let text: String = (0..rows)
        .map(|r| {
            let positive = unit(seed ^ r) < 0.5;
            let noise = 2 + (unit(seed ^ ((r + 1) << 20)) * 20.0) as u64;
            match (positive, with_index_zero) {
                (true, _) => format!("1 1:1 {noise}:1\n"),
                (false, true) => format!("0 0:1 {noise}:1\n"),
                // Without its index-0 feature: the file holds no index 0 at all.
                (false, false) => format!("0 {noise}:1\n"),
            }
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_zero_based_file_without_index_zero_reads_the_same_as_with_it() {
    let dir = scratch("base");
    let train = dir.join("train.svm");
    let (test, test0) = (dir.join("test.svm"), dir.join("test0.svm"));
    let model = dir.join("m");
    zero_based_file(&train, 2000, 3, true);
    // Two spellings of the same zero-based rows: without any index 0, and with a `0:0` that
    // changes nothing but betrays the base.
    zero_based_file(&test, 500, 4, false);
    let text = std::fs::read_to_string(&test).unwrap();
    let (first, rest) = text.split_once('\n').unwrap();
    let (label, features) = first.split_once(' ').unwrap();
    std::fs::write(&test0, format!("{label} 0:0 {features}\n{rest}")).unwrap();
    let (trained, err) = run_ok(&[
        "train",
        "--data",
        s(&train),
        "--test",
        s(&test),
        "--epochs",
        "2",
        "--save",
        s(&model),
        "--keep",
        "last",
    ]);
    assert!(err.contains("index base 0: index 0 at"), "{err}");
    let auc = |data: &Path| {
        let (out, _) = run_ok(&["predict", "--model", s(&model), "--data", s(data)]);
        field(&out, "auc")
    };
    let trained_auc = field(epochs_of(&trained).last().unwrap(), "test_auc");
    assert!(trained_auc > 0.9, "{trained}");
    assert_eq!(auc(&test), auc(&test0));
    assert_eq!(auc(&test), trained_auc);
    // Told the files count from 1, the run stops at the first index 0, naming its line.
    let out = pserver()
        .args([
            "train",
            "--data",
            s(&train),
            "--test",
            s(&test),
            "--index-base",
            "1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    let first_zero = std::fs::read_to_string(&train)
        .unwrap()
        .lines()
        .position(|l| l.contains(" 0:"))
        .unwrap();
    assert!(
        err.contains(&format!("train.svm:{}:", first_zero + 1)) && err.contains("index 0"),
        "{err}"
    );
    // predict refuses a base that contradicts the model's.
    let out = pserver()
        .args(["predict", "--model", s(&model), "--data", s(&test)])
        .args(["--index-base", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A small training set with many features and no regularization: the test log loss
/// reaches its lowest after a few epochs and then rises.
fn overfitting(dir: &Path) -> (PathBuf, PathBuf) {
    let (train, test) = (dir.join("train.svm"), dir.join("test.svm"));
    run_ok(&[
        "gen",
        "--rows",
        "300",
        "--features",
        "3000",
        "--out",
        s(&train),
    ]);
    run_ok(&[
        "gen",
        "--rows",
        "2000",
        "--features",
        "3000",
        "--first-row",
        "300",
        "--out",
        s(&test),
    ]);
    (train, test)
}

const OVERFIT: [&str; 12] = [
    "--alpha",
    "0.3",
    "--l1",
    "0",
    "--l2",
    "0",
    "--workers",
    "1",
    "--servers",
    "1",
    "--seed",
    "7",
];

/// Trains on the overfitting files for `epochs` epochs with `extra` options; returns stdout,
/// stderr and each epoch's test log loss.
fn overfit_run(
    train: &Path,
    test: &Path,
    epochs: &str,
    extra: &[&str],
) -> (String, String, Vec<f64>) {
    let args = [
        "train",
        "--data",
        s(train),
        "--test",
        s(test),
        "--epochs",
        epochs,
    ];
    let (out, err) = run_ok(&[&args[..], &OVERFIT, extra].concat());
    let losses = epochs_of(&out)
        .iter()
        .map(|l| field(l, "test_logloss"))
        .collect();
    (out, err, losses)
}

/// The first epoch with the lowest of `losses`.
fn first_lowest(losses: &[f64]) -> usize {
    losses
        .iter()
        .enumerate()
        .fold(
            (0, f64::INFINITY),
            |b, (i, &l)| if l < b.1 { (i, l) } else { b },
        )
        .0
}

/// Each epoch's validation log loss.
fn validation_of(out: &str) -> Vec<f64> {
    epochs_of(out)
        .iter()
        .map(|l| field(l, "valid_logloss"))
        .collect()
}

/// `--save` keeps the epoch whose log loss on rows held out of the training data is lowest,
/// never looking at the test rows, and `--keep last` the last epoch (holding nothing out).
#[test]
fn save_keeps_the_epoch_with_the_lowest_validation_logloss_unless_told_to_keep_the_last() {
    let dir = scratch("keep");
    let (train, test) = overfitting(&dir);
    let (best, last) = (dir.join("best"), dir.join("last"));
    let (out, _, losses) = overfit_run(&train, &test, "12", &["--save", s(&best)]);
    let (last_out, _, last_losses) =
        overfit_run(&train, &test, "12", &["--save", s(&last), "--keep", "last"]);
    assert!(
        !last_out.contains("valid_logloss"),
        "keeping the last epoch, nothing is held out: {last_out}"
    );
    let validation = validation_of(&out);
    assert_eq!(validation.len(), losses.len(), "{out}");
    let chosen = first_lowest(&validation);
    assert!(
        *validation.last().unwrap() > validation[chosen] + 0.01,
        "the run does not overfit: {out}"
    );
    let predicted = |model: &Path| {
        let (out, _) = run_ok(&["predict", "--model", s(model), "--data", s(&test)]);
        field(&out, "logloss")
    };
    assert_eq!(predicted(&best), losses[chosen], "{out}");
    assert_eq!(predicted(&last), *last_losses.last().unwrap(), "{last_out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn early_stop_ends_the_run_n_epochs_after_the_best_one() {
    let dir = scratch("early");
    let (train, test) = overfitting(&dir);
    let (out, err, _) = overfit_run(&train, &test, "50", &["--early-stop", "2"]);
    // Judged on the rows held out of the training data, not on the test rows.
    let losses = validation_of(&out);
    let best = first_lowest(&losses);
    assert_eq!(losses.len(), best + 1 + 2, "{out}");
    assert!(losses.len() < 50);
    assert!(err.contains("early stop after epoch"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_sorted_by_label_trains_within_0_003_of_the_same_file_shuffled() {
    let dir = scratch("sorted");
    let adult = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/adult");
    let gz = std::fs::read(adult.join("adult.train.svm.gz")).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(&gz[..]), &mut text)
        .unwrap();
    let mut sorted: Vec<&str> = text.lines().collect();
    sorted.sort_by_key(|l| l.split_whitespace().next().map(str::to_owned));
    let (original, by_label) = (dir.join("original.svm"), dir.join("sorted.svm"));
    std::fs::write(&original, &text).unwrap();
    std::fs::write(&by_label, sorted.join("\n") + "\n").unwrap();
    let test = adult.join("adult.test.svm.gz");
    let auc = |data: &Path, workers: &str, extra: &[&str]| {
        let args = ["train", "--data", s(data), "--test", s(&test)];
        // Sequential consistency: each minibatch sees every push before it, so a run repeats
        // itself and the comparison measures the file order alone. Under bounded delay four
        // workers' interleaving moves the AUC from run to run by as much as the bound.
        let more = [
            "--workers",
            workers,
            "--epochs",
            "2",
            "--consistency",
            "sequential",
        ];
        let (out, _) = run_ok(&[&args[..], &more, extra].concat());
        epochs_of(&out)
            .iter()
            .map(|e| field(e, "test_auc"))
            .fold(0.0, f64::max)
    };
    // One worker shuffles the whole file; four are dealt shares from a shuffled file.
    for workers in ["1", "4"] {
        let shuffled = auc(&original, workers, &[]);
        let sorted_shuffled = auc(&by_label, workers, &[]);
        assert!(
            (shuffled - sorted_shuffled).abs() <= 0.003,
            "{workers} workers: {shuffled} {sorted_shuffled}"
        );
    }
    // What the shuffle saves: in file order, one label's rows come all at once (0.0196 of
    // AUC lost when measured).
    let (shuffled, in_file_order) = (
        auc(&original, "1", &[]),
        auc(&by_label, "1", &["--no-shuffle"]),
    );
    assert!(
        in_file_order < shuffled - 0.01,
        "{in_file_order} {shuffled}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_a_terminal_progress_lines_and_epoch_lines_carry_rows_per_second() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command as Process, Stdio};
    let mut child = Process::new(assert_cmd::cargo::cargo_bin("pserver"))
        .args(["train", "--epochs", "100000", "--progress-every", "0.05"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kept open until the end: a closed pipe would end the run at its next progress line.
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let progress = stderr
        .by_ref()
        .map_while(Result::ok)
        // The first ticks may come before the first minibatch.
        .find(|l| l.starts_with("progress ") && !l.contains(" rows=0/"));
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let epoch = stdout.next().and_then(Result::ok);
    let _ = child.kill();
    let _ = child.wait();
    drop(stderr);
    let progress = progress.expect("a progress line before the run ends");
    assert!(field(&progress, "rows_per_sec") > 0.0, "{progress}");
    assert!(progress.contains(" rows="), "{progress}");
    let epoch = epoch.expect("an epoch line");
    assert!(field(&epoch, "rows_per_sec") > 0.0, "{epoch}");
}

/// Straggler options a run cannot follow are refused before anything trains (exit status 2,
/// naming what is wrong), and a run with them ends with its pace line.
#[test]
fn straggler_options_are_checked_before_training_and_a_run_ends_with_its_pace() {
    for (args, says) in [
        (
            &["--consistency", "sequential", "--skip-ahead"][..],
            "bounded delay",
        ),
        (&["--slow-worker", "4:4"][..], "workers 0 to 3"),
        (&["--slow-worker", "1"][..], "W:F"),
        (&["--straggler", "0.5"][..], "slowdown factor"),
        (&["--adaptive-tau", "4:1"][..], "MIN:MAX"),
    ] {
        let out = pserver().arg("train").args(args).output().unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            !err.contains("train:"),
            "refused before reading data: {err}"
        );
    }
    let (stdout, _) = run_ok(&[
        "train",
        "--epochs",
        "2",
        "--consistency",
        "bounded:2",
        "--skip-ahead",
        "--shares",
        "2",
        "--slow-worker",
        "1:4",
    ]);
    assert_eq!(epochs_of(&stdout).len(), 2, "{stdout}");
    let pace = stdout
        .lines()
        .find(|l| l.starts_with("pace "))
        .unwrap_or_else(|| panic!("no pace line in {stdout}"));
    for key in [
        "stragglers",
        "shares_moved",
        "skipped_iterations",
        "skipped_rows",
        "repeated_rows",
    ] {
        assert!(field(pace, key) >= 0.0, "{pace}");
    }
}

#[test]
fn the_significantly_modified_filter_sends_fewer_rows_and_says_what_it_saved() {
    for bad in ["-1", "nan", "inf", "x"] {
        let out = pserver().args(["train", "--sigmod", bad]).output().unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("finite number of at least 0"), "{bad}: {err}");
    }
    let bytes_of = |args: &[&str]| {
        let (stdout, _) = run_ok(&[&["train", "--epochs", "2"], args].concat());
        let epochs = epochs_of(&stdout);
        assert_eq!(epochs.len(), 2, "{stdout}");
        // Each epoch says what it sent, and the epochs add up to what was sent in all.
        let each: f64 = epochs.iter().map(|l| field(l, "epoch_bytes")).sum();
        assert_eq!(each, field(epochs[1], "bytes"), "{stdout}");
        (stdout.clone(), each)
    };
    let (plain, plain_bytes) = bytes_of(&[]);
    assert!(!plain.contains("filter "), "{plain}");
    let (filtered, filtered_bytes) = bytes_of(&["--sigmod", "5"]);
    let line = filtered
        .lines()
        .find(|l| l.starts_with("filter sigmod "))
        .unwrap_or_else(|| panic!("no filter line in {filtered}"));
    let (rows_in, rows_out) = (field(line, "rows_in"), field(line, "rows_out"));
    assert!(rows_out > 0.0 && rows_out < rows_in / 4.0, "{line}");
    assert_eq!(
        field(line, "bytes_saved"),
        (rows_in - rows_out) * 12.0,
        "{line}"
    );
    assert!(
        filtered_bytes < plain_bytes,
        "{filtered_bytes} of {plain_bytes}"
    );
}

#[test]
fn the_kkt_filter_needs_an_l1_model_holds_zero_weights_changes_and_says_what_it_saved() {
    for (args, said) in [
        (
            &["--kkt", "0"][..],
            "`0` is not a whole number of pushes of at least 1",
        ),
        (
            &["--kkt", "--updater", "sgd"][..],
            "--kkt: the KKT filter needs an L1-regularised model",
        ),
        (
            &["--kkt", "--l1", "0"][..],
            "--kkt: needs --l1 above 0, not 0",
        ),
    ] {
        let out = pserver()
            .args([&["train"], args].concat())
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
    }
    let (stdout, _) = run_ok(&["train", "--epochs", "2", "--kkt", "50"]);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("filter kkt "))
        .unwrap_or_else(|| panic!("no filter line in {stdout}"));
    let (rows_in, rows_out) = (field(line, "rows_in"), field(line, "rows_out"));
    // The shipped data's model is sparse under the default l1: a good part of every push
    // is the change to a zero weight.
    assert!(rows_out > 0.0 && rows_out < rows_in * 0.9, "{line}");
    assert_eq!(
        field(line, "bytes_saved"),
        (rows_in - rows_out) * 12.0,
        "{line}"
    );
}

#[test]
fn a_run_without_test_in_another_folder_holds_out_part_of_its_data_and_never_reads_the_shipped_one()
{
    let dir = scratch("held-out");
    let train = dir.join("mine.svm");
    base_rate_file(&train, 2000, 7);
    // In a folder without data/adult: the shipped test file cannot be read by mistake.
    let out = pserver()
        .current_dir(&dir)
        .args(["train", "--data", "mine.svm", "--epochs", "2"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("adult"), "{stderr}");
    let held = stderr
        .lines()
        .find(|l| l.starts_with("test: "))
        .unwrap_or_else(|| panic!("{stderr}"));
    let rows: f64 = held.split_whitespace().nth(1).unwrap().parse().unwrap();
    // About a tenth, chosen by the seed.
    assert!((150.0..=250.0).contains(&rows), "{held}");
    let epochs = epochs_of(&stdout);
    assert_eq!(epochs.len(), 2, "{stdout}");
    assert!(field(epochs[1], "test_logloss") > 0.0, "{stdout}");
    // The same seed holds out the same rows; another holds out others.
    let again = pserver()
        .current_dir(&dir)
        .args([
            "train", "--data", "mine.svm", "--epochs", "1", "--seed", "3",
        ])
        .output()
        .unwrap();
    let other = String::from_utf8_lossy(&again.stderr);
    assert!(other.contains("--seed 3"), "{other}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_with_three_classes_is_refused_naming_its_line() {
    let dir = scratch("three-classes");
    let data = dir.join("three.svm");
    std::fs::write(&data, "1 1:1\n1 2:1\n2 1:1\n3 2:1\n").unwrap();
    let out = pserver()
        .args(["train", "--data", s(&data)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let last = stderr.trim().lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!(
            "error: {}:3:1: expected a binary label",
            data.display()
        )) && last.contains("found '2'"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three classes, each with a feature of its own and a feature of noise: `--positive 2`
/// trains class 2 against the other two, which its feature tells apart, `pserver predict
/// --positive 2` scores the saved model as training measured it, and a label no row holds is
/// refused.
#[test]
fn positive_trains_one_of_three_classes_against_the_rest_and_refuses_a_label_no_row_holds() {
    let dir = scratch("positive");
    let (train, test) = (dir.join("train.svm"), dir.join("test.svm"));
    let classes = |rows: u64, seed: u64| -> String {
        (0..rows)
            .map(|r| {
                let class = 1 + r % 3;
                let noise = 4 + (unit(seed ^ r) * 20.0) as u64;
                format!("{class} {class}:1 {noise}:1\n")
            })
            .collect()
    };
    std::fs::write(&train, classes(600, 1)).unwrap();
    std::fs::write(&test, classes(150, 2)).unwrap();
    let model = dir.join("m.bin");
    let (stdout, _) = run_ok(&[
        "train",
        "--data",
        s(&train),
        "--test",
        s(&test),
        "--positive",
        "2",
        "--epochs",
        "3",
        "--keep",
        "last",
        "--save",
        s(&model),
    ]);
    let last = *epochs_of(&stdout).last().unwrap();
    assert!(field(last, "test_auc") > 0.99, "{stdout}");
    let (predicted, _) = run_ok(&[
        "predict",
        "--model",
        s(&model),
        "--data",
        s(&test),
        "--positive",
        "2",
    ]);
    assert_eq!(
        field(&predicted, "auc"),
        field(last, "test_auc"),
        "{predicted}"
    );
    assert_eq!(field(&predicted, "logloss"), field(last, "test_logloss"));
    // Without it, predict reads the labels as binary and refuses a third class.
    let out = pserver()
        .args(["predict", "--model", s(&model), "--data", s(&test)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("test.svm:2:1: expected a binary label"),
        "{stderr}"
    );
    let out = pserver()
        .args(["train", "--data", s(&train), "--positive", "7"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim().lines().last().unwrap_or_default(),
        format!(
            "error: {}: no row is labelled 7, the label --positive names",
            train.display()
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_test_set_of_one_class_is_said() {
    let dir = scratch("one-class");
    let (train, test) = (dir.join("train.svm"), dir.join("test.svm"));
    base_rate_file(&train, 500, 1);
    std::fs::write(&test, "1 1:1\n1 2:1\n+1 3:1\n").unwrap();
    let (_, stderr) = run_ok(&[
        "train",
        "--data",
        s(&train),
        "--test",
        s(&test),
        "--epochs",
        "1",
    ]);
    assert!(
        stderr.contains("warning: every one of the 3 test rows is positive"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A warm start: a run given a saved model with `--init` starts where that model ended, so
/// its first epoch is as good as the model, and better than a first epoch from zero.
#[test]
fn a_model_given_to_init_is_where_training_starts() {
    let dir = scratch("init");
    let model = dir.join("m.bin");
    // One worker under sequential consistency: every run the same, so that the comparison
    // below is of the starting points, not of the order pushes happened to arrive in. A slow
    // rate, so that five epochs learn more than one: at the default, one epoch from zero
    // already reaches what more epochs do on this data.
    let run = |more: &[&str]| {
        let mut args = vec![
            "train",
            "--consistency",
            "sequential",
            "--workers",
            "1",
            "--alpha",
            "0.01",
        ];
        args.extend_from_slice(more);
        run_ok(&args)
    };
    let (saved, _) = run(&["--epochs", "5", "--keep", "last", "--save", s(&model)]);
    let saved = field(epochs_of(&saved).last().unwrap(), "test_logloss");
    let (warm, said) = run(&["--epochs", "1", "--init", s(&model)]);
    assert!(said.contains("init: "), "{said}");
    let warm = field(epochs_of(&warm)[0], "test_logloss");
    let (cold, _) = run(&["--epochs", "1"]);
    let cold = field(epochs_of(&cold)[0], "test_logloss");
    assert!(
        warm < cold && warm < saved + 0.002,
        "a warm start's first epoch {warm} against a cold start's {cold} and the model's {saved}"
    );
    // A model trained on data counted from 1 does not read data counted from 0.
    let out = pserver()
        .args([
            "train",
            "--epochs",
            "1",
            "--init",
            s(&model),
            "--index-base",
            "0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("m.bin: the model was trained on data whose indices count from 1"),
        "{err}"
    );
    // Nor is a file that is not a model taken for one.
    let not_a_model = dir.join("data.svm");
    base_rate_file(&not_a_model, 10, 1);
    let out = pserver()
        .args(["train", "--epochs", "1", "--init", s(&not_a_model)])
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("data.svm: not a pserver model"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every server of a run with --checkpoint-dir writes its shards after every epoch; killed
/// and started again with --resume, the run trains only the epochs after the newest one every
/// server holds whole and ends as an uninterrupted run does; a torn newest file on one server
/// sends the whole job to the epoch before.
#[test]
fn a_resumed_run_goes_on_from_the_servers_checkpoints_and_a_torn_one_sends_it_to_the_epoch_before()
{
    let dir = scratch("resume");
    let ckpt = dir.join("ckpt");
    let run = |more: &[&str]| {
        let mut args = vec!["train", "--consistency", "sequential", "--no-pipeline"];
        args.extend_from_slice(more);
        run_ok(&args)
    };
    let auc = |stdout: &str| field(epochs_of(stdout).last().unwrap(), "test_auc");
    let iters = |stdout: &str| {
        epochs_of(stdout)
            .iter()
            .map(|l| field(l, "iter") as u32)
            .collect::<Vec<_>>()
    };
    let (whole, _) = run(&["--epochs", "4"]);
    let (first, _) = run(&["--epochs", "2", "--checkpoint-dir", s(&ckpt)]);
    assert_eq!(iters(&first), [1, 2]);
    for server in ["server-1", "server-2"] {
        let files = std::fs::read_dir(ckpt.join(server)).unwrap().count();
        assert_eq!(files, 2, "{server} wrote a checkpoint after each epoch");
    }
    // Not resumed by mistake, nor overwritten.
    let out = pserver()
        .args(["train", "--epochs", "1", "--checkpoint-dir", s(&ckpt)])
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("give --resume to go on from them"), "{err}");
    let (rest, err) = run(&["--epochs", "4", "--checkpoint-dir", s(&ckpt), "--resume"]);
    assert!(
        err.contains("resume: epochs 1 to 2 from the servers' checkpoints"),
        "{err}"
    );
    assert_eq!(iters(&rest), [3, 4]);
    let (end, resumed) = (auc(&whole), auc(&rest));
    assert!(
        (end - resumed).abs() < 0.005,
        "uninterrupted {end}, resumed {resumed}"
    );
    // One server's newest checkpoint (epoch 4) torn: the job goes on from epoch 3, which
    // both servers hold.
    let server = ckpt.join("server-1");
    let newest = std::fs::read_dir(&server)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
    let (again, err) = run(&["--epochs", "4", "--checkpoint-dir", s(&ckpt), "--resume"]);
    assert!(err.contains("refused, torn"), "{err}");
    assert!(
        err.contains("resume: epochs 1 to 3 from the servers' checkpoints"),
        "{err}"
    );
    assert_eq!(iters(&again), [4]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs pserver with `args` to its end, expecting success, and reads its peak resident memory
/// (`VmHWM`, in kB) while it runs: the last reading before it exits, a few milliseconds of
/// growth at most missed. Returns it with stdout and stderr.
fn peak_kb(args: &[&str]) -> (u64, String, String) {
    use std::process::Stdio;
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("pserver"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let readers = (
        std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut out, &mut s).unwrap();
            s
        }),
        std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut err, &mut s).unwrap();
            s
        }),
    );
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if let Some(kb) = std::fs::read_to_string(&status_file).ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        }) {
            peak = kb;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let (stdout, stderr) = (readers.0.join().unwrap(), readers.1.join().unwrap());
    assert!(status.success(), "{args:?}: {stderr}");
    (peak, stdout, stderr)
}

/// `--stream` reads the training file a window at a time: a run on a file eight times as long
/// peaks at about the same memory, where a run that reads the file whole grows with it, and
/// it trains every row of every epoch to what that run reaches.
#[test]
fn a_streamed_file_trains_every_row_in_memory_that_does_not_grow_with_the_file() {
    let dir = scratch("stream");
    let generate = |rows: &str, first: &str, name: &str| {
        let path = dir.join(name);
        run_ok(&[
            "gen",
            "--rows",
            rows,
            "--features",
            "65536",
            "--seed",
            "3",
            "--first-row",
            first,
            "--out",
            s(&path),
        ]);
        path
    };
    let (short, long) = (
        generate("50000", "0", "short.svm"),
        generate("400000", "0", "long.svm"),
    );
    let test = generate("5000", "400000", "test.svm");
    let train = |data: &Path, stream: bool| {
        let mut args = vec![
            "train",
            "--data",
            s(data),
            "--test",
            s(&test),
            "--index-base",
            "0",
            "--epochs",
            "2",
            "--servers",
            "1",
            "--workers",
            "1",
            "--consistency",
            "sequential",
        ];
        if stream {
            args.extend(["--stream", "--window", "5000"]);
        }
        peak_kb(&args)
    };
    let (stream_short, _, _) = train(&short, true);
    let (stream_long, out, err) = train(&long, true);
    let (whole_short, _, _) = train(&short, false);
    let (whole_long, whole_out, _) = train(&long, false);
    eprintln!(
        "peak kB: streamed {stream_short} then {stream_long}, whole {whole_short} then {whole_long}"
    );
    // 350,000 more rows of 30 features: 42 MB more parsed rows held whole, none streamed.
    // The peak of a run moves by up to 12 MB between runs on the same file (the allocator's
    // pages, frames in flight), so the margins are wide.
    assert!(
        whole_long > whole_short + 20_000,
        "whole: {whole_short} then {whole_long} kB"
    );
    assert!(
        stream_long < stream_short + 10_000,
        "streamed: {stream_short} then {stream_long} kB"
    );
    assert!(
        err.contains("train: 400000 rows streamed in windows of 5000"),
        "{err}"
    );
    // What a streamed file cannot do yet is refused, not ignored.
    let refused = pserver()
        .args([
            "train",
            "--data",
            s(&short),
            "--stream",
            "--test",
            s(&test),
            "--validation-fraction",
            "0.1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8(refused.stderr).unwrap();
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--validation-fraction: a streamed file holds no validation rows out yet"),
        "{stderr}"
    );
    same_test_auc((&out, &whole_out), 2, 0.005);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The two runs' outputs print `epochs` epochs each, at test AUCs within `tolerance` epoch by
/// epoch.
fn same_test_auc((a, b): (&str, &str), epochs: usize, tolerance: f64) {
    let (a_epochs, b_epochs) = (epochs_of(a), epochs_of(b));
    assert_eq!(
        (a_epochs.len(), b_epochs.len()),
        (epochs, epochs),
        "{a}\n{b}"
    );
    for (x, y) in a_epochs.iter().zip(&b_epochs) {
        assert!(
            (field(x, "test_auc") - field(y, "test_auc")).abs() < tolerance,
            "{x}\n{y}"
        );
    }
}

/// Without `--test`, a streamed run holds out of its file the rows a run reading it whole holds
/// out, trains on the others and measures its model on those, read from the file each epoch.
#[test]
fn a_streamed_file_without_a_test_file_holds_out_the_rows_a_whole_run_holds_out() {
    let dir = scratch("stream-held");
    let data = dir.join("data.svm");
    run_ok(&[
        "gen",
        "--rows",
        "20000",
        "--features",
        "4096",
        "--seed",
        "5",
        "--out",
        s(&data),
    ]);
    // Comment and blank lines between the rows: rows are counted, not lines.
    let text = std::fs::read_to_string(&data).unwrap();
    let mut spaced = String::new();
    for (i, line) in text.lines().enumerate() {
        if i % 7 == 3 {
            spaced += "# a comment\n\n";
        }
        spaced += line;
        spaced += "\n";
    }
    std::fs::write(&data, spaced).unwrap();
    let run = |stream: bool| {
        let mut args = vec![
            "train",
            "--data",
            s(&data),
            "--index-base",
            "0",
            "--epochs",
            "2",
            "--servers",
            "1",
            "--workers",
            "1",
            "--consistency",
            "sequential",
        ];
        if stream {
            args.extend(["--stream", "--window", "1000"]);
        }
        let out = pserver().args(&args).output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        );
        assert!(out.status.success(), "{args:?}: {stderr}");
        (stdout, stderr)
    };
    let ((streamed, streamed_err), (whole, whole_err)) = (run(true), run(false));
    // The same rows held out, the same left to train: "test: N rows held out of ..." and
    // "train: N rows ..." agree.
    let count = |err: &str, prefix: &str| -> usize {
        let line = err
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no '{prefix}' line: {err}"));
        line[prefix.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let held = count(&streamed_err, "test: ");
    assert!(streamed_err.contains("rows held out of"), "{streamed_err}");
    assert_eq!(
        held,
        count(&whole_err, "test: "),
        "{streamed_err}\n{whole_err}"
    );
    assert!((1500..2500).contains(&held), "{streamed_err}");
    let trained = count(&streamed_err, "train: ");
    assert_eq!(trained, 20000 - held, "{streamed_err}");
    assert_eq!(trained, count(&whole_err, "train: "), "{whole_err}");
    assert!(
        streamed_err.contains("streamed in windows of 1000 per share"),
        "{streamed_err}"
    );
    // Every row trained but those held out: none reported skipped.
    assert!(!streamed.contains("skipped_rows"), "{streamed}");
    // Trained on the same rows and measured on the same rows, in orders shuffled apart.
    same_test_auc((&streamed, &whole), 2, 0.01);
    let _ = std::fs::remove_dir_all(&dir);
}
