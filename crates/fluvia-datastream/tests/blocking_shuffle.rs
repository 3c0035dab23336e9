//! Blocking (batch) exchanges written as sort-merge files on the embedded
//! mini-cluster: corruption on disk is detected and repaired by running the
//! producer again, and nothing is left behind.

#![allow(clippy::unwrap_used)]

use fluvia_core::RuntimeMode;
use fluvia_datastream::StreamExecutionEnvironment;
use std::path::{Path, PathBuf};

fn shuffle_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            shuffle_files(&p, out);
        } else if p.to_string_lossy().ends_with(".shuffle.data") {
            out.push(p);
        }
    }
}

/// Flips one byte near the end of the largest shuffle data file under `dir`.
fn corrupt_largest(dir: &Path) {
    let mut files = Vec::new();
    shuffle_files(dir, &mut files);
    let path = files
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .expect("a shuffle data file");
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 1 << 20, "{} is small", path.display());
    let at = bytes.len() - 20;
    bytes[at] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn a_flipped_byte_in_a_shuffle_file_reruns_its_producer_and_the_answer_is_right() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("corrupted");
    let spill = tmp.path().join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(1).set_runtime_mode(RuntimeMode::Batch);
    env.set_config("io.tmp.dirs", spill.to_str().unwrap())
        .set_config("restart-strategy.type", "fixed-delay")
        .set_config("restart-strategy.fixed-delay.attempts", "3")
        .set_config("restart-strategy.fixed-delay.delay", "10")
        // Uncompressed, so the flipped byte lands in a payload or header.
        .set_config(
            "taskmanager.network.blocking-shuffle.compression.enabled",
            "false",
        );
    let n = 2_000_000i64;
    let (m, root) = (marker.clone(), spill.clone());
    let (_, handle) = env
        .from_sequence(1, n)
        .rebalance()
        .map(move |x: i64| {
            // The first consumer corrupts what it is about to read: it has
            // read ahead a few buffers, the end of the file comes later.
            if !m.exists() {
                corrupt_largest(&root);
                std::fs::write(&m, b"").unwrap();
            }
            x
        })
        .key_by(|_: &i64| 0u8)
        .reduce(|a, b| a + b)
        .collect();
    let result = env.execute("corrupt shuffle").unwrap();
    assert!(marker.exists(), "the file was corrupted");
    assert_eq!(handle.take(), vec![n * (n + 1) / 2]);
    let attempt = |v: usize| {
        result
            .attempts
            .iter()
            .find(|(vertex, _, _)| *vertex == v)
            .map(|a| a.2)
            .unwrap()
    };
    assert_eq!(attempt(0), 1, "the source whose file was corrupt ran again");
    assert_eq!(attempt(1), 1, "the reader that failed ran again");
    assert_eq!(attempt(2), 0, "the reduce never saw bad data");
    let mut left = Vec::new();
    shuffle_files(&spill, &mut left);
    assert!(
        left.is_empty(),
        "shuffle files left after the job: {left:?}"
    );
}
