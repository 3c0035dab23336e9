//! What the test files share: a catalog of no programs, a cluster
//! configuration on free ports and a two-vertex job.

#![allow(dead_code)]

use fluvia_cluster::program::{ProgramCatalog, ProgramSpec};
use fluvia_core::{Configuration, ExchangeMode, FluviaError, PartitionerKind};
use fluvia_graph::{JobGraph, JobGraphGenerator, StreamGraphBuilder};
use fluvia_runtime::OperatorRegistry;

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
