//! The slot pool: the TaskManagers the scheduler may place attempts on,
//! their free slots, and the blocklist of speculative execution (Flink's
//! `SlotPool` with its `BlocklistHandler`). It chooses shared slots for a
//! region's attempts and takes them back; it knows nothing of deployments,
//! failover or events.

use crate::deployment::ExecutionAttemptId;
use crate::execution_graph::ExecutionState;
use crate::job::{Job, SharedSlot};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A TaskManager as it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskManagerSpec {
    pub id: String,
    pub slots: usize,
    /// The programs its binary carries; only jobs of that fingerprint go there.
    pub fingerprint: String,
    /// Where its partitions are served.
    pub data_address: String,
}

/// An attempt waiting for a slot: (vertex, subtask, attempt).
pub(crate) type Member = (usize, usize, u32);

/// Where a member goes: an existing shared slot, or a new one on
/// (TaskManager, slot sharing group, subtask index).
pub(crate) type SlotChoice = std::result::Result<u64, (String, String, usize)>;

struct Tm {
    spec: TaskManagerSpec,
    last_heartbeat: Duration,
    used_slots: usize,
}

/// The registered TaskManagers and their slots.
#[derive(Default)]
pub struct SlotPool {
    tms: BTreeMap<String, Tm>,
    /// Registration order: slots are taken from the first with room.
    order: Vec<String>,
    /// TaskManagers that get no new attempts until the given time (the
    /// soft blocklist of speculative execution).
    blocked: BTreeMap<String, Duration>,
}

impl SlotPool {
    /// Registers a TaskManager, or refreshes one it knows (keeping its slot
    /// accounting). Returns whether it was known.
    pub(crate) fn register(&mut self, spec: TaskManagerSpec, now: Duration) -> bool {
        let id = spec.id.clone();
        if let Some(t) = self.tms.get_mut(&id) {
            t.spec = spec;
            t.last_heartbeat = now;
            return true;
        }
        self.tms.insert(
            id.clone(),
            Tm {
                spec,
                last_heartbeat: now,
                used_slots: 0,
            },
        );
        if !self.order.contains(&id) {
            self.order.push(id);
        }
        false
    }

    /// A heartbeat of the TaskManager; false if it is not registered.
    pub(crate) fn heartbeat(&mut self, tm: &str, now: Duration) -> bool {
        match self.tms.get_mut(tm) {
            Some(t) => {
                t.last_heartbeat = now;
                true
            }
            None => false,
        }
    }

    /// Forgets a lost TaskManager; false if it was not registered.
    pub(crate) fn remove(&mut self, tm: &str) -> bool {
        if self.tms.remove(tm).is_none() {
            return false;
        }
        self.order.retain(|t| t != tm);
        true
    }

    pub fn contains(&self, tm: &str) -> bool {
        self.tms.contains_key(tm)
    }

    pub fn spec(&self, tm: &str) -> Option<&TaskManagerSpec> {
        self.tms.get(tm).map(|t| &t.spec)
    }

    /// Registered TaskManagers in registration order, with their used slots.
    pub fn task_managers(&self) -> impl Iterator<Item = (&TaskManagerSpec, usize)> {
        self.order
            .iter()
            .filter_map(|id| self.tms.get(id))
            .map(|t| (&t.spec, t.used_slots))
    }

    /// Ids of the registered TaskManagers, in registration order.
    pub(crate) fn ids(&self) -> &[String] {
        &self.order
    }

    /// TaskManagers silent for `timeout` or longer (by id).
    pub(crate) fn silent(&self, now: Duration, timeout: Duration) -> Vec<String> {
        self.tms
            .values()
            .filter(|t| now.saturating_sub(t.last_heartbeat) >= timeout)
            .map(|t| t.spec.id.clone())
            .collect()
    }

