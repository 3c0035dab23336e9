//! The TaskManager's side of pluggable shuffle (Flink's FLIP-31
//! `ShuffleEnvironment`): the partitions an attempt writes and the input
//! channels it reads, created from the descriptors the JobManager's
//! `ShuffleMaster` decided.
//!
//! - [`InternalShuffleEnvironment`]: the TaskManager keeps and serves its
//!   partitions (pipelined in memory, blocking ones as files in its working
//!   directory).
//! - [`ExternalShuffleEnvironment`]: blocking partitions are written as
//!   sort-merge files into the directory of the shuffle service of this
//!   host and handed over to it when the attempt finished.
//!
//! Input channels do not depend on the kind: a consumer reads a partition
//! in place when it is on this TaskManager, else over TCP from wherever the
//! descriptor says it lives (a TaskManager or a shuffle service). Neither
//! the runtime nor SQL knows which environment made their partitions.

use crate::deployment::{partition_id, partition_to_proto};
use crate::security;
use fluvia_core::{FluviaError, Result};
use fluvia_deployment::{InputDescriptor, OutputDescriptor, PartitionRef, ShuffleServiceTarget};
use fluvia_network::net::client::GateBufferPool;
use fluvia_network::net::environment::{NetworkEnvironment, RemoteChannelSpec};
use fluvia_network::net::protocol::ResultPartitionId;
use fluvia_network::{InputChannel, InputChannelSpec, LocalInputChannel, ResultPartition};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// One partition an attempt writes.
pub struct ProducedPartition {
    pub id: ResultPartitionId,
    pub partition: Arc<ResultPartition>,
    /// Buffers of its writer's pool.
    pub pool_size: usize,
    /// Registered with this TaskManager's server (released with the job).
    pub served_here: bool,
    /// Where it goes once finished, for an external one.
    handover: Option<ShuffleServiceTarget>,
}

/// What a partition is created for.
pub struct PartitionRequest<'a> {
    pub job_id: &'a str,
    pub id: ResultPartitionId,
    pub name: String,
    pub output: &'a OutputDescriptor,
}

/// Creates an attempt's partitions and makes them readable once it
/// finished.
pub trait ShuffleEnvironment: Send + Sync {
    /// `spill_dir` gives the job's working directory (created on demand).
    fn create_result_partition(
        &self,
        request: PartitionRequest<'_>,
        spill_dir: &mut dyn FnMut() -> Result<std::path::PathBuf>,
    ) -> Result<ProducedPartition>;

    /// The attempt finished writing `partition`: make it readable where its
    /// consumers will look for it.
    fn partition_finished(&self, job_id: &str, partition: &ProducedPartition) -> Result<()>;
}

fn seed(id: &ResultPartitionId) -> u64 {
    (id.data_set as u64) ^ ((id.producer_subtask as u64) << 32) ^ id.attempt as u64
}

fn file_prefix(id: &ResultPartitionId) -> String {
    format!(
        "{:032x}-{}-{}",
        id.data_set, id.producer_subtask, id.attempt
    )
}

/// The TaskManager serves what it produced.
pub struct InternalShuffleEnvironment {
    env: Arc<NetworkEnvironment>,
}

impl InternalShuffleEnvironment {
    pub fn new(env: Arc<NetworkEnvironment>) -> Self {
        InternalShuffleEnvironment { env }
    }
}

impl ShuffleEnvironment for InternalShuffleEnvironment {
    fn create_result_partition(
        &self,
        r: PartitionRequest<'_>,
        spill_dir: &mut dyn FnMut() -> Result<std::path::PathBuf>,
    ) -> Result<ProducedPartition> {
        let dir = if r.output.blocking {
            Some(spill_dir()?)
        } else {
            None
        };
        let prefix = file_prefix(&r.id);
        let (partition, pool_size) = self.env.create_result_partition(
            r.name,
            r.output.num_subpartitions,
            dir.as_deref().map(|d| (d, prefix.as_str())),
            seed(&r.id),
        )?;
        let partition = Arc::new(partition);
        self.env.register_partition(r.id, Arc::clone(&partition));
        Ok(ProducedPartition {
            id: r.id,
            partition,
            pool_size,
            served_here: true,
            handover: None,
        })
    }

    fn partition_finished(&self, _job_id: &str, _partition: &ProducedPartition) -> Result<()> {
        Ok(())
    }
}

/// Blocking partitions go to the shuffle service of this host.
pub struct ExternalShuffleEnvironment {
    env: Arc<NetworkEnvironment>,
    secret: Option<String>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl ExternalShuffleEnvironment {
    pub fn new(
        env: Arc<NetworkEnvironment>,
        secret: Option<String>,
        runtime: tokio::runtime::Handle,
        timeout: Duration,
    ) -> Self {
        ExternalShuffleEnvironment {
            env,
            secret,
            runtime,
            timeout,
        }
    }
}

impl ShuffleEnvironment for ExternalShuffleEnvironment {
    fn create_result_partition(
        &self,
        r: PartitionRequest<'_>,
        _spill_dir: &mut dyn FnMut() -> Result<std::path::PathBuf>,
    ) -> Result<ProducedPartition> {
        let Some(target) = &r.output.shuffle_service else {
            return Err(FluviaError::Internal(format!(
                "partition {} has no shuffle service",
                r.id
            )));
        };
        let dir = Path::new(&target.dir).join(r.job_id);
        std::fs::create_dir_all(&dir).map_err(|e| {
            FluviaError::io(
                format!(
                    "creating {} for shuffle service {}",
                    dir.display(),
                    target.id
                ),
                e,
            )
        })?;
        let (partition, pool_size) = self.env.create_sort_merge_partition(
            r.name,
            r.output.num_subpartitions,
            &dir,
            &file_prefix(&r.id),
            seed(&r.id),
        )?;
        Ok(ProducedPartition {
            id: r.id,
            partition: Arc::new(partition),
            pool_size,
            served_here: false,
            handover: Some(target.clone()),
        })
    }

