//! The heap keyed state backend (Flink's `HeapKeyedStateBackend`, state
//! backend `hashmap`) of one keyed operator subtask.
//!
//! The operator sets the current key for each record
//! ([`KeyedStateBackend::set_current_key`]) and reads and writes state
//! through typed handles obtained by registering descriptors
//! ([`ValueState`], [`ListState`], [`MapState`], [`ReducingState`],
//! [`AggregatingState`]); every access is scoped to the current key.
//!
//! # Storage and snapshots
//!
//! Every state keeps one hash map per key group of the subtask's range,
//! each behind an `Arc`. [`KeyedStateBackend::snapshot`] is the synchronous
//! phase of a checkpoint: it clones those `Arc`s (O(key groups × states),
//! no entry copied) and returns a [`KeyedSnapshot`] that is `Send`. A write
//! after it goes through `Arc::make_mut`, which copies a key group's map
//! only the first time that group is written while the snapshot holds it
//! (copy-on-write at key-group granularity). [`KeyedSnapshot::encode`] is
//! the asynchronous phase: it runs on any thread and yields each key
//! group's bytes, so the snapshot is cut by key group for free.
//!
//! # Restore
//!
//! [`KeyedStateBackend::restore`] keeps each state's entries as raw bytes
//! until the operator registers that state with its types (Flink restores
//! lazily too); registration decodes them. Restored states that are never
//! registered are carried into the next snapshot unchanged.
//!
//! # Cost per record
//!
//! `set_current_key` computes the key group once (Flink's murmur hash of
//! the key's hash, the same the keyed exchange routed by). A state access
//! then costs a vector index, a `TypeId` comparison and one hash lookup
//! (a second one only to insert a key seen for the first time) — what the
//! runtime's plain `KeyedState` map costs, plus the key-group computation.
//! Reads never copy a key group; only writes do, once per snapshot.
//!
//! This module does not know operators, timers, files or the network.

mod state;
mod table;
mod ttl;

pub use state::{
    AggregateFunction, AggregatingState, AggregatingStateDescriptor, ListState,
    ListStateDescriptor, MapState, MapStateDescriptor, ReducingState, ReducingStateDescriptor,
    ValueState, ValueStateDescriptor,
};
pub use ttl::{StateTtlConfig, StateTtlConfigBuilder, StateVisibility, UpdateType};

use crate::codec::{Reader, patch_u32, patch_u64, put_bytes32, put_u8, put_u32, put_u64};
use crate::error::{Result, StateError};
use fluvia_core::keygroup::key_group_for_hash;
use rustc_hash::FxHashMap;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::any::TypeId;
use std::collections::BTreeMap;
use std::hash::Hash;
use std::sync::Arc;
use table::{ErasedSnapshot, ErasedTable, Stored, Table};

/// What a state value must be: a record (`Data` in the runtime) that is
/// also `Sync`, because a snapshot shares it with the thread that encodes.
pub trait StateData: Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Sync + Serialize + DeserializeOwned + 'static> StateData for T {}

/// What a key (or a map state's user key) must be.
pub trait StateKey: StateData + Eq + Hash {}
impl<T: StateData + Eq + Hash> StateKey for T {}

/// The kind of a registered state; its tag is written into snapshots so a
/// restored state registered as another kind is an error, not garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateKind {
    Value,
    List,
    Map,
    Reducing,
    Aggregating,
}

impl StateKind {
    fn tag(self) -> u8 {
        match self {
            StateKind::Value => 0,
            StateKind::List => 1,
            StateKind::Map => 2,
            StateKind::Reducing => 3,
            StateKind::Aggregating => 4,
        }
    }

    fn from_tag(tag: u8) -> Option<Self> {
        Some(match tag {
            0 => StateKind::Value,
            1 => StateKind::List,
            2 => StateKind::Map,
            3 => StateKind::Reducing,
            4 => StateKind::Aggregating,
            _ => return None,
        })
    }
}

