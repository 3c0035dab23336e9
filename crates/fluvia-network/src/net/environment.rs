//! The network side of one TaskManager: its buffer budget, the registry of
//! the partitions it produces (and how they are stored), the read scheduler
//! of its blocking partitions, the server other TaskManagers read them from,
//! and its connections to theirs.

use super::client::{ConnectionManager, GateBufferPool, RemoteInputChannel};
use super::protocol::ResultPartitionId;
use super::server::{PartitionRequestServer, ResultPartitionManager, ServerConfig};
use crate::ResultPartition;
use crate::buffer::NetworkBufferPool;
use crate::sortmerge::{ReadScheduler, SortMergeConfig, SortMergePartition};
use fluvia_core::Result;
use std::net::SocketAddr;
use std::sync::Arc;

/// Network settings of a TaskManager (Flink's keys in parentheses).
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// `taskmanager.memory.segment-size`
    pub segment_size: usize,
    /// `taskmanager.memory.network.size`
    pub total_memory: u64,
    /// Exclusive buffers per remote channel (`buffers-per-channel`).
    pub buffers_per_channel: usize,
    /// Floating buffers per gate (`floating-buffers-per-gate`).
    pub floating_buffers_per_gate: usize,
    /// `taskmanager.network.compression.codec` = LZ4
    pub compression: bool,
    /// The cluster secret every data connection must present.
    pub secret: Option<String>,
    /// Blocking partitions with at least this many subpartitions are
    /// sort-merge, the others one file per subpartition
    /// (`taskmanager.network.sort-shuffle.min-parallelism`).
    pub sort_shuffle_min_parallelism: usize,
    /// Segments of a sort-merge writer's sort area
    /// (`taskmanager.network.sort-shuffle.min-buffers`).
    pub sort_shuffle_min_buffers: usize,
    /// LZ4 per buffer in sort-merge files
    /// (`taskmanager.network.blocking-shuffle.compression.enabled`).
    pub blocking_compression: bool,
    /// Read buffers of all sort-merge readers
    /// (`taskmanager.memory.framework.off-heap.batch-shuffle.size`).
    pub batch_shuffle_read_memory: u64,
    /// How long a reservation of buffers waits for running tasks to give
    /// theirs back before it fails
    /// (`taskmanager.network.memory.exclusive-buffers-request-timeout-ms`).
    pub buffer_request_timeout: std::time::Duration,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            segment_size: 32 * 1024,
            total_memory: 64 * 1024 * 1024,
            buffers_per_channel: 2,
            floating_buffers_per_gate: 8,
            compression: false,
            secret: None,
            sort_shuffle_min_parallelism: 1,
            sort_shuffle_min_buffers: 64,
            blocking_compression: true,
            batch_shuffle_read_memory: 64 * 1024 * 1024,
            buffer_request_timeout: std::time::Duration::from_secs(30),
        }
    }
}

/// One remote channel to open: where its producer lives and what to read
/// (subpartitions `first_subpartition..=last_subpartition`).
#[derive(Debug, Clone, Copy)]
pub struct RemoteChannelSpec {
    pub peer: SocketAddr,
    pub partition: ResultPartitionId,
    pub first_subpartition: u32,
    pub last_subpartition: u32,
}

pub struct NetworkEnvironment {
    config: NetworkConfig,
    global: Arc<NetworkBufferPool>,
    partitions: Arc<ResultPartitionManager>,
    server: PartitionRequestServer,
    connections: ConnectionManager,
    read_scheduler: Arc<ReadScheduler>,
}

debug_fields!(NetworkEnvironment, |this| { data_address: this.server.address() });

impl NetworkEnvironment {
    /// Creates the buffer budget and starts the data server on `bind`.
    pub fn start(config: NetworkConfig, bind: SocketAddr) -> Result<Arc<Self>> {
        let global = NetworkBufferPool::with_request_timeout(
            config.total_memory,
            config.segment_size,
            config.buffer_request_timeout,
        )?;
        let config_for_env = config.clone();
        let partitions = Arc::new(ResultPartitionManager::default());
        let server = PartitionRequestServer::start(
            bind,
            Arc::clone(&partitions),
            ServerConfig {
                compression: config.compression,
                secret: config.secret.clone(),
            },
        )?;
        let read_scheduler =
            ReadScheduler::start(config.batch_shuffle_read_memory, config.segment_size)?;
        Ok(Arc::new(NetworkEnvironment {
            read_scheduler,
            config: config_for_env,
            global,
            partitions,
            server,
            connections: ConnectionManager::new(config.secret.clone()),
        }))
    }

    pub fn config(&self) -> &NetworkConfig {
        &self.config
    }

