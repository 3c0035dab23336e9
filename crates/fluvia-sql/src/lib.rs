//! SQL on DataFusion, distributed by Fluvia.
//!
//! DataFusion parses and optimises; [`split`] cuts its physical plan at
//! every exchange into fragments, [`job`] ships the fragments as
//! datafusion-proto bytes inside a Fluvia job whose StreamGraph has one node
//! per fragment, and [`exchange`] moves Arrow batches between them through
//! Fluvia's result partitions and input gates. [`tpcds`] generates, runs and
//! checks the TPC-DS benchmark.
//!
//! This is the only crate that knows DataFusion and Arrow; the runtime sees
//! a [`fluvia_runtime::TaskDriver`] and bytes.

pub mod catalog;
pub mod cluster;
pub mod codec;
pub mod csv_errors;
pub mod csv_scan;
pub mod csv_stats;
pub mod deferred;
pub mod demand;
pub mod empty_probe;
pub mod exchange;
pub mod file_sink;
pub mod ipc;
pub mod job;
pub mod output;
pub mod pass_through;
pub mod pruned_probe;
pub mod released;
pub mod reuse;
pub mod row_group_split;
pub mod runtime_filter;
pub mod scalar_join;
pub mod session;
pub mod split;
pub mod staging;
pub mod statement;
pub mod tpcds;

/// The DataFusion this crate plans with (and its Arrow), for callers that
/// print or compare results.
pub use datafusion;
