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
//!
//! ```
//! use fluvia_core::keygroup::KeyHash;
//! use fluvia_state::keyed::{KeyedStateBackend, ReducingStateDescriptor};
//!
//! // Subtask 1 of 2 owns key groups 64..=127 of 128.
//! let mut backend = KeyedStateBackend::<String>::new((64, 127), 128)?;
//! let count = backend.reducing_state(&ReducingStateDescriptor::new("count", |a: u64, b: u64| a + b))?;
//! let word = "fox".to_string(); // key group 67
//! backend.set_current_key(word.clone(), word.key_hash())?;
//! count.add(&mut backend, 1)?;
//! count.add(&mut backend, 1)?;
//! assert_eq!(count.get(&mut backend)?, Some(2));
//!
//! // Checkpoint: a cheap synchronous cut, then encoding on any thread.
//! let groups = backend.snapshot().encode()?;
//! let mut restored = KeyedStateBackend::<String>::new((64, 127), 128)?;
//! restored.restore(groups.iter().map(|(g, b)| (*g, b.as_slice())))?;
//! let count = restored.reducing_state(&ReducingStateDescriptor::new("count", |a: u64, b: u64| a + b))?;
//! restored.set_current_key(word.clone(), word.key_hash())?;
//! assert_eq!(count.get(&mut restored)?, Some(2));
//! # Ok::<(), fluvia_state::StateError>(())
//! ```

pub(crate) mod codec;
pub mod error;
pub mod keyed;
pub mod redistribute;
pub mod snapshot;
pub mod storage;

pub use error::{Result, StateError};
pub use keyed::{KeyedSnapshot, KeyedStateBackend, StateTtlConfig};
pub use redistribute::{SubtaskState, redistribute};
pub use snapshot::{OperatorListState, OperatorStateMode, OperatorStateSnapshot};
pub use storage::CheckpointStorage;