struct Registered<K> {
    name: String,
    kind: StateKind,
    type_id: TypeId,
    type_name: String,
    ttl: Option<StateTtlConfig>,
    table: Box<dyn ErasedTable<K>>,
}

impl<K> Registered<K> {
    fn describe(&self) -> String {
        describe(self.kind, &self.type_name, self.ttl.as_ref())
    }
}

fn describe(kind: StateKind, type_name: &str, ttl: Option<&StateTtlConfig>) -> String {
    match ttl {
        None => format!("{kind:?} state of {type_name}"),
        Some(t) => format!("{kind:?} state of {type_name} with {t:?}"),
    }
}

/// Raw restored entries of one state: (key group, bincode entries).
type Chunks = Vec<(usize, Arc<[u8]>)>;

/// Restored entries of a state not registered yet.
struct Pending {
    kind: StateKind,
    chunks: Chunks,
}

/// The keyed state of one keyed operator subtask: the key groups
/// `first..=last` of `max_parallelism`.
pub struct KeyedStateBackend<K> {
    first: usize,
    last: usize,
    max_parallelism: usize,
    /// The current key and its key group minus `first`.
    current: Option<(K, usize)>,
    now: u64,
    states: Vec<Registered<K>>,
    by_name: FxHashMap<String, usize>,
    pending: BTreeMap<String, Pending>,
}

/// Borrowed access to the current key's entry of one state.
pub(crate) struct ReadCtx<'a, K, S> {
    pub(crate) map: &'a FxHashMap<K, S>,
    pub(crate) key: &'a K,
    pub(crate) ttl: Option<&'a StateTtlConfig>,
    pub(crate) now: u64,
}

/// Mutable access; obtaining it has already copied the key group if a
/// snapshot still shares it.
pub(crate) struct WriteCtx<'a, K, S> {
    pub(crate) map: &'a mut FxHashMap<K, S>,
    pub(crate) key: &'a K,
    pub(crate) ttl: Option<&'a StateTtlConfig>,
    pub(crate) now: u64,
}

impl<K: StateKey> KeyedStateBackend<K> {
    /// A backend owning the inclusive key-group range `key_group_range` of
    /// `max_parallelism` key groups.
    pub fn new(key_group_range: (usize, usize), max_parallelism: usize) -> Result<Self> {
        let (first, last) = key_group_range;
        if first > last || last >= max_parallelism {
            return Err(StateError::KeyGroupOutOfRange {
                key_group: last,
                first,
                last: max_parallelism.saturating_sub(1),
            });
        }
        Ok(KeyedStateBackend {
            first,
            last,
            max_parallelism,
            current: None,
            now: 0,
            states: Vec::new(),
            by_name: FxHashMap::default(),
            pending: BTreeMap::new(),
        })
    }

    pub fn key_group_range(&self) -> (usize, usize) {
        (self.first, self.last)
    }

    pub fn max_parallelism(&self) -> usize {
        self.max_parallelism
    }

    /// Sets the key every state access is scoped to. `key_hash` is the hash
    /// the keyed exchange routed the record by (`KeyHash::key_hash`); a key
    /// whose group this subtask does not own is an error.
    #[inline]
    pub fn set_current_key(&mut self, key: K, key_hash: i32) -> Result<()> {
        let group = key_group_for_hash(key_hash, self.max_parallelism);
        if group < self.first || group > self.last {
            return Err(StateError::KeyGroupOutOfRange {
                key_group: group,
                first: self.first,
                last: self.last,
            });
        }
        self.current = Some((key, group - self.first));
        Ok(())
    }

    pub fn current_key(&self) -> Option<&K> {
        self.current.as_ref().map(|(k, _)| k)
    }

    /// The key group of the current key.
    pub fn current_key_group(&self) -> Option<usize> {
        self.current.as_ref().map(|(_, g)| self.first + g)
    }

