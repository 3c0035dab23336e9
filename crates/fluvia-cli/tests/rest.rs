//! The REST API against Flink's documented shapes: every endpoint's field
//! names and JSON types (a client written for Flink's REST API reads
//! Fluvia's), live metrics of a running job, and cancel.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Cluster, assert_success, get, job_id, request};
use serde_json::Value;
use std::time::Duration;

/// JSON types as Flink documents them.
#[derive(Clone, Copy, Debug)]
enum T {
    Str,
    /// Integer (ms, bytes, counts; may be -1).
    Int,
    Num,
    Bool,
    Arr,
    Obj,
    /// A string or null.
    OptStr,
}

fn check(v: &Value, what: &str, fields: &[(&str, T)]) {
    for (k, t) in fields {
        let f = &v[*k];
        let ok = match t {
            T::Str => f.is_string(),
            T::Int => f.is_i64() || f.is_u64(),
            T::Num => f.is_number(),
            T::Bool => f.is_boolean(),
            T::Arr => f.is_array(),
            T::Obj => f.is_object(),
            T::OptStr => f.is_string() || f.is_null(),
        };
        assert!(ok, "{what}.{k} should be {t:?}, is {f} in {v}");
    }
}

const IO_METRICS: &[(&str, T)] = &[
    ("read-bytes", T::Int),
    ("read-bytes-complete", T::Bool),
    ("write-bytes", T::Int),
    ("write-bytes-complete", T::Bool),
    ("read-records", T::Int),
    ("read-records-complete", T::Bool),
    ("write-records", T::Int),
    ("write-records-complete", T::Bool),
    ("accumulated-backpressured-time", T::Int),
    ("accumulated-idle-time", T::Int),
    ("accumulated-busy-time", T::Num),
];

const EXECUTION_STATES: &[&str] = &[
    "CREATED",
    "SCHEDULED",
    "DEPLOYING",
    "RUNNING",
    "FINISHED",
    "CANCELING",
    "CANCELED",
    "FAILED",
    "RECONCILING",
    "INITIALIZING",
];

const SUBTASK: &[(&str, T)] = &[
    ("subtask", T::Int),
    ("status", T::Str),
    ("attempt", T::Int),
    ("endpoint", T::Str),
    ("start-time", T::Int),
    ("start_time", T::Int),
    ("end-time", T::Int),
    ("duration", T::Int),
    ("metrics", T::Obj),
    ("taskmanager-id", T::Str),
    ("status-duration", T::Obj),
];

