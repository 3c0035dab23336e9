//! Vocabulary shared by every Fluvia crate: ids, configuration, errors, the
//! kinds of partitioners and exchanges, and Flink-compatible key groups.
//!
//! This crate owns plain data and pure functions only. It must not know about
//! graphs, threads, buffers or the network: everything above depends on it, it
//! depends on nothing of ours.

pub mod config;
pub mod error;
pub mod ids;
pub mod keygroup;
pub mod kinds;
pub mod random;

pub use config::{ConfigOption, Configuration};
pub use error::{FluviaError, Result};
pub use ids::{IntermediateDataSetId, JobId, JobVertexId, StableHasher};
pub use kinds::{
    ChainingStrategy, DistributionPattern, ExchangeMode, PartitionerKind, ResultPartitionType,
    RuntimeMode,
};
