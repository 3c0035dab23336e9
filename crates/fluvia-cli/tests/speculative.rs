//! Speculative execution through separate processes: four TaskManagers, one
//! of which the test slows down from outside (a SIGSTOP / SIGCONT duty cycle
//! on its process) while it runs a tokenizer subtask of a batch word count.
//! The slow subtask gets a second attempt on another TaskManager, that
//! attempt wins, the slow TaskManager is blocked, and the output is right.

#![cfg(unix)]
#![allow(clippy::unwrap_used)]

mod common;

use common::{Cluster, corpus, get};
use serde_json::Value;
use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Stops and continues `pid` (75 % of the time stopped) until `stop`.
fn slow_down(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let signal = |s: &str| {
            let _ = Command::new("kill")
                .args([s, &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        while !stop.load(Ordering::Relaxed) {
            signal("-STOP");
            std::thread::sleep(Duration::from_millis(150));
            signal("-CONT");
            std::thread::sleep(Duration::from_millis(50));
        }
        signal("-CONT");
    })
}

#[test]
fn a_slowed_task_manager_gets_a_twin_of_its_subtask_elsewhere_and_is_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("corpus.txt");
    let out = dir.path().join("counts.txt");
    let expected = corpus(&input, 400_000, 2000, 0);
    let cluster = Cluster::start(&[], 4, &["--slots", "1"]);
    let mut client = common::fluvia()
        .args(["run", "--jobmanager", &cluster.rpc, "wordcount", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&out)
        .args(["-p", "4"])
        .args(["-D", "execution.batch.speculative.enabled=true"])
        .args([
            "-D",
            "slow-task-detector.execution-time.baseline-lower-bound=300ms",
        ])
        .args(["-D", "slow-task-detector.check-interval=100ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The TaskManager running tokenizer subtask 0, once it runs.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (job, victim) = loop {
        assert!(Instant::now() < deadline, "the job never ran");
        let jobs = get(&cluster.rest, "/jobs");
        let found = jobs["jobs"].as_array().unwrap().first().and_then(|j| {
            let id = j["id"].as_str()?.to_string();
            let d = get(&cluster.rest, &format!("/jobs/{id}"));
            let s = &d["vertices"][0]["subtasks"][0];
            (s["status"] == "RUNNING")
                .then(|| (id, s["taskmanager-id"].as_str().unwrap_or("").to_string()))
        });
        if let Some((id, tm)) = found
            && !tm.is_empty()
        {
            break (id, tm);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let pid: u32 = victim.rsplit('-').next().unwrap().parse().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let slowing = slow_down(pid, Arc::clone(&stop));
    let status = client.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    slowing.join().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(client.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    let mut want = String::new();
    for (w, n) in &expected {
        writeln!(want, "{w},{n}").unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        want,
        "each word once, right counts"
    );

    let details = get(&cluster.rest, &format!("/jobs/{job}"));
    let attempts = details["vertices"][0]["subtasks"][0]["attempts"]
        .as_array()
        .unwrap()
        .clone();
    let twin: Vec<&Value> = attempts
        .iter()
        .filter(|a| a["speculative"] == true)
        .collect();
    assert!(!twin.is_empty(), "no speculative attempt: {attempts:?}");
    assert!(
        twin.iter().all(|a| a["taskmanager-id"] != victim.as_str()),
        "{attempts:?}"
    );
    assert!(
        details["numEffectiveSpeculativeExecutions"]
            .as_u64()
            .unwrap()
            >= 1,
        "the twin should have won: {attempts:?}"
    );
    let tms = get(&cluster.rest, "/taskmanagers");
    let blocked: Vec<&str> = tms["taskmanagers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["blocked"] == true)
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert!(blocked.contains(&victim.as_str()), "{blocked:?}");
    assert!(
        get(&cluster.rest, "/overview")["taskmanagers-blocked"]
            .as_u64()
            .unwrap()
            >= 1
    );
    // The same counters in Prometheus form.
    let (status, metrics) = common::http(&cluster.rest, "GET", "/metrics", &[]);
    assert_eq!(status, 200);
    let effective = metrics
        .lines()
        .find(|l| {
            l.starts_with("fluvia_job_num_effective_speculative_executions") && l.contains(&job)
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no speculation counter for {job} in:\n{metrics}"));
    assert!(effective >= 1);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("fluvia_jobmanager_taskmanagers_blocked ") && !l.ends_with(" 0")),
        "{metrics}"
    );
}
