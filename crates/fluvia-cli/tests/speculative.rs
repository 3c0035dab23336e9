//! Speculative execution through separate processes: four TaskManagers, one
//! of which the test slows down from outside (a SIGSTOP / SIGCONT duty cycle
//! on its process). The slow subtask gets a second attempt on another
//! TaskManager, that attempt wins, the slow TaskManager is blocked, and the
//! output is right: for a word count whose slowed subtask is a source, for
//! one whose slowed subtask is a sink writing part files (each record once,
//! no attempt's leftovers), and for a TPC-DS query.

#![cfg(unix)]
#![allow(clippy::unwrap_used)]

mod common;

use common::{Cluster, corpus, get, request};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
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

/// These tests measure slowness: three clusters of five processes each,
/// slowed from outside, on two cores would make every TaskManager slow.
/// They run one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Speculation on, with a detector quick enough for a test.
const SPECULATION: [&str; 6] = [
    "-D",
    "execution.batch.speculative.enabled=true",
    "-D",
    "slow-task-detector.execution-time.baseline-lower-bound=300ms",
    "-D",
    "slow-task-detector.check-interval=100ms",
];

/// The first job's id and the TaskManager running subtask 0 of `vertex`,
/// once it runs.
fn running_subtask_0(cluster: &Cluster, vertex: usize) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the job never ran");
        let jobs = get(&cluster.rest, "/jobs");
        let found = jobs["jobs"].as_array().unwrap().first().and_then(|j| {
            let id = j["id"].as_str()?.to_string();
            let d = get(&cluster.rest, &format!("/jobs/{id}"));
            let s = &d["vertices"][vertex]["subtasks"][0];
            (s["status"] == "RUNNING")
                .then(|| (id, s["taskmanager-id"].as_str().unwrap_or("").to_string()))
        });
        if let Some((id, tm)) = found
            && !tm.is_empty()
        {
            return (id, tm);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// TaskManager ids end in their process id.
fn pid_of(tm: &str) -> u32 {
    tm.rsplit('-').next().unwrap().parse().unwrap()
}

/// `word,count` lines of `counts`, sorted.
fn lines_of(counts: &BTreeMap<String, u64>) -> String {
    let mut want = String::new();
    for (w, n) in counts {
        writeln!(want, "{w},{n}").unwrap();
    }
    want
}

/// A speculative attempt of some subtask of `vertex` ran away from
/// `victim`, and a speculative attempt won.
/// `won`: a speculative attempt must also have finished first (the long
/// jobs; in TPC-DS q3 at SF 0.1 a task takes a fraction of a second, and on
/// a loaded machine the slowed original may still finish first).
fn assert_twin_elsewhere(details: &Value, vertex: usize, victim: &str, won: bool) {
    let attempts: Vec<Value> = details["vertices"][vertex]["subtasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["attempts"].as_array().unwrap().clone())
        .collect();
    let twins: Vec<&Value> = attempts
        .iter()
        .filter(|a| a["speculative"] == true)
        .collect();
    assert!(!twins.is_empty(), "no speculative attempt: {attempts:?}");
    assert!(
        twins.iter().all(|a| a["taskmanager-id"] != victim),
        "{attempts:?}"
    );
    assert!(
        !won || details["numEffectiveSpeculativeExecutions"]
            .as_u64()
            .unwrap()
            >= 1,
        "a speculative attempt should have won: {attempts:?}"
    );
}

fn assert_blocked(cluster: &Cluster, victim: &str) {
    let tms = get(&cluster.rest, "/taskmanagers");
    let blocked: Vec<&str> = tms["taskmanagers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["blocked"] == true)
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert!(blocked.contains(&victim), "{blocked:?}");
}

/// Waits for `client`, slowing `victim` meanwhile; its stderr if it failed.
fn wait_slowed(mut client: std::process::Child, victim: &str) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let slowing = slow_down(pid_of(victim), Arc::clone(&stop));
    let status = client.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    slowing.join().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(client.stderr.as_mut().unwrap(), &mut err).unwrap();
    let mut out = String::new();
    if let Some(o) = client.stdout.as_mut() {
        std::io::Read::read_to_string(o, &mut out).unwrap();
    }
    if status.success() {
        Ok(())
    } else {
        Err(format!("{out}\n{err}"))
    }
}

/// Starts the word count job from `input` into `out` on `cluster` with
/// speculation on and `args`; its standard error is piped.
fn speculated_wordcount(cluster: &Cluster, input: &Path, out: &Path, args: &[&str]) -> Child {
    common::fluvia()
        .args(["run", "--jobmanager", &cluster.rpc, "wordcount", "--input"])
        .arg(input)
        .arg("--output")
        .arg(out)
        .args(args)
        .args(SPECULATION)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A corpus of 400,000 lines over `distinct` words in `dir`, and the path
/// `out` there for the word count's output: (corpus, output, the counts).
fn corpus_and_output(
    dir: &Path,
    distinct: u64,
    out: &str,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    BTreeMap<String, u64>,
) {
    let input = dir.join("corpus.txt");
    let expected = corpus(&input, 400_000, distinct, 0);
    (input, dir.join(out), expected)
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn a_slowed_task_manager_gets_a_twin_of_its_subtask_elsewhere_and_is_blocked() {
    let _one_at_a_time = serial();
    let dir = tempfile::tempdir().unwrap();
    let (input, out, expected) = corpus_and_output(dir.path(), 2000, "counts.txt");
    let cluster = Cluster::start(&[], 4, &["--slots", "1"]);
    let client = speculated_wordcount(&cluster, &input, &out, &["-p", "4"]);
    let (job, victim) = running_subtask_0(&cluster, 0);
    wait_slowed(client, &victim).unwrap();
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        lines_of(&expected),
        "each word once, right counts"
    );
    let details = get(&cluster.rest, &format!("/jobs/{job}"));
    assert_twin_elsewhere(&details, 0, &victim, true);
    assert_blocked(&cluster, &victim);
    assert!(
        get(&cluster.rest, "/overview")["taskmanagers-blocked"]
            .as_u64()
            .unwrap()
            >= 1
    );
    // The same counters in Prometheus form.
    let (status, metrics) = request(&cluster.rest, "GET", "/metrics");
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

#[test]
fn a_slowed_sink_subtask_is_speculated_and_each_record_is_written_once() {
    let _one_at_a_time = serial();
    let dir = tempfile::tempdir().unwrap();
    let (input, out, expected) = corpus_and_output(dir.path(), 200_000, "counts");
    let mut cluster = Cluster::start(
        &["-D", "shuffle-service.type=external"],
        4,
        &["--slots", "1"],
    );
    // The sinks' inputs are served by a process that is not slowed.
    cluster.add_shuffle_service(&dir.path().join("shuffle"));
    let client = speculated_wordcount(&cluster, &input, &out, &["--unsorted", "-p", "4"]);
    // Vertex 1: keyed sum -> format -> text file sink, one part file each.
    let (job, victim) = running_subtask_0(&cluster, 1);
    wait_slowed(client, &victim).unwrap();
    let details = get(&cluster.rest, &format!("/jobs/{job}"));
    assert!(
        details["vertices"][1]["name"]
            .as_str()
            .unwrap()
            .contains("Sink: Text File"),
        "{}",
        details["vertices"][1]["name"]
    );
    assert_twin_elsewhere(&details, 1, &victim, true);
    assert_blocked(&cluster, &victim);

    let parts = ["part-0", "part-1", "part-2", "part-3"];
    // The losing attempt's hidden file goes when its TaskManager releases
    // the job.
    let deadline = Instant::now() + Duration::from_secs(20);
    while names_in(&out) != parts && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(names_in(&out), parts, "only the winners' files, committed");
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for p in parts {
        for line in std::fs::read_to_string(out.join(p)).unwrap().lines() {
            let (w, n) = line.rsplit_once(',').unwrap();
            assert!(
                got.insert(w.to_string(), n.parse().unwrap()).is_none(),
                "{w} written twice"
            );
        }
    }
    assert_eq!(got, expected, "each word once, right counts");
}

#[test]
fn a_tpcds_query_on_a_cluster_with_a_slowed_task_manager_is_right_and_speculated() {
    let _one_at_a_time = serial();
    let data = common::tpcds_data();
    let cluster = Cluster::start(&[], 4, &["--slots", "1"]);
    let victim = get(&cluster.rest, "/taskmanagers")["taskmanagers"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Slowed from the start: every stage's subtask there lags.
    let client = common::fluvia()
        .args(["tpcds", "run", "--data"])
        .arg(data)
        .arg("--queries")
        .arg(common::shared().join("queries"))
        .arg("--check")
        .arg(common::shared().join("answers/sf0.1"))
        .args(["--query", "3", "-p", "4", "--jobmanager", &cluster.rpc])
        .args(SPECULATION)
        .args([
            "-D",
            "slow-task-detector.execution-time.baseline-lower-bound=100ms",
            // The scans at -p 4 on DataFusion's byte ranges: at SF 0.1 each
            // table is one row group, which split on row groups would be
            // one subtask, with no sibling to measure a slow one against.
            "-D",
            "table.exec.parquet.split-on-row-groups=false",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_slowed(client, &victim).unwrap();
    let jobs = get(&cluster.rest, "/jobs");
    let job = jobs["jobs"][0]["id"].as_str().unwrap().to_string();
    let details = get(&cluster.rest, &format!("/jobs/{job}"));
    let speculated: Vec<usize> = (0..details["vertices"].as_array().unwrap().len())
        .filter(|&v| {
            details["vertices"][v]["subtasks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| {
                    s["attempts"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|a| a["speculative"] == true)
                })
        })
        .collect();
    assert!(!speculated.is_empty(), "nothing speculated: {details}");
    for v in speculated {
        assert_twin_elsewhere(&details, v, &victim, false);
    }
    assert_blocked(&cluster, &victim);
}
