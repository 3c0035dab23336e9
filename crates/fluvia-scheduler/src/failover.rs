//! Failover of one job: whether a failure restarts the failed subtasks or
//! fails the job (Flink's restart strategies: fixed-delay,
//! exponential-delay, failure-rate; [`RestartStrategy`]), the restart that
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

/// A restart strategy (`restart-strategy.type` and its keys), Flink's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RestartStrategy {
    /// No restart: a failure fails the job.
    None,
    /// `attempts` restarts, `delay` apart.
    FixedDelay { attempts: usize, delay: Duration },
    /// The delay starts at `initial` and grows by `multiplier` up to `max`
    /// (with ± `jitter` of it); a failure more than `reset_threshold` after
    /// the previous one starts over at `initial`. Gives up after
    /// `attempts_before_reset` restarts without such a reset.
    ExponentialDelay {
        initial: Duration,
        max: Duration,
        multiplier: f64,
        reset_threshold: Duration,
        jitter: f64,
        attempts_before_reset: usize,
    },
    /// Restarts `delay` after a failure unless more than
    /// `max_failures_per_interval` failures fell within `interval`.
    FailureRate {
        max_failures_per_interval: usize,
        interval: Duration,
        delay: Duration,
    },
}

impl RestartStrategy {
    /// Flink's exponential-delay defaults (the default strategy of a job
    /// with checkpointing since Flink 1.19).
    pub fn exponential_default() -> Self {
        RestartStrategy::ExponentialDelay {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            multiplier: 1.5,
            reset_threshold: Duration::from_secs(3600),
            jitter: 0.1,
            attempts_before_reset: usize::MAX,
        }
    }

    /// The strategy a configuration names (`restart-strategy.type` and its
    /// keys); `None` when it names none.
    pub fn from_configuration(
        config: &fluvia_core::Configuration,
    ) -> fluvia_core::Result<Option<RestartStrategy>> {
        use fluvia_core::config::options as o;
        let kind = config.get(&o::RESTART_STRATEGY)?.to_ascii_lowercase();
        Ok(Some(match kind.as_str() {
            "" => return Ok(None),
            "none" | "off" | "disable" => RestartStrategy::None,
            "fixed-delay" | "fixeddelay" => RestartStrategy::FixedDelay {
                attempts: config.get(&o::RESTART_ATTEMPTS)?,
                delay: config.get(&o::RESTART_DELAY)?,
            },
            "exponential-delay" | "exponentialdelay" => RestartStrategy::ExponentialDelay {
                initial: config.get(&o::RESTART_EXP_INITIAL)?,
                max: config.get(&o::RESTART_EXP_MAX)?,
                multiplier: config.get(&o::RESTART_EXP_MULTIPLIER)?,
                reset_threshold: config.get(&o::RESTART_EXP_RESET)?,
                jitter: config.get(&o::RESTART_EXP_JITTER)?,
                attempts_before_reset: config.get(&o::RESTART_EXP_ATTEMPTS)?,
            },
            "failure-rate" | "failurerate" => RestartStrategy::FailureRate {
                max_failures_per_interval: config.get(&o::RESTART_RATE_MAX_FAILURES)?,
                interval: config.get(&o::RESTART_RATE_INTERVAL)?,
                delay: config.get(&o::RESTART_RATE_DELAY)?,
            },
            other => {
                return Err(fluvia_core::FluviaError::Config(format!(
                    "unknown {} '{other}': expected none, fixed-delay, exponential-delay or \
                     failure-rate",
                    o::RESTART_STRATEGY.key
                )));
            }
        }))
    }

    /// The name Flink's REST API shows.
    pub fn describe(&self) -> String {
        match self {
            RestartStrategy::None => "No restart".to_string(),
            RestartStrategy::FixedDelay { attempts, delay } => format!(
                "Restart with fixed delay ({} ms). #{attempts} restart attempts.",
                delay.as_millis()
            ),
            RestartStrategy::ExponentialDelay {
                initial,
                max,
                multiplier,
                ..
            } => format!(
                "Restart with exponential delay: initial {} ms, maximum {} ms, multiplier {multiplier}",
                initial.as_millis(),
                max.as_millis()
            ),
            RestartStrategy::FailureRate {
                max_failures_per_interval,
                interval,
                delay,
            } => format!(
                "Failure rate restart with maximum of {max_failures_per_interval} failures within \
                 interval {} ms and fixed delay {} ms.",
                interval.as_millis(),
                delay.as_millis()
            ),
        }
    }
}

