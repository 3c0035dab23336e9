//! A planned query as a Fluvia job: the serialisable [`SqlJob`] (fragments
//! as datafusion-proto bytes, edges, DataFusion options), and the three
//! steps of its life, one file each:
//!
//! - `plan`: a statement into a [`SqlJob`]: DataFusion plans it, the rules
//!   of [`crate::planning`] cut and annotate its physical plan ([`plan()`]);
//! - `graph`: the job as a StreamGraph and a JobGraph, with the operators
//!   of every process ([`SqlJob::build`]);
//! - `stage_task`: the task-side driver that runs one subtask of a stage's
//!   fragments and writes their batches into the task's outputs;
//!
//! and `runtime`, the Tokio and DataFusion runtimes planning and tasks run on.
//!
//! The client plans once; every process (JobManager, TaskManagers) rebuilds
//! the same StreamGraph from the same bytes, so fingerprints match by
//! construction and no process needs the SQL, the tables' catalog or the
//! planner. The execution nodes a fragment is made of are
//! [`crate::exec`]'s; this module only wires them into tasks.

mod graph;
mod plan;
pub(crate) mod runtime;
mod stage_task;

pub use plan::{
    InsertTarget, PlanError, PlanRequest, PlannedQuery, QueryError, check_statement, cut_policy,
    plan, planning_context, run_in_datafusion,
};
pub use stage_task::read_result;

use crate::exec::exchange::lock;
use crate::formats::file_sink::FileSinkSpec;
use crate::planning::source_reuse::ReuseGroup;
use crate::planning::split::Exchange;
use crate::session::options as sql_options;
use base64::Engine;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::error::DataFusionError;
use datafusion_proto::protobuf;
use fluvia_core::config::options;
use fluvia_core::{Configuration, FluviaError, Result};
use prost::Message;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The name of the SQL program in a binary's program catalog.
pub const PROGRAM: &str = "sql";

/// One fragment, shipped.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageSpec {
    pub name: String,
    /// datafusion-proto bytes; a HASH output wraps the fragment in a
    /// `RepartitionExec` that carries the hash expressions.
    pub plan: Vec<u8>,
    pub parallelism: usize,
    pub exchange: Exchange,
    pub consumer: Option<usize>,
    pub inputs: Vec<usize>,
    /// proto bytes of the fragment's output schema.
    pub schema: Vec<u8>,
}

/// A planned query.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SqlJob {
    pub name: String,
    /// DataFusion options the fragments were planned with.
    pub options: Vec<(String, String)>,
    pub stages: Vec<StageSpec>,
    /// Where the sink writes the result (an Arrow IPC file).
    pub result_path: String,
    /// Fluvia configuration entries of the job (`-D`).
    pub config: Vec<(String, String)>,
    /// Per stage: whether its parallelism is left to the adaptive batch
    /// scheduler (decided from the bytes its inputs wrote).
    #[serde(default)]
    pub adaptive: Vec<bool>,
    /// Subpartitions a producer hashes into for an adaptive consumer (its
    /// max parallelism: the consumer reads ranges of them).
    #[serde(default)]
    pub key_groups: usize,
    /// Per stage, per input: whether a skewed subpartition of the input may
    /// be split across the stage's subtasks (a join side; FLIP-475).
    #[serde(default)]
    pub splittable: Vec<Vec<bool>>,
    /// Some stage reads exchanges under the branches of a union: each of
    /// its subtasks reads only its branch's inputs. It releases the others'
    /// at its start; read to their end instead (when it ends), a pipelined
    /// broadcast into another branch would wait for it while that branch
    /// waits for the broadcast, so such a job then blocks.
    #[serde(default)]
    pub branch_readers: bool,
    /// `INSERT INTO`: part files in a table's folder instead of the
    /// result file.
    #[serde(default)]
    pub files: Option<FileSinkSpec>,
    /// Groups of stages that scan the same files and run as one task
    /// reading them once (`table.optimizer.reuse-source-enabled`).
    #[serde(default)]
    pub reuse: Vec<ReuseGroup>,
    /// Per stage: a scan its consumer reads only on the probe side of a
    /// join, which waits for demand (`table.exec.source.start-on-demand`).
    #[serde(default)]
    pub read_later: Vec<bool>,
    /// Broadcast build sides this process's subtasks cluster once.
    #[serde(skip)]
    pub shared_clusters: Arc<crate::exec::cluster::SharedClusters>,
    /// Each fragment's protobuf message, read from its bytes once per
    /// process: its subtasks each build their own plan from it (a plan holds
    /// the state of one execution), but need not parse the bytes again.
    #[serde(skip)]
    pub parsed: Arc<Mutex<BTreeMap<usize, Arc<protobuf::PhysicalPlanNode>>>>,
}

fn df_err(e: DataFusionError) -> FluviaError {
    match e {
        DataFusionError::External(inner) => match inner.downcast::<FluviaError>() {
            Ok(f) => *f,
            Err(other) => FluviaError::Internal(other.to_string()),
        },
        DataFusionError::Context(ctx, inner) => match df_err(*inner) {
            FluviaError::Cancelled => FluviaError::Cancelled,
            other => FluviaError::Internal(format!("{ctx}: {other}")),
        },
        other => FluviaError::Internal(other.to_string()),
    }
}

