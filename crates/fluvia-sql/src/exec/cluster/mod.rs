//! A hash join's build side with the rows of one key side by side.
//!
//! DataFusion's hash join chains the build rows of a key through an index
//! array and gathers their columns by position. When many build rows share
//! a key (q72's `catalog_sales ⋈ inventory` on the item: 18 build rows per
//! key, 26 candidate rows per probe row), every candidate is a jump to a
//! random row of a build table larger than the core's cache. DataFusion alone
//! hides part of that by splitting the join into hash partitions; a Fluvia
//! task runs one partition, so its build table is the whole one. Reordering
//! the build rows by the hash of their key makes each chain one run of
//! neighbouring rows.
//!
//! Whether that pays is only known once the build side is in: a sort of a
//! million rows whose keys are unique costs more than it saves. The build
//! side is blocking anyway (the join reads all of it before it probes), so
//! [`ClusterByKeyExec`] buffers it, estimates the rows per key from a
//! sample, and sorts only where keys repeat. This module knows DataFusion
//! only; which joins get it is the task's choice.
//!
//! A broadcast join's build side is the same rows in every subtask. The
//! subtasks of one stage that run in one process cluster it once
//! ([`SharedClusters`], [`share_broadcast_builds`]): the first whose input
//! ended clusters it and hands the result to the others, which still read
//! their own input and take the shared result only if it has as many rows
//! (a build side cut short, because its join no longer needed it, is never
//! handed to a subtask that read its whole input). A build side that reads
//! no exchange (a scan kept in the join's task, read whole by every
//! subtask) is read once: the others wait for the first and never run their
//! own input, unless the first was cut short (one of its leaves' end
//! signals set), failed or was dropped, when each reads its own. The read
//! runs on threads of the process (`exec::build_readers`), not on the first's
//! task thread, which its exchange readers may block on data that a waiting
//! subtask holds up.

//!
//! Here: `rules` (which joins get the node, the plan rewrites a task
//! applies), `exec` ([`ClusterByKeyExec`] and how it reads its input),
//! `shared` (the slots through which subtasks of one process share a build
//! side) and `hash` (ordering rows by the hash of their key, counting keys).

mod exec;
mod hash;
mod rules;
mod shared;
#[cfg(test)]
mod tests;

pub use exec::ClusterByKeyExec;
pub use rules::{cluster_build_sides, share_broadcast_builds};
pub use shared::SharedClusters;
