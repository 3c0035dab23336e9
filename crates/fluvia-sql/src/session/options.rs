//! The configuration keys of SQL: Flink's `table.*` options Fluvia reads,
//! and its own. Keys and defaults are user contracts (`-D key=value`,
//! `SET 'key' = 'value'`); the typed-option machinery is
//! [`fluvia_core::config`]'s. Keys the adaptive batch scheduler reads as
//! well (the broadcast threshold, skewed joins) stay in
//! [`fluvia_core::config::options`].

fluvia_core::config_options! {
    MULTIPLE_INPUT: bool = "table.optimizer.multiple-input-enabled",
        true,
        "SQL: fuse operators not separated by an exchange (joins in a row, chained scans) into one multiple-input task; false gives each join its own task.";
    /// Flink's key and values; `AUTO`, the default, is Fluvia's.
    BATCH_SHUFFLE_MODE: &'static str = "execution.batch-shuffle-mode",
        "AUTO",
        "SQL jobs: ALL_EXCHANGES_BLOCKING (Flink's default) writes each exchange to a blocking partition its consumers read once the producer finished; ALL_EXCHANGES_PIPELINED streams it while both ends run; AUTO pipelines on the embedded mini-cluster at a fixed parallelism without speculative execution or an external shuffle service (slots for every task, nothing a blocking partition would buy), and blocks otherwise. A job with a stage whose parallelism the adaptive batch scheduler decides, or a stage that reads exchanges under the branches of a union, stays blocking.";
    /// Fluvia's key (Flink's runtime filters are built differently).
    FILTERED_BUILD_IN_TASK: bool = "table.optimizer.runtime-filter.build-side-in-task",
        true,
        "SQL, with multiple input on: a broadcast join's build side that is a plain scan carrying the runtime (dynamic) filters of joins in the task that consumes it is read inside that task by each of its subtasks, so the filters, complete by then, prune the scan; false broadcasts it from its own task, where they never arrive.";
    /// Fluvia's key.
    SMALL_BUILD_IN_TASK_MAX_SIZE: u64 = "table.optimizer.small-build-side-in-task.max-size",
        1536 * 1024 => "1536 kb",
        "SQL, with multiple input on: a broadcast join's build side that is a plain scan pipeline over at most this many bytes of files is read inside the join's task instead of in a task of its own that broadcasts it (once per process for its subtasks, with table.exec.hash-join.read-build-side-once); 0 never.";
    /// Fluvia's key: which reader parses CSV tables.
    CSV_READER: &'static str = "table.exec.csv.reader",
        "fluvia",
        "SQL on CSV tables: 'fluvia' finds fields 16 bytes at a time, parses only the columns a query needs and drops rows by the runtime filters of the joins above before parsing the rest; 'datafusion' reads with DataFusion's CSV scan (the single-process DataFusion baseline always does).";
    /// Flink's key.
    REUSE_SOURCE: bool = "table.optimizer.reuse-source-enabled",
        true,
        "SQL: fragments that scan the same CSV files (whatever columns each keeps) and do not feed each other run as one task that reads the files once and hands every batch to each of them; its outputs are blocking exchanges.";
    /// Fluvia's key.
    SCALAR_SUBQUERY_JOIN_PUSHDOWN: bool = "table.optimizer.scalar-subquery-join-pushdown-enabled",
        true,
        "SQL: the join a scalar subquery becomes (`col = (SELECT ...)`) moves down from the top of the FROM list to the table whose column it compares, so it filters that table before the other joins instead of after them.";
    /// Fluvia's key.
    RELEASE_UNREAD_INPUTS: bool = "table.exec.release-unread-inputs",
        true,
        "SQL: an input a task stops needing (the probe side of a join whose build side came out empty, what follows a satisfied LIMIT, union branches a subtask does not run) is released: its pipelined producers drop what they would send there and end early once no consumer reads them, and a union whose branches read exchanges can be pipelined. false reads such inputs to their end (such a union then blocks).";
    /// Fluvia's key.
    SOURCE_START_ON_DEMAND: bool = "table.exec.source.start-on-demand",
        true,
        "SQL: a scan task that its consumer reads only on the probe side of a hash join that an empty build side empties (inner, left, semi, left anti), over pipelined exchanges, waits before it reads: its consumer demands it once every such join above it saw its build side deliver a row, or when it first polls it; once every consumer released it unread, it ends. Behind a build side that came out empty the scan never runs. false starts every scan at deployment.";
    /// Fluvia's key.
    END_JOIN_ON_EMPTY_PROBE: bool = "table.exec.hash-join.end-on-empty-probe",
        true,
        "SQL: a hash join whose output an empty probe side empties (inner, right, semi, right anti) and whose probe side reads exchanges under projections, filters and aggregates reads that probe side on a thread of its own once its build side delivered a row, and ends as soon as the probe side ends without a row: its build side's readers stop, its task ends and releases its inputs. false always collects the build side first.";
    /// Fluvia's key.
    SKIP_BUILD_ON_PRUNED_PROBE: bool = "table.exec.hash-join.skip-build-on-pruned-probe",
        true,
        "SQL: before a hash join whose output an empty probe side empties (inner, right, semi, right anti) collects its build side, it checks the Parquet scan its probe side reads (through projections, filters and joins an empty probe side empties) against the runtime filters the joins above it already completed: when those filters prune every row group of the task's part of the scan, the probe side is empty, and the build side is not read (nor the build sides of the joins below). false always collects the build side.";
    /// Fluvia's key.
    SPLIT_SCANS_ON_ROW_GROUPS: bool = "table.exec.parquet.split-on-row-groups",
        true,
        "SQL: a Parquet scan whose byte ranges would leave a subtask without a row group (a file of one row group split in two) gets its row groups dealt out again, whole and balanced by bytes, over at most as many subtasks as it has row groups, so no subtask starts to read nothing; false keeps DataFusion's byte ranges.";
    /// Flink's key; Fluvia's default is on (Flink's is off).
    RUNTIME_FILTER_ENABLED: bool = "table.optimizer.runtime-filter.enabled",
        true,
        "SQL, with multiple input on: a hash join whose build side is a small filtered scan pipeline and whose probe key comes, through an exchange, from a scan in another task gets a runtime filter there: every subtask of that task reads the small side and keeps only the scan's rows whose key it holds, its row groups and pages skipped by the key's bounds, before the rows are shuffled.";
    /// Flink's key and default.
    RUNTIME_FILTER_MAX_BUILD_SIZE: u64 = "table.optimizer.runtime-filter.max-build-data-size",
        10 * 1024 * 1024,
        "SQL, runtime filters: the build side's files are at most this many bytes (each subtask of the scan's task reads them whole).";
    /// Flink's key; Flink's default is 10 GB, sized for its own filter
    /// (a Bloom filter built once and shipped); here the filtered task
    /// re-reads a side of at most `max-build-data-size`, which measured no
    /// slower, within noise, on the smallest statements it fires in at
    /// SF 1 (q1, q61, q91: 60–200 ms).
    RUNTIME_FILTER_MIN_PROBE_SIZE: u64 = "table.optimizer.runtime-filter.min-probe-data-size",
        1024 * 1024,
        "SQL, runtime filters: the task of the filtered scan reads at least this many bytes of files in all (its other scans gain too: the joins the dropped rows no longer reach prune them).";
    /// Fluvia's key.
    CLUSTER_BUILD_SIDE: bool = "table.exec.hash-join.cluster-build-side",
        true,
        "SQL: a hash join's build side of at least 32K rows whose keys repeat (two or more rows per key in a sample) is reordered by key before the join builds its table, so the rows a probe row matches are neighbours in memory; false builds the table in arrival order.", unchecked;
    /// Fluvia's key.
    READ_BUILD_SIDE_ONCE: bool = "table.exec.hash-join.read-build-side-once",
        true,
        "SQL: a broadcast hash join's build side that every subtask reads whole from the same files (a dimension table kept in the join's task) is read, filtered and clustered by one subtask per process for all the others of its stage, which wait for it and never open the files; false has each subtask read its own. Needs table.exec.hash-join.cluster-build-side.";
    /// Fluvia's key; a size with a unit (`64mb`) or bytes.
    REUSE_SOURCE_MIN_SIZE: u64 = "table.optimizer.reuse-source.min-size",
        64 * 1024 * 1024 => "64 mb",
        "SQL, with source reuse on: only scans of at least this many bytes of files are shared (a small table read again costs less than the blocking exchanges a shared task writes).";
}
