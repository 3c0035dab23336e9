//! The jobs behind `fluvia run` and `fluvia explain`, as a library so that
//! benchmarks and tests build exactly the jobs users run.
//!
//! Each example builds its job on a [`StreamExecutionEnvironment`] given to
//! it; the binary (`main.rs`) only parses arguments and prints.
//!
//! [`StreamExecutionEnvironment`]: fluvia_datastream::StreamExecutionEnvironment

pub mod catalog;
pub mod examples;
pub mod sql;

/// Runs `future` on a fresh async runtime and shuts the runtime down without
/// waiting for background work (servers of an embedded cluster).
pub fn block_on<T>(future: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    use anyhow::Context;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let out = rt.block_on(future);
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    Ok(out)
}
