//! The REST API over a real JobManager: what it reads of the cluster (jobs,
//! TaskManagers, their last reports, metrics) and cancelling, with a job
//! that could not be placed (no TaskManager carries its program).

#![allow(clippy::unwrap_used)]

mod common;

use common::{Unplaced, run_unplaced};
use fluvia_core::Configuration;
use fluvia_graph::JobGraph;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

fn config() -> Configuration {
    let mut c = common::config("300");
    c.set("rest.address", "127.0.0.1");
    c
}

fn graph() -> JobGraph {
    common::graph("unplaced")
}

/// One HTTP/1.0 request; the status code and body.
fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "{method} {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (code, body.to_string())
}

fn get(addr: SocketAddr, path: &str) -> Value {
    let (code, body) = http(addr, "GET", path);
    assert_eq!(code, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_api_reads_jobs_and_task_managers_and_cancels() {
    let Unplaced {
        jm,
        tm,
        client: _client,
        id,
        status,
        ..
    } = run_unplaced(config(), "other", &graph(), "mine").await;
    let rest = jm.rest_address;
    assert_eq!(status.state, "FAILED");

    let rest_get = move |path: String| tokio::task::spawn_blocking(move || get(rest, &path));
    let overview = rest_get("/overview".into()).await.unwrap();
    assert_eq!(overview["taskmanagers"], 1, "{overview}");
    assert_eq!(overview["jobs-failed"], 1, "{overview}");
    let jobs = rest_get("/jobs/overview".into()).await.unwrap();
    assert_eq!(jobs["jobs"][0]["jid"], id.as_str(), "{jobs}");
    assert_eq!(jobs["jobs"][0]["state"], "FAILED", "{jobs}");
    let job = rest_get(format!("/jobs/{id}")).await.unwrap();
    assert_eq!(job["name"], "unplaced", "{job}");
    assert_eq!(job["vertices"].as_array().unwrap().len(), 2, "{job}");
    let vid = job["vertices"][0]["id"].as_str().unwrap().to_string();
    let vertex = rest_get(format!("/jobs/{id}/vertices/{vid}"))
        .await
        .unwrap();
    assert!(vertex["subtasks"].is_array(), "{vertex}");
    let tms = rest_get("/taskmanagers".into()).await.unwrap();
    let tm_id = tms["taskmanagers"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(tms["taskmanagers"][0]["programFingerprint"], "other");
    let one = rest_get(format!("/taskmanagers/{tm_id}")).await.unwrap();
    assert!(one["tasks"].is_array(), "{one}");
    let config = rest_get("/config".into()).await.unwrap();
    assert_eq!(config["secret-required"], false, "{config}");

    let (code, metrics) = tokio::task::spawn_blocking(move || http(rest, "GET", "/metrics"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("fluvia_jobmanager_taskmanagers 1"),
        "{metrics}"
    );
    let path = format!("/jobs/{id}");
    let (code, body) = tokio::task::spawn_blocking(move || http(rest, "PATCH", &path))
        .await
        .unwrap();
    assert_eq!(code, 409, "a failed job cannot be cancelled: {body}");
    let (code, _) = tokio::task::spawn_blocking(move || {
        http(rest, "PATCH", "/jobs/00000000000000000000000000000000")
    })
    .await
    .unwrap();
    assert_eq!(code, 404);

    tm.shutdown();
    jm.abort();
    tokio::time::sleep(Duration::from_millis(10)).await;
}
