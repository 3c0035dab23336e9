//! A [`SqlJob`] as a StreamGraph (one node per task, a sink, an edge per
//! stage's exchange) and a JobGraph with the operators of every process.
//! Which stages share a task (a reuse group: a shared source chained to
//! several fragments) is [`crate::planning::source_reuse`]'s decision.

use super::stage_task::{SinkFactory, StageFactory};
use super::{ShuffleMode, SqlJob, decode_schema};
use crate::exec::exchange::OutputOf;
use crate::formats::file_sink::FileSinkFactory;
use crate::planning::source_reuse::ReuseGroup;
use crate::planning::split::Exchange;
use crate::session::options as sql_options;
use fluvia_core::config::options;
use fluvia_core::{ExchangeMode, FluviaError, PartitionerKind, Result, RuntimeMode};
use fluvia_graph::{JobGraph, JobGraphGenerator, StreamGraph, StreamGraphBuilder};
use fluvia_runtime::OperatorRegistry;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

impl SqlJob {
    /// How many subtasks the sink runs: one collects the result; an
    /// INSERT's part files are written by as many as the last fragment has.
    fn sink_parallelism(&self) -> usize {
        match (&self.files, self.stages.last()) {
            (Some(_), Some(root)) => root.parallelism.max(1),
            _ => 1,
        }
    }

    /// Whether stage `id` feeds its consumer one-to-one.
    pub(super) fn is_pointwise(&self, id: usize) -> bool {
        let s = &self.stages[id];
        let consumer_parallelism = s
            .consumer
            .map_or(self.sink_parallelism(), |c| self.stages[c].parallelism);
        s.exchange == (Exchange::Forward { offset: 0 }) && s.parallelism == consumer_parallelism
    }

    fn partitioner(&self, id: usize) -> PartitionerKind {
        match self.stages[id].exchange {
            Exchange::Hash { .. } => PartitionerKind::Hash,
            Exchange::Broadcast => PartitionerKind::Broadcast,
            Exchange::Global { .. } => PartitionerKind::Global,
            Exchange::Forward { .. } if self.is_pointwise(id) => PartitionerKind::Forward,
            // A direct route: the producer picks the consumer subtask.
            Exchange::Forward { .. } => PartitionerKind::Hash,
        }
    }

    /// The stages run by one task, as [`SqlJob::tasks`] lists them.
    fn members(&self, id: usize) -> Vec<usize> {
        self.reuse_group(id)
            .map(|g| g.stages.clone())
            .unwrap_or_else(|| vec![id])
    }

    fn reuse_group(&self, id: usize) -> Option<&ReuseGroup> {
        self.reuse.iter().find(|g| g.stages.contains(&id))
    }

    /// One entry per task, in stage order of its first stage: a reuse group
    /// runs as one task, every other stage alone.
    pub fn tasks(&self) -> Vec<Vec<usize>> {
        let mut out: Vec<Vec<usize>> = Vec::new();
        for id in 0..self.stages.len() {
            let m = self.members(id);
            if m[0] == id {
                out.push(m);
            }
        }
        out
    }

    /// The stages a task reads, in the order of its input numbers: its
    /// stages' inputs one after another.
    pub(super) fn task_inputs(&self, members: &[usize]) -> Vec<usize> {
        members
            .iter()
            .flat_map(|&m| self.stages[m].inputs.iter().copied())
            .collect()
    }

    /// Flink's chain name for a task of several stages: the shared source
    /// chained to each stage's operators.
    fn task_name(&self, members: &[usize]) -> String {
        match members {
            [one] => self.stages[*one].name.clone(),
            _ => {
                let names: Vec<&str> = members
                    .iter()
                    .map(|&m| self.stages[m].name.as_str())
                    .collect();
                let prefix = names[0].split(" -> ").next().unwrap_or_default();
                if prefix.starts_with("Source: ")
                    && names
                        .iter()
                        .all(|n| n.starts_with(&format!("{prefix} -> ")))
                {
                    let rest: Vec<&str> = names.iter().map(|n| &n[prefix.len() + 4..]).collect();
                    format!("{prefix} -> ({})", rest.join(", "))
                } else {
                    format!("({})", names.join(", "))
                }
            }
        }
    }

