//! Flink-style configuration: string keys with typed options, defaults and
//! descriptions kept together, values given as `key: value` text (files) or
//! `-D key=value` (command line).

use crate::error::{FluviaError, Result};
use crate::kinds::RuntimeMode;
use std::collections::BTreeMap;
use std::time::Duration;

/// A typed option: key, default and a line of documentation.
#[derive(Debug, Clone, Copy)]
pub struct ConfigOption<T: 'static> {
    pub key: &'static str,
    /// Older spellings that are still accepted.
    pub fallback_keys: &'static [&'static str],
    pub default: T,
    pub description: &'static str,
}

/// Declares typed options from one table: a `pub const` [`ConfigOption`]
/// each, plus `all()` (key, default as text, description, in table order, for
/// docs and `fluvia config`) and `check(config)` (reads every option with its
/// type; an error names the first key whose value does not parse).
///
/// An entry is `NAME: Type = "key" | "fallback key"..., default, "description";`.
/// `default => "text"` shows the default as `text` in `all()` instead of the
/// value; a trailing `, unchecked` leaves the option out of `check`, and
/// `, unlisted` leaves it out of both.
#[macro_export]
macro_rules! config_options {
    ($(
        $(#[$attr:meta])*
        $name:ident: $ty:ty = $key:literal $(| $fallback:literal)*,
            $default:expr $(=> $shown:literal)?,
            $description:expr $(, $flag:ident)?;
    )*) => {
        $(
            $(#[$attr])*
            pub const $name: $crate::config::ConfigOption<$ty> = $crate::config::ConfigOption {
                key: $key,
                fallback_keys: &[$($fallback),*],
                default: $default,
                description: $description,
            };
        )*

        /// (key, default as text, description) of every option, for docs and
        /// `fluvia config`.
        pub fn all() -> Vec<(&'static str, String, &'static str)> {
            [$($crate::config_options!(@list $name, [$($shown)?], $($flag)?)),*]
                .into_iter()
                .flatten()
                .collect()
        }

        /// Reads every option of `config` with its type: an error names the
        /// first key whose value does not parse (`SET` checks with it).
        pub fn check(config: &$crate::config::Configuration) -> $crate::Result<()> {
            $($crate::config_options!(@check config, $name, $($flag)?);)*
            Ok(())
        }
    };
    (@list $name:ident, [$($shown:literal)?], unlisted) => {
        None
    };
    (@list $name:ident, [], $(unchecked)?) => {
        Some((
            $name.key,
            $crate::config::ShowDefault::show_default(&$name.default),
            $name.description,
        ))
    };
    (@list $name:ident, [$shown:literal], $(unchecked)?) => {
        Some(($name.key, $shown.to_string(), $name.description))
    };
    (@check $config:ident, $name:ident,) => {
        $config.get(&$name)?;
    };
    (@check $config:ident, $name:ident, $(unchecked)? $(unlisted)?) => {};
}

/// How `all()` of [`config_options!`] shows a default without a text of its own.
pub trait ShowDefault {
    fn show_default(&self) -> String;
}

macro_rules! show_with_to_string {
    ($($t:ty),*) => {
        $(impl ShowDefault for $t {
            fn show_default(&self) -> String {
                self.to_string()
            }
        })*
    };
}
show_with_to_string!(usize, u64, f64, bool, &'static str, RuntimeMode);

impl ShowDefault for Duration {
    fn show_default(&self) -> String {
        format!("{} ms", self.as_millis())
    }
}

/// Every option the engine reads, for documentation and validation.
pub mod options {
    use super::*;

    crate::config_options! {
        /// Flink's `BatchExecutionOptions` (with the deprecated
        /// `jobmanager.adaptive-batch-scheduler.*` spellings).
        AUTO_PARALLELISM_ENABLED: bool = "execution.batch.adaptive.auto-parallelism.enabled" | "jobmanager.adaptive-batch-scheduler.enabled",
            true,
            "Batch jobs: decide at runtime, from the bytes their inputs produced, the parallelism of vertices whose parallelism nobody set, and balance the subpartitions each subtask reads.";
        AUTO_PARALLELISM_MIN: usize = "execution.batch.adaptive.auto-parallelism.min-parallelism" | "jobmanager.adaptive-batch-scheduler.min-parallelism",
            1,
            "Lower bound of the parallelism the adaptive batch scheduler decides.";
        AUTO_PARALLELISM_MAX: usize = "execution.batch.adaptive.auto-parallelism.max-parallelism" | "jobmanager.adaptive-batch-scheduler.max-parallelism",
            128,
            "Upper bound of the parallelism the adaptive batch scheduler decides.";
        AUTO_PARALLELISM_AVG_DATA_VOLUME: u64 = "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task" | "jobmanager.adaptive-batch-scheduler.avg-data-volume-per-task",
            16 * 1024 * 1024 => "16 mb",
            "Bytes each subtask of a vertex whose parallelism is decided adaptively should read (skew or the max parallelism can make it read more).";
        AUTO_PARALLELISM_DEFAULT_SOURCE: usize = "execution.batch.adaptive.auto-parallelism.default-source-parallelism" | "jobmanager.adaptive-batch-scheduler.default-source-parallelism",
            1,
            "Parallelism of sources whose parallelism is not set, under the adaptive batch scheduler.";
        SPECULATIVE_ENABLED: bool = "execution.batch.speculative.enabled",
            false,
            "Batch jobs: run a second attempt of a subtask the slow-task detector finds slow on another TaskManager; the first to finish wins.";
        SPECULATIVE_MAX_CONCURRENT: usize = "execution.batch.speculative.max-concurrent-executions",
            2,
            "Attempts of one subtask that may run at once under speculative execution.";
        SPECULATIVE_BLOCK_DURATION: Duration = "execution.batch.speculative.block-slow-node-duration",
            Duration::from_secs(60) => "1 min",
            "How long a TaskManager running a slow attempt gets no new attempts (0: not blocked).";
        SLOW_TASK_CHECK_INTERVAL: Duration = "slow-task-detector.check-interval",
            Duration::from_secs(1) => "1 s",
            "How often the slow-task detector looks for slow attempts.";
        SLOW_TASK_LOWER_BOUND: Duration = "slow-task-detector.execution-time.baseline-lower-bound",
            Duration::from_secs(60) => "1 min",
            "An attempt running shorter than this is never slow.";
        SLOW_TASK_BASELINE_RATIO: f64 = "slow-task-detector.execution-time.baseline-ratio",
            0.75,
            "Share of a vertex's subtasks that must have finished before its slow ones are looked for; the baseline is the median of that share.";
        SLOW_TASK_BASELINE_MULTIPLIER: f64 = "slow-task-detector.execution-time.baseline-multiplier",
            1.5,
            "An attempt is slow above this many times the baseline execution time per input byte.";
        ADAPTIVE_BROADCAST_JOIN_STRATEGY: &'static str = "table.optimizer.adaptive-broadcast-join.strategy",
            "AUTO",
            "SQL under the adaptive batch scheduler: AUTO broadcasts a join side the planner estimated small, and at runtime one whose real bytes are below table.optimizer.join.broadcast-threshold; RUNTIME_ONLY only the latter; NONE only the planner's.";
        SKEWED_JOIN_STRATEGY: &'static str = "table.optimizer.skewed-join-optimization.strategy",
            "AUTO",
            "SQL under the adaptive batch scheduler: AUTO splits a skewed subpartition of a join side across subtasks where the join type allows it; NONE never.";
        SKEWED_JOIN_FACTOR: f64 = "table.optimizer.skewed-join-optimization.skewed-factor",
            4.0,
            "A join side's subpartition is skewed above this many times the median one (and above the threshold).";
        SKEWED_JOIN_THRESHOLD: u64 = "table.optimizer.skewed-join-optimization.skewed-threshold",
            256 * 1024 * 1024 => "256 mb",
            "A join side's subpartition is skewed only above this many bytes.";
        /// Flink's key; a size with a unit (`10mb`) or bytes.
        BROADCAST_THRESHOLD: u64 = "table.optimizer.join.broadcast-threshold",
            1024 * 1024,
            "SQL: a join side estimated below this many bytes is broadcast to the other side's subtasks instead of hash-partitioning both.";
        /// Flink's key.
        BUFFER_REQUEST_TIMEOUT: u64 = "taskmanager.network.memory.exclusive-buffers-request-timeout-ms",
            30_000,
            "Milliseconds a task being deployed waits for network buffers held by running tasks to be given back before it fails with 'insufficient number of network buffers'.";
        PARALLELISM: usize = "parallelism.default",
            1,
            "Parallelism of operators that do not set their own.";
        /// 0 means "derive from parallelism" as Flink does (1.5 × p, within [128, 32768]).
        MAX_PARALLELISM: usize = "pipeline.max-parallelism",
            0,
            "Number of key groups; 0 derives it from the parallelism.";
        CHAINING_ENABLED: bool = "pipeline.operator-chaining.enabled",
            true,
            "Chain operators into one task where Flink's rules allow.";
        OBJECT_REUSE: bool = "pipeline.object-reuse",
            false,
            "Hand records to chained operators without a defensive copy.";
        RUNTIME_MODE: RuntimeMode = "execution.runtime-mode",
            RuntimeMode::Automatic,
            "STREAMING, BATCH or AUTOMATIC (batch when all sources are bounded).";
        BUFFER_TIMEOUT: Duration = "execution.buffer-timeout" | "execution.buffer-timeout.interval",
            Duration::from_millis(100) => "100 ms",
            "Longest time a partly filled network buffer waits before it is sent.";
        SORT_SHUFFLE_MIN_PARALLELISM: usize = "taskmanager.network.sort-shuffle.min-parallelism",
            1,
            "Blocking partitions with at least this many subpartitions are written \
            sort-merge (one data and one index file); smaller ones one file per \
            subpartition.";
        SORT_SHUFFLE_MIN_BUFFERS: usize = "taskmanager.network.sort-shuffle.min-buffers",
            64,
            "Network buffers of a sort-merge writer's sort area, whatever its \
            number of subpartitions.";
        BLOCKING_SHUFFLE_COMPRESSION: bool = "taskmanager.network.blocking-shuffle.compression.enabled",
            true,
            "LZ4 per buffer in sort-merge shuffle files (kept only where smaller).";
        BATCH_SHUFFLE_READ_MEMORY: u64 = "taskmanager.memory.framework.off-heap.batch-shuffle.size",
            64 * 1024 * 1024 => "64 mb",
            "Read buffers shared by all readers of a TaskManager's sort-merge \
            partitions.";
        SEGMENT_SIZE: u64 = "taskmanager.memory.segment-size",
            32 * 1024 => "32 kb",
            "Size of one network buffer.";
        NETWORK_MEMORY: u64 = "taskmanager.memory.network.size" | "taskmanager.memory.network.max",
            64 * 1024 * 1024 => "64 mb",
            "Total memory of the network buffer pool of a TaskManager.";
        BUFFERS_PER_CHANNEL: usize = "taskmanager.network.memory.buffers-per-channel",
            2,
            "Buffers each subpartition / input channel may hold (exclusive buffers).";
        FLOATING_BUFFERS: usize = "taskmanager.network.memory.floating-buffers-per-gate",
            8,
            "Extra buffers shared by all channels of a partition or gate.";
        TMP_DIRS: &'static str = "io.tmp.dirs",
            "" => "(system temp dir)",
            "Directory for spilled blocking partitions (empty: the system temp dir).";
        COMPRESSION_CODEC: &'static str = "taskmanager.network.compression.codec",
            "NONE",
            "Compression of network buffers between TaskManagers: NONE or LZ4.", unlisted;
        ADAPTIVE_PARTITIONER: bool = "taskmanager.network.adaptive-partitioner.enabled",
            false,
            "Rebalance and rescale prefer the subpartition with the smallest backlog.", unlisted;
        ADAPTIVE_PARTITIONER_TRAVERSE: usize = "taskmanager.network.adaptive-partitioner.max-traverse-size",
            4,
            "How many subpartitions the load-aware partitioner compares per record.", unlisted;
        LOCAL_TASK_MANAGERS: usize = "local.number-taskmanager",
            1,
            "TaskManagers of the embedded mini-cluster; with more than one, \
            exchanges between them go over TCP on loopback.", unlisted;
        /// Flink's `RestartStrategyOptions`. Without a type, a job with
        /// checkpointing restarts with exponential-delay, others not at all.
        RESTART_STRATEGY: &'static str = "restart-strategy.type" | "restart-strategy",
            "" => "(none; exponential-delay with checkpointing)",
            "none, fixed-delay, exponential-delay or failure-rate.";
        RESTART_ATTEMPTS: usize = "restart-strategy.fixed-delay.attempts",
            1,
            "Restarts allowed by the fixed-delay strategy.";
        RESTART_DELAY: Duration = "restart-strategy.fixed-delay.delay",
            Duration::from_secs(1) => "1 s",
            "Wait before a restart (fixed-delay).";
        RESTART_EXP_INITIAL: Duration = "restart-strategy.exponential-delay.initial-backoff",
            Duration::from_secs(1) => "1 s",
            "Exponential-delay: the first restart's delay.";
        RESTART_EXP_MAX: Duration = "restart-strategy.exponential-delay.max-backoff",
            Duration::from_secs(60) => "1 min",
            "Exponential-delay: the longest delay.";
        RESTART_EXP_MULTIPLIER: f64 = "restart-strategy.exponential-delay.backoff-multiplier",
            1.5,
            "Exponential-delay: how much the delay grows per restart.";
        RESTART_EXP_RESET: Duration = "restart-strategy.exponential-delay.reset-backoff-threshold",
            Duration::from_secs(3600) => "1 h",
            "Exponential-delay: a failure this long after the previous one starts over at the initial delay.";
        RESTART_EXP_JITTER: f64 = "restart-strategy.exponential-delay.jitter-factor",
            0.1,
            "Exponential-delay: the delay varies by up to this fraction.";
        RESTART_EXP_ATTEMPTS: usize = "restart-strategy.exponential-delay.attempts-before-reset-backoff",
            usize::MAX => "(no limit)",
            "Exponential-delay: restarts allowed before the delay is reset.";
        RESTART_RATE_MAX_FAILURES: usize = "restart-strategy.failure-rate.max-failures-per-interval",
            1,
            "Failure-rate: failures allowed within the interval.";
        RESTART_RATE_INTERVAL: Duration = "restart-strategy.failure-rate.failure-rate-interval",
            Duration::from_secs(60) => "1 min",
            "Failure-rate: the interval failures are counted in.";
        RESTART_RATE_DELAY: Duration = "restart-strategy.failure-rate.delay",
            Duration::from_secs(1) => "1 s",
            "Failure-rate: wait before a restart.";
        /// Flink's `CheckpointingOptions` (1.20+ names; the older `state.*`
        /// spellings are read too).
        CHECKPOINTING_INTERVAL: Duration = "execution.checkpointing.interval",
            Duration::ZERO => "(none)",
            "Streaming jobs: how often a checkpoint is triggered (none or 0: no periodic checkpoints).";
        CHECKPOINTING_MODE: &'static str = "execution.checkpointing.mode",
            "EXACTLY_ONCE",
            "EXACTLY_ONCE (barriers are aligned) or AT_LEAST_ONCE (they are not).";
        CHECKPOINTING_TIMEOUT: Duration = "execution.checkpointing.timeout",
            Duration::from_secs(600) => "10 min",
            "A checkpoint not completed within this time is aborted.";
        CHECKPOINTING_MIN_PAUSE: Duration = "execution.checkpointing.min-pause",
            Duration::ZERO => "0 ms",
            "Least time between the end of one checkpoint and the start of the next.";
        CHECKPOINTING_MAX_CONCURRENT: usize = "execution.checkpointing.max-concurrent-checkpoints",
            1,
            "Checkpoints that may be in progress at once.";
        CHECKPOINTING_TOLERABLE_FAILURES: usize = "execution.checkpointing.tolerable-failed-checkpoints",
            0,
            "Consecutive checkpoint failures tolerated before the job fails.";
        CHECKPOINTING_NUM_RETAINED: usize = "execution.checkpointing.num-retained" | "state.checkpoints.num-retained",
            1,
            "Completed checkpoints kept; older ones are deleted.";
        CHECKPOINTING_UNALIGNED: bool = "execution.checkpointing.unaligned.enabled" | "execution.checkpointing.unaligned",
            false,
            "Barriers overtake in-flight data, which is stored as channel state (exactly once only).";
        CHECKPOINTING_ALIGNED_TIMEOUT: Duration = "execution.checkpointing.aligned-checkpoint-timeout" | "execution.checkpointing.alignment-timeout",
            Duration::ZERO => "0 ms",
            "With unaligned checkpoints: start aligned and switch to unaligned after this long (0: unaligned at once).";
        CHECKPOINTING_RETENTION: &'static str = "execution.checkpointing.externalized-checkpoint-retention" | "execution.checkpointing.externalized-checkpoint.retention",
            "NO_EXTERNALIZED_CHECKPOINTS",
            "DELETE_ON_CANCELLATION, RETAIN_ON_CANCELLATION or NO_EXTERNALIZED_CHECKPOINTS.";
        CHECKPOINTS_DIRECTORY: &'static str = "execution.checkpointing.dir" | "state.checkpoints.dir",
            "" => "(system temp dir)/fluvia-checkpoints",
            "Where checkpoints are written (a directory every process of the cluster can read).";
        SAVEPOINT_DIRECTORY: &'static str = "execution.checkpointing.savepoint-dir" | "state.savepoints.dir",
            "" => "(none)",
            "Default directory of savepoints.";
        STATE_RECOVERY_PATH: &'static str = "execution.state-recovery.path" | "execution.savepoint.path",
            "" => "(none)",
            "A savepoint or retained checkpoint the job starts from.";
        STATE_RECOVERY_IGNORE_UNCLAIMED: bool = "execution.state-recovery.ignore-unclaimed-state" | "execution.savepoint.ignore-unclaimed-state",
            false,
            "Start even if the snapshot holds state of an operator the job no longer has.";
    }
}

/// Values that can be read from configuration text.
pub trait ConfigValue: Sized + Clone {
    fn parse_value(s: &str) -> std::result::Result<Self, String>;
}

impl ConfigValue for usize {
    fn parse_value(s: &str) -> std::result::Result<Self, String> {
        s.trim()
            .parse()
            .map_err(|_| "expected a non-negative integer".to_string())
    }
}

impl ConfigValue for f64 {
    fn parse_value(s: &str) -> std::result::Result<Self, String> {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| "expected a non-negative number".to_string())
    }
}

impl ConfigValue for bool {
    fn parse_value(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err("expected true or false".to_string()),
        }
    }
}

impl ConfigValue for RuntimeMode {
    fn parse_value(s: &str) -> std::result::Result<Self, String> {
        RuntimeMode::parse(s.trim())
            .ok_or_else(|| "expected STREAMING, BATCH or AUTOMATIC".to_string())
    }
}

impl ConfigValue for &'static str {
    fn parse_value(s: &str) -> std::result::Result<Self, String> {
        // Leaked once per read: only used for rarely-read path options.
        Ok(Box::leak(s.trim().to_string().into_boxed_str()))
    }
}

