//! The JobManager's side of pluggable shuffle (Flink's FLIP-31
//! `ShuffleMaster`): where each produced partition lives, decided before
//! its producer deploys, and what is lost when a location goes away.
//!
//! - [`ShuffleServiceType::Internal`]: the producing TaskManager serves its
//!   own partitions (they are gone with it).
//! - [`ShuffleServiceType::External`]: the producer writes its blocking
//!   partitions into the directory of the shuffle service on its host and
//!   hands them over when it finishes; the service serves them, so the
//!   TaskManager may go away once its producers finished.
//!
//! Pipelined partitions always stay with their producer. This module knows
//! no sockets or files: it decides, the shells carry it out.

use fluvia_core::{FluviaError, Result};
use std::collections::BTreeMap;

/// `shuffle-service.type`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShuffleServiceType {
    #[default]
    Internal,
    External,
}

impl ShuffleServiceType {
    pub const KEY: &'static str = "shuffle-service.type";

    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "internal" => Ok(ShuffleServiceType::Internal),
            "external" => Ok(ShuffleServiceType::External),
            other => Err(FluviaError::Config(format!(
                "{}: expected internal or external, got '{other}'",
                Self::KEY
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ShuffleServiceType::Internal => "internal",
            ShuffleServiceType::External => "external",
        }
    }
}

/// A shuffle service as it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShuffleServiceSpec {
    pub id: String,
    /// The host it serves: TaskManagers whose data address is on it write
    /// into its directory.
    pub host: String,
    /// Where consumers read the partitions it holds.
    pub data_address: String,
    /// Its directory (on `host`).
    pub dir: String,
    /// Where the TaskManagers hand partitions over (its RPC address).
    pub rpc_address: String,
}

/// Where a partition is read from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum PartitionLocation {
    /// Served by the TaskManager that produced it.
    TaskManager(String),
    /// Handed over to, and served by, a shuffle service.
    ShuffleService(String),
}

impl PartitionLocation {
    /// The TaskManager that must outlive the partition (Flink's
    /// `storesLocalResourcesOn`), if any.
    pub fn stores_local_resources_on(&self) -> Option<&str> {
        match self {
            PartitionLocation::TaskManager(t) => Some(t),
            PartitionLocation::ShuffleService(_) => None,
        }
    }
}

/// The host part of a `host:port` address.
pub fn host_of(address: &str) -> &str {
    match address.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => address,
    }
}

/// The registered shuffle services, and the choice of one for a producer.
#[derive(Debug, Default)]
pub struct ShuffleMaster {
    /// Each service with the order it registered in.
    services: BTreeMap<String, (u64, ShuffleServiceSpec)>,
    registrations: u64,
}

impl ShuffleMaster {
    pub fn register_service(&mut self, spec: ShuffleServiceSpec) {
        self.registrations += 1;
        self.services
            .insert(spec.id.clone(), (self.registrations, spec));
    }

    /// Forgets a service; its partitions are lost.
    pub fn unregister_service(&mut self, id: &str) -> bool {
        self.services.remove(id).is_some()
    }

    pub fn service(&self, id: &str) -> Option<&ShuffleServiceSpec> {
        self.services.get(id).map(|(_, s)| s)
    }

    pub fn services(&self) -> impl Iterator<Item = &ShuffleServiceSpec> {
        self.services.values().map(|(_, s)| s)
    }

    /// Where the blocking partitions of a producer on `task_manager` (whose
    /// data address is `producer_address`) go (Flink's
    /// `registerPartitionWithProducer`).
    pub fn register_partition_with_producer(
        &self,
        kind: ShuffleServiceType,
        task_manager: &str,
        producer_address: &str,
    ) -> Result<PartitionLocation> {
        match kind {
            ShuffleServiceType::Internal => Ok(PartitionLocation::TaskManager(task_manager.into())),
            ShuffleServiceType::External => {
                let host = host_of(producer_address);
                // The newest on the host: a restarted service registers
                // again before its predecessor is declared lost.
                self.services
                    .values()
                    .filter(|(_, s)| s.host == host)
                    .max_by_key(|(order, _)| *order)
                    .map(|(_, s)| PartitionLocation::ShuffleService(s.id.clone()))
                    .ok_or_else(|| {
                        FluviaError::Execution(format!(
                            "{} is external but no shuffle service runs on host {host} \
                             (of TaskManager {task_manager}); start `fluvia shuffle-service` there",
                            ShuffleServiceType::KEY
                        ))
                    })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, host: &str) -> ShuffleServiceSpec {
        ShuffleServiceSpec {
            id: id.into(),
            host: host.into(),
            data_address: format!("{host}:7000"),
            dir: "/shuffle".into(),
            rpc_address: format!("{host}:7001"),
        }
    }

    #[test]
    fn external_partitions_go_to_the_service_on_the_producers_host() {
        let mut m = ShuffleMaster::default();
        m.register_service(spec("ss-a", "10.0.0.1"));
        m.register_service(spec("ss-b", "10.0.0.2"));
        let l = m
            .register_partition_with_producer(ShuffleServiceType::External, "tm-1", "10.0.0.2:6121")
            .unwrap();
        assert_eq!(l, PartitionLocation::ShuffleService("ss-b".into()));
        assert_eq!(l.stores_local_resources_on(), None);
        let err = m
            .register_partition_with_producer(ShuffleServiceType::External, "tm-3", "10.0.0.3:6121")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no shuffle service runs on host 10.0.0.3"),
            "{err}"
        );
        let l = m
            .register_partition_with_producer(ShuffleServiceType::Internal, "tm-3", "10.0.0.3:6121")
            .unwrap();
        assert_eq!(l.stores_local_resources_on(), Some("tm-3"));
        // A service restarted on a host is preferred to the one before it.
        m.register_service(spec("ss-b2", "10.0.0.2"));
        let l = m
            .register_partition_with_producer(ShuffleServiceType::External, "tm-1", "10.0.0.2:6121")
            .unwrap();
        assert_eq!(l, PartitionLocation::ShuffleService("ss-b2".into()));
    }

    #[test]
    fn the_type_parses_as_flink_users_write_it() {
        assert_eq!(
            ShuffleServiceType::parse("External").unwrap(),
            ShuffleServiceType::External
        );
        assert!(ShuffleServiceType::parse("remote").is_err());
        assert_eq!(host_of("[::1]:80"), "::1");
        assert_eq!(host_of("127.0.0.1:80"), "127.0.0.1");
    }
}