    /// The StreamGraph: one node per task (a source when it has no
    /// network input) and a sink; edges carry the stages' exchanges. Also
    /// the node of each stage, the edge out of each stage, and the sink.
    fn graph(&self) -> Result<(StreamGraph, Vec<usize>, Vec<usize>, usize)> {
        let config = self.configuration();
        let mut b = StreamGraphBuilder::new(self.name.clone());
        b.runtime_mode = RuntimeMode::Batch;
        b.chaining_enabled = config.get(&options::CHAINING_ENABLED)?;
        // Branch readers deadlock pipelined unless the inputs of branches a
        // subtask does not run are released at its start.
        let branches_safe =
            !self.branch_readers || config.get(&sql_options::RELEASE_UNREAD_INPUTS)?;
        // The adaptive batch scheduler sizes stages from the bytes their
        // producers wrote into finished partitions (as in Flink, it takes
        // blocking exchanges only).
        let pipelined = ShuffleMode::of(&config)? == ShuffleMode::Pipelined
            && branches_safe
            && !(0..self.stages.len()).any(|k| self.is_adaptive(k));
        let mut nodes = vec![usize::MAX; self.stages.len()];
        for members in self.tasks() {
            let k = members[0];
            let s = &self.stages[k];
            let inputs = self.task_inputs(&members).len();
            let name = self.task_name(&members);
            let id = if inputs == 0 {
                b.add_source(name, true)
            } else {
                let n = b.add_operator(name, inputs);
                // A fragment pulls its own inputs: never chained behind
                // another one, even over a pipelined forward edge.
                b.set_chaining_strategy(n, fluvia_core::ChainingStrategy::Head);
                n
            };
            if self.is_adaptive(k) {
                // Left to the scheduler; the planned count is the default.
                b.default_parallelism = s.parallelism;
                b.set_max_parallelism(id, self.key_groups.max(s.parallelism));
            } else {
                b.set_parallelism(id, s.parallelism);
                b.set_max_parallelism(id, s.parallelism.max(1));
            }
            for &m in &members {
                nodes[m] = id;
            }
        }
        let sink_name = match &self.files {
            Some(f) => format!("Sink: {} ({} files)", f.table, f.format.name()),
            None => "Sink: collect".to_string(),
        };
        let sink = b.add_operator(sink_name, 1);
        // Each attempt writes its own files; the winner's are renamed into
        // place when the job finishes.
        b.set_supports_concurrent_attempts(sink, true);
        let root = self.stages.len() - 1;
        if self.files.is_some() && self.is_adaptive(root) {
            // Chained to the last fragment: its parallelism, whatever the
            // scheduler decides.
            b.set_max_parallelism(sink, self.key_groups.max(self.stages[root].parallelism));
        } else {
            b.set_parallelism(sink, self.sink_parallelism());
            b.set_max_parallelism(sink, self.sink_parallelism());
        }
        let mut edges = Vec::with_capacity(self.stages.len());
        for (id, s) in self.stages.iter().enumerate() {
            let (target, type_number) = match s.consumer {
                Some(c) => {
                    let inputs = self.task_inputs(&self.members(c));
                    let pos = inputs.iter().position(|&i| i == id).ok_or_else(|| {
                        FluviaError::Plan(format!("stage {c} does not read stage {id}"))
                    })?;
                    (nodes[c], if inputs.len() == 1 { 0 } else { pos as u8 + 1 })
                }
                None => (sink, 0),
            };
            // Fragments are never chained to each other (each pulls its
            // own inputs); only the sink chains onto the last fragment. A
            // task of several stages writes blocking partitions unless its
            // outputs are single rows (see `ReuseGroup`).
            let blocking = self.reuse_group(id).is_some_and(|g| !g.small_outputs);
            let mode = if s.consumer.is_some() {
                if pipelined && !blocking {
                    ExchangeMode::Pipelined
                } else {
                    ExchangeMode::Batch
                }
            } else {
                ExchangeMode::Undefined
            };
            let edge = b.add_edge(
                nodes[id],
                target,
                Some(self.partitioner(id)),
                mode,
                type_number,
            );
            if let Some(c) = s.consumer {
                let pos = self.stages[c].inputs.iter().position(|&i| i == id);
                let split = pos
                    .and_then(|p| self.splittable.get(c).and_then(|f| f.get(p)))
                    .copied()
                    .unwrap_or(false);
                b.set_intra_input_key_correlated(edge, !split);
            }
            edges.push(edge);
        }
        Ok((b.build()?, nodes, edges, sink))
    }

    /// The StreamGraph the job runs as.
    pub fn stream_graph(&self) -> Result<StreamGraph> {
        Ok(self.graph()?.0)
    }

    /// The JobGraph and the operators of every process.
    pub fn build(self: &Arc<Self>) -> Result<(JobGraph, OperatorRegistry)> {
        let (graph, nodes, edges, sink) = self.graph()?;
        let job = JobGraphGenerator::new(&graph).create_job_graph(self.configuration(), true)?;
        let mut registry = OperatorRegistry::new();
        let session = Arc::new(OnceLock::new());
        for members in self.tasks() {
            let node = nodes[members[0]];
            let schema = self.stage_schema(members[0])?;
            registry.register(
                node,
                Arc::new(StageFactory {
                    job: Arc::clone(self),
                    stages: members,
                    schema,
                    session: Arc::clone(&session),
                }),
            );
        }
        // Which stage's batches each edge takes (a task of several stages
        // writes each stage's output to its own edge).
        for (stage, &edge) in edges.iter().enumerate() {
            registry.register_edge_data(edge, Arc::new(OutputOf(stage)));
        }
        let root = self.stages.len() - 1;
        match &self.files {
            None => registry.register(
                sink,
                Arc::new(SinkFactory {
                    path: PathBuf::from(&self.result_path),
                    schema: self.stage_schema(root)?,
                }),
            ),
            Some(spec) => registry.register(
                sink,
                Arc::new(FileSinkFactory {
                    spec: spec.clone(),
                    input: self.stage_schema(root)?,
                    file_schema: decode_schema(&spec.schema, "table")?,
                }),
            ),
        }
        Ok((job, registry))
    }
}