    /// Sets the processing time (milliseconds) TTL is measured against.
    pub fn set_current_time(&mut self, ms: u64) {
        self.now = ms;
    }

    pub fn current_time(&self) -> u64 {
        self.now
    }

    /// The names of registered states and of restored states not
    /// registered yet.
    pub fn state_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .states
            .iter()
            .map(|r| r.name.as_str())
            .chain(self.pending.keys().map(String::as_str))
            .collect();
        names.sort_unstable();
        names
    }

    /// Registers (or finds) the state `name` stored as `S`.
    pub(crate) fn register<S: Stored>(
        &mut self,
        name: &str,
        kind: StateKind,
        type_name: String,
        ttl: Option<&StateTtlConfig>,
    ) -> Result<usize> {
        if let Some(&index) = self.by_name.get(name) {
            let r = &self.states[index];
            if r.kind != kind || r.type_id != TypeId::of::<S>() || r.ttl.as_ref() != ttl {
                return Err(StateError::StateMismatch {
                    state: name.to_string(),
                    existing: r.describe(),
                    requested: describe(kind, &type_name, ttl),
                });
            }
            return Ok(index);
        }
        let mut table: Table<K, S> = Table::new(self.last - self.first + 1, ttl.cloned());
        if let Some(p) = self.pending.get(name) {
            if p.kind != kind {
                return Err(StateError::StateMismatch {
                    state: name.to_string(),
                    existing: format!("{:?} state (restored)", p.kind),
                    requested: describe(kind, &type_name, ttl),
                });
            }
            for (group, bytes) in &p.chunks {
                table
                    .restore_group(group - self.first, bytes)
                    .map_err(|reason| StateError::Serialization {
                        state: name.to_string(),
                        key_group: *group,
                        reason,
                    })?;
            }
            self.pending.remove(name);
        }
        let index = self.states.len();
        self.states.push(Registered {
            name: name.to_string(),
            kind,
            type_id: TypeId::of::<S>(),
            type_name,
            ttl: ttl.cloned(),
            table: Box::new(table),
        });
        self.by_name.insert(name.to_string(), index);
        Ok(index)
    }

    fn no_state(index: usize) -> StateError {
        StateError::Internal {
            state: format!("#{index}"),
            reason: "handle of another backend: no state at this index".into(),
        }
    }

    fn type_mismatch<S>(name: &str) -> StateError {
        StateError::Internal {
            state: name.to_string(),
            reason: format!(
                "handle expects storage {}, the state holds another type",
                std::any::type_name::<S>()
            ),
        }
    }

    #[inline]
    pub(crate) fn read<S: Stored>(&self, index: usize) -> Result<ReadCtx<'_, K, S>> {
        let r = self
            .states
            .get(index)
            .ok_or_else(|| Self::no_state(index))?;
        let Some((key, g)) = &self.current else {
            return Err(StateError::NoCurrentKey {
                state: r.name.clone(),
            });
        };
        let table = r
            .table
            .as_any()
            .downcast_ref::<Table<K, S>>()
            .ok_or_else(|| Self::type_mismatch::<S>(&r.name))?;
        Ok(ReadCtx {
            map: &table.groups[*g],
            key,
            ttl: table.ttl.as_ref(),
            now: self.now,
        })
    }

    #[inline]
    pub(crate) fn write<S: Stored>(&mut self, index: usize) -> Result<WriteCtx<'_, K, S>> {
        let Registered { name, table, .. } = self
            .states
            .get_mut(index)
            .ok_or_else(|| Self::no_state(index))?;
        let Some((key, g)) = &self.current else {
            return Err(StateError::NoCurrentKey {
                state: name.clone(),
            });
        };
        let table = table
            .as_any_mut()
            .downcast_mut::<Table<K, S>>()
            .ok_or_else(|| Self::type_mismatch::<S>(name))?;
        Ok(WriteCtx {
            // Copies this key group's map only if a snapshot still shares it.
            map: Arc::make_mut(&mut table.groups[*g]),
            key,
            ttl: table.ttl.as_ref(),
            now: self.now,
        })
    }

    /// The synchronous phase of a checkpoint: shares every state's key
    /// groups with the returned snapshot. Later writes copy a key group the
    /// first time they touch it, so the snapshot never changes.
    pub fn snapshot(&mut self) -> KeyedSnapshot {
        KeyedSnapshot {
            first: self.first,
            last: self.last,
            now: self.now,
            states: self
                .states
                .iter()
                .map(|r| (r.name.clone(), r.kind, r.table.snapshot()))
                .collect(),
            pending: self
                .pending
                .iter()
                .map(|(name, p)| (name.clone(), p.kind, p.chunks.clone()))
                .collect(),
        }
    }

    /// Restores key groups as [`KeyedSnapshot::encode`] wrote them. Entries
    /// of states not registered yet are kept raw until they are registered;
    /// a key group outside this backend's range is an error.
    pub fn restore<'a>(
        &mut self,
        groups: impl IntoIterator<Item = (usize, &'a [u8])>,
    ) -> Result<()> {
        for (group, bytes) in groups {
            if group < self.first || group > self.last {
                return Err(StateError::KeyGroupOutOfRange {
                    key_group: group,
                    first: self.first,
                    last: self.last,
                });
            }
            let source = format!("keyed state of key group {group}");
            let mut r = Reader::new(bytes, &source);
            let count = r.u32("state count")?;
            for _ in 0..count {
                let name = r.str32("state name")?;
                let tag = r.u8("state kind")?;
                let kind = StateKind::from_tag(tag)
                    .ok_or_else(|| r.corrupt(format!("state '{name}' has unknown kind {tag}")))?;
                let len = r.len64("entries length")?;
                let entries = r.bytes(len, "entries")?;
                if let Some(&index) = self.by_name.get(name) {
                    let reg = &mut self.states[index];
                    if reg.kind != kind {
                        return Err(StateError::StateMismatch {
                            state: name.to_string(),
                            existing: reg.describe(),
                            requested: format!("{kind:?} state (restored)"),
                        });
                    }
                    reg.table
                        .restore_group(group - self.first, entries)
                        .map_err(|reason| StateError::Serialization {
                            state: name.to_string(),
                            key_group: group,
                            reason,
                        })?;
                } else {
                    let p = self.pending.entry(name.to_string()).or_insert(Pending {
                        kind,
                        chunks: Vec::new(),
                    });
                    if p.kind != kind {
                        return Err(r.corrupt(format!(
                            "state '{name}' restored as {:?} and as {kind:?}",
                            p.kind
                        )));
                    }
                    p.chunks.push((group, Arc::from(entries)));
                }
            }
            if r.remaining() != 0 {
                return Err(r.corrupt(format!("{} stray bytes after the states", r.remaining())));
            }
        }
        Ok(())
    }
}

