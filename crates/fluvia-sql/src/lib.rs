//! SQL on DataFusion, distributed by Fluvia.
//!
//! DataFusion parses and optimises; Fluvia cuts its physical plan at every
//! exchange into fragments, ships them as datafusion-proto bytes inside a
//! Fluvia job whose StreamGraph has one node per task, and moves Arrow
//! batches between them through Fluvia's result partitions and input
//! gates. The modules follow that path:
//!
//! - [`session`]: what a SQL session knows: its statements, its catalog of
//!   tables and views, DataFusion's settings for a distributed run.
//! - [`planning`]: the rules on the physical plan: stage splitting
//!   ([`planning::split`]), the multiple-input operator
//!   ([`planning::multiple_input`]), source chaining
//!   ([`planning::source_chaining`]) and reuse ([`planning::source_reuse`]),
//!   broadcast, runtime filters,
//!   scalar-subquery pushdown, row-group splits.
//! - [`job`]: a statement planned into a [`job::SqlJob`], its JobGraph
//!   translation, and the task-side stage driver.
//! - [`exec`]: the execution nodes Fluvia adds to fragments (exchange
//!   readers, early ends, shared scans, clustered build sides).
//! - [`formats`]: CSV reading, Arrow IPC, the fragment codec, file sinks.
//! - [`inspect`]: facts read off a plan that planning and exec share.
//!
//! `job` uses all the others and nothing uses `job`; `planning` places
//! `exec` nodes, and no `exec` node knows which rule placed it; `session`
//! registers tables in `formats`. The fragment codec and the sinks in
//! `formats` know the exchange's reader and batch type. No module imports
//! one that imports it back.
//!
//! This is the only crate that knows DataFusion and Arrow; the runtime sees
//! a [`fluvia_runtime::TaskDriver`] and bytes. TPC-DS generation and
//! checking is a tool of its own, in `fluvia-tpcds`.

pub mod exec;
pub mod formats;
pub mod inspect;
pub mod job;
pub mod planning;
pub mod session;
#[cfg(test)]
mod test_util;

/// The DataFusion this crate plans with (and its Arrow), for callers that
/// print or compare results.
pub use datafusion;
