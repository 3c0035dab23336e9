//! Storage of one registered state: one hash map per key group of the
//! backend's range, each behind an `Arc` so a snapshot shares them and a
//! write after it copies only the key group it touches (`Arc::make_mut`).
//!
//! The table is type-erased behind [`ErasedTable`] so the backend can keep
//! states of different types in one list; typed access downcasts by
//! `TypeId`.

use super::ttl::{StateTtlConfig, Ttl};
use super::{StateData, StateKey};
use rustc_hash::FxHashMap;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;

/// The stored form of one key's state: `Ttl<V>` (value, reducing,
/// aggregating), `Vec<Ttl<V>>` (list) or `FxHashMap<UK, Ttl<UV>>` (map).
pub(crate) trait Stored:
    Clone + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The part still alive at `now`, or `None` if nothing is.
    fn unexpired(&self, ttl: &StateTtlConfig, now: u64) -> Option<Cow<'_, Self>>;
}

/// A collection with `live` of its `len` entries alive: nothing, all of it
/// borrowed, or the live entries `kept` copies out.
fn keep_live<C: Clone>(
    all: &C,
    live: usize,
    len: usize,
    kept: impl FnOnce() -> C,
) -> Option<Cow<'_, C>> {
    if live == 0 {
        None
    } else if live == len {
        Some(Cow::Borrowed(all))
    } else {
        Some(Cow::Owned(kept()))
    }
}

impl<T: StateData> Stored for Ttl<T> {
    fn unexpired(&self, ttl: &StateTtlConfig, now: u64) -> Option<Cow<'_, Self>> {
        (!ttl.is_expired(self.ts, now)).then_some(Cow::Borrowed(self))
    }
}

impl<T: StateData> Stored for Vec<Ttl<T>> {
    fn unexpired(&self, ttl: &StateTtlConfig, now: u64) -> Option<Cow<'_, Self>> {
        let live = self.iter().filter(|e| !ttl.is_expired(e.ts, now)).count();
        keep_live(self, live, self.len(), || {
            self.iter()
                .filter(|e| !ttl.is_expired(e.ts, now))
                .cloned()
                .collect()
        })
    }
}

impl<UK: StateKey, UV: StateData> Stored for FxHashMap<UK, Ttl<UV>> {
    fn unexpired(&self, ttl: &StateTtlConfig, now: u64) -> Option<Cow<'_, Self>> {
        let live = self.values().filter(|e| !ttl.is_expired(e.ts, now)).count();
        keep_live(self, live, self.len(), || {
            self.iter()
                .filter(|(_, e)| !ttl.is_expired(e.ts, now))
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect()
        })
    }
}

pub(crate) struct Table<K, S> {
    /// Indexed by key group minus the range's first group.
    pub(crate) groups: Vec<Arc<FxHashMap<K, S>>>,
    pub(crate) ttl: Option<StateTtlConfig>,
}

impl<K, S> Table<K, S> {
    pub(crate) fn new(groups: usize, ttl: Option<StateTtlConfig>) -> Self {
        Table {
            groups: (0..groups)
                .map(|_| Arc::new(FxHashMap::default()))
                .collect(),
            ttl,
        }
    }
}

pub(crate) trait ErasedTable<K>: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Shares every key group's map: O(key groups), no entry is copied.
    fn snapshot(&self) -> Box<dyn ErasedSnapshot>;
    /// Adds the entries of one key group (bincode `Vec<(K, S)>`).
    fn restore_group(&mut self, index: usize, entries: &[u8]) -> Result<(), String>;
}

impl<K: StateKey, S: Stored> ErasedTable<K> for Table<K, S> {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn snapshot(&self) -> Box<dyn ErasedSnapshot> {
        Box::new(TableSnapshot {
            groups: self.groups.iter().map(Arc::clone).collect(),
            ttl: self.ttl.clone(),
        })
    }

    fn restore_group(&mut self, index: usize, entries: &[u8]) -> Result<(), String> {
        let decoded: Vec<(K, S)> = bincode::deserialize(entries).map_err(|e| {
            format!(
                "decoding {} bytes of entries as {}: {e}",
                entries.len(),
                std::any::type_name::<S>()
            )
        })?;
        let map = self
            .groups
            .get_mut(index)
            .ok_or_else(|| format!("key-group index {index} outside the table"))?;
        Arc::make_mut(map).extend(decoded);
        Ok(())
    }
}

/// A table's key groups as of a snapshot, encodable on another thread.
pub(crate) trait ErasedSnapshot: Send {
    /// Appends the live entries of one key group as bincode `Vec<(K, S)>`
    /// and returns how many; appends nothing when none are live.
    fn encode_group(&self, index: usize, now: u64, out: &mut Vec<u8>) -> Result<u64, String>;
}

struct TableSnapshot<K, S> {
    groups: Vec<Arc<FxHashMap<K, S>>>,
    ttl: Option<StateTtlConfig>,
}

impl<K: StateKey, S: Stored> ErasedSnapshot for TableSnapshot<K, S> {
    fn encode_group(&self, index: usize, now: u64, out: &mut Vec<u8>) -> Result<u64, String> {
        let Some(map) = self.groups.get(index) else {
            return Ok(0);
        };
        if map.is_empty() {
            return Ok(0);
        }
        let start = out.len();
        out.extend_from_slice(&0u64.to_le_bytes());
        let mut n = 0u64;
        for (k, s) in map.iter() {
            let s = match &self.ttl {
                None => Cow::Borrowed(s),
                Some(ttl) => match s.unexpired(ttl, now) {
                    Some(s) => s,
                    None => continue,
                },
            };
            bincode::serialize_into(&mut *out, &(k, &*s)).map_err(|e| e.to_string())?;
            n += 1;
        }
        if n == 0 {
            out.truncate(start);
        } else {
            crate::codec::patch_u64(out, start, n);
        }
        Ok(n)
    }
}
