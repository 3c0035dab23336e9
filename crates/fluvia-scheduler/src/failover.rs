//! Failover of one job: whether a failure restarts the failed subtasks or
//! fails the job (Flink's fixed-delay restart strategy), the restart that
//! waits for its delay (failures before it fires join it), and the probes
//! of every TaskManager sent before it fires, so a dead one is found at once
//! rather than after the heartbeat timeout (Flink's
//! `ExecutionFailureHandler` with the restart backoff of `DefaultScheduler`).
//!
//! It keeps plain data: which subtasks restart, when, and which probes are
//! unanswered. The scheduler cancels what runs, creates the new attempts and
//! sends the probes.

use std::collections::BTreeSet;
use std::time::Duration;

/// The restart strategy (`restart-strategy.fixed-delay.*`) and how long a
/// restart waits for probe answers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RestartPolicy {
    pub attempts: usize,
    pub delay: Duration,
    pub probe_timeout: Duration,
}

/// What a failure leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RestartDecision {
    /// A restart is pending already: the failed subtasks join it.
    Join,
    /// A new restart after the policy's delay; probe these TaskManagers.
    Start { probe: Vec<String> },
    /// No restart left: the job fails.
    Exhausted,
}

#[derive(Debug, Clone)]
struct PendingRestart {
    at: Duration,
    subtasks: BTreeSet<(usize, usize)>,
}

/// The failover state of one job.
#[derive(Debug, Clone, Default)]
pub(crate) struct Failover {
    pending: Option<PendingRestart>,
    /// TaskManagers probed for the pending restart that have not answered.
    probes: BTreeSet<String>,
    probe_deadline: Duration,
}

impl Failover {
    /// A failure at `now`: join the pending restart, start one (counting it
    /// in `restarts`), or give up. `alive` are the registered TaskManagers.
    pub(crate) fn on_failure(
        &mut self,
        restarts: &mut usize,
        policy: &RestartPolicy,
        now: Duration,
        alive: &[String],
    ) -> RestartDecision {
        if self.pending.is_some() {
            return RestartDecision::Join;
        }
        if *restarts >= policy.attempts {
            return RestartDecision::Exhausted;
        }
        *restarts += 1;
        self.pending = Some(PendingRestart {
            at: now + policy.delay,
            subtasks: BTreeSet::new(),
        });
        self.probes = alive.iter().cloned().collect();
        self.probe_deadline = now + policy.probe_timeout;
        RestartDecision::Start {
            probe: alive.to_vec(),
        }
    }

    /// Adds subtasks to the pending restart (if any).
    pub(crate) fn restart_also(&mut self, subtasks: impl IntoIterator<Item = (usize, usize)>) {
        if let Some(p) = &mut self.pending {
            p.subtasks.extend(subtasks);
        }
    }

    pub(crate) fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The pending restart fires: once its delay is over, every probe is
    /// answered and none of its subtasks is still being cancelled. Returns
    /// the subtasks to run again.
    pub(crate) fn take_due(
        &mut self,
        now: Duration,
        canceling: impl Fn(usize, usize) -> bool,
    ) -> Option<BTreeSet<(usize, usize)>> {
        let p = self.pending.as_ref()?;
        let cancelled_all = p.subtasks.iter().all(|&(v, i)| !canceling(v, i));
        if now >= p.at && self.probes.is_empty() && cancelled_all {
            self.pending.take().map(|p| p.subtasks)
        } else {
            None
        }
    }

    /// A probed TaskManager answered (or is gone): the restart no longer
    /// waits for it.
    pub(crate) fn probe_done(&mut self, tm: &str) {
        self.probes.remove(tm);
    }

    /// Unanswered probes past their deadline: the heartbeat timeout will
    /// tell.
    pub(crate) fn expire_probes(&mut self, now: Duration) {
        if !self.probes.is_empty() && now >= self.probe_deadline {
            self.probes.clear();
        }
    }

    /// The job ended: nothing restarts.
    pub(crate) fn clear(&mut self) {
        self.pending = None;
        self.probes.clear();
    }

    /// When the scheduler next needs a tick for this job's failover. Once
    /// its delay is over, a restart waits for probe answers (their
    /// deadline) or for cancelled attempts to stop (an event); a tick then
    /// would change nothing.
    pub(crate) fn deadlines(&self, now: Duration) -> impl Iterator<Item = Duration> {
        let delay = self.pending.as_ref().map(|p| p.at).filter(|&at| at > now);
        let probes =
            (self.pending.is_some() && !self.probes.is_empty()).then_some(self.probe_deadline);
        delay.into_iter().chain(probes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: RestartPolicy = RestartPolicy {
        attempts: 1,
        delay: Duration::from_secs(1),
        probe_timeout: Duration::from_millis(500),
    };

    #[test]
    fn a_restart_waits_for_its_delay_probes_and_cancellations() {
        let mut f = Failover::default();
        let mut restarts = 0;
        let tms = ["a".to_string(), "b".to_string()];
        let d = f.on_failure(&mut restarts, &POLICY, Duration::ZERO, &tms);
        assert_eq!(
            d,
            RestartDecision::Start {
                probe: tms.to_vec()
            }
        );
        f.restart_also([(0, 1)]);
        let d = f.on_failure(&mut restarts, &POLICY, Duration::from_millis(10), &tms);
        assert_eq!(d, RestartDecision::Join);
        f.restart_also([(1, 0)]);
        let at = Duration::from_secs(1);
        assert_eq!(f.take_due(at, |_, _| false), None, "probes unanswered");
        f.probe_done("a");
        f.expire_probes(Duration::from_millis(500));
        assert_eq!(f.take_due(at, |v, _| v == 1), None, "(1, 0) still cancels");
        let due = f.take_due(at, |_, _| false).expect("due");
        assert_eq!(due, BTreeSet::from([(0, 1), (1, 0)]));
        assert!(!f.is_pending());
        assert_eq!(restarts, 1);
        let d = f.on_failure(&mut restarts, &POLICY, at, &tms);
        assert_eq!(d, RestartDecision::Exhausted);
    }
}