/// The restart strategy and how long a restart waits for probe answers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RestartPolicy {
    pub strategy: RestartStrategy,
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
    /// Failures that started a restart, for failure-rate.
    failures: std::collections::VecDeque<Duration>,
    /// Exponential-delay: the last delay and when its failure happened.
    backoff: Option<(Duration, Duration)>,
    /// Exponential-delay: restarts since the backoff was last reset.
    since_reset: usize,
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
        let Some(delay) = self.next_delay(&policy.strategy, *restarts, now) else {
            return RestartDecision::Exhausted;
        };
        *restarts += 1;
        self.pending = Some(PendingRestart {
            at: now + delay,
            subtasks: BTreeSet::new(),
        });
        self.probes = alive.iter().cloned().collect();
        self.probe_deadline = now + policy.probe_timeout;
        RestartDecision::Start {
            probe: alive.to_vec(),
        }
    }

    /// The delay before the restart a failure at `now` starts, or `None`
    /// when the strategy allows no more.
    fn next_delay(
        &mut self,
        strategy: &RestartStrategy,
        restarts: usize,
        now: Duration,
    ) -> Option<Duration> {
        match *strategy {
            RestartStrategy::None => None,
            RestartStrategy::FixedDelay { attempts, delay } => {
                (restarts < attempts).then_some(delay)
            }
            RestartStrategy::FailureRate {
                max_failures_per_interval,
                interval,
                delay,
            } => {
                while self
                    .failures
                    .front()
                    .is_some_and(|&t| now.saturating_sub(t) > interval)
                {
                    self.failures.pop_front();
                }
                if self.failures.len() >= max_failures_per_interval.max(1) {
                    return None;
                }
                self.failures.push_back(now);
                Some(delay)
            }
            RestartStrategy::ExponentialDelay {
                initial,
                max,
                multiplier,
                reset_threshold,
                jitter,
                attempts_before_reset,
            } => {
                let base = match self.backoff {
                    Some((last, at)) if now.saturating_sub(at) <= reset_threshold => {
                        last.mul_f64(multiplier.max(1.0)).min(max)
                    }
                    _ => {
                        self.since_reset = 0;
                        initial.min(max)
                    }
                };
                if self.since_reset >= attempts_before_reset {
                    return None;
                }
                self.since_reset += 1;
                self.backoff = Some((base, now));
                // Deterministic jitter (the scheduler has no randomness):
                // spread by the restart count within ± jitter.
                let spread = ((restarts as f64 * 0.618_033_988_75).fract() * 2.0 - 1.0)
                    * jitter.clamp(0.0, 1.0);
                Some(base.mul_f64((1.0 + spread).max(0.0)))
            }
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
        strategy: RestartStrategy::FixedDelay {
            attempts: 1,
            delay: Duration::from_secs(1),
        },
        probe_timeout: Duration::from_millis(500),
    };

    fn delays(strategy: RestartStrategy, failures_at_ms: &[u64]) -> Vec<Option<u64>> {
        let mut f = Failover::default();
        let mut restarts = 0;
        failures_at_ms
            .iter()
            .map(|&ms| {
                let d = f
                    .next_delay(&strategy, restarts, Duration::from_millis(ms))
                    .map(|d| d.as_millis() as u64);
                if d.is_some() {
                    restarts += 1;
                }
                d
            })
            .collect()
    }

    #[test]
    fn exponential_delay_grows_to_its_maximum_and_resets_after_a_quiet_spell() {
        let s = RestartStrategy::ExponentialDelay {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            multiplier: 2.0,
            reset_threshold: Duration::from_secs(10),
            jitter: 0.0,
            attempts_before_reset: 100,
        };
        assert_eq!(
            delays(s, &[0, 1, 2, 3, 4, 5, 60_000]),
            [100, 200, 400, 800, 1000, 1000, 100].map(Some)
        );
        let limited = RestartStrategy::ExponentialDelay {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            multiplier: 2.0,
            reset_threshold: Duration::from_secs(10),
            jitter: 0.0,
            attempts_before_reset: 2,
        };
        assert_eq!(delays(limited, &[0, 1, 2]), [Some(100), Some(200), None]);
    }

    #[test]
    fn jitter_stays_within_its_factor() {
        let s = RestartStrategy::ExponentialDelay {
            initial: Duration::from_millis(1000),
            max: Duration::from_millis(1000),
            multiplier: 1.0,
            reset_threshold: Duration::from_secs(3600),
            jitter: 0.1,
            attempts_before_reset: usize::MAX,
        };
        let d = delays(s, &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(
            d.iter().all(|d| (900..=1100).contains(&d.unwrap_or(0))),
            "{d:?}"
        );
        assert!(d.windows(2).any(|w| w[0] != w[1]), "jitter spreads: {d:?}");
    }

    #[test]
    fn failure_rate_gives_up_when_too_many_failures_fall_in_the_interval() {
        let s = RestartStrategy::FailureRate {
            max_failures_per_interval: 2,
            interval: Duration::from_secs(10),
            delay: Duration::from_millis(50),
        };
        // Two in 10 s restart; a third within the interval fails the job;
        // once the first ones age out, restarts are allowed again.
        assert_eq!(delays(s, &[0, 1000, 2000]), [Some(50), Some(50), None]);
        assert_eq!(
            delays(s, &[0, 1000, 20_000, 21_000]),
            [Some(50), Some(50), Some(50), Some(50)]
        );
    }

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