    /// Where other TaskManagers connect to read this one's partitions.
    pub fn data_address(&self) -> SocketAddr {
        self.server.address()
    }

    pub fn buffer_pool(&self) -> &Arc<NetworkBufferPool> {
        &self.global
    }

    pub fn partitions(&self) -> &Arc<ResultPartitionManager> {
        &self.partitions
    }

    pub fn server(&self) -> &PartitionRequestServer {
        &self.server
    }

    pub fn connections(&self) -> &ConnectionManager {
        &self.connections
    }

    /// The reader of this TaskManager's sort-merge partitions.
    pub fn read_scheduler(&self) -> &Arc<ReadScheduler> {
        &self.read_scheduler
    }

    /// Creates the partition a producing subtask writes, with the size of
    /// its buffer pool. A pipelined partition gets `buffers-per-channel` per
    /// subpartition plus the floating buffers. A blocking one writes into
    /// `blocking = (directory, file prefix)`: sort-merge with a fixed sort
    /// area whatever the number of subpartitions, or below
    /// `sort-shuffle.min-parallelism` one file per subpartition with one
    /// buffer each plus one. `rotation_seed` varies the order in which a
    /// sort-merge producer writes its subpartitions.
    pub fn create_result_partition(
        &self,
        name: String,
        num_subpartitions: usize,
        blocking: Option<(&std::path::Path, &str)>,
        rotation_seed: u64,
    ) -> Result<(ResultPartition, usize)> {
        let n = num_subpartitions;
        let c = &self.config;
        Ok(match blocking {
            None => (
                ResultPartition::pipelined(name, n, c.segment_size),
                (n * c.buffers_per_channel + c.floating_buffers_per_gate).max(n + 1),
            ),
            Some((dir, prefix)) if n >= c.sort_shuffle_min_parallelism => {
                self.create_sort_merge_partition(name, n, dir, prefix, rotation_seed)?
            }
            Some((dir, prefix)) => (
                ResultPartition::blocking(name, n, c.segment_size, dir, prefix)?,
                n + 1,
            ),
        })
    }

    /// A sort-merge partition in `dir` whatever its number of
    /// subpartitions (for a partition handed over to a shuffle service),
    /// with the size of its buffer pool.
    pub fn create_sort_merge_partition(
        &self,
        name: String,
        num_subpartitions: usize,
        dir: &std::path::Path,
        prefix: &str,
        rotation_seed: u64,
    ) -> Result<(ResultPartition, usize)> {
        let c = &self.config;
        let config = SortMergeConfig {
            segment_size: c.segment_size,
            sort_buffers: c.sort_shuffle_min_buffers.max(1),
            compression: c.blocking_compression,
        };
        let p = SortMergePartition::create(
            name,
            num_subpartitions,
            dir,
            prefix,
            config,
            Arc::clone(&self.read_scheduler),
            rotation_seed,
        )?;
        Ok((
            ResultPartition::sort_merge(p),
            c.sort_shuffle_min_buffers.max(1),
        ))
    }

    /// Makes a partition readable by remote consumers.
    pub fn register_partition(
        &self,
        id: ResultPartitionId,
        partition: Arc<crate::ResultPartition>,
    ) {
        self.partitions.register(id, partition);
    }

    /// Opens the remote channels of one input gate: reserves
    /// `channels × buffers-per-channel + floating` segments for them and
    /// sends their partition requests.
    pub fn open_remote_channels(
        &self,
        specs: &[RemoteChannelSpec],
    ) -> Result<(Arc<GateBufferPool>, Vec<Arc<RemoteInputChannel>>)> {
        let size =
            specs.len() * self.config.buffers_per_channel + self.config.floating_buffers_per_gate;
        let pool = GateBufferPool::new(self.global.create_local_pool(size)?);
        // Every channel's exclusive segments first: an opened channel may
        // take floating ones from the same pool as soon as data arrives.
        let exclusive = specs
            .iter()
            .map(|_| RemoteInputChannel::exclusive_segments(&pool, self.config.buffers_per_channel))
            .collect::<Result<Vec<_>>>()?;
        let mut channels = Vec::with_capacity(specs.len());
        for (s, segments) in specs.iter().zip(exclusive) {
            let conn = self.connections.connection(s.peer)?;
            channels.push(RemoteInputChannel::request(
                &conn,
                &pool,
                s.partition,
                (s.first_subpartition, s.last_subpartition),
                segments,
            )?);
        }
        Ok((pool, channels))
    }

    /// Closes connections and stops the server.
    pub fn shutdown(&self) {
        self.connections.close_all();
        self.server.shutdown();
        self.read_scheduler.shutdown();
    }
}