/// Splits `100 ms` into the number and its unit (lower case, possibly
/// empty); `expected` describes the form for the error.
fn number_and_unit(s: &str, expected: &str) -> std::result::Result<(u64, String), String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n = num.parse().map_err(|_| format!("expected {expected}"))?;
    Ok((n, unit.trim().to_ascii_lowercase()))
}

/// Durations as Flink writes them: `100 ms`, `2s`, `1 min`, `500` (millis).
impl ConfigValue for Duration {
    fn parse_value(s: &str) -> std::result::Result<Self, String> {
        let (n, unit) = number_and_unit(s, "a duration like '100 ms'")?;
        match unit.as_str() {
            "" | "ms" | "milli" | "millis" | "millisecond" | "milliseconds" => {
                Ok(Duration::from_millis(n))
            }
            "s" | "sec" | "secs" | "second" | "seconds" => Ok(Duration::from_secs(n)),
            "min" | "m" | "minute" | "minutes" => Ok(Duration::from_secs(n * 60)),
            "h" | "hour" | "hours" => Ok(Duration::from_secs(n * 3600)),
            "us" | "micros" => Ok(Duration::from_micros(n)),
            other => Err(format!("unknown duration unit '{other}'")),
        }
    }
}

/// Memory sizes as Flink writes them: `32kb`, `64 mb`, `1g`, `4096` (bytes).
impl ConfigValue for u64 {
    fn parse_value(s: &str) -> std::result::Result<Self, String> {
        let (n, unit) = number_and_unit(s, "a size like '32 kb'")?;
        let mult = match unit.as_str() {
            "" | "b" | "bytes" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            other => return Err(format!("unknown size unit '{other}'")),
        };
        n.checked_mul(mult)
            .ok_or_else(|| "size overflows".to_string())
    }
}

