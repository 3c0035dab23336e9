//! Fluvia as a distributed system: the JobManager and TaskManager processes.
//!
//! - [`jobmanager`]: a thin shell around `fluvia-scheduler`'s state machine:
//!   accepts TaskManagers and jobs over gRPC, feeds the scheduler events
//!   (registrations, heartbeats, attempt reports, RPC outcomes, ticks) and
//!   performs its actions through one RPC queue per TaskManager; serves the
//!   REST API ([`rest`]), which reads it only through a small query
//!   interface (a read-only view of the cluster under its lock, and job
//!   cancellation), never its internals.
//! - [`deployment`]: the wire boundary of a deployment: the
//!   `fluvia-deployment` descriptor shipped with the job's information, and
//!   the protobuf forms of attempt ids, states and metrics.
//! - [`taskmanager`]: registers its slots, data port and program
//!   fingerprint, runs deployed attempts, exchanges data with other
//!   TaskManagers over the TCP data plane, and reports attempt states (typed,
//!   resent with heartbeats until acknowledged).
//! - [`shuffle`]: the TaskManager's `ShuffleEnvironment`s (internal: it
//!   serves its partitions; external: they go to the host's shuffle
//!   service), chosen per partition by the JobManager's descriptor.
//! - [`shuffle_service`]: the external shuffle service, one per host: takes
//!   over the finished blocking partitions of that host's TaskManagers and
//!   serves them, so a TaskManager may leave once its producers finished.
//! - [`minicluster`]: the same JobManager and TaskManagers inside one process.
//! - [`client`]: what `fluvia run --jobmanager`, `list`, `cancel` and a
//!   program's `execute` use.
//!
//! User code is shipped by *application mode*: a binary carries programs
//! ([`program::ProgramCatalog`]); a job names a program and its arguments,
//! every TaskManager it runs on rebuilds the same JobGraph from them and
//! compares fingerprints. The JobManager carries no program: it places a job
//! only on TaskManagers whose program fingerprint is the job's. This crate
//! knows no concrete program.

pub mod allocator;
mod checkpointing;
pub mod client;
pub mod config;
mod coordinators;
pub mod deployment;
mod details;
pub mod jobmanager;
pub mod minicluster;
pub mod program;
mod query;
pub mod rest;
pub mod security;
pub mod shuffle;
pub mod shuffle_service;
pub mod task_threads;
pub mod taskmanager;
pub mod workdir;

/// Runs `future` on a fresh async runtime and shuts the runtime down without
/// waiting for background work (the servers of an embedded cluster). Every
/// client of a cluster (the CLI, a program's `execute`) uses this one.
pub fn block_on<T>(future: impl std::future::Future<Output = T>) -> fluvia_core::Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| fluvia_core::FluviaError::io("starting the async runtime", e))?;
    let out = rt.block_on(future);
    // The caller has its answer: the runtime's threads wind down behind it
    // (joining them took about half a millisecond of every statement).
    rt.shutdown_background();
    Ok(out)
}

/// Generated gRPC code for `proto/cluster.proto`.
pub mod rpc {
    #![allow(clippy::all, missing_docs, clippy::unwrap_used)]
    tonic::include_proto!("fluvia.cluster");
}

impl rpc::Ack {
    /// The acknowledgement of a request that was carried out.
    pub fn success() -> rpc::Ack {
        rpc::Ack {
            ok: true,
            message: String::new(),
        }
    }

    /// Success, or a refusal that says why.
    pub fn from_result(result: std::result::Result<(), String>) -> rpc::Ack {
        match result {
            Ok(()) => rpc::Ack::success(),
            Err(message) => rpc::Ack { ok: false, message },
        }
    }
}

/// A channel to the RPC server at `address` (`host:port`) that connects on
/// first use.
pub(crate) fn lazy_channel(
    address: &str,
) -> std::result::Result<tonic::transport::Channel, tonic::codegen::http::uri::InvalidUri> {
    Ok(
        tonic::transport::Channel::from_shared(format!("http://{address}"))?
            .tcp_nodelay(true)
            .connect_lazy(),
    )
}

/// What a gRPC handler returns.
pub(crate) type RpcResult<T> = std::result::Result<tonic::Response<T>, tonic::Status>;

/// Prints the lines a process announces its addresses with (scripts and
/// tests read them to find the ports), in one write. A reader that took the
/// first line and closed the pipe must not kill the process: `println!`
/// panics on a closed standard output, and a shuffle service died so when
/// its second line came after the reader had gone.
pub fn announce(lines: &[String]) {
    use std::io::Write;
    let mut text = lines.join("\n");
    text.push('\n');
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        tracing::warn!("announcing {lines:?} on standard output failed: {e}");
    }
}
