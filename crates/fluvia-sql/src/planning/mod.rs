//! Planning: the rules that turn DataFusion's physical plan into a
//! distributed one, each in its own file.
//!
//! - [`split`]: the plan cut at its exchanges into stages joined by
//!   network edges (forward where the input already has the distribution,
//!   hash, broadcast, global), adaptive and skew-splittable stages.
//! - [`multiple_input`]: the operators no exchange separates, fused into one
//!   multiple-input task with input read priorities (build before probe).
//! - [`source_chaining`]: a broadcast build side that is a plain scan
//!   stays in its join's task, chained into the multiple-input operator.
//! - [`source_reuse`]: stages that scan the same files run as one task
//!   whose shared scan is chained to each of them.
//! - [`broadcast`]: broadcast for small build sides, where it is safe.
//! - [`runtime_filter`]: runtime filters that cross a task.
//! - [`scalar_join`]: scalar-subquery joins pushed down to their table.
//! - [`row_group_split`]: Parquet scans split on row-group boundaries.
//!
//! Planning runs in the client only. It places [`crate::exec`] nodes in the
//! plan, but knows nothing of tasks, jobs or the network: shipping the
//! stages is [`crate::job`]'s business.

pub mod broadcast;
pub mod multiple_input;
pub mod row_group_split;
pub mod runtime_filter;
pub mod scalar_join;
pub mod source_chaining;
pub mod source_reuse;
pub mod split;
