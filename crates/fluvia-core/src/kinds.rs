//! The enums that describe how operators connect: partitioners, exchange
//! modes, result partition types, chaining strategies and runtime modes. Their
//! string forms are Flink's, because they show up in plans users compare.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How records of an edge are routed to the consumer's subtasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PartitionerKind {
    /// Subtask i sends to subtask i; needs equal parallelism.
    Forward,
    /// Round robin over all consumers, from a random start.
    Rebalance,
    /// Round robin inside the pointwise subset of consumers.
    Rescale,
    /// Uniformly random consumer.
    Shuffle,
    /// Every record to every consumer.
    Broadcast,
    /// Everything to consumer 0.
    Global,
    /// By key group: `murmur(hash(key)) % maxParallelism`, then `kg * p / maxP`.
    Hash,
}

impl PartitionerKind {
    /// Pointwise edges connect a producer to a subset of consumers only.
    pub fn is_pointwise(self) -> bool {
        matches!(self, PartitionerKind::Forward | PartitionerKind::Rescale)
    }

    /// Flink's `shipStrategyName` (the partitioner's `toString`).
    pub fn ship_strategy_name(self) -> &'static str {
        match self {
            PartitionerKind::Forward => "FORWARD",
            PartitionerKind::Rebalance => "REBALANCE",
            PartitionerKind::Rescale => "RESCALE",
            PartitionerKind::Shuffle => "SHUFFLE",
            PartitionerKind::Broadcast => "BROADCAST",
            PartitionerKind::Global => "GLOBAL",
            PartitionerKind::Hash => "HASH",
        }
    }

    pub fn distribution_pattern(self) -> DistributionPattern {
        if self.is_pointwise() {
            DistributionPattern::Pointwise
        } else {
            DistributionPattern::AllToAll
        }
    }
}

impl fmt::Display for PartitionerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.ship_strategy_name())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DistributionPattern {
    Pointwise,
    AllToAll,
}

/// The exchange mode requested on a StreamGraph edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum ExchangeMode {
    /// Consumers read while producers write.
    Pipelined,
    /// Consumers start after producers finished; data is persisted.
    Batch,
    /// Decided by the runtime mode (streaming: pipelined, batch: blocking).
    #[default]
    Undefined,
}

/// The kind of result partition a JobEdge reads (lower case in plan JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResultPartitionType {
    /// In-memory, bounded by the buffer pool: back-pressure instead of growth.
    PipelinedBounded,
    /// Written completely (spilled to files) before consumers start.
    Blocking,
}

impl ResultPartitionType {
    pub fn name(self) -> &'static str {
        match self {
            ResultPartitionType::PipelinedBounded => "pipelined_bounded",
            ResultPartitionType::Blocking => "blocking",
        }
    }

    pub fn is_blocking(self) -> bool {
        self == ResultPartitionType::Blocking
    }
}

/// Flink's `ChainingStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum ChainingStrategy {
    /// Chain to the predecessor whenever the other rules allow.
    #[default]
    Always,
    /// Never chained to predecessor or successor.
    Never,
    /// Starts a chain; successors may chain to it.
    Head,
    /// Like Head, but chains to a source predecessor (used for source chaining).
    HeadWithSources,
}

/// `execution.runtime-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum RuntimeMode {
    Streaming,
    Batch,
    /// Batch when every source is bounded, streaming otherwise.
    #[default]
    Automatic,
}

impl RuntimeMode {
    pub fn parse(s: &str) -> Option<RuntimeMode> {
        match s.to_ascii_uppercase().as_str() {
            "STREAMING" => Some(RuntimeMode::Streaming),
            "BATCH" => Some(RuntimeMode::Batch),
            "AUTOMATIC" => Some(RuntimeMode::Automatic),
            _ => None,
        }
    }
}

impl fmt::Display for RuntimeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuntimeMode::Streaming => "STREAMING",
            RuntimeMode::Batch => "BATCH",
            RuntimeMode::Automatic => "AUTOMATIC",
        })
    }
}
