//! Programs a Fluvia binary can run, by name (application mode).

use fluvia_core::Result;
use fluvia_graph::JobGraph;
use fluvia_runtime::OperatorRegistry;
use serde::{Deserialize, Serialize};

/// What a job runs: a program of the binary and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramSpec {
    pub name: String,
    pub args: Vec<String>,
}

/// The programs this binary carries.
pub trait ProgramCatalog: Send + Sync {
    /// Builds the program's JobGraph and operator registry. Must be
    /// deterministic: every process builds the same graph from the same spec.
    fn build(&self, spec: &ProgramSpec) -> Result<(JobGraph, OperatorRegistry)>;

    /// Identifies the code of the programs; processes of one cluster must
    /// agree on it.
    fn fingerprint(&self) -> String;
}