fn write_input(dir: &std::path::Path, lines: usize) -> std::path::PathBuf {
    let p = dir.join("in.txt");
    let text: String = (0..lines)
        .map(|i| format!("w{} w{} w{}\n", i % 13, i % 7, i % 3))
        .collect();
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn every_endpoint_answers_with_flink_s_field_names_types_and_units() {
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path(), 3_000);
    let cluster = Cluster::start(&["-D", "web.refresh-interval=2 s"], 2, &["--slots", "2"]);
    let out = dir.path().join("out.txt");
    let o = cluster.wordcount(&input, &out, &["-p", "2"]);
    assert_success(&o);
    let id = job_id(&o);

    let config = get(&cluster.rest, "/config");
    check(
        &config,
        "/config",
        &[
            ("refresh-interval", T::Int),
            ("timezone-name", T::Str),
            ("timezone-offset", T::Int),
            ("flink-version", T::Str),
            ("flink-revision", T::Str),
            ("features", T::Obj),
        ],
    );
    assert_eq!(config["refresh-interval"], 2000, "ms");
    check(
        &config["features"],
        "/config.features",
        &[
            ("web-submit", T::Bool),
            ("web-cancel", T::Bool),
            ("web-rescale", T::Bool),
            ("web-history", T::Bool),
        ],
    );

    let overview = get(&cluster.rest, "/overview");
    check(
        &overview,
        "/overview",
        &[
            ("taskmanagers", T::Int),
            ("slots-total", T::Int),
            ("slots-available", T::Int),
            ("jobs-running", T::Int),
            ("jobs-finished", T::Int),
            ("jobs-cancelled", T::Int),
            ("jobs-failed", T::Int),
            ("flink-version", T::Str),
            ("flink-commit", T::Str),
        ],
    );
    assert_eq!(overview["slots-total"], 4);

    let jobs = get(&cluster.rest, "/jobs/overview");
    let line = &jobs["jobs"][0];
    check(
        line,
        "/jobs/overview.jobs[]",
        &[
            ("jid", T::Str),
            ("name", T::Str),
            ("start-time", T::Int),
            ("end-time", T::Int),
            ("duration", T::Int),
            ("state", T::Str),
            ("last-modification", T::Int),
            ("tasks", T::Obj),
        ],
    );
    assert_eq!(line["jid"], id.as_str());
    assert_eq!(line["state"], "FINISHED");
    // Lower-case states and a total, as Flink's overview has them.
    for s in EXECUTION_STATES {
        assert!(line["tasks"][s.to_lowercase()].is_u64(), "{line}");
    }
    assert_eq!(line["tasks"]["total"], line["tasks"]["finished"], "{line}");
    assert!(line["tasks"]["total"].as_u64().unwrap() >= 3, "{line}");
    let start = line["start-time"].as_u64().unwrap();
    let end = line["end-time"].as_u64().unwrap();
    assert_eq!(line["duration"].as_u64().unwrap(), end - start, "ms");
    assert!(start > 1_700_000_000_000, "epoch milliseconds: {start}");

    let job = get(&cluster.rest, &format!("/jobs/{id}"));
    check(
        &job,
        "/jobs/:id",
        &[
            ("jid", T::Str),
            ("name", T::Str),
            ("isStoppable", T::Bool),
            ("state", T::Str),
            ("job-type", T::Str),
            ("start-time", T::Int),
            ("end-time", T::Int),
            ("duration", T::Int),
            ("maxParallelism", T::Int),
            ("now", T::Int),
            ("timestamps", T::Obj),
            ("vertices", T::Arr),
            ("status-counts", T::Obj),
            ("plan", T::Obj),
        ],
    );
    assert_eq!(job["job-type"], "BATCH");
    assert!(job["timestamps"]["FINISHED"].as_u64().unwrap() >= start);
    for s in EXECUTION_STATES {
        assert!(job["status-counts"][s].is_u64(), "status-counts.{s}");
    }
    let vertices = job["vertices"].as_array().unwrap();
    assert_eq!(vertices.len(), 3);
    for v in vertices {
        check(
            v,
            "vertices[]",
            &[
                ("id", T::Str),
                ("name", T::Str),
                ("maxParallelism", T::Int),
                ("parallelism", T::Int),
                ("status", T::Str),
                ("start-time", T::Int),
                ("end-time", T::Int),
                ("duration", T::Int),
                ("tasks", T::Obj),
                ("metrics", T::Obj),
            ],
        );
        check(&v["metrics"], "vertices[].metrics", IO_METRICS);
        assert_eq!(v["status"], "FINISHED");
        assert_eq!(v["metrics"]["write-records-complete"], true);
        for s in EXECUTION_STATES {
            assert!(v["tasks"][s].is_u64(), "vertices[].tasks.{s}: {v}");
        }
    }
    assert_eq!(
        vertices[1]["metrics"]["read-records"],
        vertices[0]["metrics"]["write-records"]
    );

    // The plan: Flink's node fields, one node per vertex, inputs by id.
    let plan = get(&cluster.rest, &format!("/jobs/{id}/plan"));
    assert_eq!(plan["plan"], job["plan"]);
    check(
        &plan["plan"],
        "plan",
        &[
            ("jid", T::Str),
            ("name", T::Str),
            ("type", T::Str),
            ("nodes", T::Arr),
        ],
    );
    let nodes = plan["plan"]["nodes"].as_array().unwrap();
    for (n, v) in nodes.iter().zip(vertices) {
        check(
            n,
            "plan.nodes[]",
            &[
                ("id", T::Str),
                ("parallelism", T::Int),
                ("operator", T::Str),
                ("operator_strategy", T::Str),
                ("description", T::Str),
            ],
        );
        assert_eq!(n["id"], v["id"]);
        // Sources have no inputs key (as in Flink 1.x).
        for i in n["inputs"]
            .as_array()
            .map(|a| a.as_slice())
            .unwrap_or_default()
        {
            check(
                i,
                "plan.nodes[].inputs[]",
                &[
                    ("num", T::Int),
                    ("id", T::Str),
                    ("ship_strategy", T::Str),
                    ("exchange", T::Str),
                ],
            );
        }
    }
    // The keyed edge carried what the source wrote.
    let hash = &nodes[1]["inputs"][0];
    assert_eq!(hash["ship_strategy"], "HASH");
    assert_eq!(hash["id"], nodes[0]["id"]);
    assert_eq!(hash["records"], vertices[0]["metrics"]["write-records"]);
    assert!(hash["bytes"].as_u64().unwrap() > 0);

    let vid = vertices[1]["id"].as_str().unwrap();
    let vertex = get(&cluster.rest, &format!("/jobs/{id}/vertices/{vid}"));
    check(
        &vertex,
        "/jobs/:id/vertices/:vid",
        &[
            ("id", T::Str),
            ("name", T::Str),
            ("parallelism", T::Int),
            ("maxParallelism", T::Int),
            ("now", T::Int),
            ("subtasks", T::Arr),
        ],
    );
    let subtasks = vertex["subtasks"].as_array().unwrap();
    assert_eq!(subtasks.len(), 2);
    let hosts: std::collections::BTreeSet<&str> = subtasks
        .iter()
        .map(|s| s["taskmanager-id"].as_str().unwrap())
        .collect();
    assert!(!hosts.is_empty());
    for s in subtasks {
        check(s, "subtasks[]", SUBTASK);
        check(&s["metrics"], "subtasks[].metrics", IO_METRICS);
        assert_eq!(s["status"], "FINISHED");
        assert!(s["endpoint"].as_str().unwrap().contains(':'), "{s}");
        assert!(
            s["status-duration"]["RUNNING"].as_i64().unwrap() >= 0,
            "{s}"
        );
        assert!(s["other-concurrent-attempts"].is_array(), "{s}");
    }

    let attempt = get(
        &cluster.rest,
        &format!("/jobs/{id}/vertices/{vid}/subtasks/1/attempts/0"),
    );
    check(&attempt, "attempt", SUBTASK);
    assert_eq!(attempt["subtask"], 1);
    assert_eq!(attempt["attempt"], 0);
    let current = get(
        &cluster.rest,
        &format!("/jobs/{id}/vertices/{vid}/subtasks/1"),
    );
    assert_eq!(current["attempt"], 0);
    assert_json_404(
        &cluster.rest,
        &format!("/jobs/{id}/vertices/{vid}/subtasks/1/attempts/7"),
    );

    let agg = get(
        &cluster.rest,
        &format!(
            "/jobs/{id}/vertices/{vid}/subtasks/metrics?get=numRecordsIn,busyTimeMsPerSecond&agg=min,max,sum"
        ),
    );
    let agg = agg.as_array().expect("a top-level array, as Flink's");
    assert_eq!(agg.len(), 2);
    assert_eq!(agg[0]["id"], "numRecordsIn");
    check(
        &agg[0],
        "subtasks/metrics[]",
        &[("min", T::Num), ("max", T::Num), ("sum", T::Num)],
    );
    assert!(agg[0]["avg"].is_null(), "only the aggregates asked for");
    assert_eq!(
        agg[0]["sum"].as_f64().unwrap() as u64,
        vertices[1]["metrics"]["read-records"].as_u64().unwrap()
    );
    let names = get(
        &cluster.rest,
        &format!("/jobs/{id}/vertices/{vid}/subtasks/metrics"),
    );
    assert!(
        names
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "backPressuredTimeMsPerSecond")
    );

    let bp = get(
        &cluster.rest,
        &format!("/jobs/{id}/vertices/{vid}/backpressure"),
    );
    check(
        &bp,
        "backpressure",
        &[
            ("status", T::Str),
            ("backpressure-level", T::Str),
            ("backpressureLevel", T::Str),
            ("end-timestamp", T::Int),
            ("subtasks", T::Arr),
        ],
    );
    for s in bp["subtasks"].as_array().unwrap() {
        check(
            s,
            "backpressure.subtasks[]",
            &[
                ("subtask", T::Int),
                ("backpressure-level", T::Str),
                ("ratio", T::Num),
                ("idleRatio", T::Num),
                ("busyRatio", T::Num),
            ],
        );
        assert!(["ok", "low", "high"].contains(&s["backpressure-level"].as_str().unwrap()));
        let r = s["ratio"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&r), "a ratio: {r}");
    }

    let exceptions = get(&cluster.rest, &format!("/jobs/{id}/exceptions"));
    check(
        &exceptions,
        "exceptions",
        &[
            ("root-exception", T::OptStr),
            ("all-exceptions", T::Arr),
            ("truncated", T::Bool),
            ("exceptionHistory", T::Obj),
        ],
    );
    assert_eq!(
        exceptions["exceptionHistory"]["entries"],
        serde_json::json!([])
    );

    let jc = get(&cluster.rest, &format!("/jobs/{id}/config"));
    check(
        &jc,
        "/jobs/:id/config",
        &[
            ("jid", T::Str),
            ("name", T::Str),
            ("execution-config", T::Obj),
        ],
    );
    check(
        &jc["execution-config"],
        "execution-config",
        &[
            ("execution-mode", T::Str),
            ("restart-strategy", T::Str),
            ("job-parallelism", T::Int),
            ("object-reuse-mode", T::Bool),
            ("user-config", T::Obj),
        ],
    );

    let tms = get(&cluster.rest, "/taskmanagers");
    let tms = tms["taskmanagers"].as_array().unwrap();
    assert_eq!(tms.len(), 2);
    for t in tms {
        check(
            t,
            "taskmanagers[]",
            &[
                ("id", T::Str),
                ("path", T::Str),
                ("dataPort", T::Int),
                ("jmxPort", T::Int),
                ("timeSinceLastHeartbeat", T::Int),
                ("slotsNumber", T::Int),
                ("freeSlots", T::Int),
                ("totalResource", T::Obj),
                ("freeResource", T::Obj),
                ("hardware", T::Obj),
                ("blocked", T::Bool),
            ],
        );
        // Flink's timeSinceLastHeartbeat is the time of the last heartbeat.
        let at = t["timeSinceLastHeartbeat"].as_u64().unwrap();
        assert!(at > 1_700_000_000_000, "epoch ms: {at}");
        let tm = t["id"].as_str().unwrap();
        let details = get(&cluster.rest, &format!("/taskmanagers/{tm}"));
        check(
            &details,
            "/taskmanagers/:id",
            &[
                ("id", T::Str),
                ("metrics", T::Obj),
                ("allocatedSlots", T::Arr),
                ("slotsNumber", T::Int),
            ],
        );
    }

    for path in [
        "/jobs/00000000000000000000000000000000".to_string(),
        format!("/jobs/{id}/vertices/00000000000000000000000000000000"),
        "/taskmanagers/nobody".to_string(),
        "/no/such/path".to_string(),
    ] {
        assert_json_404(&cluster.rest, &path);
    }

    // The UI is served from the binary.
    let (status, page) = request(&cluster.rest, "GET", "/");
    assert_eq!(status, 200);
    assert!(page.contains("app.js"), "{page}");
}

