//! The JobGraph: one [`JobVertex`] per operator chain, connected through
//! [`IntermediateDataSet`]s (what a vertex produces on a non-chained output) and
//! [`JobEdge`]s (what a vertex consumes). Closure-free and serialisable: each
//! chained operator is referenced by its StreamGraph node id and a stable
//! operator id, and the runtime looks the user code up by those.

use fluvia_core::{
    Configuration, DistributionPattern, IntermediateDataSetId, JobId, JobVertexId, PartitionerKind,
    Result, ResultPartitionType, internal_err,
};
use serde::{Deserialize, Serialize};

use crate::StreamNodeId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobType {
    Streaming,
    Batch,
}

impl JobType {
    pub fn name(self) -> &'static str {
        match self {
            JobType::Streaming => "STREAMING",
            JobType::Batch => "BATCH",
        }
    }
}

/// An operator inside a chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainedOperator {
    pub node_id: StreamNodeId,
    /// Stable hash of the operator (its uid, or its position in the graph).
    pub operator_id: String,
    pub name: String,
    /// The operator's coordinator on the JobManager, if any.
    #[serde(default)]
    pub coordinator: Option<crate::CoordinatorSpec>,
    /// Operators of the same vertex this one calls directly (indices into
    /// [`JobVertex::operators`]).
    pub chained_outputs: Vec<usize>,
    /// Non-chained outputs, in the order of the stream edges.
    pub network_outputs: Vec<NetworkOutput>,
    /// The consumers of its side outputs, one entry per output tag that
    /// has any (Flink's `OutputTag`): chained or not, like the main output.
    #[serde(default)]
    pub side_outputs: Vec<SideOutputEdges>,
}

/// Where one side output of a chained operator goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideOutputEdges {
    /// The output tag's id.
    pub tag: String,
    pub chained_outputs: Vec<usize>,
    pub network_outputs: Vec<NetworkOutput>,
}

impl ChainedOperator {
    /// The consumers of side output `tag`, made on first use.
    pub fn side_output_mut(&mut self, tag: &str) -> &mut SideOutputEdges {
        let i = match self.side_outputs.iter().position(|s| s.tag == tag) {
            Some(i) => i,
            None => {
                self.side_outputs.push(SideOutputEdges {
                    tag: tag.to_string(),
                    chained_outputs: Vec::new(),
                    network_outputs: Vec::new(),
                });
                self.side_outputs.len() - 1
            }
        };
        &mut self.side_outputs[i]
    }

    /// Every chained successor, of the main output and the side outputs.
    pub fn all_chained_outputs(&self) -> impl Iterator<Item = usize> + '_ {
        self.chained_outputs
            .iter()
            .chain(self.side_outputs.iter().flat_map(|s| &s.chained_outputs))
            .copied()
    }

    /// Every network output, of the main output and the side outputs.
    pub fn all_network_outputs(&self) -> impl Iterator<Item = &NetworkOutput> + '_ {
        self.network_outputs
            .iter()
            .chain(self.side_outputs.iter().flat_map(|s| &s.network_outputs))
    }
}

/// A non-chained output of a chained operator: which produced data set it
/// writes and which StreamGraph edge it stands for (the edge carries the key
/// selector of a keyed exchange).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkOutput {
    /// Index into [`JobVertex::produced_data_sets`].
    pub data_set: usize,
    pub stream_edge: usize,
}

/// The data one vertex produces for one consumer edge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntermediateDataSet {
    pub id: IntermediateDataSetId,
    pub producer: JobVertexId,
    pub consumer: JobVertexId,
    pub partitioner: PartitionerKind,
    pub result_partition_type: ResultPartitionType,
    pub stream_edge: usize,
}

/// One input of a vertex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEdge {
    pub source_data_set: IntermediateDataSetId,
    pub source_vertex: JobVertexId,
    pub partitioner: PartitionerKind,
    pub distribution_pattern: DistributionPattern,
    pub result_partition_type: ResultPartitionType,
    /// 0 for a one-input head, 1 or 2 for the inputs of a two-input head.
    pub type_number: u8,
    pub stream_edge: usize,
    /// See `StreamEdge::intra_input_key_correlated`.
    #[serde(default = "configured")]
    pub intra_input_key_correlated: bool,
}

impl JobEdge {
    /// Flink's ship strategy name (FORWARD, HASH, REBALANCE...).
    pub fn ship_strategy_name(&self) -> &'static str {
        self.partitioner.ship_strategy_name()
    }
}

