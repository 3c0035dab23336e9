//! Source chaining: a broadcast join's build side that is a plain scan
//! pipeline stays in its join's fragment, chained into the multiple-input
//! task that consumes it, instead of being read by a task of its own and
//! broadcast. Two kinds qualify: a build side whose scans carry the
//! runtime filters of joins of that fragment
//! (`table.optimizer.runtime-filter.build-side-in-task`), and a small one
//! (`table.optimizer.small-build-side-in-task.max-size`).
//!
//! [`crate::planning::split`] asks while it cuts; sources shared by
//! several fragments are [`crate::planning::source_reuse`]'s.

use crate::inspect::{dynamic_filter_ids, file_bytes, is_plain_pipeline, partitions};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use std::sync::Arc;

/// Which broadcast build sides stay in their join's fragment.
#[derive(Debug, Clone, Copy)]
pub struct SourceChaining {
    /// Keep a build side that carries runtime filters of the joins above
    /// it in their fragment.
    pub filtered_build_in_task: bool,
    /// Keep a build side that is a plain scan pipeline over at most this
    /// many bytes of files in its join's fragment (0: never).
    pub small_build_bytes: u64,
}

impl SourceChaining {
    /// Whether the build side `child` of a broadcast join stays in the
    /// join's fragment: a plain scan pipeline (gathered, or of one
    /// partition) whose scans carry dynamic filters of joins of this
    /// fragment (`filters_above`: the ids of those the joins above it
    /// produce), or that reads few bytes. Each subtask then reads it whole,
    /// after those joins built their tables (a join reads its build side
    /// before its probe side, and the filtered scan is on the probe side of
    /// the joins that filter it), so the filters prune it as they do in
    /// DataFusion's single process. Broadcast from its own task it would be
    /// read before any of them exist.
    pub fn keeps_build(&self, child: &Arc<dyn ExecutionPlan>, filters_above: &[u64]) -> bool {
        if !self.filtered_build_in_task {
            return false;
        }
        let scan = match child.downcast_ref::<CoalescePartitionsExec>() {
            Some(c) => c.input(),
            None if partitions(child) == 1 => child,
            None => return false,
        };
        is_plain_pipeline(scan)
            && (dynamic_filter_ids(scan)
                .iter()
                .any(|id| filters_above.contains(id))
                || file_bytes(scan).is_some_and(|b| b <= self.small_build_bytes))
    }
}
