//! Channel selection: which subpartition(s) a record goes to, per
//! partitioner kind, as Flink's `StreamPartitioner`s choose.

use crate::partition::ResultPartition;
use fluvia_core::PartitionerKind;
use fluvia_core::keygroup::{key_group_for_hash, operator_index_for_key_group};
use std::sync::Arc;

/// Where one record goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    One(usize),
    All,
}

/// Stateful selector for one output (round-robin position, random state).
#[derive(Debug, Clone)]
pub struct ChannelSelector {
    kind: PartitionerKind,
    num_channels: usize,
    max_parallelism: usize,
    next: usize,
    rng: u64,
    /// Load-aware rebalance/rescale: the partition whose backlogs to compare
    /// and how many candidates to look at per record.
    load_aware: Option<(Arc<ResultPartition>, usize)>,
}

impl ChannelSelector {
    /// `max_parallelism` is the consumer's (it defines the key groups); `seed`
    /// makes rebalance's random start and shuffle reproducible per subtask.
    pub fn new(
        kind: PartitionerKind,
        num_channels: usize,
        max_parallelism: usize,
        seed: u64,
    ) -> Self {
        let mut s = ChannelSelector {
            kind,
            num_channels: num_channels.max(1),
            max_parallelism: max_parallelism.max(1),
            next: 0,
            rng: seed ^ 0x9e37_79b9_7f4a_7c15,
            load_aware: None,
        };
        s.next = match kind {
            // Flink starts rebalance at a random channel so that many
            // producers do not all hit consumer 0 first.
            PartitionerKind::Rebalance => (s.random() % s.num_channels as u64) as usize,
            _ => 0,
        };
        s
    }

    /// Makes rebalance and rescale load-aware (Flink 2.3's adaptive
    /// partitioner, `taskmanager.network.adaptive-partitioner.enabled`): of
    /// the next `max_traverse` channels in round-robin order, the one with
    /// the smallest backlog gets the record, so a slow consumer receives less.
    pub fn load_aware(mut self, partition: Arc<ResultPartition>, max_traverse: usize) -> Self {
        if matches!(
            self.kind,
            PartitionerKind::Rebalance | PartitionerKind::Rescale
        ) && partition.num_subpartitions() == self.num_channels
            && max_traverse > 1
            // A blocking partition's backlog says nothing about a consumer's
            // speed (nobody reads until the producer finished); a sort-merge
            // one has no per-subpartition queues at all.
            && !partition.is_blocking()
        {
            self.load_aware = Some((partition, max_traverse.min(self.num_channels)));
        }
        self
    }

    pub fn kind(&self) -> PartitionerKind {
        self.kind
    }

    /// Whether [`select`](Self::select) needs the record's key hash.
    pub fn needs_key(&self) -> bool {
        self.kind == PartitionerKind::Hash
    }

    fn random(&mut self) -> u64 {
        // splitmix64: tiny, fast and good enough for load spreading.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The target of a record; `key_hash` is only read for `Hash`.
    #[inline]
    pub fn select(&mut self, key_hash: i32) -> Target {
        match self.kind {
            PartitionerKind::Forward | PartitionerKind::Global => Target::One(0),
            PartitionerKind::Broadcast => Target::All,
            PartitionerKind::Rebalance | PartitionerKind::Rescale if self.load_aware.is_some() => {
                let start = self.next;
                let mut best = start;
                if let Some((partition, traverse)) = &self.load_aware {
                    let mut best_backlog = usize::MAX;
                    for k in 0..*traverse {
                        let ch = (start + k) % self.num_channels;
                        let b = partition.subpartition(ch).backlog_hint();
                        if b < best_backlog {
                            best_backlog = b;
                            best = ch;
                        }
                    }
                }
                self.next = (start + 1) % self.num_channels;
                Target::One(best)
            }
            PartitionerKind::Rebalance | PartitionerKind::Rescale => {
                let ch = self.next;
                self.next += 1;
                if self.next == self.num_channels {
                    self.next = 0;
                }
                Target::One(ch)
            }
            PartitionerKind::Shuffle => {
                Target::One((self.random() % self.num_channels as u64) as usize)
            }
            PartitionerKind::Hash => {
                let kg = key_group_for_hash(key_hash, self.max_parallelism);
                Target::One(operator_index_for_key_group(
                    self.max_parallelism,
                    self.num_channels,
                    kg,
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebalance_cycles_through_all_channels() {
        let mut s = ChannelSelector::new(PartitionerKind::Rebalance, 3, 128, 42);
        let picks: Vec<Target> = (0..6).map(|_| s.select(0)).collect();
        let mut counts = [0; 3];
        for p in picks {
            let Target::One(c) = p else { panic!() };
            counts[c] += 1;
        }
        assert_eq!(counts, [2, 2, 2]);
    }

    #[test]
    fn hash_follows_the_key_group_formula() {
        let mut s = ChannelSelector::new(PartitionerKind::Hash, 4, 128, 0);
        for key in 0..1000i32 {
            let kg = key_group_for_hash(key, 128);
            assert_eq!(s.select(key), Target::One(kg * 4 / 128));
        }
    }

    #[test]
    fn global_broadcast_and_shuffle() {
        assert_eq!(
            ChannelSelector::new(PartitionerKind::Global, 4, 128, 0).select(5),
            Target::One(0)
        );
        assert_eq!(
            ChannelSelector::new(PartitionerKind::Broadcast, 4, 128, 0).select(5),
            Target::All
        );
        let mut s = ChannelSelector::new(PartitionerKind::Shuffle, 4, 128, 1);
        let mut seen = [false; 4];
        for _ in 0..200 {
            let Target::One(c) = s.select(0) else {
                panic!()
            };
            seen[c] = true;
        }
        assert_eq!(seen, [true; 4]);
    }
}
