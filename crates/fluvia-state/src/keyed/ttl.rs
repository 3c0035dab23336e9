//! State time-to-live, as Flink's `StateTtlConfig`: how long an entry lives
//! after it was last written (or read), and whether an expired entry that is
//! still stored may be returned. Time is the backend's injected processing
//! time ([`super::KeyedStateBackend::set_current_time`]), never a clock read
//! here, so expiry is deterministic in tests and replays.
//!
//! Expired entries are dropped when they are read and are never written to
//! a snapshot (Flink's cleanup in full snapshot; a heap snapshot is always
//! full).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// When an entry's timestamp is refreshed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpdateType {
    /// On creation and every write (Flink's default).
    OnCreateAndWrite,
    /// Also on every read.
    OnReadAndWrite,
}

/// Whether an expired entry that has not been removed yet is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateVisibility {
    /// Expired entries are never returned (Flink's default).
    NeverReturnExpired,
    /// An expired entry is returned by the read that removes it.
    ReturnExpiredIfNotCleanedUp,
}

/// Time-to-live of a state's entries; attach with a descriptor's
/// `enable_time_to_live`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateTtlConfig {
    ttl: Duration,
    update_type: UpdateType,
    visibility: StateVisibility,
}

impl StateTtlConfig {
    /// A builder with Flink's defaults: update on create and write, never
    /// return expired entries.
    pub fn new_builder(ttl: Duration) -> StateTtlConfigBuilder {
        StateTtlConfigBuilder {
            config: StateTtlConfig {
                ttl,
                update_type: UpdateType::OnCreateAndWrite,
                visibility: StateVisibility::NeverReturnExpired,
            },
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn update_type(&self) -> UpdateType {
        self.update_type
    }

    pub fn visibility(&self) -> StateVisibility {
        self.visibility
    }

    /// Whether an entry last refreshed at `ts` is expired at `now` (both
    /// milliseconds): Flink's `expirationTimestamp <= currentTimestamp`.
    pub(crate) fn is_expired(&self, ts: u64, now: u64) -> bool {
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        ts.saturating_add(ttl_ms) <= now
    }

    pub(crate) fn returns_expired(&self) -> bool {
        self.visibility == StateVisibility::ReturnExpiredIfNotCleanedUp
    }

    pub(crate) fn refreshes_on_read(&self) -> bool {
        self.update_type == UpdateType::OnReadAndWrite
    }
}

/// Builds a [`StateTtlConfig`].
#[derive(Debug, Clone)]
pub struct StateTtlConfigBuilder {
    config: StateTtlConfig,
}

impl StateTtlConfigBuilder {
    pub fn set_update_type(mut self, update_type: UpdateType) -> Self {
        self.config.update_type = update_type;
        self
    }

    pub fn set_state_visibility(mut self, visibility: StateVisibility) -> Self {
        self.config.visibility = visibility;
        self
    }

    /// Expired entries are left out of snapshots. Always the case for this
    /// backend; kept so code reads like Flink's.
    pub fn cleanup_full_snapshot(self) -> Self {
        self
    }

    pub fn build(self) -> StateTtlConfig {
        self.config
    }
}

/// A stored value with the time it was last refreshed. Every entry carries
/// it (8 bytes), TTL or not, so one representation serves both and a state
/// may gain a TTL across a restore.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Ttl<T> {
    pub(crate) value: T,
    pub(crate) ts: u64,
}
