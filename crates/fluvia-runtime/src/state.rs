//! Operator state as the lifecycle sees it: what an operator restores from
//! ([`StateInitializationContext`]), what it writes at a checkpoint
//! ([`StateSnapshotContext`]), and [`KeyedState`], per-key values that know
//! their key groups so a snapshot can be cut by key group and handed to
//! another parallelism on restore (Flink's `KeyGroupRange`).
//!
//! This layer holds bytes and key groups; it knows no checkpoint storage
//! and no coordinator (the checkpoint issue adds both behind it).

use fluvia_core::keygroup::key_group_for_hash;
pub use fluvia_state::snapshot::{OperatorListState, OperatorStateMode, OperatorStateSnapshot};
use std::collections::BTreeMap;
use std::hash::Hash;

/// What `initialize_state` is given.
#[derive(Debug, Clone)]
pub struct StateInitializationContext {
    key_groups: (usize, usize),
    restored: Option<OperatorStateSnapshot>,
}

impl StateInitializationContext {
    pub fn new(key_groups: (usize, usize), restored: Option<OperatorStateSnapshot>) -> Self {
        StateInitializationContext {
            key_groups,
            restored,
        }
    }

    /// Whether this start restores a snapshot.
    pub fn is_restored(&self) -> bool {
        self.restored.is_some()
    }

    /// The inclusive range of key groups this subtask owns.
    pub fn key_group_range(&self) -> (usize, usize) {
        self.key_groups
    }

    /// This subtask's share of the restored list state `name` (all of it
    /// for union state).
    pub fn operator_state(&self, name: &str) -> &[Vec<u8>] {
        self.restored
            .as_ref()
            .and_then(|s| s.operator_state.get(name))
            .map_or(&[], |l| l.elements.as_slice())
    }

    /// The restored keyed state of the key groups this subtask owns.
    pub fn keyed_state(&self) -> impl Iterator<Item = (usize, &[u8])> {
        let (first, last) = self.key_groups;
        self.restored
            .iter()
            .flat_map(move |s| s.keyed_state.range(first..=last))
            .map(|(g, b)| (*g, b.as_slice()))
    }
}

/// Keyed state frozen at the barrier, encoded later off the task thread.
pub type DeferredKeyedState =
    Box<dyn FnOnce() -> fluvia_state::Result<BTreeMap<usize, Vec<u8>>> + Send>;

/// What `snapshot_state` writes into.
#[derive(Default)]
pub struct StateSnapshotContext {
    pub checkpoint_id: u64,
    pub snapshot: OperatorStateSnapshot,
    pub(crate) deferred_keyed: Option<DeferredKeyedState>,
}

debug_fields!(StateSnapshotContext, |s| {
    checkpoint_id: s.checkpoint_id,
    snapshot: s.snapshot,
    deferred_keyed: s.deferred_keyed.is_some(),
});

impl StateSnapshotContext {
    /// Writes the keyed state of a backend: `snapshot` is frozen now (the
    /// synchronous part costs only its copy-on-write bookkeeping) and
    /// encoded on the task's checkpoint thread (Flink's asynchronous part).
    pub fn keyed_state(&mut self, snapshot: fluvia_state::KeyedSnapshot) {
        self.deferred_keyed = Some(Box::new(move || snapshot.encode()));
    }

    /// Writes list state `name`: on restore at another parallelism its
    /// elements are split among the subtasks (Flink's `getListState`).
    pub fn list_state(&mut self, name: &str, elements: Vec<Vec<u8>>) {
        self.operator_list(name, OperatorStateMode::Split, elements);
    }

    /// Writes union list state `name`: on restore every subtask gets every
    /// subtask's elements (Flink's `getUnionListState`).
    pub fn union_list_state(&mut self, name: &str, elements: Vec<Vec<u8>>) {
        self.operator_list(name, OperatorStateMode::Union, elements);
    }

    fn operator_list(&mut self, name: &str, mode: OperatorStateMode, elements: Vec<Vec<u8>>) {
        self.snapshot
            .operator_state
            .insert(name.to_string(), OperatorListState { mode, elements });
    }
}

/// Per-key values of a keyed operator, with the key group of every key
/// computable from the same hash the keyed exchange routes by. Lookups cost
/// what a hash map's cost; key groups are computed only when a snapshot is
/// cut.
#[derive(Debug, Clone)]
pub struct KeyedState<K, V> {
    map: rustc_hash::FxHashMap<K, V>,
    max_parallelism: usize,
}

impl<K: Eq + Hash, V> KeyedState<K, V> {
    pub fn new(max_parallelism: usize) -> Self {
        KeyedState {
            map: Default::default(),
            max_parallelism: max_parallelism.max(1),
        }
    }

    #[inline]
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.map.get_mut(key)
    }

    #[inline]
    pub fn entry(&mut self, key: K) -> std::collections::hash_map::Entry<'_, K, V> {
        self.map.entry(key)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter()
    }

    pub fn drain(&mut self) -> impl Iterator<Item = (K, V)> + '_ {
        self.map.drain()
    }

    /// The entries grouped by key group, given the key's hash as the keyed
    /// exchange computes it (so a key's group here is the group its records
    /// were routed by).
    pub fn by_key_group(&self, key_hash: impl Fn(&K) -> i32) -> BTreeMap<usize, Vec<(&K, &V)>> {
        let mut groups: BTreeMap<usize, Vec<(&K, &V)>> = BTreeMap::new();
        for (k, v) in &self.map {
            let g = key_group_for_hash(key_hash(k), self.max_parallelism);
            groups.entry(g).or_default().push((k, v));
        }
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_state_cuts_by_the_key_group_the_exchange_routes_by() {
        let mut s: KeyedState<i32, u64> = KeyedState::new(128);
        for k in 0..1000 {
            *s.entry(k).or_insert(0) += 1;
        }
        let hash = |k: &i32| *k;
        let groups = s.by_key_group(hash);
        assert_eq!(groups.values().map(Vec::len).sum::<usize>(), 1000);
        for (g, entries) in &groups {
            assert!(*g < 128);
            for (k, _) in entries {
                assert_eq!(key_group_for_hash(hash(k), 128), *g);
            }
        }
        let ctx = StateInitializationContext::new(
            (0, 63),
            Some(OperatorStateSnapshot {
                operator_state: BTreeMap::from([(
                    "offsets".to_string(),
                    OperatorListState {
                        mode: OperatorStateMode::Split,
                        elements: vec![vec![1]],
                    },
                )]),
                keyed_state: BTreeMap::from([(3, vec![3]), (64, vec![64])]),
            }),
        );
        assert_eq!(
            ctx.keyed_state().map(|(g, _)| g).collect::<Vec<_>>(),
            vec![3]
        );
        assert_eq!(ctx.operator_state("offsets"), &[vec![1u8]][..]);
    }
}
