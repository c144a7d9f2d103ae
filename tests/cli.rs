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
