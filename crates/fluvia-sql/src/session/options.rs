//! The configuration keys of SQL: Flink's `table.*` options Fluvia reads,
//! and its own. Keys and defaults are user contracts (`-D key=value`,
//! `SET 'key' = 'value'`); the typed-option machinery is
//! [`fluvia_core::config`]'s. Keys the adaptive batch scheduler reads as
//! well (the broadcast threshold, skewed joins) stay in
//! [`fluvia_core::config::options`].

use fluvia_core::config::{ConfigOption, Configuration};

pub const MULTIPLE_INPUT: ConfigOption<bool> = ConfigOption {
    key: "table.optimizer.multiple-input-enabled",
    fallback_keys: &[],
    default: true,
    description: "SQL: fuse operators not separated by an exchange (joins in a row, chained scans) into one multiple-input task; false gives each join its own task.",
};

/// Flink's key and values; `AUTO`, the default, is Fluvia's.
pub const BATCH_SHUFFLE_MODE: ConfigOption<&'static str> = ConfigOption {
    key: "execution.batch-shuffle-mode",
    fallback_keys: &[],
    default: "AUTO",
    description: "SQL jobs: ALL_EXCHANGES_BLOCKING (Flink's default) writes each exchange to a blocking partition its consumers read once the producer finished; ALL_EXCHANGES_PIPELINED streams it while both ends run; AUTO pipelines on the embedded mini-cluster at a fixed parallelism without speculative execution or an external shuffle service (slots for every task, nothing a blocking partition would buy), and blocks otherwise. A job with a stage whose parallelism the adaptive batch scheduler decides, or a stage that reads exchanges under the branches of a union, stays blocking.",
};

/// Flink's key.
pub const REUSE_SOURCE: ConfigOption<bool> = ConfigOption {
    key: "table.optimizer.reuse-source-enabled",
    fallback_keys: &[],
    default: true,
    description: "SQL: fragments that scan the same CSV files (whatever columns each keeps) and do not feed each other run as one task that reads the files once and hands every batch to each of them; its outputs are blocking exchanges.",
};

/// Fluvia's key.
pub const SCALAR_SUBQUERY_JOIN_PUSHDOWN: ConfigOption<bool> = ConfigOption {
    key: "table.optimizer.scalar-subquery-join-pushdown-enabled",
    fallback_keys: &[],
    default: true,
    description: "SQL: the join a scalar subquery becomes (`col = (SELECT ...)`) moves down from the top of the FROM list to the table whose column it compares, so it filters that table before the other joins instead of after them.",
};

/// Fluvia's key; a size with a unit (`64mb`) or bytes.
pub const REUSE_SOURCE_MIN_SIZE: ConfigOption<u64> = ConfigOption {
    key: "table.optimizer.reuse-source.min-size",
    fallback_keys: &[],
    default: 64 * 1024 * 1024,
    description: "SQL, with source reuse on: only scans of at least this many bytes of files are shared (a small table read again costs less than the blocking exchanges a shared task writes).",
};

/// Fluvia's key: which reader parses CSV tables.
pub const CSV_READER: ConfigOption<&'static str> = ConfigOption {
    key: "table.exec.csv.reader",
    fallback_keys: &[],
    default: "fluvia",
    description: "SQL on CSV tables: 'fluvia' finds fields 16 bytes at a time, parses only the columns a query needs and drops rows by the runtime filters of the joins above before parsing the rest; 'datafusion' reads with DataFusion's CSV scan (the single-process DataFusion baseline always does).",
};

/// Fluvia's key (Flink's runtime filters are built differently).
pub const FILTERED_BUILD_IN_TASK: ConfigOption<bool> = ConfigOption {
    key: "table.optimizer.runtime-filter.build-side-in-task",
    fallback_keys: &[],
    default: true,
    description: "SQL, with multiple input on: a broadcast join's build side that is a plain scan carrying the runtime (dynamic) filters of joins in the task that consumes it is read inside that task by each of its subtasks, so the filters, complete by then, prune the scan; false broadcasts it from its own task, where they never arrive.",
};

/// Fluvia's key.
pub const SMALL_BUILD_IN_TASK_MAX_SIZE: ConfigOption<u64> = ConfigOption {
    key: "table.optimizer.small-build-side-in-task.max-size",
    fallback_keys: &[],
    default: 1536 * 1024,
    description: "SQL, with multiple input on: a broadcast join's build side that is a plain scan pipeline over at most this many bytes of files is read inside the join's task instead of in a task of its own that broadcasts it (once per process for its subtasks, with table.exec.hash-join.read-build-side-once); 0 never.",
};