#[test]
fn a_failed_job_lists_its_exceptions_newest_first() {
    let cluster = Cluster::start(&[], 1, &["--slots", "2"]);
    // Fails in its task, at runtime.
    let o = cluster.sql("1", "SELECT 10 / (1 - 1) AS x");
    assert!(!o.status.success());
    let id = get(&cluster.rest, "/jobs/overview")["jobs"][0]["jid"]
        .as_str()
        .unwrap()
        .to_string();
    let job = get(&cluster.rest, &format!("/jobs/{id}"));
    assert_eq!(job["state"], "FAILED");
    let ex = get(&cluster.rest, &format!("/jobs/{id}/exceptions"));
    let root = ex["root-exception"].as_str().unwrap();
    assert!(root.contains("Divide by zero"), "{ex}");
    let entries = ex["exceptionHistory"]["entries"].as_array().unwrap();
    assert!(!entries.is_empty(), "{ex}");
    let e = &entries[0];
    for k in [
        "exceptionName",
        "stacktrace",
        "taskName",
        "endpoint",
        "taskManagerId",
    ] {
        assert!(e[k].is_string(), "{k}: {e}");
    }
    assert!(e["timestamp"].as_u64().unwrap() > 1_700_000_000_000);
    assert!(e["failureLabels"].is_object() && e["concurrentExceptions"].is_array());
    assert!(e["taskName"].as_str().unwrap().contains("(1/1)#0"), "{e}");
    let limited = get(
        &cluster.rest,
        &format!("/jobs/{id}/exceptions?maxExceptions=0"),
    );
    assert_eq!(limited["exceptionHistory"]["truncated"], true);
}

