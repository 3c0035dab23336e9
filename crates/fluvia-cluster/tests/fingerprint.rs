//! Application mode over real gRPC: the JobManager is generic (it carries no
//! program), accepts TaskManagers of any program, and places a job only on
//! TaskManagers whose program fingerprint is the job's; a job whose program
//! no TaskManager carries fails after the slot timeout saying so. A
//! malformed JobGraph is refused at submission with the reason.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Unplaced, run_unplaced};
use fluvia_cluster::client::ClusterClient;
use fluvia_core::Configuration;
use fluvia_graph::JobGraph;
use std::time::Duration;

fn config() -> Configuration {
    common::config("500")
}

fn graph() -> JobGraph {
    common::graph("two vertices")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_only_where_its_program_is_and_fails_clearly_when_nowhere() {
    // A TaskManager of another program registers and stays up.
    let Unplaced {
        jm,
        tm,
        address,
        mut client,
        spec,
        id,
        status,
    } = run_unplaced(config(), "build-b", &graph(), "build-a").await;
    assert_eq!(status.state, "FAILED");
    assert!(
        status
            .error
            .contains("no registered TaskManager carries program 'mine' (fingerprint build-a)"),
        "{}",
        status.error
    );
    // The other program's TaskManager was never given a task of it.
    let details: serde_json::Value = serde_json::from_str(&status.details_json).unwrap();
    for v in details["vertices"].as_array().unwrap() {
        for s in v["subtasks"].as_array().unwrap() {
            // Flink's word for an attempt never placed.
            assert_eq!(s["taskmanager-id"], "(unassigned)", "{s}");
        }
    }

    // A client that only waits for the end can do without the details.
    let mut bare = ClusterClient::connect(&address, None).await.unwrap();
    bare.set_details(false);
    let status = bare.status(&id).await.unwrap();
    assert_eq!(status.state, "FAILED");
    assert!(status.details_json.is_empty(), "{}", status.details_json);

    // A crafted graph is refused with the reason, not a panic.
    let mut bad = graph();
    bad.vertices[1].parallelism = 0;
    bad.job_id = fluvia_core::JobId::generate();
    let err = client
        .submit(&spec, &bad, "build-a")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("invalid job graph") && err.contains("parallelism 0"),
        "{err}"
    );
    tm.shutdown();
    jm.abort();
    tokio::time::sleep(Duration::from_millis(10)).await;
}
