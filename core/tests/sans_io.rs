//! The core stays sans-IO: no async runtime, sockets, wall clocks, threads or global randomness
//! anywhere in its source, comments included, so that a reader never has to wonder.

use std::fs;
use std::path::Path;

const FORBIDDEN: [&str; 7] = [
    "tokio",
    "std::net",
    "Instant::now",
    "SystemTime",
    "thread::spawn",
    "thread_rng",
    "rand::random",
];

fn visit(dir: &Path, hits: &mut Vec<String>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            visit(&path, hits);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                for word in FORBIDDEN {
                    if line.contains(word) {
                        hits.push(format!("{}:{}: {word}", path.display(), n + 1));
                    }
                }
            }
        }
    }
}

#[test]
fn core_source_uses_no_io_clock_thread_or_global_rng() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut hits = Vec::new();
    visit(&src, &mut hits);
    assert!(
        hits.is_empty(),
        "core/src must stay sans-IO:\n{}",
        hits.join("\n")
    );
    // Guard the guard: the scan does read the sources.
    let mut probe = Vec::new();
    visit(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"),
        &mut probe,
    );
    assert!(
        !probe.is_empty(),
        "the scan finds the forbidden words listed in this very file"
    );
}