/// Key-value configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Configuration {
    values: BTreeMap<String, String>,
}

impl Configuration {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.values.insert(key.into(), value.into());
        self
    }

    pub fn set_option<T: ToString>(&mut self, option: &ConfigOption<T>, value: T) -> &mut Self {
        self.set(option.key, value.to_string())
    }

    pub fn get_raw(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// Loads Flink's `key: value` lines (`flink-conf.yaml` style, `#`
    /// comments). Errors name file and line.
    pub fn load_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            FluviaError::Config(format!(
                "cannot read configuration file '{}': {e}",
                path.display()
            ))
        })?;
        let mut c = Configuration::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once(':') else {
                return Err(FluviaError::Config(format!(
                    "{}:{}: expected 'key: value', found '{line}'",
                    path.display(),
                    i + 1
                )));
            };
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(v);
            if k.trim().is_empty() {
                return Err(FluviaError::Config(format!(
                    "{}:{}: empty key",
                    path.display(),
                    i + 1
                )));
            }
            c.set(k.trim(), v);
        }
        Ok(c)
    }

    /// Adds every entry of `other`, replacing existing keys.
    pub fn merge(&mut self, other: &Configuration) {
        for (k, v) in other.iter() {
            self.set(k, v);
        }
    }

    /// Applies `key=value` strings as given with `-D`.
    pub fn apply_dynamic(&mut self, pairs: &[String]) -> Result<()> {
        for p in pairs {
            let (k, v) = p.split_once('=').ok_or_else(|| {
                FluviaError::Config(format!("'-D {p}' must have the form key=value"))
            })?;
            self.set(k.trim(), v.trim());
        }
        Ok(())
    }

    /// Reads an option, falling back to its default; a malformed value is an
    /// error naming the key, never silently the default.
    pub fn get<T: ConfigValue>(&self, option: &ConfigOption<T>) -> Result<T> {
        let raw = std::iter::once(option.key)
            .chain(option.fallback_keys.iter().copied())
            .find_map(|k| self.values.get(k).map(|v| (k, v)));
        match raw {
            None => Ok(option.default.clone()),
            Some((k, v)) => T::parse_value(v)
                .map_err(|e| FluviaError::Config(format!("invalid value '{v}' for '{k}': {e}"))),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_options_parse_and_default() {
        let mut c = Configuration::new();
        assert_eq!(
            c.get(&options::BUFFER_TIMEOUT).unwrap(),
            Duration::from_millis(100)
        );
        c.set("execution.buffer-timeout", "5 s");
        assert_eq!(
            c.get(&options::BUFFER_TIMEOUT).unwrap(),
            Duration::from_secs(5)
        );
        c.set("taskmanager.memory.segment-size", "64kb");
        assert_eq!(c.get(&options::SEGMENT_SIZE).unwrap(), 65536);
        c.set("execution.runtime-mode", "batch");
        assert_eq!(c.get(&options::RUNTIME_MODE).unwrap(), RuntimeMode::Batch);
    }

    #[test]
    fn malformed_value_names_the_key() {
        let mut c = Configuration::new();
        c.set("pipeline.object-reuse", "yes please");
        let err = c.get(&options::OBJECT_REUSE).unwrap_err().to_string();
        assert!(err.contains("pipeline.object-reuse"), "{err}");
    }

    #[test]
    fn flat_yaml_files_load_and_errors_name_the_line() {
        let dir = std::env::temp_dir().join(format!("fluvia-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.yaml");
        std::fs::write(
            &good,
            "# comment\nrest.port: 8082\nsecurity.cluster-secret: \"s3cret\"\n",
        )
        .unwrap();
        let c = Configuration::load_file(&good).unwrap();
        assert_eq!(c.get_raw("rest.port"), Some("8082"));
        assert_eq!(c.get_raw("security.cluster-secret"), Some("s3cret"));
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, "a: 1\nnonsense\n").unwrap();
        let err = Configuration::load_file(&bad).unwrap_err().to_string();
        assert!(err.contains("bad.yaml:2"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn check_reads_the_listed_options_and_all_shows_their_defaults() {
        let mut c = Configuration::new();
        assert!(options::check(&c).is_ok());
        c.set("execution.buffer-timeout.interval", "soon");
        let err = options::check(&c).unwrap_err().to_string();
        assert!(err.contains("execution.buffer-timeout.interval"), "{err}");
        let mut c = Configuration::new();
        c.set("local.number-taskmanager", "many");
        assert!(
            options::check(&c).is_ok(),
            "unlisted options are not checked"
        );
        let all = options::all();
        assert_eq!(all.len(), 59);
        assert!(
            all.iter()
                .all(|(k, _, _)| *k != options::LOCAL_TASK_MANAGERS.key)
        );
        assert_eq!(all[0].0, options::AUTO_PARALLELISM_ENABLED.key);
        let shown = |key: &str| {
            all.iter()
                .find(|(k, _, _)| *k == key)
                .map(|(_, d, _)| d.clone())
        };
        assert_eq!(
            shown(options::BUFFER_TIMEOUT.key).as_deref(),
            Some("100 ms")
        );
        assert_eq!(shown(options::PARALLELISM.key).as_deref(), Some("1"));
    }

    #[test]
    fn dynamic_properties_need_an_equals_sign() {
        let mut c = Configuration::new();
        assert!(c.apply_dynamic(&["a=b".into()]).is_ok());
        assert_eq!(c.get_raw("a"), Some("b"));
        assert!(c.apply_dynamic(&["nonsense".into()]).is_err());
    }
}
