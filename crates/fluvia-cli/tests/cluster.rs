//! A real cluster: a JobManager and TaskManagers as separate `fluvia`
//! processes on loopback, driven through the CLI and the REST API.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Cluster, assert_success, fluvia, get, http, job_id, request, run_endless_pipeline};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

fn write_input(dir: &Path, lines: usize) -> PathBuf {
    let path = dir.join("in.txt");
    let mut text = String::with_capacity(lines * 60);
    let words = [
        "stream", "batch", "slot", "credit", "barrier", "Fluvia", "flink", "key", "group",
    ];
    for i in 0..lines {
        for j in 0..8 {
            text.push_str(words[(i * 7 + j * 3 + i / 13) % words.len()]);
            text.push(' ');
        }
        text.push_str(&format!("w{}\n", i % 500));
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn embedded_counts(input: &Path, out: &Path) -> String {
    let o = fluvia()
        .args(["run", "wordcount", "--input"])
        .arg(input)
        .arg("--output")
        .arg(out)
        .output()
        .unwrap();
    assert_success(&o);
    std::fs::read_to_string(out).unwrap()
}

#[test]
fn word_count_on_a_cluster_matches_the_embedded_run_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path(), 20_000);
    let expected = embedded_counts(&input, &dir.path().join("embedded.txt"));
    let cluster = Cluster::start(&[], 2, &["--slots", "2"]);
    for mode in ["batch", "streaming"] {
        let out = dir.path().join(format!("{mode}.txt"));
        let o = cluster.wordcount(&input, &out, &["-p", "3", "--mode", mode]);
        assert!(
            o.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(std::fs::read_to_string(&out).unwrap(), expected, "{mode}");
        let details = get(&cluster.rest, &format!("/jobs/{}", job_id(&o)));
        assert_eq!(details["state"], "FINISHED");
        // Subtasks ran on both TaskManagers.
        assert_eq!(hosts(&details).len(), 2, "{details}");
    }
}

#[test]
fn rest_endpoints_have_the_documented_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path(), 2_000);
    let cluster = Cluster::start(&[], 2, &["--slots", "2"]);
    let out = dir.path().join("out.txt");
    let o = cluster.wordcount(&input, &out, &["-p", "2"]);
    assert_success(&o);
    let id = job_id(&o);

    let overview = get(&cluster.rest, "/overview");
    for k in [
        "taskmanagers",
        "slots-total",
        "slots-available",
        "jobs-running",
        "jobs-finished",
        "jobs-failed",
        "jobs-cancelled",
    ] {
        assert!(overview[k].is_u64(), "/overview.{k}: {overview}");
    }
    assert_eq!(overview["slots-total"], 4);
    assert_eq!(overview["jobs-finished"], 1);

    let jobs = get(&cluster.rest, "/jobs");
    assert_eq!(jobs["jobs"][0]["id"], id.as_str());
    assert_eq!(jobs["jobs"][0]["status"], "FINISHED");

    let job = get(&cluster.rest, &format!("/jobs/{id}"));
    for k in [
        "jid",
        "name",
        "state",
        "start-time",
        "end-time",
        "duration",
        "vertices",
    ] {
        assert!(!job[k].is_null(), "/jobs/:id.{k}: {job}");
    }
    let vertices = job["vertices"].as_array().unwrap();
    assert_eq!(vertices.len(), 3);
    for v in vertices {
        for k in ["id", "name", "parallelism", "status", "metrics", "subtasks"] {
            assert!(!v[k].is_null(), "vertex.{k}: {v}");
        }
    }
    assert_eq!(
        vertices[1]["metrics"]["read-records"],
        vertices[0]["metrics"]["write-records"]
    );

    let plan = get(&cluster.rest, &format!("/jobs/{id}/plan"));
    assert_eq!(plan["plan"]["jid"], id.as_str());
    let explain = fluvia()
        .args([
            "explain",
            "--json",
            "wordcount",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "-p",
            "2",
        ])
        .output()
        .unwrap();
    // The plan endpoint shows what explain --json prints (and, beside
    // Flink's fields, what ran through each edge).
    let explained: Value = serde_json::from_slice(&explain.stdout).unwrap();
    let flink_fields = |plan: &Value| -> Value {
        let nodes: Vec<Value> = plan["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                let inputs: Vec<Value> = n["inputs"]
                    .as_array()
                    .map(|a| a.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .map(|i| {
                        serde_json::json!([i["num"], i["id"], i["ship_strategy"], i["exchange"]])
                    })
                    .collect();
                serde_json::json!([
                    n["id"],
                    n["parallelism"],
                    n["operator"],
                    n["operator_strategy"],
                    n["description"],
                    inputs
                ])
            })
            .collect();
        serde_json::json!([plan["name"], plan["type"], nodes])
    };
    assert_eq!(flink_fields(&plan["plan"]), flink_fields(&explained));

    let vid = vertices[1]["id"].as_str().unwrap();
    let vertex = get(&cluster.rest, &format!("/jobs/{id}/vertices/{vid}"));
    let subtasks = vertex["subtasks"].as_array().unwrap();
    assert_eq!(subtasks.len(), 2);
    for s in subtasks {
        for k in ["subtask", "attempt", "host", "status", "metrics"] {
            assert!(!s[k].is_null(), "subtask.{k}: {s}");
        }
        assert_eq!(s["status"], "FINISHED");
    }

    let tms = get(&cluster.rest, "/taskmanagers");
    let tms = tms["taskmanagers"].as_array().unwrap();
    assert_eq!(tms.len(), 2);
    for t in tms {
        for k in [
            "id",
            "path",
            "dataAddress",
            "slotsNumber",
            "timeSinceLastHeartbeat",
        ] {
            assert!(!t[k].is_null(), "taskmanager.{k}: {t}");
        }
    }

    let (status, metrics) = request(&cluster.rest, "GET", "/metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("fluvia_jobmanager_taskmanagers 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE fluvia_task_records_in_total counter"),
        "{metrics}"
    );

    let (status, _) = request(
        &cluster.rest,
        "GET",
        "/jobs/00000000000000000000000000000000",
    );
    assert_eq!(status, 404);
}

