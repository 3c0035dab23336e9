//! Checkpoints on a real cluster (a JobManager and TaskManagers as separate
//! `fluvia` processes): a streaming word count that writes every running
//! count exactly once although a TaskManager is killed, and savepoints
//! restored at another parallelism.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Cluster, assert_success, fluvia, get, request};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

/// `lines` lines of words whose true counts are known.
fn write_input(dir: &Path, lines: usize) -> (PathBuf, BTreeMap<String, u64>) {
    let path = dir.join("in.txt");
    let words = [
        "stream", "barrier", "slot", "credit", "key", "group", "state",
    ];
    let mut text = String::new();
    let mut counts = BTreeMap::new();
    for i in 0..lines {
        for j in 0..4 {
            let w = words[(i * 3 + j * 5 + i / 7) % words.len()];
            text.push_str(w);
            text.push(' ');
            *counts.entry(w.to_string()).or_insert(0) += 1;
        }
        let w = format!("w{}", i % 97);
        text.push_str(&w);
        text.push('\n');
        *counts.entry(w).or_insert(0) += 1;
    }
    std::fs::write(&path, text).unwrap();
    (path, counts)
}

/// Every `word,count` line of the committed part files under `dirs` (hidden
/// in-progress and pending files are not output).
fn committed_counts(dirs: &[&Path]) -> BTreeMap<String, Vec<u64>> {
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for dir in dirs {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with('.') || p.is_dir() {
                continue;
            }
            for line in std::fs::read_to_string(&p).unwrap().lines() {
                let (w, n) = line.rsplit_once(',').unwrap();
                seen.entry(w.to_string())
                    .or_default()
                    .push(n.parse().unwrap());
            }
        }
    }
    seen
}

/// Per word the running counts 1..=n, each exactly once, n its true count.
fn assert_exactly_once(seen: &BTreeMap<String, Vec<u64>>, truth: &BTreeMap<String, u64>) {
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        truth.keys().collect::<Vec<_>>(),
        "the words"
    );
    for (w, counts) in seen {
        let mut c = counts.clone();
        c.sort();
        let n = truth[w];
        assert_eq!(
            c.len() as u64,
            n,
            "{w}: {} counts for {n} occurrences",
            c.len()
        );
        assert!(
            c.iter().copied().eq(1..=n),
            "{w}: the running counts are not 1..={n} each once: {:?}",
            &c[..c.len().min(20)]
        );
    }
}

