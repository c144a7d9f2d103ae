//! The command line as a user meets it.

use assert_cmd::Command;

fn pserver() -> Command {
    Command::cargo_bin("pserver").unwrap()
}

#[test]
fn version_and_help_explain_themselves() {
    let out = pserver().arg("--version").output().unwrap();
    assert!(out.status.success());
    let version = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        version.trim(),
        format!("pserver {}", env!("CARGO_PKG_VERSION"))
    );

    let out = pserver().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("parameter server"));
    assert!(help.contains("ring"));
}

#[test]
fn ring_prints_one_share_per_server_and_the_moved_share() {
    let out = pserver()
        .args(["ring", "--servers", "4", "--vnodes", "32", "--add", "9"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let shares: f64 = text
        .lines()
        .filter_map(|l| l.strip_prefix("share."))
        .map(|l| l.split(' ').nth(1).unwrap().parse::<f64>().unwrap())
        .sum();
    assert!((shares - 1.0).abs() < 1e-3, "shares sum to {shares}");
    assert!(text.lines().any(|l| l.starts_with("add.moved ")));
}

#[test]
fn an_impossible_ring_is_a_clear_error_not_a_panic() {
    let out = pserver()
        .args(["ring", "--servers", "2", "--replicas", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("2 replicas need at least 3 servers"), "{err}");
    assert!(!err.contains("panicked"));
}

#[test]
fn sim_ends_with_exactly_one_summary_line() {
    let out = pserver()
        .args([
            "sim",
            "seeds",
            "--seeds",
            "20",
            "--drop",
            "0.1",
            "--dup",
            "0.05",
            "--reorder",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let last = text.lines().last().unwrap();
    assert!(last.starts_with("sim seeds=20 failed=0 steps="), "{text}");
    assert!(last.contains(" secs="));
    assert_eq!(text.lines().filter(|l| l.starts_with("sim ")).count(), 1);
}

#[test]
fn a_failing_sim_exits_1_and_prints_the_replay_command() {
    let out = pserver()
        .args([
            "sim",
            "seeds",
            "--seeds",
            "2",
            "--first-seed",
            "40",
            "--time-limit-ms",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.trim_end().ends_with("failed=2") || stdout.contains("failed=2 "),
        "{stdout}"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("seeds 40..42"), "{stderr}");
    for seed in [40, 41] {
        let replay = format!("replay: pserver sim seeds --seeds 1 --first-seed {seed} ");
        assert!(stderr.contains(&replay), "{stderr}");
    }
}

#[test]
fn sim_runs_a_chosen_update_rule_on_a_changed_ring_and_counts_redirects() {
    let out = pserver()
        .args([
            "sim",
            "seeds",
            "--seeds",
            "10",
            "--servers",
            "3",
            "--updater",
            "ftrl",
            "--ring-change",
            "--drop",
            "0.05",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let last = text.lines().last().unwrap();
    let redirects: u64 = last
        .split_whitespace()
        .find_map(|f| f.strip_prefix("redirects="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no redirect count: {last}"));
    assert!(redirects > 0, "{last}");
    // A failing run names the rule and the ring change in its replay command.
    let out = pserver()
        .args([
            "sim",
            "seeds",
            "--seeds",
            "1",
            "--updater",
            "adagrad",
            "--ring-change",
            "--time-limit-ms",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains(" --updater adagrad --ring-change"),
        "{stderr}"
    );
    let out = pserver()
        .args(["sim", "seeds", "--updater", "adam"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("[possible values: ftrl, adagrad, sgd, sum]"),
        "{err}"
    );
}

#[test]
fn sim_refuses_impossible_arguments_with_a_clear_message() {
    let out = pserver()
        .args(["sim", "seeds", "--drop", "1.5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("not a probability"), "{err}");
    let out = pserver()
        .args(["sim", "seeds", "--consistency", "bounded"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("bounded:TAU")
    );
}

#[test]
fn sim_crashes_servers_and_prints_recovery_times_before_the_summary() {
    let out = pserver()
        .args([
            "sim",
            "seeds",
            "--seeds",
            "12",
            "--servers",
            "3",
            "--replicas",
            "1",
            "--crash-servers",
            "1",
            "--drop",
            "0.05",
            "--reorder",
            "--partition",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    let n = lines.len();
    assert!(n >= 4, "{text}");
    assert!(
        lines[n - 1].starts_with("sim seeds=12 failed=0 steps="),
        "{text}"
    );
    let traffic = lines[n - 2];
    assert!(traffic.starts_with("replication pushed_values="), "{text}");
    let ratio: f64 = traffic
        .rsplit("ratio=")
        .next()
        .and_then(|r| r.parse().ok())
        .unwrap();
    assert!(ratio > 0.0, "{text}");
    let recovery = lines[n - 3];
    assert!(recovery.starts_with("recovery_ms mean="), "{text}");
    let crashes: usize = recovery
        .rsplit("crashes=")
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap();
    assert!(crashes > 0, "{text}");
    assert!(lines[n - 4].starts_with("server_faults crashes="), "{text}");
}

#[test]
fn sim_refuses_shapes_and_straggler_policies_it_cannot_run() {
    for (args, says) in [
        (
            &["--replicas", "1", "--crash-servers", "2", "--servers", "4"][..],
            "--crash-servers 2 exceeds --replicas 1",
        ),
        (
            &["--replicas", "2", "--servers", "2"][..],
            "--replicas 2 needs more than 2 servers",
        ),
        (
            &["--replicas", "1", "--leave-servers", "1", "--servers", "2"][..],
            "--servers 2 is too few",
        ),
        (&["--skip-ahead"][..], "need bounded delay"),
        (
            &["--consistency", "bounded:2", "--adaptive-tau", "4:2"][..],
            "is not a range of tau MIN:MAX",
        ),
    ] {
        let out = pserver()
            .args(["sim", "seeds"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn sim_refuses_push_slots_it_cannot_grant_in_one_line() {
    for bad in ["8192:0", "8192", "big:1", "8192:-1"] {
        let out = pserver()
            .args(["sim", "seeds", "--seeds", "1", "--push-slots", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(out.stdout.is_empty(), "{bad}");
        let err = String::from_utf8(out.stderr).unwrap();
        let said: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(said.len(), 1, "{bad}: {err}");
        assert!(
            said[0].contains(&format!("`{bad}` is not MIN_BYTES:AT_ONCE")),
            "{bad}: {err}"
        );
        assert!(!err.contains("panicked"), "{bad}: {err}");
    }
}

#[test]
fn the_tau_sweep_prints_a_row_per_tau() {
    let out = pserver()
        .args([
            "sim",
            "tau-sweep",
            "--straggler",
            "4",
            "--seeds",
            "2",
            "--iterations",
            "8",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let taus: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("tau="))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        taus,
        [
            "0",
            "1",
            "2",
            "4",
            "8",
            "inf",
            "adaptive:1-8",
            "skip-ahead:1",
            "skip-ahead+shares:1"
        ]
    );
}

#[test]
fn check_prints_a_verdict_per_property_and_the_summary_line() {
    let out = pserver()
        .args(["check", "--network", "ordered"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for property in [
        "exactly-once",
        "staleness",
        "pull complete",
        "in-flight bound",
        "completion",
        "livelock-free",
    ] {
        let line = format!("property {property}: holds");
        assert_eq!(text.lines().filter(|l| *l == line).count(), 2, "{text}");
    }
    assert!(text.contains("property pull waited: found"));
    let last = text.lines().last().unwrap();
    assert!(last.starts_with("check states="), "{text}");
    for field in [" unique=", " depth=", " secs="] {
        assert!(last.contains(field), "{last}");
    }
}

/// The header line of each model configuration a `pserver check` run printed.
fn model_heads(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("model cluster"))
        .collect()
}

/// The replication model with a worker that runs no iteration, in its three configurations:
/// the crash, the fail-over and the refilled replicas; the same on two servers, which leaves
/// one holding every range; the join, the copy and the switch.
/// Small enough for a test (the default shape takes minutes).
#[test]
fn check_model_replication_fails_over_joins_and_checks_the_replication_properties() {
    let out = pserver()
        .args(["check", "replication", "--iterations", "0"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let heads = model_heads(&text);
    assert_eq!(heads.len(), 3, "{text}");
    assert!(
        heads[0].contains("servers=3")
            && heads[0].contains("crashes=1")
            && heads[0].contains("replicas=1"),
        "{text}"
    );
    assert!(
        heads[1].contains("servers=2")
            && heads[1].contains("crashes=1")
            && heads[1].contains("replicas=1"),
        "{text}"
    );
    assert!(
        heads[2].contains("servers=1")
            && heads[2].contains("crashes=0")
            && heads[2].contains("joins=1"),
        "{text}"
    );
    for property in [
        "exactly-once",
        "durability",
        "single-owner",
        "replica-convergence",
        "completion",
        "livelock-free",
    ] {
        let line = format!("property {property}: holds");
        assert_eq!(text.lines().filter(|l| *l == line).count(), 3, "{text}");
    }
    for found in ["primary failed over", "server joined", "replica refilled"] {
        assert!(text.contains(&format!("property {found}: found")), "{text}");
    }
    assert!(text.lines().last().unwrap().starts_with("check states="));
}

/// The shape options that place servers check the one configuration they describe.
#[test]
fn check_model_replication_with_joins_checks_that_one_shape() {
    let out = pserver()
        .args([
            "check",
            "replication",
            "--iterations",
            "0",
            "--servers",
            "1",
            "--replicas",
            "0",
            "--crashes",
            "0",
            "--joins",
            "1",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let heads = model_heads(&text);
    assert_eq!(heads.len(), 1, "{text}");
    assert!(heads[0].contains("joins=1"), "{text}");
    assert!(text.contains("property server joined: found"), "{text}");
    let refused = pserver().args(["check", "--joins", "1"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let err = String::from_utf8(refused.stderr).unwrap();
    assert!(err.contains("check replication"), "{err}");
}

#[cfg(feature = "mutations")]
#[test]
fn check_model_replication_catches_acknowledgements_before_replication() {
    let out = pserver()
        .args(["check", "replication", "--mutation", "ack-before-replicate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("property durability: violated"), "{text}");
    assert!(text.contains("n1 crashes"), "{text}");
}

#[cfg(feature = "mutations")]
#[test]
fn check_model_standby_catches_a_standby_taking_over_without_a_newer_term() {
    let out = pserver()
        .args([
            "check",
            "standby",
            "--crashes",
            "0",
            "--fires",
            "8",
            "--dfs",
            "--mutation",
            "take-over-without-term",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("property single-coordinator: violated"),
        "{text}"
    );
    assert!(
        text.contains("    1. "),
        "a readable counterexample: {text}"
    );
}

#[test]
fn check_model_standby_holds_single_coordinator() {
    let out = pserver()
        .args(["check", "standby", "--fires", "4"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("property single-coordinator: holds"),
        "{text}"
    );
    assert!(
        text.starts_with("model standby crash=true fires=4"),
        "{text}"
    );
}

#[cfg(feature = "mutations")]
#[test]
fn check_finds_a_violation_for_every_mutation() {
    let sequential = ["--consistency", "sequential"].as_slice();
    for (mutation, property, shape) in [
        ("no-dedupe", "exactly-once", sequential),
        ("no-gating", "staleness", sequential),
        ("no-retransmit", "completion", sequential),
        (
            "own-progress-only",
            "staleness",
            &[
                "--consistency",
                "bounded:1",
                "--network",
                "ordered",
                "--iterations",
                "2",
            ],
        ),
        ("eager-advance", "in-flight bound", sequential),
        ("short-pull", "pull complete", sequential),
        (
            "ignore-redirect",
            "livelock-free",
            &["--consistency", "sequential", "--ring-change"],
        ),
        ("skip-past-decision", "staleness", &["--skip-ahead"]),
        ("tau-past-decision", "staleness", &["--adaptive-tau", "0:2"]),
    ] {
        let out = pserver()
            .args(["check", "--mutation", mutation])
            .args(shape)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{mutation}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains(&format!("property {property}: violated")),
            "{text}"
        );
        let explained = text.contains("    1. ") || text.contains("(already in the initial state)");
        assert!(explained, "a readable counterexample: {text}");
    }
}

#[cfg(not(feature = "mutations"))]
#[test]
fn check_mutation_explains_that_it_needs_the_feature() {
    let out = pserver()
        .args(["check", "--mutation", "no-dedupe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("--features mutations"), "{err}");
}

#[test]
fn train_refuses_bad_data_with_file_line_and_column_and_status_2() {
    let dir = std::env::temp_dir().join(format!("pserver-cli-train-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("reviews.svm");
    std::fs::write(&bad, "1 3:1\n0 2:1 abc\n").unwrap();
    let out = pserver()
        .args(["train", "--data", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("reviews.svm:2:7: expected 'index:value', found 'abc'"),
        "{err}"
    );
    let (good, missing) = (dir.join("good.svm"), dir.join("missing.svm"));
    std::fs::write(&good, "1 3:1\n0 2:1\n").unwrap();
    let out = pserver()
        .args(["train", "--data", good.to_str().unwrap()])
        .args(["--test", missing.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("missing.svm: cannot read"), "{err}");
    assert!(!err.contains("panicked"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_saved_model_predicts_what_training_measured() {
    let dir = std::env::temp_dir().join(format!("pserver-cli-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("model.bin");
    let out = pserver()
        .args(["train", "--epochs", "1", "--save", model.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trained = String::from_utf8(out.stdout).unwrap();
    let auc_of = |text: &str, key: &str| -> String {
        let field = text
            .split_whitespace()
            .find(|f| f.starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in {text}"));
        field[key.len()..].to_owned()
    };
    let out = pserver()
        .args([
            "predict",
            "--model",
            model.to_str().unwrap(),
            "--data",
            "data/adult/adult.test.svm.gz",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let predicted = String::from_utf8(out.stdout).unwrap();
    assert_eq!(auc_of(&predicted, "auc="), auc_of(&trained, "test_auc="));
    assert_eq!(
        auc_of(&predicted, "logloss="),
        auc_of(&trained, "test_logloss=")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts a long training run that plots and saves, sends `signal` once two epochs have
/// finished, and returns the exit code with the plot (empty if none) and the model written.
/// The `auc=` field of a `predict` line.
fn auc_of(text: &str) -> Option<f64> {
    text.split_whitespace()
        .find_map(|f| f.strip_prefix("auc="))
        .and_then(|v| v.parse().ok())
}

fn train_then_signal(signal: &str) -> (Option<i32>, String, Result<f64, String>) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command as Process, Stdio};
    use std::time::{Duration, Instant};
    let dir = std::env::temp_dir().join(format!(
        "pserver-cli-signal-{signal}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (plot, model) = (dir.join("loss.svg"), dir.join("model.txt"));
    let mut child = Process::new(assert_cmd::cargo::cargo_bin("pserver"))
        .args(["train", "--epochs", "100000", "--plot"])
        .arg(&plot)
        .arg("--save")
        .arg(&model)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Two finished epochs, so that the plot has a line to draw.
    for _ in 0..2 {
        let line = lines.next().expect("an epoch line").unwrap();
        assert!(line.starts_with("iter="), "{line}");
    }
    let status = Process::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("training did not stop within 30 s of SIG{signal}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let svg = std::fs::read_to_string(&plot).unwrap_or_default();
    // The saved model must load and score the test set.
    let predicted = Process::new(assert_cmd::cargo::cargo_bin("pserver"))
        .args([
            "predict",
            "--data",
            "data/adult/adult.test.svm.gz",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let weights = if predicted.status.success() {
        let text = String::from_utf8_lossy(&predicted.stdout).into_owned();
        auc_of(&text).ok_or(text)
    } else {
        Err(String::from_utf8_lossy(&predicted.stderr).into_owned())
    };
    let written = (code, svg, weights);
    let _ = std::fs::remove_dir_all(&dir);
    written
}

/// Training ended by `signal` exits with `code` and keeps a plot with a line in it and a model
/// of the finished epochs.
fn keeps_finished_epochs_on(signal: &str, code: i32) -> Result<(), String> {
    let (exit, svg, weights) = train_then_signal(signal);
    assert_eq!(exit, Some(code));
    assert!(
        svg.starts_with("<svg") && svg.contains("<polyline"),
        "a partial plot"
    );
    assert!(
        weights? > 0.8,
        "the model of the finished epochs scores the test set"
    );
    Ok(())
}

#[test]
fn ctrl_c_stops_training_cleanly_and_keeps_a_partial_plot() -> Result<(), String> {
    keeps_finished_epochs_on("INT", 130)
}

#[test]
fn sigterm_keeps_finished_epochs() -> Result<(), String> {
    keeps_finished_epochs_on("TERM", 143)
}

/// `bench --quick` measures every transport and the raw baselines, one `name value unit` line
/// each, and `--table` adds the ratios to the raw TCP baseline.
#[test]
fn bench_quick_prints_one_machine_readable_line_per_measure() {
    let out = pserver()
        .args(["bench", "push", "--quick", "--table"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (lines, table) = text.split_once("\n\n").expect("a table after the lines");
    let mut names = Vec::new();
    for line in lines.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 3, "{line}");
        let value: f64 = fields[1].parse().unwrap();
        assert!(value.is_finite() && value > 0.0, "{line}");
        assert!(
            ["GB/s", "us", "Mkeys/s", "fraction"].contains(&fields[2]),
            "{line}"
        );
        // With two servers, each is the primary of between 40% and 60% of every request's
        // keys: the ring, told the bench's key space, spreads them.
        if fields[0].contains(".share.") {
            assert!((0.4..=0.6).contains(&value), "{line}");
        }
        names.push(fields[0].to_owned());
    }
    for wire in ["mem", "tcp", "udp"] {
        for what in ["dense.1K", "dense.64K", "sparse.64K"] {
            let shares = names
                .iter()
                .filter(|n| n.starts_with(&format!("{wire}.2s2w.{what}.share.")))
                .count();
            assert_eq!(shares, 2, "{wire} {what}: {names:?}");
        }
    }
    for name in ["raw_tcp.stream", "raw_tcp.ping_pong.p50"] {
        assert!(names.iter().any(|n| n == name), "{name} missing: {names:?}");
    }
    for wire in ["mem", "tcp", "udp"] {
        for shape in ["1s1w", "2s2w"] {
            for what in [
                "dense_push.1K",
                "dense_pull.64K",
                "sparse_push.64K",
                "sparse_pull.64K",
                "small_push_rtt.p50",
                "small_push_rtt.p99",
            ] {
                let name = format!("{wire}.{shape}.{what}");
                assert!(names.contains(&name), "{name} missing: {names:?}");
            }
        }
    }
    // UDP with a thousandth of its datagrams dropped, each push still applied exactly once
    // (the benchmark checks the totals and fails otherwise).
    for what in ["dense_push.64K", "dense_pull.64K"] {
        let name = format!("udp_lossy.1s1w.{what}");
        assert!(names.contains(&name), "{name} missing: {names:?}");
    }
    assert!(table.contains("vs raw TCP"), "{table}");
    assert_eq!(table.lines().count(), names.len() + 1, "{table}");
}

/// The value of the `name value unit` line named `name` of a benchmark's output.
fn measure(text: &str, name: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.split(' ').next() == Some(name))
        .unwrap_or_else(|| panic!("{name} missing: {text}"));
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

/// `bench --train --quick` measures the floor, three ways of running pserver train in the
/// process and three as processes of their own (one streaming) on the same generated rows,
/// click-shaped and text-shaped, one `name value unit` line each.
#[test]
fn bench_train_measures_pserver_against_a_floor_on_the_same_rows() {
    let out = pserver()
        .args(["bench", "train", "--quick", "--table"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let value = |name: &str| measure(&text, name);
    for way in ["floor", "mem.1s1w", "mem.2s2w", "tcp.1s1w"] {
        assert!(value(&format!("train.{way}.rows_per_sec")) > 0.0);
        let auc = value(&format!("train.{way}.test_auc"));
        assert!(auc > 0.6, "{way}: {text}");
    }
    // One worker under bounded delay runs the floor's minibatches in the floor's order: the
    // same model, to float rounding.
    let (floor, one) = (
        value("train.floor.test_auc"),
        value("train.mem.1s1w.test_auc"),
    );
    assert!((floor - one).abs() < 1e-3, "{text}");
    assert!(value("train.mem.1s1w.vs_floor") > 0.0);
    // Every way reports its peak memory and how its first epoch compares with the later ones.
    for way in ["floor", "mem.1s1w", "mem.2s2w", "tcp.1s1w"] {
        assert!(value(&format!("train.{way}.peak_rss")) > 0.0, "{text}");
        assert!(
            value(&format!("train.{way}.first_epoch_vs_later")) > 0.0,
            "{text}"
        );
    }
    // The same ways on the text-shaped rows, and `pserver train` run as a process for one
    // epoch on both shapes' files, parsing and startup in its CPU.
    for shape in ["", "text."] {
        for way in ["floor", "mem.1s1w", "mem.2s2w", "tcp.1s1w"] {
            let auc = value(&format!("train.{shape}{way}.test_auc"));
            assert!(auc > 0.6, "{shape}{way}: {text}");
            // Every epoch's AUC, the last of which is the one reported.
            assert_eq!(value(&format!("train.{shape}{way}.epoch2.test_auc")), auc);
        }
        for way in ["process.1s1w", "process.2s2w", "process.stream"] {
            assert!(
                value(&format!("train.{shape}{way}.test_auc")) > 0.6,
                "{text}"
            );
            assert!(value(&format!("train.{shape}{way}.cpu_secs_per_mrow")) > 0.0);
        }
        // A streamed run's peak against its file's size.
        assert!(value(&format!("train.{shape}process.stream.rss_vs_file")) > 0.0);
    }
    // VW runs on the same rows when it is installed, and is said to be skipped when not.
    let stderr = String::from_utf8_lossy(&out.stderr);
    if text.contains("train.vw.rows_per_sec") {
        assert!(value("train.vw.test_auc") > 0.6, "{text}");
        assert!(value("train.mem.2s2w.vs_vw") > 0.0, "{text}");
        assert!(value("train.text.process.1s1w.cpu_vs_vw") > 0.0, "{text}");
        // Each way that trains epochs says when it first reached VW's AUC, or that it did not.
        for way in ["floor", "mem.1s1w", "text.mem.2s2w"] {
            let said = format!("train.{way}: VW's test AUC");
            if !stderr.contains(&said) {
                let epochs = value(&format!("train.{way}.epochs_to_vw_auc"));
                assert!((1.0..=2.0).contains(&epochs), "{way}: {text}");
                assert!(
                    value(&format!("train.{way}.secs_to_vw_auc")) > 0.0,
                    "{text}"
                );
            }
        }
    } else {
        assert!(stderr.contains("vw: skipped"), "{stderr}");
    }
    // The table: a header, then a row per way, each with its ratio to the floor.
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("way "))
        .collect();
    assert!(table.len() >= 5, "{text}");
    assert!(table[0].contains("vs floor"), "{text}");
    let floor_row = table
        .iter()
        .find(|l| l.starts_with("floor "))
        .expect("a floor row");
    assert!(floor_row.contains(" 1.000 "), "{floor_row}");
}

/// `bench --filters --quick` measures each filter configuration next to unfiltered training
/// on the shipped and the generated problems: key caching and compression send fewer bytes
/// at the same test AUC.
#[test]
fn bench_filters_measures_the_bytes_each_configuration_saves_next_to_unfiltered_training() {
    let out = pserver()
        .args(["bench", "filters", "--quick"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let value = |name: &str| measure(&text, name);
    for problem in ["adult.mem", "generated.mem"] {
        let none = value(&format!("filters.{problem}.none.epoch_bytes"));
        assert!(none > 0.0, "{text}");
        for config in ["keycache", "keycache_compress", "keycache_compress_sigmod"] {
            let cut = value(&format!("filters.{problem}.{config}.bytes_cut"));
            let bytes = value(&format!("filters.{problem}.{config}.epoch_bytes"));
            assert!(cut > 1.0, "{problem} {config}: {text}");
            assert!(
                (none / bytes - cut).abs() < 1e-3,
                "{problem} {config}: {text}"
            );
            let delta = value(&format!("filters.{problem}.{config}.auc_delta"));
            assert!(delta.abs() < 0.01, "{problem} {config}: {text}");
            // CPU per row, next to unfiltered training's: the cost on a machine whose cores
            // are all busy, where rows/s moves with whatever else runs.
            let cpu = value(&format!("filters.{problem}.{config}.cpu_secs_per_mrow"));
            let none_cpu = value(&format!("filters.{problem}.none.cpu_secs_per_mrow"));
            let ratio = value(&format!("filters.{problem}.{config}.cpu_ratio"));
            assert!(cpu > 0.0 && none_cpu > 0.0, "{problem} {config}: {text}");
            assert!(
                (cpu / none_cpu - ratio).abs() < 1e-3,
                "{problem} {config}: {text}"
            );
        }
        // Compression saves bytes on top of key caching. Not asked of the epochs' totals: they
        // count every message sent, retransmissions included, and on a loaded machine two
        // runs' totals differ by more than compression saves (CI saw 3.85 MB with it, 3.46
        // without).
        assert!(
            value(&format!(
                "filters.{problem}.keycache_compress.compress_bytes_saved"
            )) > 0.0,
            "{text}"
        );
    }
    assert!(value("filters.generated.tcp.keycache_compress.bytes_cut") > 1.0);
    assert!(value("filters.generated.tcp.keycache_compress.rows_per_sec_ratio") > 0.0);
}

/// `bench checkpoint --quick` times a server's checkpoint of a 16 MiB model next to `cp` of the
/// file it wrote, the job started again from it (the bench fails if the model read back is not
/// the one written), and training with a checkpoint after every epoch next to training
/// without; each ratio is its two figures' and the file holds the model.
#[test]
fn bench_checkpoint_measures_a_checkpoint_next_to_cp_and_training_next_to_none() {
    let out = pserver()
        .args(["bench", "checkpoint", "--quick"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let value = |name: &str| measure(&text, name);
    // 16 MiB of rows of a weight and two values of state, each key a byte.
    let mib = value("checkpoint.model.bytes");
    assert!((12.0..20.0).contains(&mib), "{text}");
    for (ratio, over, under) in [
        (
            "checkpoint.write_vs_cp",
            "checkpoint.write.secs",
            "checkpoint.cp.secs",
        ),
        (
            "checkpoint.write_vs_cp_and_flush",
            "checkpoint.write.secs",
            "checkpoint.cp_and_flush.secs",
        ),
        (
            "checkpoint.write_first_vs_cp_and_flush",
            "checkpoint.write.first.secs",
            "checkpoint.cp_and_flush.secs",
        ),
        (
            "checkpoint.train.slowdown",
            "checkpoint.train.every_epoch.secs",
            "checkpoint.train.without.secs",
        ),
    ] {
        let (a, b) = (value(over), value(under));
        assert!(a > 0.0 && b > 0.0, "{text}");
        // The figures are printed to 4 decimals: their ratio is the printed one's to 2%.
        assert!(
            (a / b - value(ratio)).abs() < 0.02 * value(ratio),
            "{ratio}: {text}"
        );
    }
    assert!(value("checkpoint.restore.secs") > 0.0, "{text}");
    // The workers are held until the server took its copy, part of the time to write it.
    let held = value("checkpoint.workers_held.secs");
    assert!(
        held > 0.0 && held <= value("checkpoint.write.secs"),
        "{text}"
    );
}

#[test]
fn bench_measures_only_the_kinds_and_shapes_asked_for() {
    let out = pserver()
        .args([
            "bench",
            "push",
            "--quick",
            "--transports",
            "mem,udp",
            "--kinds",
            "rtt",
            "--topologies",
            "2s2w",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "raw_tcp.stream",
            "raw_tcp.ping_pong.p50",
            "mem.2s2w.small_push_rtt.p50",
            "mem.2s2w.small_push_rtt.p99",
            "udp.2s2w.small_push_rtt.p50",
            "udp.2s2w.small_push_rtt.p99",
        ]
    );
}

/// Runs pserver with `args`, expecting exit status 2 and an error line naming `what`: the
/// first line of stderr, the only one that starts with `error:`.
fn refused(args: &[&str], what: &str) -> String {
    let out = pserver().args(args).output().unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("error: ") && first.contains(what),
        "{args:?}: {err}"
    );
    assert_eq!(err.matches("error:").count(), 1, "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    first.to_owned()
}

#[test]
fn a_nan_alpha_is_refused_naming_the_flag() {
    for nan in ["NaN", "nan", "inf"] {
        refused(&["train", "--alpha", nan], "--alpha");
    }
    refused(&["train", "--alpha", "0"], "--alpha");
}

#[test]
fn a_negative_learning_rate_is_refused() {
    refused(&["train", "--updater", "sgd", "--lr", "-1"], "--lr");
    refused(&["train", "--lr=-1"], "--lr");
    refused(&["train", "--lr", "0"], "--lr");
    refused(&["train", "--lr", "NaN"], "--lr");
}

#[test]
fn a_negative_or_nan_regularization_is_refused_naming_the_flag() {
    refused(&["train", "--l1", "-5"], "--l1");
    refused(&["train", "--l2", "-0.1"], "--l2");
    refused(&["train", "--l2", "NaN"], "--l2");
}

#[test]
fn a_rate_the_chosen_updater_does_not_use_is_refused_not_ignored() {
    refused(
        &["train", "--lr", "0.5"],
        "--lr is not used by --updater ftrl",
    );
    refused(
        &["train", "lr", "--updater", "sgd", "--alpha", "1"],
        "--alpha",
    );
    refused(&["train", "--updater", "adagrad", "--l1", "0"], "--l1");
    refused(&["train", "--updater", "sgd", "--l2", "1"], "--l2");
}

#[test]
fn each_application_of_train_has_its_own_options_and_help() {
    let help = |app: &str| {
        let out = pserver().args(["train", app, "--help"]).output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let (lr, mf, sketch) = (help("lr"), help("mf"), help("sketch"));
    assert!(lr.contains("--alpha") && lr.contains("--updater"), "{lr}");
    assert!(!mf.contains("--alpha") && !mf.contains("--updater"), "{mf}");
    assert!(mf.contains("--epochs") && !mf.contains("--items"), "{mf}");
    assert!(
        sketch.contains("--items") && !sketch.contains("--data"),
        "{sketch}"
    );
    refused(&["train", "sketch", "--data", "x.svm"], "--data");
    refused(&["train", "mf", "--alpha", "1"], "--alpha");
}

#[test]
fn a_model_or_plot_that_could_never_be_written_is_refused_before_training() {
    refused(
        &["train", "--save", "/nonexistent-pserver-dir/m.bin"],
        "--save",
    );
    refused(
        &["train", "--plot", "/nonexistent-pserver-dir/p.svg"],
        "--plot",
    );
}

#[test]
fn zero_epochs_or_batch_are_refused() {
    refused(&["train", "--epochs", "0"], "--epochs");
    refused(&["train", "--batch", "0"], "--batch");
    refused(&["train", "--epochs", "-1"], "--epochs");
    refused(&["train", "mf", "--epochs", "0"], "--epochs");
}

#[test]
fn meaningless_counts_and_bounds_of_the_other_commands_are_refused_naming_the_flag() {
    refused(&["train", "sketch", "--eps", "0"], "--eps");
    refused(&["train", "sketch", "--eps", "-0.1"], "--eps");
    refused(&["train", "sketch", "--delta", "NaN"], "--delta");
    refused(&["train", "sketch", "--items", "0"], "--items");
    refused(&["gen", "--rows", "0", "--out", "never.svm"], "--rows");
    refused(&["local", "--iterations", "0"], "--iterations");
    refused(&["local", "--max-slice-bytes", "0"], "--max-slice-bytes");
    refused(&["sim", "seeds", "--seeds", "0"], "--seeds");
    refused(&["sim", "seeds", "--threads", "0"], "--threads");
    refused(&["check", "--threads", "0"], "--threads");
    refused(&["check", "--max-states", "0"], "--max-states");
}

#[test]
fn an_empty_training_file_is_refused_naming_it() {
    let dir = std::env::temp_dir().join(format!("pserver-cli-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.svm");
    std::fs::write(&empty, "# only a comment\n\n").unwrap();
    let path = empty.to_str().unwrap();
    let line = refused(&["train", "--data", path], "empty.svm");
    assert!(line.contains("no examples"), "{line}");
    // predict needs a model before it reads the data: train one on two rows.
    let tiny = dir.join("tiny.svm");
    std::fs::write(&tiny, "1 1:1\n0 2:1\n").unwrap();
    let (tiny, model) = (tiny.to_str().unwrap(), dir.join("model.bin"));
    refused(&["train", "--data", tiny, "--test", path], "empty.svm");
    let model = model.to_str().unwrap();
    let out = pserver()
        .args(["train", "--data", tiny, "--test", tiny, "--epochs", "1"])
        .args(["--save", model])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    refused(&["predict", "--model", model, "--data", path], "empty.svm");
    // A worker of a cluster reads only its share, but still refuses an empty file.
    let cluster = dir.join("c.toml");
    std::fs::write(&cluster, cluster_file("data = \"empty.svm\"")).unwrap();
    refused(
        &["worker", "--config", cluster.to_str().unwrap(), "--id", "2"],
        "empty.svm: no examples",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cluster file of one server and one worker on ports nobody listens on, running an lr job
/// with the `[job]` lines `job`.
fn cluster_file(job: &str) -> String {
    format!(
        "cluster_id = \"t\"\nsecret_file = \"s.key\"\n[job]\napp = \"lr\"\n{job}\n\
         [[node]]\nid = 0\nrole = \"coordinator\"\naddress = \"127.0.0.1:1\"\n\
         [[node]]\nid = 1\nrole = \"server\"\naddress = \"127.0.0.1:2\"\n\
         [[node]]\nid = 2\nrole = \"worker\"\naddress = \"127.0.0.1:3\"\n"
    )
}

#[test]
fn a_cluster_file_with_a_zero_batch_is_refused_naming_the_field() {
    let dir = std::env::temp_dir().join(format!("pserver-cli-job-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = dir.join("c.toml");
    let config = cluster.to_str().unwrap();
    for (job, field) in [
        ("batch = 0", "c.toml: job.batch: must be at least 1"),
        ("epochs = 0", "c.toml: job.epochs: must be at least 1"),
        (
            "alpha = nan",
            "c.toml: job.alpha: NaN is not a finite number above 0",
        ),
        (
            "l1 = -5.0",
            "c.toml: job.l1: -5 is not a finite number of at least 0",
        ),
    ] {
        std::fs::write(&cluster, cluster_file(&format!("data = \"t.svm\"\n{job}"))).unwrap();
        refused(&["worker", "--config", config, "--id", "2"], field);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Completions and man pages are generated from the definitions that parse the command line:
/// they name the subcommands and flags it takes today.
#[test]
fn completions_and_man_pages_list_the_commands_and_flags_of_the_command_line() {
    let out = pserver().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    for word in [
        "tau-sweep",
        "slots-sweep",
        "stragglers",
        "--slow-worker",
        "--kkt-bound",
    ] {
        assert!(script.contains(word), "{word}");
    }
    let out = pserver().args(["completions", "cobol"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = pserver().arg("man").output().unwrap();
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.contains(".TH pserver 1"), "{page}");
    let dir = std::env::temp_dir().join(format!("pserver-man-{}", std::process::id()));
    let out = pserver().args(["man", "--dir"]).arg(&dir).output().unwrap();
    assert!(out.status.success());
    let seeds = std::fs::read_to_string(dir.join("pserver-sim-seeds.1")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    // roff writes a flag's hyphens as `\-`.
    assert!(seeds.contains(r"kkt\-bound"), "{seeds}");
}

/// Seeds of the coordinator-fault batteries that once lost acknowledged pushes, each to a live
/// server declared dead: by a coordinator back from being cut off (1124), by one cut off
/// while a member had missed its takeover (15, 1491), and by one whose only reminder of a
/// takeover was lost (715). Replayed as the batteries printed them.
#[test]
fn coordinator_fault_seeds_that_once_lost_pushes_replay_clean() {
    let common = "--keys 16 --consistency bounded:1 --drop 0.05 --dup 0.05 --reorder --partition --crash --no-ring-change --crash-coordinator --partition-coordinator";
    let replays = [
        "--first-seed 1124 --servers 3 --workers 3 --iterations 30 --updater ftrl --replicas 1 --crash-servers 1",
        "--first-seed 15 --servers 2 --workers 6 --iterations 20 --updater sum",
        "--first-seed 1491 --servers 2 --workers 6 --iterations 20 --updater sgd",
        "--first-seed 715 --servers 2 --workers 6 --iterations 20 --updater sgd --slow-worker 0:8 --detect-lag 1 --shares 2",
    ];
    for replay in replays {
        let args: Vec<&str> = ["sim", "seeds", "--seeds", "1"]
            .into_iter()
            .chain(replay.split_whitespace())
            .chain(common.split_whitespace())
            .collect();
        let out = pserver().args(&args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{replay}\n{text}");
        assert!(text.contains("sim seeds=1 failed=0"), "{replay}\n{text}");
    }
}
