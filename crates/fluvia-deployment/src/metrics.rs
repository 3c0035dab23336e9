//! What an attempt reports when it ends.

use serde::{Deserialize, Serialize};

/// What an attempt reports when it ends: Flink's task I/O metrics, and per
/// produced result the bytes and records of each subpartition (what the
/// adaptive batch scheduler decides parallelism from).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptMetrics {
    pub records_in: u64,
    pub records_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub buffers_in: u64,
    pub buffers_out: u64,
    /// Per chained operator: records received (sources: emitted).
    pub operator_records: Vec<u64>,
    /// Per produced data set (the vertex's order), per subpartition.
    pub subpartition_bytes: Vec<Vec<u64>>,
    pub subpartition_records: Vec<Vec<u64>>,
    pub output_buffers_max_in_use: u64,
    pub output_buffers_limit: u64,
    pub backpressure_waits: u64,
    /// Averages over the attempt's run.
    pub busy_ms_per_second: f64,
    pub idle_ms_per_second: f64,
    pub back_pressured_ms_per_second: f64,
    /// Named results a sink hands back to the client (`collect()`).
    pub accumulators: Vec<(String, Vec<u8>)>,
    /// Files the attempt wrote under attempt-private names: they get their
    /// final names only if this attempt wins and the job finishes.
    pub staged_files: Vec<StagedFile>,
}

/// A file an attempt wrote to `pending`, to be renamed to `target` when the
/// job commits its output (Flink's in-progress part files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedFile {
    pub pending: String,
    pub target: String,
}