/// Fluvia's key.
pub const RELEASE_UNREAD_INPUTS: ConfigOption<bool> = ConfigOption {
    key: "table.exec.release-unread-inputs",
    fallback_keys: &[],
    default: true,
    description: "SQL: an input a task stops needing (the probe side of a join whose build side came out empty, what follows a satisfied LIMIT, union branches a subtask does not run) is released: its pipelined producers drop what they would send there and end early once no consumer reads them, and a union whose branches read exchanges can be pipelined. false reads such inputs to their end (such a union then blocks).",
};

/// Fluvia's key.
pub const SOURCE_START_ON_DEMAND: ConfigOption<bool> = ConfigOption {
    key: "table.exec.source.start-on-demand",
    fallback_keys: &[],
    default: true,
    description: "SQL: a scan task that its consumer reads only on the probe side of a hash join that an empty build side empties (inner, left, semi, left anti), over pipelined exchanges, waits before it reads: its consumer demands it once every such join above it saw its build side deliver a row, or when it first polls it; once every consumer released it unread, it ends. Behind a build side that came out empty the scan never runs. false starts every scan at deployment.",
};

/// Fluvia's key.
pub const END_JOIN_ON_EMPTY_PROBE: ConfigOption<bool> = ConfigOption {
    key: "table.exec.hash-join.end-on-empty-probe",
    fallback_keys: &[],
    default: true,
    description: "SQL: a hash join whose output an empty probe side empties (inner, right, semi, right anti) and whose probe side reads exchanges under projections, filters and aggregates reads that probe side on a thread of its own once its build side delivered a row, and ends as soon as the probe side ends without a row: its build side's readers stop, its task ends and releases its inputs. false always collects the build side first.",
};

/// Fluvia's key.
pub const SKIP_BUILD_ON_PRUNED_PROBE: ConfigOption<bool> = ConfigOption {
    key: "table.exec.hash-join.skip-build-on-pruned-probe",
    fallback_keys: &[],
    default: true,
    description: "SQL: before a hash join whose output an empty probe side empties (inner, right, semi, right anti) collects its build side, it checks the Parquet scan its probe side reads (through projections, filters and joins an empty probe side empties) against the runtime filters the joins above it already completed: when those filters prune every row group of the task's part of the scan, the probe side is empty, and the build side is not read (nor the build sides of the joins below). false always collects the build side.",
};

/// Fluvia's key.
pub const SPLIT_SCANS_ON_ROW_GROUPS: ConfigOption<bool> = ConfigOption {
    key: "table.exec.parquet.split-on-row-groups",
    fallback_keys: &[],
    default: true,
    description: "SQL: a Parquet scan whose byte ranges would leave a subtask without a row group (a file of one row group split in two) gets its row groups dealt out again, whole and balanced by bytes, over at most as many subtasks as it has row groups, so no subtask starts to read nothing; false keeps DataFusion's byte ranges.",
};

/// Flink's key; Fluvia's default is on (Flink's is off).
pub const RUNTIME_FILTER_ENABLED: ConfigOption<bool> = ConfigOption {
    key: "table.optimizer.runtime-filter.enabled",
    fallback_keys: &[],
    default: true,
    description: "SQL, with multiple input on: a hash join whose build side is a small filtered scan pipeline and whose probe key comes, through an exchange, from a scan in another task gets a runtime filter there: every subtask of that task reads the small side and keeps only the scan's rows whose key it holds, its row groups and pages skipped by the key's bounds, before the rows are shuffled.",
};

/// Flink's key and default.
pub const RUNTIME_FILTER_MAX_BUILD_SIZE: ConfigOption<u64> = ConfigOption {
    key: "table.optimizer.runtime-filter.max-build-data-size",
    fallback_keys: &[],
    default: 10 * 1024 * 1024,
    description: "SQL, runtime filters: the build side's files are at most this many bytes (each subtask of the scan's task reads them whole).",
};

/// Flink's key; Flink's default is 10 GB, sized for its own filter
/// (a Bloom filter built once and shipped); here the filtered task
/// re-reads a side of at most `max-build-data-size`, which measured no
/// slower, within noise, on the smallest statements it fires in at
/// SF 1 (q1, q61, q91: 60–200 ms).
pub const RUNTIME_FILTER_MIN_PROBE_SIZE: ConfigOption<u64> = ConfigOption {
    key: "table.optimizer.runtime-filter.min-probe-data-size",
    fallback_keys: &[],
    default: 1024 * 1024,
    description: "SQL, runtime filters: the task of the filtered scan reads at least this many bytes of files in all (its other scans gain too: the joins the dropped rows no longer reach prune them).",
};