fn run_word_count(
    cluster: &Cluster,
    input: &Path,
    out: &Path,
    parallelism: usize,
    extra: &[String],
) -> (std::thread::JoinHandle<Output>, String) {
    let before: Vec<Value> = get(&cluster.rest, "/jobs")["jobs"]
        .as_array()
        .unwrap()
        .clone();
    let mut args: Vec<String> = vec![
        "run".into(),
        "--jobmanager".into(),
        cluster.rpc.clone(),
        "wordcount".into(),
        "--input".into(),
        input.display().to_string(),
        "--output".into(),
        out.display().to_string(),
        "--unsorted".into(),
        "--mode".into(),
        "streaming".into(),
        "-p".into(),
        parallelism.to_string(),
    ];
    args.extend(extra.iter().cloned());
    let runner = std::thread::spawn(move || fluvia().args(&args).output().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let id = loop {
        assert!(Instant::now() < deadline, "the job was never submitted");
        let jobs = get(&cluster.rest, "/jobs");
        let new = jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| !before.iter().any(|b| b["id"] == j["id"]))
            .map(|j| j["id"].as_str().unwrap().to_string());
        if let Some(id) = new {
            break id;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (runner, id)
}

/// Waits until the job completed `n` checkpoints.
fn wait_for_checkpoints(cluster: &Cluster, id: &str, n: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = request(&cluster.rest, "GET", &format!("/jobs/{id}/checkpoints"));
        if status == 200 {
            let c: Value = serde_json::from_str(&body).unwrap();
            if c["counts"]["completed"].as_u64().unwrap() >= n {
                return c;
            }
        }
        let job = get(&cluster.rest, &format!("/jobs/{id}"));
        let state = job["state"].as_str().unwrap().to_string();
        assert!(
            !["FINISHED", "FAILED", "CANCELED"].contains(&state.as_str()),
            "the job ended before {n} checkpoints: {job}"
        );
        assert!(
            Instant::now() < deadline,
            "no {n} checkpoints in time: {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn checkpointing(dir: &Path) -> Vec<String> {
    [
        "execution.checkpointing.interval=500ms".to_string(),
        format!("execution.checkpointing.dir={}", dir.join("chk").display()),
        "restart-strategy.type=fixed-delay".to_string(),
        "restart-strategy.fixed-delay.attempts=3".to_string(),
        "restart-strategy.fixed-delay.delay=200".to_string(),
    ]
    .into_iter()
    .flat_map(|kv| ["-D".to_string(), kv])
    .collect()
}

/// The check: three TaskManagers, a rate-limited streaming word
/// count with the exactly-once file sink and checkpoints every 500 ms, a
/// TaskManager killed with SIGKILL after two completed checkpoints. The job
/// recovers and finishes; the output has every running count exactly once;
/// the REST API shows the restore and the completed checkpoints.
#[test]
fn a_killed_task_manager_leaves_every_running_count_written_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (input, truth) = write_input(dir.path(), 24_000);
    let mut cluster = Cluster::start(&[], 3, &["--slots", "2"]);
    let out = dir.path().join("out");
    let mut extra = checkpointing(dir.path());
    extra.extend(["--rate".to_string(), "2500".to_string()]);
    let (runner, id) = run_word_count(&cluster, &input, &out, 2, &extra);
    wait_for_checkpoints(&cluster, &id, 2);
    // Kill the TaskManager of the counting vertex's first subtask.
    let job = get(&cluster.rest, &format!("/jobs/{id}"));
    let victim = job["vertices"][1]["subtasks"][0]["taskmanager-id"]
        .as_str()
        .unwrap()
        .to_string();
    let pid: u32 = victim.rsplit('-').next().unwrap().parse().unwrap();
    let child = cluster.tms.iter_mut().find(|c| c.id() == pid).unwrap();
    child.kill().unwrap();
    let _ = child.wait();

    let o = runner.join().unwrap();
    assert_success(&o);
    assert_exactly_once(&committed_counts(&[&out]), &truth);

    let job = get(&cluster.rest, &format!("/jobs/{id}"));
    assert_eq!(job["state"], "FINISHED");
    assert!(job["restarts"].as_u64().unwrap() >= 1, "{job}");
    let c = get(&cluster.rest, &format!("/jobs/{id}/checkpoints"));
    assert!(c["counts"]["completed"].as_u64().unwrap() >= 2, "{c}");
    assert!(c["counts"]["restored"].as_u64().unwrap() >= 1, "{c}");
    let restored = &c["latest"]["restored"];
    assert!(restored["id"].is_u64(), "{c}");
    assert!(restored["restore_timestamp"].is_u64(), "{c}");
    assert_eq!(restored["is_savepoint"], false);
    for key in ["state_size", "end_to_end_duration", "checkpointed_size"] {
        for s in ["min", "max", "avg"] {
            assert!(c["summary"][key][s].is_u64(), "summary.{key}.{s}: {c}");
        }
    }
    let latest = &c["latest"]["completed"];
    assert_eq!(latest["status"], "COMPLETED");
    assert_eq!(latest["className"], ".CompletedCheckpointStatistics");
    assert!(latest["external_path"].is_string(), "{c}");
    let details = get(
        &cluster.rest,
        &format!("/jobs/{id}/checkpoints/details/{}", latest["id"]),
    );
    assert_eq!(details["id"], latest["id"]);
    let config = get(&cluster.rest, &format!("/jobs/{id}/checkpoints/config"));
    assert_eq!(config["mode"], "exactly_once");
    assert_eq!(config["interval"], 500);
    assert_eq!(config["timeout"], 600_000);
    assert_eq!(config["max_concurrent"], 1);
    assert_eq!(config["externalization"]["enabled"], false);
    let m = get(
        &cluster.rest,
        &format!("/jobs/{id}/metrics?get=numberOfCompletedCheckpoints,numRestarts"),
    );
    assert_eq!(m[0]["id"], "numberOfCompletedCheckpoints");
    assert!(m[1]["value"].as_str().unwrap().parse::<u64>().unwrap() >= 1);
}

/// Stop-with-savepoint at parallelism 2, then the job from the savepoint at
/// parallelism 3 and at 1: each restored run writes the counts after the
/// savepoint, so with the first run's output every running count is there
/// exactly once.
#[test]
fn a_savepoint_taken_at_parallelism_2_restores_at_3_and_at_1() {
    let dir = tempfile::tempdir().unwrap();
    let (input, truth) = write_input(dir.path(), 16_000);
    let cluster = Cluster::start(&[], 3, &["--slots", "2"]);
    let first = dir.path().join("first");
    let mut extra = checkpointing(dir.path());
    extra.extend(["--rate".to_string(), "2000".to_string()]);
    let (runner, id) = run_word_count(&cluster, &input, &first, 2, &extra);
    wait_for_checkpoints(&cluster, &id, 1);
    let savepoints = dir.path().join("savepoints");
    let o = fluvia()
        .args(["stop", "--jobmanager", &cluster.rpc, "--savepoint-path"])
        .arg(&savepoints)
        .arg(&id)
        .output()
        .unwrap();
    assert_success(&o);
    let savepoint = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(
        Path::new(&savepoint).join("_metadata").is_file(),
        "{savepoint}"
    );
    let o = runner.join().unwrap();
    assert_success(&o);
    let job = get(&cluster.rest, &format!("/jobs/{id}"));
    assert_eq!(
        job["state"], "FINISHED",
        "stop-with-savepoint finishes the job"
    );
    let before = committed_counts(&[&first]);
    assert!(
        before.values().map(Vec::len).sum::<usize>() < truth.values().sum::<u64>() as usize,
        "the job was stopped before its end"
    );

    for p in [3, 1] {
        let out = dir.path().join(format!("restored-{p}"));
        let mut extra = checkpointing(dir.path());
        extra.extend(["-s".to_string(), savepoint.clone()]);
        let (runner, id) = run_word_count(&cluster, &input, &out, p, &extra);
        let o = runner.join().unwrap();
        assert_success(&o);
        assert_exactly_once(&committed_counts(&[&first, &out]), &truth);
        let c = get(&cluster.rest, &format!("/jobs/{id}/checkpoints"));
        assert_eq!(c["latest"]["restored"]["is_savepoint"], true, "{c}");
    }
}

/// Starting from a snapshot that cannot be used fails before anything runs,
/// naming the file or the operators.
#[test]
fn a_missing_or_mismatched_snapshot_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (input, _) = write_input(dir.path(), 100);
    // Runs the streaming word count from `snapshot`: it must fail; its
    // error output.
    let refused = |snapshot: &std::path::Path| {
        let o = fluvia()
            .args(["run", "wordcount", "--input"])
            .arg(&input)
            .args(["--mode", "streaming", "-s"])
            .arg(snapshot)
            .output()
            .unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = refused(&dir.path().join("no-such-savepoint"));
    assert!(err.contains("no-such-savepoint"), "{err}");

    let corrupt = dir.path().join("corrupt");
    std::fs::create_dir_all(&corrupt).unwrap();
    std::fs::write(corrupt.join("_metadata"), b"not a checkpoint").unwrap();
    let err = refused(&corrupt);
    assert!(err.contains("_metadata"), "{err}");
}