impl<K: std::fmt::Debug> std::fmt::Debug for KeyedStateBackend<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedStateBackend")
            .field("key_groups", &(self.first..=self.last))
            .field("max_parallelism", &self.max_parallelism)
            .field("current_key", &self.current.as_ref().map(|(k, _)| k))
            .field("time", &self.now)
            .field(
                "states",
                &self.states.iter().map(|r| r.describe()).collect::<Vec<_>>(),
            )
            .field("unregistered", &self.pending.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl std::fmt::Debug for KeyedSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedSnapshot")
            .field("key_groups", &(self.first..=self.last))
            .field("time", &self.now)
            .field(
                "states",
                &self.states.iter().map(|(n, _, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The keyed state of a subtask as of [`KeyedStateBackend::snapshot`]. It
/// shares the backend's key groups, never changes, and is `Send`, so it can
/// be encoded on another thread while the operator keeps running.
pub struct KeyedSnapshot {
    first: usize,
    last: usize,
    now: u64,
    states: Vec<(String, StateKind, Box<dyn ErasedSnapshot>)>,
    pending: Vec<(String, StateKind, Chunks)>,
}

impl KeyedSnapshot {
    /// The asynchronous phase: the bytes of every non-empty key group.
    /// Entries expired at the snapshot's time are left out.
    ///
    /// A key group's bytes: state count u32, then per state its name (u32
    /// length + UTF-8), kind u8, entries length u64 and entries (bincode
    /// `Vec<(key, stored value)>`). A state may appear more than once in a
    /// group; restore adds up its entries.
    pub fn encode(self) -> Result<BTreeMap<usize, Vec<u8>>> {
        type Raw<'a> = (&'a str, StateKind, &'a [u8]);
        let mut pending_by_group: BTreeMap<usize, Vec<Raw<'_>>> = BTreeMap::new();
        for (name, kind, chunks) in &self.pending {
            for (group, bytes) in chunks {
                pending_by_group
                    .entry(*group)
                    .or_default()
                    .push((name, *kind, bytes));
            }
        }
        let mut out = BTreeMap::new();
        for group in self.first..=self.last {
            let index = group - self.first;
            let mut blob = Vec::new();
            put_u32(&mut blob, 0);
            let mut count = 0u32;
            for (name, kind, table) in &self.states {
                let record = blob.len();
                put_bytes32(&mut blob, name.as_bytes(), name)?;
                put_u8(&mut blob, kind.tag());
                let len_at = blob.len();
                put_u64(&mut blob, 0);
                let n = table
                    .encode_group(index, self.now, &mut blob)
                    .map_err(|reason| StateError::Serialization {
                        state: name.clone(),
                        key_group: group,
                        reason,
                    })?;
                if n == 0 {
                    blob.truncate(record);
                } else {
                    let len = (blob.len() - len_at - 8) as u64;
                    patch_u64(&mut blob, len_at, len);
                    count += 1;
                }
            }
            for (name, kind, bytes) in pending_by_group.remove(&group).unwrap_or_default() {
                put_bytes32(&mut blob, name.as_bytes(), name)?;
                put_u8(&mut blob, kind.tag());
                put_u64(&mut blob, bytes.len() as u64);
                blob.extend_from_slice(bytes);
                count += 1;
            }
            if count > 0 {
                patch_u32(&mut blob, 0, count);
                out.insert(group, blob);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::ttl::Ttl;
    use super::*;

    /// The strong counts of state 0's key-group maps.
    fn counts(b: &KeyedStateBackend<i32>) -> Vec<usize> {
        let table = b.states[0]
            .table
            .as_any()
            .downcast_ref::<Table<i32, Ttl<u64>>>()
            .unwrap();
        table.groups.iter().map(Arc::strong_count).collect()
    }

    #[test]
    fn snapshot_shares_key_groups_and_a_write_copies_only_its_own() {
        let mut b: KeyedStateBackend<i32> = KeyedStateBackend::new((0, 15), 16).unwrap();
        let v = b
            .value_state(&ValueStateDescriptor::<u64>::new("v"))
            .unwrap();
        for k in 0..100 {
            b.set_current_key(k, k).unwrap();
            v.update(&mut b, 1).unwrap();
        }
        assert!(counts(&b).iter().all(|c| *c == 1));
        let snapshot = b.snapshot();
        assert!(counts(&b).iter().all(|c| *c == 2));
        // Reads do not copy.
        b.set_current_key(3, 3).unwrap();
        v.value(&mut b).unwrap();
        assert!(counts(&b).iter().all(|c| *c == 2));
        // A write copies exactly the written key group, once.
        let g = b.current_key_group().unwrap();
        v.update(&mut b, 2).unwrap();
        v.update(&mut b, 3).unwrap();
        for (i, c) in counts(&b).into_iter().enumerate() {
            assert_eq!(c, if i == g { 1 } else { 2 }, "key group {i}");
        }
        drop(snapshot);
        assert!(counts(&b).iter().all(|c| *c == 1));
    }
}
