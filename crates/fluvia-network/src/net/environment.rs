//! The network side of one TaskManager: its buffer budget, the registry of
//! the partitions it produces, the server other TaskManagers read them from,
//! and its connections to theirs.

use super::client::{ConnectionManager, GateBufferPool, RemoteInputChannel};
use super::protocol::ResultPartitionId;
use super::server::{PartitionRequestServer, ResultPartitionManager, ServerConfig};
use crate::buffer::NetworkBufferPool;
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
        }
    }
}

/// One remote channel to open: where its producer lives and what to read.
#[derive(Debug, Clone, Copy)]
pub struct RemoteChannelSpec {
    pub peer: SocketAddr,
    pub partition: ResultPartitionId,
    pub subpartition: u32,
}

pub struct NetworkEnvironment {
    config: NetworkConfig,
    global: Arc<NetworkBufferPool>,
    partitions: Arc<ResultPartitionManager>,
    server: PartitionRequestServer,
    connections: ConnectionManager,
}

impl std::fmt::Debug for NetworkEnvironment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkEnvironment")
            .field("data_address", &self.server.address())
            .finish()
    }
}

impl NetworkEnvironment {
    /// Creates the buffer budget and starts the data server on `bind`.
    pub fn start(config: NetworkConfig, bind: SocketAddr) -> Result<Arc<Self>> {
        let global = NetworkBufferPool::new(config.total_memory, config.segment_size)?;
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
        Ok(Arc::new(NetworkEnvironment {
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
                s.subpartition,
                segments,
            )?);
        }
        Ok((pool, channels))
    }

    /// Closes connections and stops the server.
    pub fn shutdown(&self) {
        self.connections.close_all();
        self.server.shutdown();
    }
}