    /// When each TaskManager is lost without a heartbeat, and when each
    /// block ends.
    pub(crate) fn deadlines(&self, timeout: Duration) -> impl Iterator<Item = Duration> + '_ {
        self.tms
            .values()
            .map(move |t| t.last_heartbeat + timeout)
            .chain(self.blocked.values().copied())
    }

    /// TaskManagers blocked by speculative execution, with the time their
    /// block ends (scheduler clock).
    pub fn blocked(&self) -> impl Iterator<Item = (&str, Duration)> {
        self.blocked.iter().map(|(tm, &until)| (tm.as_str(), until))
    }

    /// Whether the TaskManager is blocked for new attempts at `now`.
    pub fn is_blocked(&self, tm: &str, now: Duration) -> bool {
        self.blocked.get(tm).is_some_and(|&until| until > now)
    }

    /// Blocks the TaskManager until `until` (or longer, if it already is).
    pub(crate) fn block(&mut self, tm: String, until: Duration) {
        let e = self.blocked.entry(tm).or_insert(until);
        *e = (*e).max(until);
    }

    /// Drops the blocks that ended by `now`.
    pub(crate) fn unblock_expired(&mut self, now: Duration) {
        self.blocked.retain(|_, until| *until > now);
    }

    /// A slot of the TaskManager goes back (a job gave up a shared slot).
    pub(crate) fn return_slot(&mut self, tm: &str) {
        if let Some(t) = self.tms.get_mut(tm) {
            t.used_slots = t.used_slots.saturating_sub(1);
        }
    }

    /// Gives back every shared slot of an ended job.
    pub(crate) fn release_job(&mut self, job: &mut Job) {
        for slot in std::mem::take(&mut job.slots).into_values() {
            self.return_slot(&slot.task_manager);
        }
    }

    /// A slot for each member: an existing shared slot of the job
    /// (`Ok(slot)`) or a new one on a TaskManager (`Err(tm)`).
    pub(crate) fn find_slots(
        &self,
        job: &Job,
        members: &[Member],
        now: Duration,
    ) -> Option<Vec<SlotChoice>> {
        let mut free: BTreeMap<&str, usize> = self
            .tms
            .values()
            .filter(|t| t.spec.fingerprint == job.fingerprint && !self.is_blocked(&t.spec.id, now))
            .map(|t| {
                (
                    t.spec.id.as_str(),
                    t.spec.slots.saturating_sub(t.used_slots),
                )
            })
            .collect();
        // New shared slots planned in this pass, by (group, index): reuse
        // them for the other vertices of the group.
        let mut planned: Vec<(String, usize, String, BTreeSet<usize>)> = Vec::new();
        let mut taken: BTreeMap<u64, BTreeSet<usize>> = BTreeMap::new();
        let mut out = Vec::new();
        for &(v, i, n) in members {
            let group = job.graph.vertices[v].slot_sharing_group.clone();
            let avoid = job.avoid.get(&(v, i, n));
            let avoided = |tm: &str| avoid.is_some_and(|a| a.contains(tm));
            // 1. An existing shared slot without an attempt of this vertex.
            let existing = job.slots.iter().find(|(k, s)| {
                s.group == group
                    && s.index == i
                    && !avoided(&s.task_manager)
                    && !self.is_blocked(&s.task_manager, now)
                    && self.tms.contains_key(&s.task_manager)
                    && !s.hosted.iter().any(|h| h.0 == v)
                    && !taken.get(k).is_some_and(|t| t.contains(&v))
            });
            if let Some((k, _)) = existing {
                taken.entry(*k).or_default().insert(v);
                out.push(Ok(*k));
                continue;
            }
            // 2. A slot planned in this pass.
            if let Some(p) = planned
                .iter_mut()
                .find(|p| p.0 == group && p.1 == i && !p.3.contains(&v) && !avoided(&p.2))
            {
                p.3.insert(v);
                out.push(Err((p.2.clone(), group, i)));
                continue;
            }
            // 3. A new slot: the preferred TaskManager, else the first in
            // registration order (one that no sibling attempt uses first).
            let preferred = job.preferred.get(&(group.clone(), i));
            let has_free =
                |tm: &str, free: &BTreeMap<&str, usize>| free.get(tm).is_some_and(|&n| n > 0);
            let choice = preferred
                .filter(|p| has_free(p, &free) && !avoided(p))
                .cloned()
                .or_else(|| {
                    self.order
                        .iter()
                        .find(|t| has_free(t, &free) && !avoided(t))
                        .cloned()
                })
                .or_else(|| self.order.iter().find(|t| has_free(t, &free)).cloned())?;
            if let Some(n) = free.get_mut(choice.as_str()) {
                *n -= 1;
            }
            planned.push((group.clone(), i, choice.clone(), BTreeSet::from([v])));
            out.push(Err((choice, group, i)));
        }
        Some(out)
    }

    /// Puts each member in the slot [`Self::find_slots`] chose for it,
    /// taking the new slots from their TaskManagers.
    pub(crate) fn commit_slots(
        &mut self,
        job: &mut Job,
        members: &[Member],
        plan: Vec<SlotChoice>,
        now_ms: u64,
    ) {
        let mut new_slots: BTreeMap<(String, String, usize), Vec<u64>> = BTreeMap::new();
        for (&(v, i, n), choice) in members.iter().zip(plan) {
            let k = match choice {
                Ok(k) => k,
                Err(key) => {
                    // One new slot per (tm, group, index) not yet hosting v.
                    let list = new_slots.entry(key.clone()).or_default();
                    let reuse = list
                        .iter()
                        .copied()
                        .find(|k| !job.slots[k].hosted.iter().any(|h| h.0 == v));
                    match reuse {
                        Some(k) => k,
                        None => {
                            let k = job.next_slot;
                            job.next_slot += 1;
                            job.slots.insert(
                                k,
                                SharedSlot {
                                    task_manager: key.0.clone(),
                                    group: key.1.clone(),
                                    index: key.2,
                                    hosted: BTreeSet::new(),
                                },
                            );
                            if let Some(t) = self.tms.get_mut(&key.0) {
                                t.used_slots += 1;
                            }
                            list.push(k);
                            k
                        }
                    }
                }
            };
            let slot = job.slots.get_mut(&k).expect("slot exists");
            slot.hosted.insert((v, i, n));
            let tm = slot.task_manager.clone();
            let e = &mut job.eg.vertices[v].subtasks[i].attempts[n as usize];
            e.slot = Some(k);
            e.task_manager = Some(tm);
            e.transition(ExecutionState::Scheduled, now_ms);
        }
    }

    /// Takes the attempt out of its shared slot, giving the slot back when
    /// it hosts nothing more.
    pub(crate) fn free_slot_of(&mut self, job: &mut Job, a: ExecutionAttemptId) {
        let e = &mut job.eg.vertices[a.vertex].subtasks[a.subtask].attempts[a.attempt as usize];
        let Some(k) = e.slot.take() else {
            return;
        };
        let Some(slot) = job.slots.get_mut(&k) else {
            return;
        };
        slot.hosted.remove(&(a.vertex, a.subtask, a.attempt));
        if slot.hosted.is_empty() {
            let slot = job.slots.remove(&k).expect("slot exists");
            job.preferred
                .insert((slot.group.clone(), slot.index), slot.task_manager.clone());
            self.return_slot(&slot.task_manager);
        }
    }

    /// Why `job` got no slots in `waited_ms` (`slot.request.timeout`).
    pub(crate) fn shortage_message(&self, job: &Job, waited_ms: u128) -> String {
        let waited = waited_ms;
        let matching: Vec<&Tm> = self
            .tms
            .values()
            .filter(|t| t.spec.fingerprint == job.fingerprint)
            .collect();
        if matching.is_empty() {
            return format!(
                "no registered TaskManager carries program '{}' (fingerprint {}): {} TaskManagers \
                 are registered, all with other programs; waited {waited} ms (slot.request.timeout). \
                 Start a TaskManager from the program's own binary.",
                job.program,
                job.fingerprint,
                self.tms.len()
            );
        }
        let required = job.graph.required_slots();
        let held = job.slots.len();
        let free: usize = matching
            .iter()
            .map(|t| t.spec.slots.saturating_sub(t.used_slots))
            .sum();
        let total: usize = matching.iter().map(|t| t.spec.slots).sum();
        format!(
            "not enough slots: the job needs {required} slots ({} more), the cluster has {free} free \
             of {total} on {} TaskManagers for program '{}', after waiting {waited} ms \
             (slot.request.timeout)",
            required.saturating_sub(held).max(1),
            matching.len(),
            job.program
        )
    }
}
