//! A completed checkpoint ([`CompletedCheckpoint`]) and the bytes of its
//! `_metadata` file: a magic, a format version, then a JSON body.
//!
//! It turns a checkpoint into bytes and back; it does not know where the
//! bytes go (the shell writes and reads the file) nor how a checkpoint was
//! taken.

use super::state::{OperatorId, OperatorState, StateHandle};
use fluvia_core::JobId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// First bytes of every `_metadata` file.
pub const METADATA_MAGIC: [u8; 8] = *b"FLVCKPT\0";
/// The format this build writes and the only one it reads.
pub const METADATA_VERSION: u32 = 1;
const HEADER_LEN: usize = METADATA_MAGIC.len() + 4;

/// A savepoint's flavour (Flink's `SavepointType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SavepointKind {
    /// The job keeps running.
    Savepoint,
    /// Stop with savepoint: the job is stopped after it, sources are not
    /// drained.
    Suspend,
    /// Stop with savepoint and drain: sources emit end of input (timers
    /// fire, windows close) before the snapshot.
    Terminate,
}

/// What was taken (Flink's `SnapshotType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CheckpointType {
    Checkpoint,
    Savepoint(SavepointKind),
}

impl CheckpointType {
    pub fn is_savepoint(self) -> bool {
        matches!(self, CheckpointType::Savepoint(_))
    }

    /// Whether the tasks stop after it (a synchronous savepoint).
    pub fn is_synchronous(self) -> bool {
        matches!(
            self,
            CheckpointType::Savepoint(SavepointKind::Suspend | SavepointKind::Terminate)
        )
    }
}

/// A checkpoint or savepoint that every task acknowledged and whose
/// metadata was written (Flink's `CompletedCheckpoint`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletedCheckpoint {
    pub job_id: JobId,
    pub checkpoint_id: u64,
    pub checkpoint_type: CheckpointType,
    pub trigger_timestamp: u64,
    pub completion_timestamp: u64,
    pub operators: BTreeMap<OperatorId, OperatorState>,
    /// Where its `_metadata` lives (`None`: kept by the JobManager only).
    pub external_path: Option<String>,
}

impl CompletedCheckpoint {
    pub fn is_savepoint(&self) -> bool {
        self.checkpoint_type.is_savepoint()
    }

    pub fn state_size(&self) -> u64 {
        self.operators.values().map(|o| o.state_size()).sum()
    }

    /// Every handle it holds (what discarding it deletes).
    pub fn handles(&self) -> impl Iterator<Item = &StateHandle> {
        self.operators
            .values()
            .flat_map(|o| o.subtasks.values())
            .flat_map(|s| s.handles.iter())
    }
}

/// Why `_metadata` bytes could not be read (or written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("'{path}' is not a checkpoint metadata file (bad magic number)")]
    BadMagic { path: String },
    #[error(
        "checkpoint metadata '{path}' has format version {version}; this build reads {METADATA_VERSION}"
    )]
    UnknownVersion { path: String, version: u32 },
    #[error("checkpoint metadata '{path}' is corrupt: {message}")]
    Corrupt { path: String, message: String },
    #[error("checkpoint metadata '{path}' belongs to job {found}, not to job {expected}")]
    OtherJob {
        path: String,
        expected: JobId,
        found: JobId,
    },
    #[error("cannot encode checkpoint {checkpoint_id}: {message}")]
    Encode { checkpoint_id: u64, message: String },
}

/// The bytes of `_metadata` for `checkpoint`.
pub fn serialize(checkpoint: &CompletedCheckpoint) -> Result<Vec<u8>, MetadataError> {
    let body = serde_json::to_vec(checkpoint).map_err(|e| MetadataError::Encode {
        checkpoint_id: checkpoint.checkpoint_id,
        message: e.to_string(),
    })?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&METADATA_MAGIC);
    out.extend_from_slice(&METADATA_VERSION.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Reads `_metadata` bytes found at `path` (named in errors). With
/// `expected_job` (recovering this job's own retained checkpoints) the
/// metadata must be that job's; a savepoint restore passes `None`, since a
/// savepoint may come from any job.
pub fn deserialize(
    bytes: &[u8],
    path: &str,
    expected_job: Option<JobId>,
) -> Result<CompletedCheckpoint, MetadataError> {
    let path = path.to_string();
    let Some(magic) = bytes.get(..METADATA_MAGIC.len()) else {
        return Err(MetadataError::BadMagic { path });
    };
    if magic != METADATA_MAGIC {
        return Err(MetadataError::BadMagic { path });
    }
    let Some(version) = bytes
        .get(METADATA_MAGIC.len()..HEADER_LEN)
        .and_then(|v| <[u8; 4]>::try_from(v).ok())
    else {
        return Err(MetadataError::Corrupt {
            path,
            message: "truncated header".into(),
        });
    };
    let version = u32::from_be_bytes(version);
    if version != METADATA_VERSION {
        return Err(MetadataError::UnknownVersion { path, version });
    }
    let body = bytes.get(HEADER_LEN..).unwrap_or_default();
    let checkpoint: CompletedCheckpoint =
        serde_json::from_slice(body).map_err(|e| MetadataError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
    if let Some(expected) = expected_job
        && checkpoint.job_id != expected
    {
        return Err(MetadataError::OtherJob {
            path,
            expected,
            found: checkpoint.job_id,
        });
    }
    Ok(checkpoint)
}
