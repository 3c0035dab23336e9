//! The `fluvia` binary as a user runs it: a separate process, real files.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::Command;

fn fluvia() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fluvia"))
}

fn reference(text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        *counts.entry(w.to_lowercase()).or_insert(0) += 1;
    }
    counts
}

#[test]
fn run_wordcount_writes_sorted_counts_equal_to_a_reference() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let mut text = String::new();
    for i in 0..20_000 {
        text.push_str(&format!(
            "The quick brown fox {} jumps over the lazy dog Ünïcode\n",
            i % 97
        ));
    }
    std::fs::write(&input, &text).unwrap();
    let expected: Vec<String> = reference(&text)
        .into_iter()
        .map(|(w, c)| format!("{w},{c}"))
        .collect();
    for extra in [
        &["-p", "1"][..],
        &["-p", "3"],
        &["-p", "2", "--disable-chaining", "--mode", "streaming"],
    ] {
        let output = dir.path().join("out.txt");
        let status = fluvia()
            .args(["run", "wordcount", "--input"])
            .arg(&input)
            .arg("--output")
            .arg(&output)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        let summary = String::from_utf8_lossy(&status.stderr);
        assert!(summary.contains("finished in"), "{summary}");
        let lines: Vec<String> = std::fs::read_to_string(&output)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(lines, expected, "{extra:?}");
    }
}

#[test]
fn explain_json_has_the_plan_shape() {
    let out = fluvia()
        .args([
            "explain",
            "--json",
            "wordcount",
            "--input",
            "x.txt",
            "-p",
            "2",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["type"], "BATCH");
    let nodes = plan["nodes"].as_array().unwrap();
    let names: Vec<&str> = nodes
        .iter()
        .map(|n| n["description"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "Source: lines -> Tokenizer",
            "Keyed Aggregation",
            "Sorted Word Counts -> Sink: Print to Std. Out"
        ]
    );
    assert_eq!(nodes[1]["inputs"][0]["ship_strategy"], "HASH");
    assert_eq!(nodes[1]["inputs"][0]["id"], nodes[0]["id"]);
    assert_eq!(nodes[2]["inputs"][0]["ship_strategy"], "GLOBAL");
    for n in nodes {
        for key in [
            "id",
            "parallelism",
            "operator",
            "operator_strategy",
            "description",
        ] {
            assert!(n.get(key).is_some(), "missing {key}");
        }
    }

    let dot = fluvia()
        .args([
            "explain",
            "--dot",
            "pipeline",
            "--job",
            "count",
            "--disable-chaining",
        ])
        .output()
        .unwrap();
    let dot = String::from_utf8(dot.stdout).unwrap();
    assert!(dot.starts_with("digraph") && dot.contains("HASH"), "{dot}");
}

/// Runs `fluvia` with `args`, asserts that it fails and returns what it
/// wrote to standard error.
fn failure(args: &[&str]) -> String {
    let out = fluvia().args(args).output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn errors_are_clear_and_fail_the_process() {
    let err = failure(&["run", "wordcount", "--input", "/no/such/file.txt"]);
    assert!(err.contains("/no/such/file.txt"), "{err}");

    let err = failure(&["run", "pipeline", "--rows", "10", "-p", "0"]);
    assert!(err.contains("at least 1"), "{err}");

    let err = failure(&[
        "run",
        "pipeline",
        "--rows",
        "10",
        "-D",
        "pipeline.object-reuse=maybe",
    ]);
    assert!(err.contains("pipeline.object-reuse"));
}

#[test]
fn pipeline_reports_throughput() {
    let out = fluvia()
        .args([
            "run", "pipeline", "--rows", "100000", "--job", "count", "-p", "2",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("100000 rows in") && stdout.contains("M rows/s"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Running Count: 100000 records"), "{stderr}");
}

#[test]
fn a_closed_stderr_does_not_stop_a_job() {
    use std::io::Read;
    use std::process::Stdio;
    // Logging on every thread (JobManager, TaskManager, tasks) into a pipe
    // nobody reads any more, as `fluvia sql ... 2>&1 | head -1` leaves it.
    let mut child = fluvia()
        .args(["sql", "-p", "2", "-e", "SELECT 40 + 2 AS answer"])
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the job did not end within 120 s with stderr closed");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(status.success(), "{status}: {stdout}");
    assert!(stdout.contains("42"), "{stdout}");
}
