//! Application mode over real gRPC: the JobManager is generic (it carries no
//! program), accepts TaskManagers of any program, and places a job only on
//! TaskManagers whose program fingerprint is the job's; a job whose program
//! no TaskManager carries fails after the slot timeout saying so. A
//! malformed JobGraph is refused at submission with the reason.

#![allow(clippy::unwrap_used)]

mod common;

use fluvia_cluster::client::ClusterClient;
use common::Catalog;
use fluvia_cluster::program::ProgramSpec;
use fluvia_core::Configuration;
use fluvia_graph::JobGraph;
use std::sync::Arc;
use std::time::Duration;

fn config() -> Configuration {
    common::config("500")
}

fn graph() -> JobGraph {
    common::graph("two vertices")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_only_where_its_program_is_and_fails_clearly_when_nowhere() {
    let jm = fluvia_cluster::jobmanager::start(config()).await.unwrap();
    let address = jm.rpc_address.to_string();
    // A TaskManager of another program registers and stays up.
    let tm = fluvia_cluster::taskmanager::spawn(&address, config(), Arc::new(Catalog("build-b")))
        .await
        .unwrap();
    let mut client = ClusterClient::connect(&address, None).await.unwrap();
    let spec = ProgramSpec {
        name: "mine".into(),
        args: vec![],
    };
    let id = client.submit(&spec, &graph(), "build-a").await.unwrap();
    let status = client.wait(&id).await.unwrap();
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