    /// Hands the finished files to the service, which serves (and owns)
    /// them from now on.
    fn partition_finished(&self, job_id: &str, p: &ProducedPartition) -> Result<()> {
        let (Some(target), Some(smp)) = (&p.handover, p.partition.as_sort_merge()) else {
            return Err(FluviaError::Internal(format!(
                "partition {} is not a sort-merge partition for a shuffle service",
                p.id
            )));
        };
        let id = p.id;
        let req = crate::rpc::RegisterPartitionRequest {
            job_id: job_id.to_string(),
            partition: Some(partition_to_proto(&PartitionRef {
                data_set: id.data_set,
                producer_subtask: id.producer_subtask,
                attempt: id.attempt,
            })),
            data_path: smp.data_path().display().to_string(),
            index_path: smp.index_path().display().to_string(),
        };
        let req = security::authorize(req, &self.secret);
        let endpoint = format!("http://{}", target.rpc_address);
        let call = async move {
            let mut client =
                crate::rpc::shuffle_service_client::ShuffleServiceClient::connect(endpoint)
                    .await
                    .map_err(|e| e.to_string())?;
            let ack = client
                .register_partition(req)
                .await
                .map_err(|e| e.message().to_string())?
                .into_inner();
            if ack.ok { Ok(()) } else { Err(ack.message) }
        };
        let timeout = self.timeout;
        match self
            .runtime
            .block_on(async { tokio::time::timeout(timeout, call).await })
        {
            Ok(Ok(())) => {
                smp.disown_files();
                Ok(())
            }
            Ok(Err(e)) => Err(FluviaError::Execution(format!(
                "handing partition {id} over to shuffle service {} at {} failed: {e}",
                target.id, target.rpc_address
            ))),
            Err(_) => Err(FluviaError::Execution(format!(
                "shuffle service {} at {} did not take partition {id} within {} s",
                target.id,
                target.rpc_address,
                timeout.as_secs()
            ))),
        }
    }
}

/// The input channels of one attempt.
pub struct InputChannels {
    pub inputs: Vec<InputChannelSpec>,
    /// Each channel with the partition it reads, to name the partitions a
    /// failed attempt could not read.
    pub watched: Vec<(PartitionRef, Arc<dyn InputChannel>)>,
    /// The buffer pools of its remote channels.
    pub pools: Vec<Arc<GateBufferPool>>,
}

/// Creates the channels `inputs` describe: in place for a partition of this
/// TaskManager, over TCP otherwise.
pub fn create_input_channels(
    env: &NetworkEnvironment,
    task_manager: &str,
    inputs: &[InputDescriptor],
) -> Result<InputChannels> {
    let mut out = InputChannels {
        inputs: Vec::new(),
        watched: Vec::new(),
        pools: Vec::new(),
    };
    let mut remote = Vec::new();
    for input in inputs {
        let id: ResultPartitionId = partition_id(input.partition);
        if input.local {
            let partition = env.partitions().get(&id).ok_or_else(|| {
                FluviaError::Execution(format!(
                    "local partition {id} is not on TaskManager {task_manager}"
                ))
            })?;
            let channel: Arc<dyn InputChannel> = LocalInputChannel::new(
                partition,
                input.first_subpartition,
                input.last_subpartition,
            )?;
            out.watched.push((input.partition, Arc::clone(&channel)));
            out.inputs.push(InputChannelSpec {
                channel,
                input_index: input.type_number as usize,
            });
        } else {
            let peer: SocketAddr = input.producer_address.parse().map_err(|e| {
                FluviaError::Execution(format!(
                    "bad producer address '{}': {e}",
                    input.producer_address
                ))
            })?;
            remote.push((
                input.type_number as usize,
                input.partition,
                RemoteChannelSpec {
                    peer,
                    partition: id,
                    first_subpartition: input.first_subpartition,
                    last_subpartition: input.last_subpartition,
                },
            ));
        }
    }
    if !remote.is_empty() {
        let specs: Vec<RemoteChannelSpec> = remote.iter().map(|(_, _, s)| *s).collect();
        let (pool, channels) = env.open_remote_channels(&specs)?;
        out.pools.push(pool);
        for ((t, p, _), ch) in remote.iter().zip(channels) {
            let channel: Arc<dyn InputChannel> = ch;
            out.watched.push((*p, Arc::clone(&channel)));
            out.inputs.push(InputChannelSpec {
                channel,
                input_index: *t,
            });
        }
    }
    Ok(out)
}
