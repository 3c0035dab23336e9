//! The jobs behind `fluvia run` and `fluvia explain`, as a library so that
//! benchmarks and tests build exactly the jobs users run.
//!
//! Each example builds its job on a [`StreamExecutionEnvironment`] given to
//! it; the binary (`main.rs`) only parses arguments and prints.
//!
//! [`StreamExecutionEnvironment`]: fluvia_datastream::StreamExecutionEnvironment

pub mod catalog;
pub mod examples;
pub mod interactive;
pub mod progress;
pub mod session;
pub mod sql;

/// Runs `future` on a fresh async runtime (see [`fluvia_cluster::block_on`]).
pub fn block_on<T>(future: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    Ok(fluvia_cluster::block_on(future)?)
}

/// One line on standard error that does not panic when it is closed.
pub fn note_line(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