/// Fluvia's key.
pub const CLUSTER_BUILD_SIDE: ConfigOption<bool> = ConfigOption {
    key: "table.exec.hash-join.cluster-build-side",
    fallback_keys: &[],
    default: true,
    description: "SQL: a hash join's build side of at least 32K rows whose keys repeat (two or more rows per key in a sample) is reordered by key before the join builds its table, so the rows a probe row matches are neighbours in memory; false builds the table in arrival order.",
};

/// Fluvia's key.
pub const READ_BUILD_SIDE_ONCE: ConfigOption<bool> = ConfigOption {
    key: "table.exec.hash-join.read-build-side-once",
    fallback_keys: &[],
    default: true,
    description: "SQL: a broadcast hash join's build side that every subtask reads whole from the same files (a dimension table kept in the join's task) is read, filtered and clustered by one subtask per process for all the others of its stage, which wait for it and never open the files; false has each subtask read its own. Needs table.exec.hash-join.cluster-build-side.",
};

/// An option's (key, default as text, description).
fn entry<T: ToString>(option: &ConfigOption<T>) -> (&'static str, String, &'static str) {
    (option.key, option.default.to_string(), option.description)
}

/// (key, default as text, description) of every SQL option, for docs and
/// `fluvia config`.
pub fn all() -> Vec<(&'static str, String, &'static str)> {
    vec![
        entry(&MULTIPLE_INPUT),
        entry(&BATCH_SHUFFLE_MODE),
        entry(&FILTERED_BUILD_IN_TASK),
        (
            SMALL_BUILD_IN_TASK_MAX_SIZE.key,
            "1536 kb".to_string(),
            SMALL_BUILD_IN_TASK_MAX_SIZE.description,
        ),
        entry(&CSV_READER),
        entry(&REUSE_SOURCE),
        entry(&SCALAR_SUBQUERY_JOIN_PUSHDOWN),
        entry(&RELEASE_UNREAD_INPUTS),
        entry(&SOURCE_START_ON_DEMAND),
        entry(&END_JOIN_ON_EMPTY_PROBE),
        entry(&SKIP_BUILD_ON_PRUNED_PROBE),
        entry(&SPLIT_SCANS_ON_ROW_GROUPS),
        entry(&RUNTIME_FILTER_ENABLED),
        entry(&RUNTIME_FILTER_MAX_BUILD_SIZE),
        entry(&RUNTIME_FILTER_MIN_PROBE_SIZE),
        entry(&CLUSTER_BUILD_SIDE),
        entry(&READ_BUILD_SIDE_ONCE),
        (
            REUSE_SOURCE_MIN_SIZE.key,
            "64 mb".to_string(),
            REUSE_SOURCE_MIN_SIZE.description,
        ),
    ]
}

/// Reads every SQL option of `config` with its type: an error names the
/// first key whose value does not parse (`SET` checks with it).
pub fn check(config: &Configuration) -> fluvia_core::Result<()> {
    config.get(&MULTIPLE_INPUT)?;
    config.get(&FILTERED_BUILD_IN_TASK)?;
    config.get(&SMALL_BUILD_IN_TASK_MAX_SIZE)?;
    config.get(&READ_BUILD_SIDE_ONCE)?;
    config.get(&BATCH_SHUFFLE_MODE)?;
    config.get(&CSV_READER)?;
    config.get(&REUSE_SOURCE)?;
    config.get(&SCALAR_SUBQUERY_JOIN_PUSHDOWN)?;
    config.get(&RELEASE_UNREAD_INPUTS)?;
    config.get(&SOURCE_START_ON_DEMAND)?;
    config.get(&END_JOIN_ON_EMPTY_PROBE)?;
    config.get(&SKIP_BUILD_ON_PRUNED_PROBE)?;
    config.get(&SPLIT_SCANS_ON_ROW_GROUPS)?;
    config.get(&RUNTIME_FILTER_ENABLED)?;
    config.get(&RUNTIME_FILTER_MAX_BUILD_SIZE)?;
    config.get(&RUNTIME_FILTER_MIN_PROBE_SIZE)?;
    config.get(&REUSE_SOURCE_MIN_SIZE)?;
    Ok(())
}
