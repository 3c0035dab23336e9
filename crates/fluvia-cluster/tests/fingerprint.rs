//! Application mode: a TaskManager whose programs differ from the
//! JobManager's (another build) is refused at registration, over real gRPC.

#![allow(clippy::unwrap_used)]

use fluvia_cluster::program::{ProgramCatalog, ProgramSpec};
use fluvia_core::{Configuration, FluviaError};
use fluvia_graph::JobGraph;
use fluvia_runtime::OperatorRegistry;
use std::sync::Arc;

struct Catalog(&'static str);

impl ProgramCatalog for Catalog {
    fn build(&self, spec: &ProgramSpec) -> fluvia_core::Result<(JobGraph, OperatorRegistry)> {
        Err(FluviaError::Plan(format!("no program {}", spec.name)))
    }
    fn fingerprint(&self) -> String {
        self.0.to_string()
    }
}

fn config() -> Configuration {
    let mut c = Configuration::new();
    c.set("jobmanager.rpc.port", "0")
        .set("rest.port", "0")
        .set("heartbeat.interval", "50");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_manager_with_a_different_program_fingerprint_is_refused() {
    let jm = fluvia_cluster::jobmanager::start(config(), Arc::new(Catalog("build-a")))
        .await
        .unwrap();
    let address = jm.rpc_address.to_string();
    let err = fluvia_cluster::taskmanager::run(&address, config(), Arc::new(Catalog("build-b")))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("refused this TaskManager"), "{err}");
    assert!(err.contains("build-b") && err.contains("build-a"), "{err}");

    // The same fingerprint registers (and then keeps running: give it a moment).
    let ok = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        fluvia_cluster::taskmanager::run(&address, config(), Arc::new(Catalog("build-a"))),
    )
    .await;
    assert!(ok.is_err(), "a matching TaskManager stays up: {ok:?}");
}
