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

/// Every option the engine reads, for documentation and validation.
pub mod options {
    use super::*;

    pub const PARALLELISM: ConfigOption<usize> = ConfigOption {
        key: "parallelism.default",
        fallback_keys: &[],
        default: 1,
        description: "Parallelism of operators that do not set their own.",
    };
    /// 0 means "derive from parallelism" as Flink does (1.5 × p, within [128, 32768]).
    pub const MAX_PARALLELISM: ConfigOption<usize> = ConfigOption {
        key: "pipeline.max-parallelism",
        fallback_keys: &[],
        default: 0,
        description: "Number of key groups; 0 derives it from the parallelism.",
    };
    pub const CHAINING_ENABLED: ConfigOption<bool> = ConfigOption {
        key: "pipeline.operator-chaining.enabled",
        fallback_keys: &[],
        default: true,
        description: "Chain operators into one task where Flink's rules allow.",
    };
    pub const OBJECT_REUSE: ConfigOption<bool> = ConfigOption {
        key: "pipeline.object-reuse",
        fallback_keys: &[],
        default: false,
        description: "Hand records to chained operators without a defensive copy.",
    };
    pub const RUNTIME_MODE: ConfigOption<RuntimeMode> = ConfigOption {
        key: "execution.runtime-mode",
        fallback_keys: &[],
        default: RuntimeMode::Automatic,
        description: "STREAMING, BATCH or AUTOMATIC (batch when all sources are bounded).",
    };
    pub const BUFFER_TIMEOUT: ConfigOption<Duration> = ConfigOption {
        key: "execution.buffer-timeout",
        fallback_keys: &["execution.buffer-timeout.interval"],
        default: Duration::from_millis(100),
        description: "Longest time a partly filled network buffer waits before it is sent.",
    };
    pub const SEGMENT_SIZE: ConfigOption<u64> = ConfigOption {
        key: "taskmanager.memory.segment-size",
        fallback_keys: &[],
        default: 32 * 1024,
        description: "Size of one network buffer.",
    };
    pub const NETWORK_MEMORY: ConfigOption<u64> = ConfigOption {
        key: "taskmanager.memory.network.size",
        fallback_keys: &["taskmanager.memory.network.max"],
        default: 64 * 1024 * 1024,
        description: "Total memory of the network buffer pool of a TaskManager.",
    };
    pub const BUFFERS_PER_CHANNEL: ConfigOption<usize> = ConfigOption {
        key: "taskmanager.network.memory.buffers-per-channel",
        fallback_keys: &[],
        default: 2,
        description: "Buffers each subpartition / input channel may hold (exclusive buffers).",
    };
    pub const FLOATING_BUFFERS: ConfigOption<usize> = ConfigOption {
        key: "taskmanager.network.memory.floating-buffers-per-gate",
        fallback_keys: &[],
        default: 8,
        description: "Extra buffers shared by all channels of a partition or gate.",
    };
    pub const COMPRESSION_CODEC: ConfigOption<&'static str> = ConfigOption {
        key: "taskmanager.network.compression.codec",
        fallback_keys: &[],
        default: "NONE",
        description: "Compression of network buffers between TaskManagers: NONE or LZ4.",
    };
    pub const SORT_SHUFFLE_MIN_PARALLELISM: ConfigOption<usize> = ConfigOption {
        key: "taskmanager.network.sort-shuffle.min-parallelism",
        fallback_keys: &[],
        default: 1,
        description: "Blocking partitions with at least this many subpartitions are written \
                      sort-merge (one data and one index file); smaller ones one file per \
                      subpartition.",
    };
    pub const SORT_SHUFFLE_MIN_BUFFERS: ConfigOption<usize> = ConfigOption {
        key: "taskmanager.network.sort-shuffle.min-buffers",
        fallback_keys: &[],
        default: 64,
        description: "Network buffers of a sort-merge writer's sort area, whatever its \
                      number of subpartitions.",
    };
    pub const BLOCKING_SHUFFLE_COMPRESSION: ConfigOption<bool> = ConfigOption {
        key: "taskmanager.network.blocking-shuffle.compression.enabled",
        fallback_keys: &[],
        default: true,
        description: "LZ4 per buffer in sort-merge shuffle files (kept only where smaller).",
    };
    pub const BATCH_SHUFFLE_READ_MEMORY: ConfigOption<u64> = ConfigOption {
        key: "taskmanager.memory.framework.off-heap.batch-shuffle.size",
        fallback_keys: &[],
        default: 64 * 1024 * 1024,
        description: "Read buffers shared by all readers of a TaskManager's sort-merge \
                      partitions.",
    };
    pub const ADAPTIVE_PARTITIONER: ConfigOption<bool> = ConfigOption {
        key: "taskmanager.network.adaptive-partitioner.enabled",
        fallback_keys: &[],
        default: false,
        description: "Rebalance and rescale prefer the subpartition with the smallest backlog.",
    };
    pub const ADAPTIVE_PARTITIONER_TRAVERSE: ConfigOption<usize> = ConfigOption {
        key: "taskmanager.network.adaptive-partitioner.max-traverse-size",
        fallback_keys: &[],
        default: 4,
        description: "How many subpartitions the load-aware partitioner compares per record.",
    };
    pub const LOCAL_TASK_MANAGERS: ConfigOption<usize> = ConfigOption {
        key: "local.number-taskmanager",
        fallback_keys: &[],
        default: 1,
        description: "TaskManagers of the embedded mini-cluster; with more than one, \
                      exchanges between them go over TCP on loopback.",
    };
    pub const TMP_DIRS: ConfigOption<&'static str> = ConfigOption {
        key: "io.tmp.dirs",
        fallback_keys: &[],
        default: "",
        description: "Directory for spilled blocking partitions (empty: the system temp dir).",
    };
    /// Flink's key; a size with a unit (`10mb`) or bytes.
    pub const BROADCAST_THRESHOLD: ConfigOption<u64> = ConfigOption {
        key: "table.optimizer.join.broadcast-threshold",
        fallback_keys: &[],
        default: 1024 * 1024,
        description: "SQL: a join side estimated below this many bytes is broadcast to the other side's subtasks instead of hash-partitioning both.",
    };
    /// Flink's key.
    pub const BUFFER_REQUEST_TIMEOUT: ConfigOption<u64> = ConfigOption {
        key: "taskmanager.network.memory.exclusive-buffers-request-timeout-ms",
        fallback_keys: &[],
        default: 30_000,
        description: "Milliseconds a task being deployed waits for network buffers held by running tasks to be given back before it fails with 'insufficient number of network buffers'.",
    };

    /// Flink's `BatchExecutionOptions` (with the deprecated
    /// `jobmanager.adaptive-batch-scheduler.*` spellings).
    pub const AUTO_PARALLELISM_ENABLED: ConfigOption<bool> = ConfigOption {
        key: "execution.batch.adaptive.auto-parallelism.enabled",
        fallback_keys: &["jobmanager.adaptive-batch-scheduler.enabled"],
        default: true,
        description: "Batch jobs: decide at runtime, from the bytes their inputs produced, the parallelism of vertices whose parallelism nobody set, and balance the subpartitions each subtask reads.",
    };
    pub const AUTO_PARALLELISM_MIN: ConfigOption<usize> = ConfigOption {
        key: "execution.batch.adaptive.auto-parallelism.min-parallelism",
        fallback_keys: &["jobmanager.adaptive-batch-scheduler.min-parallelism"],
        default: 1,
        description: "Lower bound of the parallelism the adaptive batch scheduler decides.",
    };
    pub const AUTO_PARALLELISM_MAX: ConfigOption<usize> = ConfigOption {
        key: "execution.batch.adaptive.auto-parallelism.max-parallelism",
        fallback_keys: &["jobmanager.adaptive-batch-scheduler.max-parallelism"],
        default: 128,
        description: "Upper bound of the parallelism the adaptive batch scheduler decides.",
    };
    pub const AUTO_PARALLELISM_AVG_DATA_VOLUME: ConfigOption<u64> = ConfigOption {
        key: "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task",
        fallback_keys: &["jobmanager.adaptive-batch-scheduler.avg-data-volume-per-task"],
        default: 16 * 1024 * 1024,
        description: "Bytes each subtask of a vertex whose parallelism is decided adaptively should read (skew or the max parallelism can make it read more).",
    };
    pub const AUTO_PARALLELISM_DEFAULT_SOURCE: ConfigOption<usize> = ConfigOption {
        key: "execution.batch.adaptive.auto-parallelism.default-source-parallelism",
        fallback_keys: &["jobmanager.adaptive-batch-scheduler.default-source-parallelism"],
        default: 1,
        description: "Parallelism of sources whose parallelism is not set, under the adaptive batch scheduler.",
    };

    pub const SPECULATIVE_ENABLED: ConfigOption<bool> = ConfigOption {
        key: "execution.batch.speculative.enabled",
        fallback_keys: &[],
        default: false,
        description: "Batch jobs: run a second attempt of a subtask the slow-task detector finds slow on another TaskManager; the first to finish wins.",
    };
    pub const SPECULATIVE_MAX_CONCURRENT: ConfigOption<usize> = ConfigOption {
        key: "execution.batch.speculative.max-concurrent-executions",
        fallback_keys: &[],
        default: 2,
        description: "Attempts of one subtask that may run at once under speculative execution.",
    };
    pub const SPECULATIVE_BLOCK_DURATION: ConfigOption<Duration> = ConfigOption {
        key: "execution.batch.speculative.block-slow-node-duration",
        fallback_keys: &[],
        default: Duration::from_secs(60),
        description: "How long a TaskManager running a slow attempt gets no new attempts (0: not blocked).",
    };
    pub const SLOW_TASK_CHECK_INTERVAL: ConfigOption<Duration> = ConfigOption {
        key: "slow-task-detector.check-interval",
        fallback_keys: &[],
        default: Duration::from_secs(1),
        description: "How often the slow-task detector looks for slow attempts.",
    };
    pub const SLOW_TASK_LOWER_BOUND: ConfigOption<Duration> = ConfigOption {
        key: "slow-task-detector.execution-time.baseline-lower-bound",
        fallback_keys: &[],
        default: Duration::from_secs(60),
        description: "An attempt running shorter than this is never slow.",
    };
    pub const SLOW_TASK_BASELINE_RATIO: ConfigOption<f64> = ConfigOption {
        key: "slow-task-detector.execution-time.baseline-ratio",
        fallback_keys: &[],
        default: 0.75,
        description: "Share of a vertex's subtasks that must have finished before its slow ones are looked for; the baseline is the median of that share.",
    };
    pub const SLOW_TASK_BASELINE_MULTIPLIER: ConfigOption<f64> = ConfigOption {
        key: "slow-task-detector.execution-time.baseline-multiplier",
        fallback_keys: &[],
        default: 1.5,
        description: "An attempt is slow above this many times the baseline execution time per input byte.",
    };
    pub const ADAPTIVE_BROADCAST_JOIN_STRATEGY: ConfigOption<&'static str> = ConfigOption {
        key: "table.optimizer.adaptive-broadcast-join.strategy",
        fallback_keys: &[],
        default: "AUTO",
        description: "SQL under the adaptive batch scheduler: AUTO broadcasts a join side the planner estimated small, and at runtime one whose real bytes are below table.optimizer.join.broadcast-threshold; RUNTIME_ONLY only the latter; NONE only the planner's.",
    };
    pub const SKEWED_JOIN_STRATEGY: ConfigOption<&'static str> = ConfigOption {
        key: "table.optimizer.skewed-join-optimization.strategy",
        fallback_keys: &[],
        default: "AUTO",
        description: "SQL under the adaptive batch scheduler: AUTO splits a skewed subpartition of a join side across subtasks where the join type allows it; NONE never.",
    };
    pub const SKEWED_JOIN_FACTOR: ConfigOption<f64> = ConfigOption {
        key: "table.optimizer.skewed-join-optimization.skewed-factor",
        fallback_keys: &[],
        default: 4.0,
        description: "A join side's subpartition is skewed above this many times the median one (and above the threshold).",
    };
    pub const SKEWED_JOIN_THRESHOLD: ConfigOption<u64> = ConfigOption {
        key: "table.optimizer.skewed-join-optimization.skewed-threshold",
        fallback_keys: &[],
        default: 256 * 1024 * 1024,
        description: "A join side's subpartition is skewed only above this many bytes.",
    };

    /// (key, default as text, description) of every option, for docs and `--help`.
    pub fn all() -> Vec<(&'static str, String, &'static str)> {
        vec![
            (
                AUTO_PARALLELISM_ENABLED.key,
                AUTO_PARALLELISM_ENABLED.default.to_string(),
                AUTO_PARALLELISM_ENABLED.description,
            ),
            (
                AUTO_PARALLELISM_MIN.key,
                AUTO_PARALLELISM_MIN.default.to_string(),
                AUTO_PARALLELISM_MIN.description,
            ),
            (
                AUTO_PARALLELISM_MAX.key,
                AUTO_PARALLELISM_MAX.default.to_string(),
                AUTO_PARALLELISM_MAX.description,
            ),
            (
                AUTO_PARALLELISM_AVG_DATA_VOLUME.key,
                "16 mb".to_string(),
                AUTO_PARALLELISM_AVG_DATA_VOLUME.description,
            ),
            (
                AUTO_PARALLELISM_DEFAULT_SOURCE.key,
                AUTO_PARALLELISM_DEFAULT_SOURCE.default.to_string(),
                AUTO_PARALLELISM_DEFAULT_SOURCE.description,
            ),
            (
                SPECULATIVE_ENABLED.key,
                SPECULATIVE_ENABLED.default.to_string(),
                SPECULATIVE_ENABLED.description,
            ),
            (
                SPECULATIVE_MAX_CONCURRENT.key,
                SPECULATIVE_MAX_CONCURRENT.default.to_string(),
                SPECULATIVE_MAX_CONCURRENT.description,
            ),
            (
                SPECULATIVE_BLOCK_DURATION.key,
                "1 min".to_string(),
                SPECULATIVE_BLOCK_DURATION.description,
            ),
            (
                SLOW_TASK_CHECK_INTERVAL.key,
                "1 s".to_string(),
                SLOW_TASK_CHECK_INTERVAL.description,
            ),
            (
                SLOW_TASK_LOWER_BOUND.key,
                "1 min".to_string(),
                SLOW_TASK_LOWER_BOUND.description,
            ),
            (
                SLOW_TASK_BASELINE_RATIO.key,
                SLOW_TASK_BASELINE_RATIO.default.to_string(),
                SLOW_TASK_BASELINE_RATIO.description,
            ),
            (
                SLOW_TASK_BASELINE_MULTIPLIER.key,
                SLOW_TASK_BASELINE_MULTIPLIER.default.to_string(),
                SLOW_TASK_BASELINE_MULTIPLIER.description,
            ),
            (
                ADAPTIVE_BROADCAST_JOIN_STRATEGY.key,
                ADAPTIVE_BROADCAST_JOIN_STRATEGY.default.to_string(),
                ADAPTIVE_BROADCAST_JOIN_STRATEGY.description,
            ),
            (
                SKEWED_JOIN_STRATEGY.key,
                SKEWED_JOIN_STRATEGY.default.to_string(),
                SKEWED_JOIN_STRATEGY.description,
            ),
            (
                SKEWED_JOIN_FACTOR.key,
                SKEWED_JOIN_FACTOR.default.to_string(),
                SKEWED_JOIN_FACTOR.description,
            ),
            (
                SKEWED_JOIN_THRESHOLD.key,
                "256 mb".to_string(),
                SKEWED_JOIN_THRESHOLD.description,
            ),
            (
                BROADCAST_THRESHOLD.key,
                BROADCAST_THRESHOLD.default.to_string(),
                BROADCAST_THRESHOLD.description,
            ),
            (
                BUFFER_REQUEST_TIMEOUT.key,
                BUFFER_REQUEST_TIMEOUT.default.to_string(),
                BUFFER_REQUEST_TIMEOUT.description,
            ),
            (
                PARALLELISM.key,
                PARALLELISM.default.to_string(),
                PARALLELISM.description,
            ),
            (
                MAX_PARALLELISM.key,
                MAX_PARALLELISM.default.to_string(),
                MAX_PARALLELISM.description,
            ),
            (
                CHAINING_ENABLED.key,
                CHAINING_ENABLED.default.to_string(),
                CHAINING_ENABLED.description,
            ),
            (
                OBJECT_REUSE.key,
                OBJECT_REUSE.default.to_string(),
                OBJECT_REUSE.description,
            ),
            (
                RUNTIME_MODE.key,
                RUNTIME_MODE.default.to_string(),
                RUNTIME_MODE.description,
            ),
            (
                BUFFER_TIMEOUT.key,
                "100 ms".to_string(),
                BUFFER_TIMEOUT.description,
            ),
            (
                SORT_SHUFFLE_MIN_PARALLELISM.key,
                SORT_SHUFFLE_MIN_PARALLELISM.default.to_string(),
                SORT_SHUFFLE_MIN_PARALLELISM.description,
            ),
            (
                SORT_SHUFFLE_MIN_BUFFERS.key,
                SORT_SHUFFLE_MIN_BUFFERS.default.to_string(),
                SORT_SHUFFLE_MIN_BUFFERS.description,
            ),
            (
                BLOCKING_SHUFFLE_COMPRESSION.key,
                BLOCKING_SHUFFLE_COMPRESSION.default.to_string(),
                BLOCKING_SHUFFLE_COMPRESSION.description,
            ),
            (
                BATCH_SHUFFLE_READ_MEMORY.key,
                "64 mb".to_string(),
                BATCH_SHUFFLE_READ_MEMORY.description,
            ),
            (
                SEGMENT_SIZE.key,
                "32 kb".to_string(),
                SEGMENT_SIZE.description,
            ),
            (
                NETWORK_MEMORY.key,
                "64 mb".to_string(),
                NETWORK_MEMORY.description,
            ),
            (
                BUFFERS_PER_CHANNEL.key,
                BUFFERS_PER_CHANNEL.default.to_string(),
                BUFFERS_PER_CHANNEL.description,
            ),
            (
                FLOATING_BUFFERS.key,
                FLOATING_BUFFERS.default.to_string(),
                FLOATING_BUFFERS.description,
            ),
            (
                TMP_DIRS.key,
                "(system temp dir)".to_string(),
                TMP_DIRS.description,
            ),
        ]
    }

    /// Reads every option of `config` with its type: an error names the
    /// first key whose value does not parse (`SET` checks with it).
    pub fn check(config: &super::Configuration) -> crate::Result<()> {
        config.get(&AUTO_PARALLELISM_ENABLED)?;
        config.get(&AUTO_PARALLELISM_MIN)?;
        config.get(&AUTO_PARALLELISM_MAX)?;
        config.get(&AUTO_PARALLELISM_AVG_DATA_VOLUME)?;
        config.get(&AUTO_PARALLELISM_DEFAULT_SOURCE)?;
        config.get(&SPECULATIVE_ENABLED)?;
        config.get(&SPECULATIVE_MAX_CONCURRENT)?;
        config.get(&SPECULATIVE_BLOCK_DURATION)?;
        config.get(&SLOW_TASK_CHECK_INTERVAL)?;
        config.get(&SLOW_TASK_LOWER_BOUND)?;
        config.get(&SLOW_TASK_BASELINE_RATIO)?;
        config.get(&SLOW_TASK_BASELINE_MULTIPLIER)?;
        config.get(&ADAPTIVE_BROADCAST_JOIN_STRATEGY)?;
        config.get(&SKEWED_JOIN_STRATEGY)?;
        config.get(&SKEWED_JOIN_FACTOR)?;
        config.get(&SKEWED_JOIN_THRESHOLD)?;
        config.get(&BROADCAST_THRESHOLD)?;
        config.get(&BUFFER_REQUEST_TIMEOUT)?;
        config.get(&PARALLELISM)?;
        config.get(&MAX_PARALLELISM)?;
        config.get(&CHAINING_ENABLED)?;
        config.get(&OBJECT_REUSE)?;
        config.get(&RUNTIME_MODE)?;
        config.get(&BUFFER_TIMEOUT)?;
        config.get(&SORT_SHUFFLE_MIN_PARALLELISM)?;
        config.get(&SORT_SHUFFLE_MIN_BUFFERS)?;
        config.get(&BLOCKING_SHUFFLE_COMPRESSION)?;
        config.get(&BATCH_SHUFFLE_READ_MEMORY)?;
        config.get(&SEGMENT_SIZE)?;
        config.get(&NETWORK_MEMORY)?;
        config.get(&BUFFERS_PER_CHANNEL)?;
        config.get(&FLOATING_BUFFERS)?;
        config.get(&TMP_DIRS)?;
        Ok(())
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

/// Durations as Flink writes them: `100 ms`, `2s`, `1 min`, `500` (millis).
impl ConfigValue for Duration {
    fn parse_value(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| "expected a duration like '100 ms'".to_string())?;
        match unit.trim().to_ascii_lowercase().as_str() {
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
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| "expected a size like '32 kb'".to_string())?;
        let mult = match unit.trim().to_ascii_lowercase().as_str() {
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
    fn dynamic_properties_need_an_equals_sign() {
        let mut c = Configuration::new();
        assert!(c.apply_dynamic(&["a=b".into()]).is_ok());
        assert_eq!(c.get_raw("a"), Some("b"));
        assert!(c.apply_dynamic(&["nonsense".into()]).is_err());
    }
}
