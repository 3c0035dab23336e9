//! Formats: bytes on disk and on the wire.
//!
//! - [`csv_scan`]: Fluvia's CSV reader (and, on the error path, the file
//!   and line a bad value came from); [`csv_stats`]: row estimates for CSV
//!   tables; [`schema_file`]: the declared schema of a folder of files.
//! - [`ipc`]: one record batch as one Fluvia record (Arrow IPC).
//! - [`codec`]: fragments as datafusion-proto bytes, with Fluvia's nodes.
//! - [`file_sink`] and [`staging`]: `INSERT INTO` and `COPY ... TO` through
//!   attempt-private files; [`output`]: results as CSV text.
//!
//! Formats know DataFusion and Arrow; they do not plan and do not know
//! how a job is cut into tasks.

pub mod codec;
pub mod csv_scan;
pub mod csv_stats;
pub mod file_sink;
pub mod ipc;
pub mod output;
pub mod schema_file;
pub mod staging;