#[test]
fn a_streaming_job_without_enough_slots_fails_after_the_timeout_and_a_batch_job_takes_turns() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path(), 100);
    let cluster = Cluster::start(&["-D", "slot.request.timeout=1000"], 1, &["--slots", "1"]);
    let started = Instant::now();
    let args = ["wordcount", "--input", input.to_str().unwrap(), "-p", "3"];
    let mut streaming = args.to_vec();
    streaming.extend(["--mode", "streaming"]);
    let o = cluster.run(&streaming);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not enough slots"), "{err}");
    assert!(err.contains("needs 3 slots"), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(1000));
    // A batch job runs its subtasks in turns on the one slot (as Flink's
    // batch scheduling does) and gives the embedded run's answer.
    let out = dir.path().join("out.txt");
    let mut batch = args.to_vec();
    let out_arg = out.to_str().unwrap().to_string();
    batch.extend(["--mode", "batch", "--output", &out_arg]);
    let o = cluster.run(&batch);
    assert_success(&o);
    let expected = embedded_counts(&input, &dir.path().join("embedded.txt"));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), expected);
}

#[test]
fn a_wrong_or_missing_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path(), 100);
    let cluster = Cluster::start(
        &["-D", "security.cluster-secret=right"],
        1,
        &["-D", "security.cluster-secret=right"],
    );
    // A TaskManager with the wrong secret is refused and exits.
    let o = fluvia()
        .args([
            "taskmanager",
            "--jobmanager",
            &cluster.rpc,
            "-D",
            "security.cluster-secret=wrong",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("wrong cluster secret"));
    // A client without the secret cannot submit.
    let o = cluster.run(&["wordcount", "--input", input.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no cluster secret"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // With it, the job runs.
    let out = dir.path().join("out.txt");
    let o = cluster.wordcount(&input, &out, &["-D", "security.cluster-secret=right"]);
    assert_success(&o);
    // REST reads are open; mutations need the secret.
    let id = job_id(&o);
    let (status, body) = request(&cluster.rest, "PATCH", &format!("/jobs/{id}?mode=cancel"));
    assert_eq!(status, 401, "{body}");
    let (status, body) = http(
        &cluster.rest,
        "PATCH",
        &format!("/jobs/{id}?mode=cancel"),
        &[("X-Fluvia-Secret", "right")],
    );
    assert_eq!(status, 409, "a finished job cannot be cancelled: {body}");
}

/// Polls the job until `ready` holds (failing if it finishes first), then
/// kills (SIGKILL) the TaskManager running subtask 0 of the second vertex and
/// returns its id.
/// The job `fluvia list` names first, as the REST API shows it, checked
/// to have finished.
fn first_listed_job_finished(cluster: &Cluster) -> Value {
    let list = fluvia()
        .args(["list", "--jobmanager", &cluster.rpc])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    let id = list.split_whitespace().next().unwrap().to_string();
    let details = get(&cluster.rest, &format!("/jobs/{id}"));
    assert_eq!(details["state"], "FINISHED");
    details
}

/// The hosts the subtasks of a job (as the REST API shows it) ran on.
fn hosts(job: &Value) -> std::collections::BTreeSet<String> {
    job["vertices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| v["subtasks"].as_array().unwrap().clone())
        .map(|s| s["host"].as_str().unwrap().to_string())
        .collect()
}

fn kill_during(cluster: &mut Cluster, id: &str, ready: impl Fn(&Value) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "the job never reached the kill point; its last status: {last}"
        );
        let (status, body) = request(&cluster.rest, "GET", &format!("/jobs/{id}"));
        if status == 200 {
            let job: Value = serde_json::from_str(&body).unwrap();
            assert_ne!(
                job["state"], "FINISHED",
                "the job finished before the kill: make it longer"
            );
            assert!(
                job["state"] != "FAILED" && job["state"] != "CANCELED",
                "the job ended before the kill: {body}"
            );
            last = body;
            if ready(&job) {
                let victim = job["vertices"][1]["subtasks"][0]["taskmanager-id"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let port: u16 = victim.split('-').nth(1).unwrap().parse().unwrap();
                // The TaskManager id carries its RPC port; find that process.
                let tms = get(&cluster.rest, "/taskmanagers");
                let path = tms["taskmanagers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|t| t["id"] == victim.as_str())
                    .unwrap()["path"]
                    .as_str()
                    .unwrap()
                    .to_string();
                assert!(path.ends_with(&format!(":{port}")));
                let pid: u32 = victim.rsplit('-').next().unwrap().parse().unwrap();
                let child = cluster.tms.iter_mut().find(|c| c.id() == pid).unwrap();
                child.kill().unwrap(); // SIGKILL
                let _ = child.wait();
                return victim;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `fluvia run --jobmanager .. wordcount` (parallelism 4, `mode`) on
/// a thread and returns it with the job's id, read from the REST API.
fn submit_in_background(
    cluster: &Cluster,
    input: &Path,
    out: &Path,
    mode: &str,
) -> (std::thread::JoinHandle<Output>, String) {
    let (rpc, input, out, mode) = (
        cluster.rpc.clone(),
        input.to_path_buf(),
        out.to_path_buf(),
        mode.to_string(),
    );
    let runner = std::thread::spawn(move || {
        fluvia()
            .args(["run", "--jobmanager", &rpc, "wordcount", "--input"])
            .arg(&input)
            .arg("--output")
            .arg(&out)
            .args(["-p", "4", "--mode", &mode])
            .output()
            .unwrap()
    });
    let id = loop {
        let jobs = get(&cluster.rest, "/jobs");
        if let Some(j) = jobs["jobs"].as_array().and_then(|a| a.first()) {
            break j["id"].as_str().unwrap().to_string();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (runner, id)
}

/// Runs the word count of 600,000 lines in `mode` on three TaskManagers of
/// two slots, with a fixed-delay restart strategy (and `restart_args`),
/// kills the TaskManager of the aggregation's first subtask once `when`
/// holds for the job, and checks that the job restarted once to the
/// embedded run's result, nothing lost or duplicated. Returns the job as the
/// REST API shows it at the end, and the killed TaskManager.
fn kill_a_task_manager_during(
    mode: &str,
    restart_args: &[&str],
    when: impl Fn(&Value) -> bool,
) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path(), 600_000);
    let expected = embedded_counts(&input, &dir.path().join("embedded.txt"));
    let mut args = vec!["-D", "restart-strategy.type=fixed-delay"];
    args.extend_from_slice(restart_args);
    args.extend_from_slice(&["-D", "restart-strategy.fixed-delay.delay=100"]);
    let mut cluster = Cluster::start(&args, 3, &["--slots", "2"]);
    let out = dir.path().join("out.txt");
    let (runner, id) = submit_in_background(&cluster, &input, &out, mode);
    let victim = kill_during(&mut cluster, &id, when);
    let o = runner.join().unwrap();
    assert_success(&o);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        expected,
        "nothing lost or duplicated"
    );
    let job = get(&cluster.rest, &format!("/jobs/{id}"));
    assert_eq!(job["restarts"], 1);
    (job, victim)
}

#[test]
fn killing_a_task_manager_during_a_batch_job_reruns_only_the_affected_subtasks() {
    let restart_args = ["-D", "restart-strategy.fixed-delay.attempts=2"];
    // Kill once the source vertex finished and the aggregation runs.
    let (job, victim) = kill_a_task_manager_during("batch", &restart_args, |job| {
        job["vertices"][0]["status"] == "FINISHED" && job["vertices"][1]["status"] == "RUNNING"
    });
    let attempts = |v: usize| attempts_of(&job, v);
    // Source subtasks re-ran only where their results were lost with the
    // TaskManager; aggregation subtasks (running at the time) re-ran where
    // they ran on it or were reading from it, once at most; the sink had not
    // started and ran once.
    let source = attempts(0);
    assert!(
        source.contains(&0) && source.contains(&1),
        "source attempts {source:?} ({victim} killed)"
    );
    for s in job["vertices"][1]["subtasks"].as_array().unwrap() {
        let first = &s["attempts"][0];
        assert!(s["attempt"].as_u64().unwrap() <= 1, "{s}");
        if first["taskmanager-id"] == victim.as_str() {
            assert_eq!(s["attempt"], 1, "it ran on the killed TaskManager: {s}");
            assert_eq!(first["status"], "FAILED", "{s}");
        }
    }
    assert!(attempts(1).contains(&1));
    assert_eq!(attempts(2), vec![0]);
}

#[test]
fn killing_a_task_manager_during_a_streaming_job_restarts_it_to_a_correct_result() {
    let (job, _) = kill_a_task_manager_during("streaming", &[], |job| {
        job["vertices"][1]["subtasks"][0]["metrics"].is_object()
            && job["vertices"][1]["status"] == "RUNNING"
            && job["vertices"][1]["subtasks"][0]["taskmanager-id"].is_string()
    });
    for v in job["vertices"].as_array().unwrap() {
        for s in v["subtasks"].as_array().unwrap() {
            assert_eq!(s["attempt"], 1, "a streaming job restarts every task: {v}");
        }
    }
}

#[test]
fn list_and_cancel_a_running_job() {
    let cluster = Cluster::start(&[], 1, &["--slots", "2"]);
    let (runner, id, _) = run_endless_pipeline(&cluster, "streaming");
    let list = fluvia()
        .args(["list", "--jobmanager", &cluster.rpc])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains(&id) && listed.contains("RUNNING"),
        "{listed}"
    );

    let cancel = fluvia()
        .args(["cancel", "--jobmanager", &cluster.rpc, &id])
        .output()
        .unwrap();
    assert_success(&cancel);
    let o = runner.join().unwrap();
    assert!(!o.status.success(), "a cancelled job is not a success");
    assert!(String::from_utf8_lossy(&o.stderr).contains("CANCELED"));
    assert_eq!(
        get(&cluster.rest, &format!("/jobs/{id}"))["state"],
        "CANCELED"
    );

    let again = fluvia()
        .args(["cancel", "--jobmanager", &cluster.rpc, &id])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("CANCELED already"));

    // The slots are free again: another job runs.
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path(), 100);
    let o = cluster.run(&["wordcount", "--input", input.to_str().unwrap(), "-p", "2"]);
    assert_success(&o);
}

/// Two CSV tables: `sales(item, qty)` and `items(id, name)`.
fn write_sql_tables(dir: &Path) -> (PathBuf, std::collections::BTreeMap<String, u64>) {
    let tables = dir.join("tables");
    std::fs::create_dir_all(tables.join("sales")).unwrap();
    std::fs::create_dir_all(tables.join("items")).unwrap();
    let mut sales = String::from("item,qty\n");
    let mut expected = std::collections::BTreeMap::new();
    for i in 0..30_000u64 {
        let item = (i * 7919) % 50;
        let qty = i % 13;
        sales.push_str(&format!("{item},{qty}\n"));
        *expected.entry(format!("item {}", item % 10)).or_insert(0) += qty;
    }
    std::fs::write(tables.join("sales/sales.csv"), sales).unwrap();
    let mut items = String::from("id,name\n");
    for id in 0..50 {
        items.push_str(&format!("{id},item {}\n", id % 10));
    }
    std::fs::write(tables.join("items/items.csv"), items).unwrap();
    (tables, expected)
}

#[test]
fn sql_on_a_cluster_matches_the_embedded_run_and_spans_task_managers() {
    let dir = tempfile::tempdir().unwrap();
    let (tables, expected) = write_sql_tables(dir.path());
    let query = "select name, sum(qty) as total from sales join items on item = id \
                 group by name order by name";
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "sql",
            "--tables",
            tables.to_str().unwrap(),
            "--format",
            "csv",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Both sides hash-partitioned (the small one is not broadcast), so
        // data crosses between TaskManagers.
        v.extend(
            [
                "-p",
                "3",
                "-D",
                "table.optimizer.join.broadcast-threshold=0",
                "-e",
                query,
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let embedded = fluvia().args(args(&[])).output().unwrap();
    assert_success(&embedded);
    let mut reference = String::from("name,total\n");
    for (name, total) in &expected {
        reference.push_str(&format!("{name},{total}\n"));
    }
    assert_eq!(String::from_utf8_lossy(&embedded.stdout), reference);

    let cluster = Cluster::start(&[], 2, &["--slots", "2"]);
    let o = fluvia()
        .args(args(&["--jobmanager", &cluster.rpc, "--stats"]))
        .output()
        .unwrap();
    assert_success(&o);
    assert_eq!(o.stdout, embedded.stdout);
    let stats = String::from_utf8_lossy(&o.stderr);
    assert!(stats.contains("HASH"), "{stats}");
    let details = first_listed_job_finished(&cluster);
    assert_eq!(hosts(&details).len(), 2, "{details}");
}

#[test]
fn insert_into_on_a_cluster_commits_one_part_file_per_subtask_written_on_several_task_managers() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("events");
    std::fs::create_dir_all(&source).unwrap();
    let mut expected = Vec::new();
    for f in 0..4 {
        let mut text = String::new();
        for r in 0..3_000u64 {
            let id = f * 3_000 + r;
            text.push_str(&format!("{id},{}\n", id % 11));
            if id % 11 < 5 {
                expected.push(format!("{id},{}", (id % 11) * 2));
            }
        }
        std::fs::write(source.join(format!("e{f}.csv")), text).unwrap();
    }
    expected.sort();
    let sink = dir.path().join("doubled");
    let script = format!(
        "CREATE TABLE events (id BIGINT, kind INT) WITH ('connector' = 'filesystem', \
           'path' = '{}', 'format' = 'csv');
         CREATE TABLE doubled (id BIGINT, kind2 INT) WITH ('connector' = 'filesystem', \
           'path' = '{}', 'format' = 'csv');
         INSERT INTO doubled SELECT id, kind * 2 FROM events WHERE kind < 5",
        source.display(),
        sink.display()
    );
    let cluster = Cluster::start(&[], 2, &["--slots", "2"]);
    let o = cluster.sql("4", &script);
    assert_success(&o);
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains(&format!("{} rows written into 'doubled'", expected.len())),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut files: Vec<String> = std::fs::read_dir(&sink)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    let mut union: Vec<String> = files
        .iter()
        .flat_map(|f| {
            assert!(f.starts_with("part-") && f.ends_with("-0.csv"), "{f}");
            std::fs::read_to_string(sink.join(f))
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    union.sort();
    assert_eq!(union, expected);
    // The sink's subtasks ran (and renamed their files) on both TaskManagers.
    let details = first_listed_job_finished(&cluster);
    let sink_vertex = details["vertices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"].as_str().unwrap().contains("Sink: doubled"))
        .unwrap()
        .clone();
    let hosts: std::collections::BTreeSet<String> = sink_vertex["subtasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["host"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(hosts.len(), 2, "{hosts:?}");
}

// ------------------------------------------------------------ shuffle service

const EXTERNAL_WITH_RESTARTS: [&str; 8] = [
    "-D",
    "shuffle-service.type=external",
    "-D",
    "restart-strategy.type=fixed-delay",
    "-D",
    "restart-strategy.fixed-delay.attempts=5",
    "-D",
    "restart-strategy.fixed-delay.delay=100",
];

/// Attempt numbers of every subtask of vertex `v`.
fn attempts_of(job: &Value, v: usize) -> Vec<u64> {
    job["vertices"][v]["subtasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["attempt"].as_u64().unwrap())
        .collect()
}

/// Job directories left in a shuffle service's directory.
fn job_dirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

/// A shuffle service whose standard output was closed before it announced
/// itself keeps running: whoever reads its addresses may stop reading after
/// the first line. It used to die of the closed pipe at its second line.
#[test]
fn a_shuffle_service_outlives_a_closed_standard_output() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(&[], 0, &[]);
    let mut service = fluvia()
        .args(["shuffle-service", "--jobmanager", &cluster.rpc, "--dir"])
        .arg(dir.path())
        .args(common::FAST_HEARTBEATS)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    drop(service.stdout.take());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let services = get(&cluster.rest, "/shuffle-services");
        if !services["shuffle-services"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            service.try_wait().unwrap().is_none() && Instant::now() < deadline,
            "the shuffle service never registered (exit: {:?})",
            service.try_wait()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let exited = service.try_wait().unwrap();
    let _ = service.kill();
    let _ = service.wait();
    assert!(exited.is_none(), "the shuffle service exited: {exited:?}");
}

/// A 600 000-line input and its word counts run embedded, and a cluster
/// (two slots per TaskManager, restarts on) with an external shuffle
/// service over `<dir>/shuffle`; the job's output is to go to `out`.
struct ExternalShuffle {
    input: PathBuf,
    expected: String,
    cluster: Cluster,
    shuffle_dir: PathBuf,
    service: u32,
    out: PathBuf,
    /// Last: removed once the cluster is gone.
    _dir: tempfile::TempDir,
}

impl ExternalShuffle {
    fn start(task_managers: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let input = write_input(dir.path(), 600_000);
        let expected = embedded_counts(&input, &dir.path().join("embedded.txt"));
        let mut cluster = Cluster::start(&EXTERNAL_WITH_RESTARTS, task_managers, &["--slots", "2"]);
        let shuffle_dir = dir.path().join("shuffle");
        let service = cluster.add_shuffle_service(&shuffle_dir);
        let out = dir.path().join("out.txt");
        ExternalShuffle {
            input,
            expected,
            cluster,
            shuffle_dir,
            service,
            out,
            _dir: dir,
        }
    }
}

#[test]
fn with_an_external_shuffle_service_a_killed_task_manager_reruns_no_producer() {
    let mut run = ExternalShuffle::start(3);
    let (runner, id) = submit_in_background(&run.cluster, &run.input, &run.out, "batch");
    let victim = kill_during(&mut run.cluster, &id, |job| {
        job["vertices"][0]["status"] == "FINISHED" && job["vertices"][1]["status"] == "RUNNING"
    });
    let o = runner.join().unwrap();
    assert_success(&o);
    assert_eq!(std::fs::read_to_string(&run.out).unwrap(), run.expected);
    let job = get(&run.cluster.rest, &format!("/jobs/{id}"));
    assert_eq!(job["shuffle-service-type"], "external");
    assert_eq!(
        attempts_of(&job, 0),
        vec![0; 4],
        "the sources' data lives at the service: none re-ran ({victim} killed)"
    );
    assert!(
        attempts_of(&job, 1).contains(&1),
        "what ran on {victim} ran again"
    );
    // The job's files go once it ended.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !job_dirs(&run.shuffle_dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "{:?} left",
            job_dirs(&run.shuffle_dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn killing_the_shuffle_service_mid_job_reruns_the_producers_to_a_correct_result() {
    let mut run = ExternalShuffle::start(2);
    let (runner, id) = submit_in_background(&run.cluster, &run.input, &run.out, "batch");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "the job never reached the kill point"
        );
        let job = get(&run.cluster.rest, &format!("/jobs/{id}"));
        assert_ne!(job["state"], "FINISHED", "finished before the kill");
        if job["vertices"][0]["status"] == "FINISHED" && job["vertices"][1]["status"] == "RUNNING" {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let service = run
        .cluster
        .shuffle_services
        .iter_mut()
        .find(|c| c.id() == run.service)
        .unwrap();
    service.kill().unwrap(); // SIGKILL
    let _ = service.wait();
    // Restarted on the same directory, as a supervisor would.
    run.cluster.add_shuffle_service(&run.shuffle_dir);
    let o = runner.join().unwrap();
    assert_success(&o);
    assert_eq!(std::fs::read_to_string(&run.out).unwrap(), run.expected);
    let job = get(&run.cluster.rest, &format!("/jobs/{id}"));
    assert!(
        attempts_of(&job, 0).iter().any(|&a| a >= 1),
        "the producers whose data the service held ran again: {:?}",
        attempts_of(&job, 0)
    );
}

#[test]
fn final_reports_reach_the_job_manager_without_waiting_for_a_heartbeat() {
    // Heartbeats a minute apart: a batch job whose stages each wait for one
    // would take minutes; reports sent as tasks end make it seconds.
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path(), 2_000);
    let cluster = Cluster::start_with_heartbeats(
        &[
            "-D",
            "heartbeat.interval=60000",
            "-D",
            "heartbeat.timeout=600000",
        ],
        &[],
        1,
        &["--slots", "2"],
    );
    let started = Instant::now();
    let o = cluster.run(&[
        "wordcount",
        "--input",
        input.to_str().unwrap(),
        "-p",
        "2",
        "--mode",
        "batch",
    ]);
    assert_success(&o);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the job took {:?}: its stages waited for heartbeats",
        started.elapsed()
    );
}
