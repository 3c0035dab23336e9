//! What the test files share: a catalog of no programs, a cluster
//! configuration on free ports, a two-vertex job and a cluster on which it
//! cannot be placed.

#![allow(dead_code)]

use fluvia_cluster::client::ClusterClient;
use fluvia_cluster::jobmanager::JobManagerHandle;
use fluvia_cluster::program::{ProgramCatalog, ProgramSpec};
use fluvia_cluster::rpc::JobStatus;
use fluvia_cluster::taskmanager::TaskManagerHandle;
use fluvia_core::{Configuration, ExchangeMode, FluviaError, PartitionerKind};
use fluvia_graph::{JobGraph, JobGraphGenerator, StreamGraphBuilder};
use fluvia_runtime::OperatorRegistry;
use std::sync::Arc;

/// A catalog that builds no program and carries the fingerprint it names.
pub struct Catalog(pub &'static str);

impl ProgramCatalog for Catalog {
    fn build(&self, spec: &ProgramSpec) -> fluvia_core::Result<(JobGraph, OperatorRegistry)> {
        Err(FluviaError::Plan(format!("no program {}", spec.name)))
    }
    fn fingerprint(&self) -> String {
        self.0.to_string()
    }
}

/// A JobManager or TaskManager on free ports with fast heartbeats; a job
/// that finds no slots fails after `slot_request_timeout` (milliseconds).
pub fn config(slot_request_timeout: &str) -> Configuration {
    let mut c = Configuration::new();
    c.set("jobmanager.rpc.port", "0")
        .set("rest.port", "0")
        .set("heartbeat.interval", "50")
        .set("slot.request.timeout", slot_request_timeout);
    c
}

/// The job `name`: a source rebalanced into a map.
pub fn graph(name: &str) -> JobGraph {
    let mut b = StreamGraphBuilder::new(name);
    let s = b.add_source("Source: s", true);
    let m = b.add_operator("Map", 1);
    b.add_edge(
        s,
        m,
        Some(PartitionerKind::Rebalance),
        ExchangeMode::Undefined,
        0,
    );
    JobGraphGenerator::new(&b.build().unwrap())
        .create_job_graph(Configuration::new(), false)
        .unwrap()
}

/// A job of program `mine` that ended on a cluster whose one TaskManager
/// carries another program.
pub struct Unplaced {
    pub jm: JobManagerHandle,
    pub tm: TaskManagerHandle,
    /// The JobManager's RPC address.
    pub address: String,
    pub client: ClusterClient,
    pub spec: ProgramSpec,
    pub id: String,
    /// The job's final status.
    pub status: JobStatus,
}

/// Starts a JobManager and a TaskManager of the program with fingerprint
/// `tm_fingerprint` with `config`, submits `graph` as program `mine` with
/// fingerprint `job_fingerprint` and waits for the job's end.
pub async fn run_unplaced(
    config: Configuration,
    tm_fingerprint: &'static str,
    graph: &JobGraph,
    job_fingerprint: &str,
) -> Unplaced {
    let jm = fluvia_cluster::jobmanager::start(config.clone())
        .await
        .unwrap();
    let address = jm.rpc_address.to_string();
    let tm =
        fluvia_cluster::taskmanager::spawn(&address, config, Arc::new(Catalog(tm_fingerprint)))
            .await
            .unwrap();
    let mut client = ClusterClient::connect(&address, None).await.unwrap();
    let spec = ProgramSpec {
        name: "mine".into(),
        args: vec![],
    };
    let id = client.submit(&spec, graph, job_fingerprint).await.unwrap();
    let status = client.wait(&id).await.unwrap();
    Unplaced {
        jm,
        tm,
        address,
        client,
        spec,
        id,
        status,
    }
}