// ---------------------------------------------------------------- exchange mode

/// `execution.batch-shuffle-mode`: how a SQL job's exchanges move data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShuffleMode {
    /// Each exchange a blocking partition, read once its producer finished.
    Blocking,
    /// Each exchange streamed while both ends run (one pipelined region).
    Pipelined,
    /// Pipelined where a blocking partition buys nothing; the client
    /// resolves it with [`SqlJob::resolve_shuffle_mode`] before submitting.
    Auto,
}

impl ShuffleMode {
    pub fn of(config: &Configuration) -> Result<ShuffleMode> {
        let v = config.get(&sql_options::BATCH_SHUFFLE_MODE)?;
        match v.to_ascii_uppercase().as_str() {
            "ALL_EXCHANGES_BLOCKING" => Ok(ShuffleMode::Blocking),
            "ALL_EXCHANGES_PIPELINED" => Ok(ShuffleMode::Pipelined),
            "AUTO" => Ok(ShuffleMode::Auto),
            _ => Err(FluviaError::Config(format!(
                "{} must be ALL_EXCHANGES_BLOCKING, ALL_EXCHANGES_PIPELINED or AUTO, not '{v}'",
                sql_options::BATCH_SHUFFLE_MODE.key
            ))),
        }
    }
}

impl SqlJob {
    /// Settles `AUTO` for where the job runs: pipelined on the embedded
    /// mini-cluster, which starts with a slot for every task, unless
    /// speculative attempts or an external shuffle service want finished,
    /// stored partitions; blocking on a cluster, whose slots may be fewer
    /// than the tasks (blocking stages run in waves).
    pub fn resolve_shuffle_mode(&mut self, embedded: bool) -> Result<()> {
        let config = self.configuration();
        if ShuffleMode::of(&config)? != ShuffleMode::Auto {
            return Ok(());
        }
        let speculative = config.get(&options::SPECULATIVE_ENABLED)?;
        let external = config
            .get_raw("shuffle-service.type")
            .is_some_and(|t| t.eq_ignore_ascii_case("external"));
        let mode = if embedded && !speculative && !external {
            "ALL_EXCHANGES_PIPELINED"
        } else {
            "ALL_EXCHANGES_BLOCKING"
        };
        self.config
            .retain(|(k, _)| k != sql_options::BATCH_SHUFFLE_MODE.key);
        self.config.push((
            sql_options::BATCH_SHUFFLE_MODE.key.to_string(),
            mode.to_string(),
        ));
        Ok(())
    }
}

// ---------------------------------------------------------------- job encoding

impl SqlJob {
    /// The job as program arguments.
    pub fn to_args(&self) -> Result<Vec<String>> {
        let bytes = bincode::serialize(self)
            .map_err(|e| FluviaError::Serialization(format!("encoding the SQL job: {e}")))?;
        Ok(vec![
            "--job".to_string(),
            base64::engine::general_purpose::STANDARD.encode(bytes),
        ])
    }

    pub fn from_args(args: &[String]) -> Result<SqlJob> {
        let [flag, data] = args else {
            return Err(FluviaError::Plan("the sql program takes --job DATA".into()));
        };
        if flag != "--job" {
            return Err(FluviaError::Plan("the sql program takes --job DATA".into()));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| FluviaError::Serialization(format!("decoding the SQL job: {e}")))?;
        bincode::deserialize(&bytes)
            .map_err(|e| FluviaError::Serialization(format!("decoding the SQL job: {e}")))
    }

    pub fn configuration(&self) -> Configuration {
        let mut c = Configuration::new();
        for (k, v) in &self.config {
            c.set(k, v.clone());
        }
        c
    }

    /// Fragment `id`'s protobuf message, parsed at its first use here.
    fn parsed(&self, id: usize) -> Result<Arc<protobuf::PhysicalPlanNode>> {
        if let Some(p) = lock(&self.parsed).get(&id) {
            return Ok(Arc::clone(p));
        }
        let spec = self
            .stages
            .get(id)
            .ok_or_else(|| FluviaError::Internal(format!("the job has no stage {id}")))?;
        let p = Arc::new(
            protobuf::PhysicalPlanNode::decode(spec.plan.as_slice())
                .map_err(|e| FluviaError::Serialization(format!("stage {id}'s plan: {e}")))?,
        );
        lock(&self.parsed).insert(id, Arc::clone(&p));
        Ok(p)
    }

    fn stage_schema(&self, id: usize) -> Result<SchemaRef> {
        decode_schema(&self.stages[id].schema, &format!("stage {id}"))
    }

    /// Whether the scheduler decides the parallelism of stage `id`.
    pub fn is_adaptive(&self, id: usize) -> bool {
        self.adaptive.get(id).copied().unwrap_or(false) && self.key_groups > 0
    }
}

fn decode_schema(bytes: &[u8], what: &str) -> Result<SchemaRef> {
    let proto = protobuf::Schema::decode(bytes)
        .map_err(|e| FluviaError::Serialization(format!("{what} schema: {e}")))?;
    let schema: Schema = (&proto)
        .try_into()
        .map_err(|e| FluviaError::Serialization(format!("{what} schema: {e}")))?;
    Ok(Arc::new(schema))
}
