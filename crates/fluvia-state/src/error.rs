//! The one error type of the state crate. Every variant names what a caller
//! needs to find the fault: the file, the operator, the key group or the
//! state. Corrupt input is always an error, never a panic, because a restore
//! reads bytes that another process (or a crash) wrote.

use thiserror::Error;

/// What went wrong while keeping, snapshotting, storing or restoring state.
#[derive(Debug, Error)]
pub enum StateError {
    /// A snapshot file or a key group's bytes do not parse.
    #[error("corrupt state in {file}: {reason}")]
    Corrupt { file: String, reason: String },

    /// A snapshot file written by a format version this build does not read.
    #[error("state file {file} has format version {version}; this build reads version {supported}")]
    UnsupportedVersion {
        file: String,
        version: u32,
        supported: u32,
    },

    /// A key, or a restored key group, that this backend does not own.
    #[error(
        "key group {key_group} is outside the key-group range {first}..={last} of this subtask"
    )]
    KeyGroupOutOfRange {
        key_group: usize,
        first: usize,
        last: usize,
    },

    /// State accessed before `set_current_key`.
    #[error("state '{state}' accessed with no current key set")]
    NoCurrentKey { state: String },

    /// A state name registered again with another kind, type or TTL.
    #[error("state '{state}' is registered as {existing}, requested as {requested}")]
    StateMismatch {
        state: String,
        existing: String,
        requested: String,
    },

    /// A value of a state that bincode could not encode or decode.
    #[error("state '{state}' in key group {key_group}: {reason}")]
    Serialization {
        state: String,
        key_group: usize,
        reason: String,
    },

    /// Snapshots that cannot be redistributed to a new parallelism.
    #[error("rescaling operator {operator}: {reason}")]
    Rescale { operator: String, reason: String },

    /// Checkpoint storage given a location it cannot serve.
    #[error(
        "unsupported checkpoint location {location}: only local paths and file:// URLs are supported"
    )]
    UnsupportedScheme { location: String },

    /// A location outside the storage's directory, or not a valid path.
    #[error("invalid checkpoint location {location}: {reason}")]
    InvalidLocation { location: String, reason: String },

    /// A state file that does not exist.
    #[error("state file {path} not found")]
    NotFound { path: String },

    /// Reading, writing or deleting in checkpoint storage failed.
    #[error("checkpoint storage at {path}: {source}")]
    Storage {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A bug in this crate: an invariant the typed API should guarantee.
    #[error("internal error in state '{state}': {reason}")]
    Internal { state: String, reason: String },
}

/// The state crate's result.
pub type Result<T, E = StateError> = std::result::Result<T, E>;