/// With Flink's default heartbeat of 10 s, a running job's records still
/// reach the REST API within `metrics.fetcher.update-interval` (1 s), and
/// its subtasks show RUNNING while they run.
#[test]
fn a_running_job_shows_running_subtasks_and_live_metrics_at_most_a_second_old() {
    let cluster = Cluster::start_with_heartbeats(&[], &[], 1, &["--slots", "2"]);
    let (runner, id, job) = common::run_endless_pipeline(&cluster, "streaming");
    let source = job["vertices"][0]["id"].as_str().unwrap().to_string();
    let records = || -> u64 {
        let v = get(&cluster.rest, &format!("/jobs/{id}/vertices/{source}"));
        for s in v["subtasks"].as_array().unwrap() {
            assert_eq!(s["status"], "RUNNING", "{s}");
            assert!(s["duration"].as_i64().unwrap() >= 0);
        }
        v["subtasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["metrics"]["write-records"].as_u64().unwrap())
            .sum()
    };
    // Each read is at most a second old: three reads 1.5 s apart grow.
    std::thread::sleep(Duration::from_millis(1500));
    let a = records();
    std::thread::sleep(Duration::from_millis(1500));
    let b = records();
    std::thread::sleep(Duration::from_millis(1500));
    let c = records();
    assert!(a > 0 && b > a && c > b, "{a} {b} {c}");
    let overview = get(&cluster.rest, "/jobs/overview");
    let tasks = &overview["jobs"][0]["tasks"];
    assert_eq!(tasks["running"], tasks["total"], "{overview}");

    // Flink's dashboard cancels with GET /jobs/:id/yarn-cancel.
    let (status, body) = request(&cluster.rest, "GET", &format!("/jobs/{id}/yarn-cancel"));
    assert_eq!(status, 202, "{body}");
    let o = runner.join().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("CANCELED"));
    // What the cancelled attempts did stays visible.
    let job = get(&cluster.rest, &format!("/jobs/{id}"));
    assert_eq!(job["state"], "CANCELED");
    let kept = job["vertices"][0]["metrics"]["write-records"]
        .as_u64()
        .unwrap();
    assert!(kept >= c, "{kept} < {c}");
    // Flink's REST client's paths: the same under /v1.
    assert_eq!(
        get(&cluster.rest, &format!("/v1/jobs/{id}"))["jid"],
        id.as_str()
    );
    assert_json_404(
        &cluster.rest,
        &format!("/jobs/{id}/vertices/{source}/subtasks/x"),
    );
}

/// `GET path` answers 404 with Flink's error body, `{"errors": ["..."]}`.
fn assert_json_404(rest: &str, path: &str) {
    let (status, body) = request(rest, "GET", path);
    assert_eq!(status, 404, "{path}: {body}");
    let errors: Value = serde_json::from_str(&body).unwrap();
    assert!(errors["errors"][0].is_string(), "{path}: {body}");
}