/// One operator chain: the unit that is scheduled and runs as one task per
/// subtask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobVertex {
    pub id: JobVertexId,
    /// The chained name, e.g. `Source: lines -> Flat Map -> Map`.
    pub name: String,
    pub parallelism: usize,
    pub max_parallelism: usize,
    /// Whether the user set the parallelism (of any chained operator). A
    /// batch job's vertex without one has it decided at runtime by the
    /// adaptive batch scheduler; `parallelism` is then only the default.
    #[serde(default = "configured")]
    pub parallelism_configured: bool,
    /// Every chained operator supports concurrent attempts: the vertex may
    /// be speculated.
    #[serde(default = "configured")]
    pub supports_concurrent_attempts: bool,
    pub slot_sharing_group: String,
    /// The chain; `operators[0]` is the head.
    pub operators: Vec<ChainedOperator>,
    pub inputs: Vec<JobEdge>,
    pub produced_data_sets: Vec<IntermediateDataSet>,
    pub is_source: bool,
}

fn configured() -> bool {
    true
}

/// Connected components of `0..n` under `edges` (union-find): the
/// representative of each element's component.
pub fn components(n: usize, edges: impl IntoIterator<Item = (usize, usize)>) -> Vec<usize> {
    fn find(p: &mut [usize], x: usize) -> usize {
        let mut r = x;
        while p[r] != r {
            r = p[r];
        }
        p[x] = r;
        r
    }
    let mut parent: Vec<usize> = (0..n).collect();
    for (a, b) in edges {
        if a < n && b < n {
            let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
            parent[ra] = rb;
        }
    }
    (0..n).map(|v| find(&mut parent, v)).collect()
}

impl JobVertex {
    pub fn head(&self) -> &ChainedOperator {
        &self.operators[0]
    }
}

/// The JobGraph of one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobGraph {
    pub job_id: JobId,
    pub name: String,
    pub job_type: JobType,
    /// Vertices in topological order (producers before consumers).
    pub vertices: Vec<JobVertex>,
    pub object_reuse: bool,
    /// Hex fingerprint of the StreamGraph it was built from.
    pub fingerprint: String,
    pub config: Configuration,
}

impl JobGraph {
    pub fn vertex(&self, id: JobVertexId) -> Result<&JobVertex> {
        match self.vertices.iter().find(|v| v.id == id) {
            Some(v) => Ok(v),
            None => internal_err!("no vertex {id} in job graph '{}'", self.name),
        }
    }

    pub fn vertex_index(&self, id: JobVertexId) -> Option<usize> {
        self.vertices.iter().position(|v| v.id == id)
    }

    /// Slots the job needs (Flink's slot sharing): per slot sharing group,
    /// its largest parallelism, summed over the groups.
    pub fn required_slots(&self) -> usize {
        let mut per_group: std::collections::BTreeMap<&str, usize> = Default::default();
        for v in &self.vertices {
            let e = per_group.entry(v.slot_sharing_group.as_str()).or_insert(0);
            *e = (*e).max(v.parallelism);
        }
        per_group.values().sum()
    }

    /// Under Flink's adaptive batch scheduler: which vertices start with their
    /// parallelism undecided, and the forward group of every vertex (vertices
    /// joined by forward edges share one parallelism). `None` when the job
    /// does not run adaptively: not batch, an exchange that is not
    /// blocking, `execution.batch.adaptive.auto-parallelism.enabled` false,
    /// or every parallelism set. A group with one member the user set keeps
    /// that parallelism for all of them.
    pub fn adaptive_vertices(&self) -> Result<Option<(Vec<bool>, Vec<usize>)>> {
        use fluvia_core::config::options::AUTO_PARALLELISM_ENABLED;
        if self.job_type != JobType::Batch
            || !self.config.get(&AUTO_PARALLELISM_ENABLED)?
            || self.vertices.iter().all(|v| v.parallelism_configured)
            || self
                .vertices
                .iter()
                .flat_map(|v| &v.inputs)
                .any(|e| e.result_partition_type != ResultPartitionType::Blocking)
        {
            return Ok(None);
        }
        let n = self.vertices.len();
        let forward = self.vertices.iter().enumerate().flat_map(|(c, v)| {
            v.inputs
                .iter()
                .filter(|e| e.partitioner == PartitionerKind::Forward)
                .filter_map(move |e| Some((self.vertex_index(e.source_vertex)?, c)))
        });
        let groups = components(n, forward);
        let undecided = (0..n)
            .map(|v| {
                !self
                    .vertices
                    .iter()
                    .zip(&groups)
                    .any(|(u, &g)| g == groups[v] && u.parallelism_configured)
            })
            .collect();
        Ok(Some((undecided, groups)))
    }

    /// Number of operators over all chains.
    pub fn num_operators(&self) -> usize {
        self.vertices.iter().map(|v| v.operators.len()).sum()
    }
}
