//! The one error type of the library crates. Variants are what a caller acts
//! on: a bad plan or configuration is the user's to fix before anything runs;
//! an execution error names the operator and subtask that failed.

use std::fmt;

/// Result with [`FluviaError`] as the default error.
pub type Result<T, E = FluviaError> = std::result::Result<T, E>;

/// Where in a running job something happened: task (vertex) name, the
/// operator inside its chain, and the subtask as `index/parallelism` (1-based
/// like Flink's `(2/4)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskLocation {
    pub task: String,
    pub operator: String,
    pub subtask_index: usize,
    pub parallelism: usize,
}

impl fmt::Display for TaskLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "operator '{}' in task '{}' ({}/{})",
            self.operator,
            self.task,
            self.subtask_index + 1,
            self.parallelism
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FluviaError {
    /// A configuration key or value is wrong.
    #[error("configuration error: {0}")]
    Config(String),
    /// The job as written cannot be planned (bad parallelism, illegal edge, cycle...).
    #[error("invalid job: {0}")]
    Plan(String),
    /// A user function or the runtime failed while the job ran.
    #[error("{location} failed: {message}")]
    Task {
        location: TaskLocation,
        message: String,
    },
    /// An execution failure that is not (yet) tied to an operator.
    #[error("execution error: {0}")]
    Execution(String),
    /// The job was cancelled because another task failed or the user asked.
    #[error("cancelled")]
    Cancelled,
    /// Encoding or decoding a record or a message failed.
    #[error("serialization error: {0}")]
    Serialization(String),
    /// An I/O error with the path or peer it concerns.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A bug in Fluvia: an invariant did not hold.
    #[error("internal error: {0}")]
    Internal(String),
}

impl FluviaError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        FluviaError::Io {
            context: context.into(),
            source,
        }
    }
}

/// `return Err(FluviaError::Plan(format!(..)))` in one line.
#[macro_export]
macro_rules! plan_err {
    ($($arg:tt)*) => { Err($crate::FluviaError::Plan(format!($($arg)*))) };
}

/// `return Err(FluviaError::Internal(format!(..)))` in one line.
#[macro_export]
macro_rules! internal_err {
    ($($arg:tt)*) => { Err($crate::FluviaError::Internal(format!($($arg)*))) };
}
