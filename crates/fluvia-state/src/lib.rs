//! Operator state for Fluvia: Flink's heap (`hashmap`) state backend, the
//! snapshot files a checkpoint writes, the rules for handing state to a
//! new parallelism, and checkpoint storage on a file system.
//!
//! - [`keyed`]: [`KeyedStateBackend`], per-key value, list, map, reducing
//!   and aggregating state of one keyed operator subtask, kept in one hash
//!   map per key group, snapshotted copy-on-write and restored lazily; TTL.
//! - [`snapshot`]: [`OperatorStateSnapshot`] and its file format.
//! - [`redistribute`]: Flink's rescaling rules (whole key groups; split and
//!   union list state).
//! - [`storage`]: [`CheckpointStorage`], Flink's `FsCheckpointStorage`
//!   layout through `object_store`, blocking so callers need no runtime.
//!
//! This crate must not know operators, tasks, the network or the checkpoint
//! coordinator: it holds bytes, key groups and files. The runtime decides
//! when to snapshot, where the bytes go and what to restore.

pub(crate) mod codec;
pub mod error;
pub mod keyed;
pub mod redistribute;
pub mod snapshot;
pub mod storage;

pub use error::{Result, StateError};
pub use keyed::{KeyedSnapshot, KeyedStateBackend, StateTtlConfig};
pub use snapshot::{OperatorListState, OperatorStateMode, OperatorStateSnapshot};
pub use storage::CheckpointStorage;
