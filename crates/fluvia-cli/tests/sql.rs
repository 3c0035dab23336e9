//! `fluvia sql` and `fluvia tpcds` through the binary: TPC-DS answers at
//! SF 0.1 on the embedded mini-cluster and on a cluster of processes with an
//! external shuffle service, the same answers with every
//! optimisation switched off and at other parallelisms, q96's JobGraph and
//! shuffle bytes, and errors in queries and data.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Output;

use common::{Cluster, assert_success, fluvia, get, shared, tpcds_data, tpcds_run};

/// The outcome of a `tpcds run` over all 99 queries: every statement passed.
fn assert_all_103_statements_pass(ok: bool, out: &str) {
    let summary = out.lines().last().unwrap_or_default();
    assert!(
        ok,
        "failed: {}",
        out.lines()
            .filter(|l| l.contains("FAIL"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(summary.starts_with("# 103 passed, 0 failed"), "{summary}");
}

#[test]
fn all_99_tpcds_queries_match_the_answers_at_parallelism_2() {
    let (ok, out) = tpcds_run(&["-p", "2"]);
    assert_all_103_statements_pass(ok, &out);
}

/// No `-p`: the scans run at the machine's cores and every later stage that
/// reads only exchanges gets its parallelism from the data at runtime.
#[test]
fn all_99_tpcds_queries_match_with_the_parallelism_left_to_the_adaptive_batch_scheduler() {
    let (ok, out) = tpcds_run(&[]);
    assert_all_103_statements_pass(ok, &out);
}

#[test]
fn all_99_tpcds_queries_match_on_csv_tables_with_their_declared_schemas() {
    let data = common::tpcds_csv_data().to_string_lossy().to_string();
    let o = fluvia()
        .args([
            "tpcds",
            "run",
            "--format",
            "csv",
            "--data",
            &data,
            "--queries",
        ])
        .arg(shared().join("queries"))
        .arg("--check")
        .arg(shared().join("answers/sf0.1"))
        .args(["-p", "2"])
        // Every scan shared however small: at SF 0.1 no table reaches the
        // default size, and every query that reads one twice goes through
        // source reuse.
        .args(["-D", "table.optimizer.reuse-source.min-size=0"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    println!("{out}");
    eprintln!("{err}");
    assert!(!err.contains("inferred"), "every table is declared: {err}");
    assert_all_103_statements_pass(o.status.success(), &out);
}

#[test]
fn all_99_tpcds_queries_match_on_a_cluster_with_an_external_shuffle_service() {
    let dir = tempfile::tempdir().unwrap();
    tpcds_data();
    // Default heartbeats: a loaded machine must not lose processes.
    let mut cluster = Cluster::start_with_heartbeats(
        &[],
        &["-D", "shuffle-service.type=external"],
        2,
        &["--slots", "2"],
    );
    cluster.add_shuffle_service(&dir.path().join("shuffle"));
    let (ok, out) = tpcds_run(&["-p", "2", "--jobmanager", &cluster.rpc]);
    assert_all_103_statements_pass(ok, &out);
    let jobs = get(&cluster.rest, "/jobs");
    let jobs = jobs["jobs"].as_array().unwrap();
    assert!(jobs.len() >= 99, "{} jobs", jobs.len());
    for j in jobs {
        let id = j["id"].as_str().unwrap();
        let job = get(&cluster.rest, &format!("/jobs/{id}"));
        assert_eq!(job["shuffle-service-type"], "external", "{id}");
    }
}

/// Queries covering every exchange kind, union offsets, windows, outer and
/// semi joins, rewritten scalar subqueries and a nested-loop join.
const MIX: [&str; 12] = [
    "3", "5", "14", "23", "28", "40", "49", "54", "64", "72", "78", "95",
];

fn mix_args(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v: Vec<&str> = Vec::new();
    for q in MIX {
        v.push("--query");
        v.push(q);
    }
    v.extend_from_slice(extra);
    v
}

#[test]
fn answers_do_not_depend_on_parallelism_chaining_or_multiple_input() {
    for extra in [
        &["-p", "1"][..],
        &["-p", "4"][..],
        // Scans on DataFusion's byte ranges: at SF 0.1 every table is one
        // row group, so this is where scans run several subtasks.
        &[
            "-p",
            "4",
            "-D",
            "table.exec.parquet.split-on-row-groups=false",
        ][..],
        &[
            "-p",
            "3",
            "-D",
            "table.optimizer.multiple-input-enabled=false",
        ][..],
        &["-p", "2", "-D", "pipeline.operator-chaining.enabled=false"][..],
        &[
            "-p",
            "2",
            "-D",
            "table.optimizer.join.broadcast-threshold=0",
        ][..],
        // No -p, multiple input off: forward groups of adaptive stages.
        &[
            "-D",
            "parallelism.default=3",
            "-D",
            "table.optimizer.multiple-input-enabled=false",
        ][..],
        // No -p, skewed joins split and small sides broadcast at runtime
        // wherever the data allows it.
        &[
            "-D",
            "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task=64kb",
            "-D",
            "table.optimizer.skewed-join-optimization.skewed-threshold=0",
            "-D",
            "table.optimizer.skewed-join-optimization.skewed-factor=1.5",
            "-D",
            "table.optimizer.join.broadcast-threshold=65536",
            "-D",
            "table.optimizer.adaptive-broadcast-join.strategy=RUNTIME_ONLY",
        ][..],
    ] {
        let (ok, out) = tpcds_run(&mix_args(extra));
        assert!(ok, "{extra:?}:\n{out}");
    }
}

fn sql(args: &[&str]) -> Output {
    fluvia().arg("sql").args(args).output().unwrap()
}

/// `fluvia sql` over the CSV tables of `dir` at `parallelism`, then `args`.
fn csv_sql_p(dir: &str, parallelism: &str, args: &[&str]) -> Output {
    fluvia()
        .arg("sql")
        .args(["--tables", dir, "--format", "csv", "-p", parallelism])
        .args(args)
        .output()
        .unwrap()
}

/// `fluvia sql` with `args`, which must succeed; its standard output.
fn sql_stdout(args: &[&str]) -> String {
    let o = sql(args);
    assert_success(&o);
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn q96_args(extra: &[&str]) -> Vec<String> {
    q96_args_at("2", extra)
}

fn q96_args_at(parallelism: &str, extra: &[&str]) -> Vec<String> {
    query_args("q96", parallelism, extra)
}

/// `fluvia sql` arguments running TPC-DS `query` (as `q96`) at SF 0.1.
fn query_args(query: &str, parallelism: &str, extra: &[&str]) -> Vec<String> {
    query_args_in(tpcds_data(), query, parallelism, extra)
}

/// The same over the tables in `tables` (the SF 0.1 CSV tables, say).
fn query_args_in(
    tables: &std::path::Path,
    query: &str,
    parallelism: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut v = vec![
        "--tables".to_string(),
        tables.to_string_lossy().to_string(),
        "-f".to_string(),
        shared()
            .join(format!("queries/{query}.sql"))
            .to_string_lossy()
            .to_string(),
        "-p".to_string(),
        parallelism.to_string(),
    ];
    v.extend(BYTE_RANGES.iter().map(|s| s.to_string()));
    v.extend(BROADCAST_DIMENSIONS.iter().map(|s| s.to_string()));
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// At SF 0.1 every dimension table is under the default size of a build
/// side read in its join's task: the tests of plans that are about other
/// things keep them broadcast by tasks of their own, as at larger scales.
const BROADCAST_DIMENSIONS: [&str; 2] =
    ["-D", "table.optimizer.small-build-side-in-task.max-size=0"];

/// The SF 0.1 tables are one row group each, so split on row groups every
/// scan would run one subtask: the tests of plans at a parallelism keep
/// DataFusion's byte ranges, whose scans run that many.
const BYTE_RANGES: [&str; 2] = ["-D", "table.exec.parquet.split-on-row-groups=false"];

/// `table.exec.parquet.split-on-row-groups`: at SF 0.1 every table is one
/// row group, which DataFusion's byte ranges at `-p 2` give to one subtask
/// of two; split on row groups, each scan runs the one subtask that reads
/// it, and q96 (three dimension scans and the fact scan) is one task. The
/// same answer either way.
#[test]
fn scans_of_one_row_group_run_one_subtask_instead_of_one_that_reads_nothing() {
    let tables = tpcds_data().to_string_lossy().to_string();
    let q96 = shared()
        .join("queries/q96.sql")
        .to_string_lossy()
        .to_string();
    let run = |extra: &[&str]| {
        let mut a = vec!["--tables", &tables, "-f", &q96, "-p", "2"];
        a.extend(extra);
        sql_stdout(&a)
    };
    let split = run(&["--explain"]);
    assert!(split.contains("2 operators in 1 tasks"), "{split}");
    assert!(!split.contains("parallelism 2"), "{split}");
    let ranges = run(&[&["--explain"][..], &BYTE_RANGES[..]].concat());
    assert!(ranges.contains("parallelism 2"), "{ranges}");
    assert!(!ranges.contains("in 1 tasks"), "{ranges}");
    let answer = run(&[]);
    assert!(answer.lines().count() > 1, "{answer}");
    assert_eq!(answer, run(&BYTE_RANGES));
}

#[test]
fn q96_runs_as_one_multiple_input_task_with_the_fact_scan_chained_in() {
    let args = q96_args(&["--explain"]);
    let o = sql(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let plan = String::from_utf8_lossy(&o.stdout).to_string();
    assert_success(&o);
    println!("{plan}");
    let multi: Vec<&str> = plan
        .lines()
        .filter(|l| l.contains("MultipleInput("))
        .collect();
    assert_eq!(multi.len(), 1, "{plan}");
    let m = multi[0];
    assert_eq!(m.matches("HashJoin").count(), 3, "{m}");
    assert!(m.contains("Source: store_sales"), "{m}");
    assert!(m.contains("readOrder=[0,1,2,3]"), "{m}");
    // Three dimension scans, each broadcast into the multiple-input task.
    assert_eq!(plan.matches("BROADCAST").count(), 3, "{plan}");
    for dim in ["household_demographics", "time_dim", "store"] {
        assert!(plan.contains(&format!("Source: {dim}")), "{dim} in {plan}");
    }
    assert!(
        !plan.contains("Source: store_sales ->"),
        "the fact table is not its own task"
    );
}

/// q61 (as q90) divides two aggregates, each over `store_sales` and its
/// dimensions, in a cross join of one partition. In one task the second
/// would start only once the first was done; as tasks of their own both
/// run while the cross join waits for them. The same answer as with
/// every operator a task of its own (chaining off).
#[test]
fn the_inputs_of_a_one_partition_cross_join_that_scan_run_side_by_side() {
    let explain = q61_at_1(&["--explain"]);
    let cross = explain
        .split("\n[")
        .find(|t| t.contains("CrossJoin"))
        .unwrap_or_else(|| panic!("no cross join task in {explain}"));
    assert!(cross.contains("<- [1] BROADCAST"), "{explain}");
    assert!(cross.contains("<- [2] FORWARD"), "{explain}");
    assert!(!cross.contains("Source:"), "{explain}");
    assert_eq!(
        explain.matches("Source: store_sales").count(),
        2,
        "{explain}"
    );
    let answer = q61_at_1(&[]);
    assert!(answer.lines().count() > 1, "{answer}");
    assert_eq!(
        answer,
        q61_at_1(&["-D", "pipeline.operator-chaining.enabled=false"])
    );
}

/// q44 joins each of its two rankings with a scalar subquery: an average
/// gathered from `store_sales`, then projected. The projection runs in the
/// task that computes the average, which broadcasts it to the join: no task
/// of its own between them. The same answer as with every operator a task
/// of its own (chaining off).
#[test]
fn a_projected_scalar_subquery_is_broadcast_by_the_task_that_computes_it() {
    let args = query_args("q44", "2", &["--explain"]);
    let explain = sql_stdout(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let broadcasting: Vec<&str> = explain
        .split("\n[")
        .filter(|t| {
            t.lines()
                .next()
                .is_some_and(|l| l.ends_with("Aggregate -> Projection"))
        })
        .collect();
    assert_eq!(broadcasting.len(), 2, "{explain}");
    for t in &broadcasting {
        assert!(t.contains("parallelism 2"), "{explain}");
    }
    assert_eq!(explain.matches("BROADCAST").count(), 2, "{explain}");
    assert!(!explain.contains("] Projection\n"), "{explain}");
    // q44 finds no rows at SF 0.1: the same shape, with rows.
    let statement = "select ss_store_sk, avg(ss_net_profit) p from store_sales \
        group by ss_store_sk having avg(ss_net_profit) >= (select avg(ss_net_profit) r \
        from store_sales where ss_store_sk = 1 group by ss_store_sk) order by ss_store_sk";
    let run = |extra: &[&str]| {
        let data = tpcds_data().to_string_lossy().to_string();
        let mut args = vec!["--tables", &data, "-p", "2", "-e", statement];
        args.extend(BYTE_RANGES);
        args.extend(extra);
        sql_stdout(&args)
    };
    let plan = run(&["--explain"]);
    assert!(plan.contains("] Aggregate -> Projection\n"), "{plan}");
    assert!(plan.contains("BROADCAST"), "{plan}");
    let fused = run(&[]);
    assert!(fused.starts_with("ss_store_sk,p\n1,"), "{fused}");
    assert_eq!(
        fused,
        run(&["-D", "pipeline.operator-chaining.enabled=false"])
    );
}

fn q61_at_1(extra: &[&str]) -> String {
    let args = query_args("q61", "1", extra);
    sql_stdout(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn q72_args(extra: &[&str]) -> Vec<String> {
    query_args("q72", "2", extra)
}

/// q72 joins `catalog_sales` with `inventory` below five joins (dates,
/// demographics, items) whose runtime filters DataFusion pushes into both
/// scans; whichever of the two is the broadcast build side (the smaller at
/// this scale) is read inside the task of those joins, where the filters
/// prune it, instead of being broadcast from a task of its own before they
/// exist. Same answer both ways, fewer bytes exchanged.
#[test]
fn q72_reads_its_filtered_build_side_in_the_task_of_the_joins_that_filter_it() {
    const OFF: &str = "table.optimizer.runtime-filter.build-side-in-task=false";
    let explain = |extra: &[&str]| {
        let mut a = q72_args(&["--explain"]);
        a.extend(extra.iter().map(|s| s.to_string()));
        sql_stdout(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // Tables scanned by a task of their own: `[n] Source: t[ -> ...]`.
    let own_tasks = |plan: &str| -> Vec<String> {
        plan.lines()
            .filter(|l| l.starts_with('['))
            .filter_map(|l| l.split_once("] Source: "))
            .map(|(_, rest)| rest.split(' ').next().unwrap_or_default().to_string())
            .collect()
    };
    let on = explain(&[]);
    let off = explain(&["-D", OFF]);
    println!("{on}\n{off}");
    let multi = on
        .lines()
        .find(|l| l.contains("MultipleInput("))
        .unwrap_or_else(|| panic!("no multiple-input task in {on}"));
    let kept: Vec<String> = own_tasks(&off)
        .into_iter()
        .filter(|t| !own_tasks(&on).contains(t))
        .collect();
    assert_eq!(
        kept.len(),
        1,
        "one build side moves into the task: {kept:?}"
    );
    assert!(
        ["catalog_sales", "inventory"].contains(&kept[0].as_str()),
        "{kept:?}"
    );
    assert!(multi.contains(&format!("Source: {}", kept[0])), "{multi}");

    let run = |extra: &[&str]| {
        let mut a = q72_args(&["--stats"]);
        a.extend(extra.iter().map(|s| s.to_string()));
        rows_and_network_bytes(&a)
    };
    let (rows_on, bytes_on) = run(&[]);
    let (rows_off, bytes_off) = run(&["-D", OFF]);
    assert!(rows_on.lines().count() > 1, "{rows_on}");
    assert_eq!(rows_on, rows_off);
    assert!(
        bytes_on * 2 < bytes_off,
        "in the task {bytes_on} bytes exchanged, broadcast {bytes_off}"
    );
}

/// With q72's small build sides (dates, items, demographics) read in the
/// join's task too, the task first waits on its own scans. The build side
/// that the joins above filter (`inventory` at this scale, split in two file
/// ranges so that it is gathered) must still open its files only once its
/// join asks for it, when those joins have built their tables and their
/// filters are complete: started with the task's other scans it read every
/// row of `catalog_sales` at SF 1 and q72 took 4× longer. Same answer.
#[test]
fn a_gathered_filtered_build_side_in_the_task_starts_when_its_join_asks() {
    let run = |extra: &[&str]| {
        let mut a = q72_args(&[]);
        a.extend(extra.iter().map(|s| s.to_string()));
        let o = fluvia()
            .arg("sql")
            .args(&a)
            .env("RUST_LOG", "fluvia_sql::job=debug")
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{err}");
        (String::from_utf8_lossy(&o.stdout).to_string(), err)
    };
    let (rows, err) = run(&[
        "-D",
        "table.optimizer.small-build-side-in-task.max-size=100000000",
        "-D",
        "datafusion.optimizer.repartition_file_min_size=1",
    ]);
    // Each subtask's plan, one operator per line, children indented: a
    // scan with runtime filters gathered below its join.
    let lines: Vec<&str> = err.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut kept = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !(l.trim_start().starts_with("DataSourceExec") && l.contains("DynamicFilter")) {
            continue;
        }
        let mut depth = indent(l);
        let (mut gathered, mut deferred) = (false, false);
        for above in lines[..i].iter().rev() {
            if indent(above) < depth {
                depth = indent(above);
                let op = above.trim_start();
                if op.starts_with("HashJoinExec") {
                    break;
                }
                gathered |= op.starts_with("CoalescePartitionsExec");
                deferred |= op.starts_with("DeferredExec");
            }
        }
        if gathered {
            kept.push((deferred, *l));
        }
    }
    assert!(!kept.is_empty(), "no gathered filtered build side: {err}");
    for (deferred, scan) in &kept {
        assert!(
            deferred,
            "a filtered build side starts with the task: {scan}"
        );
    }
    let (default_rows, _) = run(&[]);
    assert!(rows.lines().count() > 1, "{rows}");
    assert_eq!(rows, default_rows);
}

/// `table.optimizer.small-build-side-in-task.max-size` (0 here unless
/// set again): q96's three small dimension scans are read by the join's
/// task instead of three tasks that broadcast them (5 tasks → 2); same
/// answer.
#[test]
fn small_build_sides_are_read_in_the_joins_task() {
    const SMALL: &str = "table.optimizer.small-build-side-in-task.max-size=100000000";
    let explain = |extra: &[&str]| {
        let plan = sql_stdout(
            &q96_args(&[&["--explain"], extra].concat())
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        let tasks = plan.lines().filter(|l| l.starts_with('[')).count();
        (plan, tasks)
    };
    let (plan_on, on) = explain(&["-D", SMALL]);
    let (plan_off, off) = explain(&[]);
    assert!(on < off, "{plan_on}\n{plan_off}");
    let multi = plan_on
        .lines()
        .find(|l| l.contains("MultipleInput("))
        .unwrap_or_else(|| panic!("{plan_on}"));
    for table in ["store", "time_dim", "household_demographics"] {
        assert!(multi.contains(&format!("Source: {table}")), "{multi}");
    }
    let (rows_on, _) = rows_and_network_bytes(&q96_args(&["--stats", "-D", SMALL]));
    let (rows_off, _) = rows_and_network_bytes(&q96_args(&["--stats"]));
    assert_eq!(rows_on, rows_off);
}

/// A left semi join whose rows only feed a GROUP BY is broadcast (its
/// small build side to every subtask of the big probe side, which is then
/// read where it is and not shuffled): a build row that two subtasks both
/// matched is emitted twice and makes the same group. Counted instead of
/// grouped, it stays partitioned. Both answer as one subtask does.
#[test]
fn a_semi_join_feeding_only_a_group_by_is_broadcast() {
    const EXISTS: &str = "EXISTS (SELECT 1 FROM store_sales \
        WHERE ss_item_sk = i_item_sk AND ss_quantity > 95)";
    let grouped = format!("SELECT i_brand FROM item WHERE {EXISTS} GROUP BY i_brand");
    let counted = format!("SELECT count(*) AS n FROM item WHERE {EXISTS}");
    let tables = tpcds_data().to_string_lossy().to_string();
    let run = |statement: &str, p: &str, extra: &[&str]| {
        let mut a = vec!["--tables", &tables, "-p", p, "-e", statement];
        a.extend(BYTE_RANGES);
        a.extend(BROADCAST_DIMENSIONS);
        a.extend(extra);
        let o = sql(&a);
        assert_success(&o);
        let mut lines: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(String::from)
            .collect();
        lines.sort();
        lines
    };
    let plan = run(&grouped, "2", &["--explain"]).join("\n");
    assert!(
        plan.contains("HashJoin[LeftSemi, CollectLeft]") && plan.contains("BROADCAST"),
        "{plan}"
    );
    let plan = run(&counted, "2", &["--explain"]).join("\n");
    assert!(plan.contains("HashJoin[LeftSemi, Partitioned]"), "{plan}");
    for statement in [&grouped, &counted] {
        let two = run(statement, "2", &[]);
        assert!(two.len() > 1, "{two:?}");
        assert_eq!(two, run(statement, "1", &[]), "{statement}");
    }
}

/// On CSV, Fluvia's reader takes the runtime filters of the joins above a
/// scan and drops rows while it parses, so q72's `catalog_sales` is read in
/// the task of the joins that filter it, as on Parquet; DataFusion's reader
/// declines the filters and the whole table is broadcast.
#[test]
fn q72_on_csv_filters_catalog_sales_while_it_is_parsed() {
    let data = common::tpcds_csv_data();
    let run = |extra: &[&str]| {
        let mut a = query_args_in(data, "q72", "2", &["--format", "csv", "--stats"]);
        a.extend(extra.iter().map(|s| s.to_string()));
        rows_and_network_bytes(&a)
    };
    let (rows, bytes) = run(&[]);
    let (df_rows, df_bytes) = run(&["-D", "table.exec.csv.reader=datafusion"]);
    assert!(rows.lines().count() > 1, "{rows}");
    assert_eq!(rows, df_rows);
    assert!(
        bytes * 2 < df_bytes,
        "filtered while parsed {bytes} bytes exchanged, DataFusion's reader {df_bytes}"
    );
    let data = data.to_string_lossy().to_string();
    let o = sql(&[
        "--tables",
        &data,
        "--format",
        "csv",
        "-e",
        "SELECT 1",
        "-D",
        "table.exec.csv.reader=pandas",
    ]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success());
    assert!(
        err.contains("table.exec.csv.reader must be 'fluvia' or 'datafusion', not 'pandas'"),
        "{err}"
    );
}

/// Source reuse: q9's fifteen scans of `store_sales` run as one task that
/// reads the table once, chained to each subquery's filter and aggregate;
/// its single-row outputs stay pipelined, while q4's shared scans, whose
/// outputs are large and meet again, write blocking partitions. Answers are
/// right on two TaskManagers, blocking or not, and on a cluster of processes.
#[test]
fn source_reuse_reads_a_table_once_for_every_fragment_that_scans_it() {
    let data = common::tpcds_csv_data();
    let explain = |query: &str, extra: &[&str]| {
        let mut a = query_args_in(data, query, "2", &["--format", "csv", "--explain"]);
        a.extend(["-D", "table.optimizer.reuse-source.min-size=0"].map(String::from));
        a.extend(extra.iter().map(|s| s.to_string()));
        sql_stdout(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let on = explain("q9", &[]);
    println!("{on}");
    assert!(on.contains("in 2 tasks"), "{on}");
    let shared_task = on
        .lines()
        .find(|l| l.contains("Source: store_sales -> (Filter -> Aggregate, "))
        .unwrap_or_else(|| panic!("one task scans store_sales: {on}"));
    assert_eq!(
        shared_task.matches("Aggregate").count(),
        15,
        "{shared_task}"
    );
    assert_eq!(on.matches("GLOBAL (pipelined_bounded)").count(), 15, "{on}");
    let off = explain("q9", &["-D", "table.optimizer.reuse-source-enabled=false"]);
    assert_eq!(off.matches("Source: store_sales").count(), 15, "{off}");
    let q4 = explain("q4", &[]);
    assert!(q4.contains("(blocking)"), "{q4}");
    assert!(q4.contains("[Source: store_sales], MultipleInput"), "{q4}");

    let data = data.to_string_lossy().to_string();
    // And on a cluster of processes: blocking, two TaskManagers.
    let cluster = Cluster::start(&[], 2, &["--slots", "2"]);
    for extra in [
        &["-D", "local.number-taskmanager=2"][..],
        &["-D", "execution.batch-shuffle-mode=ALL_EXCHANGES_BLOCKING"][..],
        &["--jobmanager", cluster.rpc.as_str()][..],
    ] {
        let o = fluvia()
            .args(["tpcds", "run", "--format", "csv", "--data", &data])
            .arg("--queries")
            .arg(shared().join("queries"))
            .arg("--check")
            .arg(shared().join("answers/sf0.1"))
            .args(["-p", "2", "-D", "table.optimizer.reuse-source.min-size=0"])
            .args([
                "--query", "9", "--query", "28", "--query", "88", "--query", "4",
            ])
            .args(extra)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(o.status.success(), "{extra:?}: {out}");
        assert!(out.contains("# 4 passed, 0 failed"), "{extra:?}: {out}");
    }
}

/// `execution.batch-shuffle-mode`: AUTO pipelines a query at a fixed
/// parallelism on the embedded mini-cluster, a union whose branches read
/// exchanges too (q76) unless the inputs of other branches are read to the
/// end; Flink's ALL_EXCHANGES_BLOCKING keeps blocking partitions; a bad
/// value is an error naming the key.
#[test]
fn sql_exchanges_are_pipelined_where_blocking_buys_nothing() {
    let explain = |query: &str, extra: &[&str]| {
        let mut a = query_args(query, "2", &["--explain"]);
        a.extend(extra.iter().map(|s| s.to_string()));
        sql(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let modes = |o: &Output| {
        assert_success(o);
        let plan = String::from_utf8_lossy(&o.stdout).to_string();
        (
            plan.matches("(pipelined_bounded)").count(),
            plan.matches("(blocking)").count(),
        )
    };
    // `query` with `extra` has at least `exchanges` exchanges, all
    // pipelined or all blocking.
    let assert_all = |query: &str, extra: &[&str], exchanges: usize, pipelined: bool| {
        let (p, b) = modes(&explain(query, extra));
        let (all, none) = if pipelined { (p, b) } else { (b, p) };
        assert!(
            all >= exchanges && none == 0,
            "{query} {extra:?}: {p} pipelined, {b} blocking"
        );
    };
    assert_all("q96", &[], 4, true);
    let blocking = ["-D", "execution.batch-shuffle-mode=ALL_EXCHANGES_BLOCKING"];
    assert_all("q96", &blocking, 4, false);
    // Each subtask of q76's union runs one branch and releases the other
    // branches' inputs at its start, so none waits for it: pipelined. Read
    // to the end instead, they would deadlock, so they block.
    assert_all("q76", &[], 6, true);
    assert_all(
        "q76",
        &["-D", "table.exec.release-unread-inputs=false"],
        6,
        false,
    );
    let o = explain("q96", &["-D", "execution.batch-shuffle-mode=SOMETIMES"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("execution.batch-shuffle-mode"), "{err}");
}

/// Runs `fluvia sql` with `args` (which include `--stats`): its result rows
/// and the bytes its tasks exchanged.
/// The run of `early` (inputs ended early) gives the rows, a zero among
/// them, of the run of `full` (everything read), which sends more than
/// `full_at_least` bytes over the network, over twice what `early` sends:
/// the rows and bytes of `full`.
fn ending_early_sends_less(early: &[String], full: &[String], full_at_least: u64) -> (String, u64) {
    let (early_rows, early_bytes) = rows_and_network_bytes(early);
    let (full_rows, full_bytes) = rows_and_network_bytes(full);
    assert_eq!(early_rows, full_rows);
    assert!(early_rows.contains("\n0,"), "{early_rows}");
    assert!(full_bytes > full_at_least, "{full_bytes}");
    assert!(
        early_bytes * 2 < full_bytes,
        "ended early {early_bytes} bytes, read to the end {full_bytes}"
    );
    (full_rows, full_bytes)
}

fn rows_and_network_bytes(args: &[String]) -> (String, u64) {
    let o = sql(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    (
        String::from_utf8_lossy(&o.stdout).to_string(),
        network_bytes(&err),
    )
}

fn network_bytes(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("network total: "))
        .and_then(|s| s.trim_end_matches(" bytes").parse().ok())
        .unwrap_or_else(|| panic!("no stats in {stderr}"))
}

#[test]
fn multiple_input_and_chaining_save_network_bytes_with_equal_results() {
    let mut results = Vec::new();
    let mut bytes = Vec::new();
    for extra in [
        &[][..],
        &["-D", "table.optimizer.multiple-input-enabled=false"][..],
        &["-D", "pipeline.operator-chaining.enabled=false"][..],
    ] {
        // q96 counts no row at SF 0.1: an empty build side. Its probe
        // inputs, released, would send however much their producers wrote
        // before the join gave up; read to the end, the bytes are the plan's.
        let mut a = q96_args(&["--stats", "-D", "table.exec.release-unread-inputs=false"]);
        a.extend(extra.iter().map(|s| s.to_string()));
        let (rows, sent) = rows_and_network_bytes(&a);
        println!("{extra:?}: {sent} bytes");
        results.push(rows);
        bytes.push(sent);
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
    assert!(
        bytes[0] * 10 < bytes[1],
        "multiple input on {} bytes vs off {}",
        bytes[0],
        bytes[1]
    );
    assert!(
        bytes[1] <= bytes[2],
        "chaining off moves the most: {bytes:?}"
    );
}

#[test]
fn parallelism_1_runs_q96_in_one_task_without_network_bytes() {
    let o = sql(&q96_args_at("1", &["--stats"])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    assert_eq!(network_bytes(&err), 0, "{err}");
    let o = sql(&q96_args_at("1", &["--explain"])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    let plan = String::from_utf8_lossy(&o.stdout);
    assert!(plan.contains("in 1 tasks"), "{plan}");
}

#[test]
fn query_errors_exit_with_2_and_name_the_problem() {
    let data = tpcds_data().to_string_lossy().to_string();
    for (q, expect) in [
        ("selec 1", "selec"),
        ("select nope from store", "nope"),
        ("select * from no_such_table", "no_such_table"),
        ("select count(*) from store where s_store_sk = ", "Expected"),
    ] {
        let o = sql(&["--tables", &data, "-e", q]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{q}: {err}");
        assert!(err.contains(expect), "{q}: {err}");
    }
}

#[test]
fn a_malformed_csv_row_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("t")).unwrap();
    std::fs::write(dir.path().join("t/part.csv"), "a,b\n1,2\n3,4\n5,6,7\n").unwrap();
    let d = dir.path().to_string_lossy().to_string();
    let o = sql(&[
        "--tables",
        &d,
        "--format",
        "csv",
        "-e",
        "select sum(a) from t",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("part.csv") && err.contains("line 4"), "{err}");
}

#[test]
fn csv_tables_give_the_same_result_as_parquet() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("t")).unwrap();
    let mut text = String::from("k,v,name\n");
    for i in 0..1000 {
        text.push_str(&format!("{},{},\"n, {}\"\n", i % 7, i, i % 3));
    }
    std::fs::write(dir.path().join("t/t.csv"), text).unwrap();
    let d = dir.path().to_string_lossy().to_string();
    let q = "select k, name, count(*) c, sum(v) s from t group by k, name order by k, name";
    let o = csv_sql_p(&d, "2", &["-e", q]);
    assert_success(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "k,name,c,s");
    assert_eq!(lines.len(), 1 + 21);
    // k=0, name "n, 0": i ≡ 0 mod 21 → 48 values 0, 21, ..., 987.
    let sum: u64 = (0..1000u64).filter(|i| i % 21 == 0).sum();
    assert_eq!(lines[1], format!("0,\"n, 0\",48,{sum}"));
}

/// Tables `a(k, v)` (large) and `b(k, w)`, as CSV.
fn small_tables() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, rows) in [("a", 5000), ("b", 3000)] {
        std::fs::create_dir(dir.path().join(name)).unwrap();
        let mut text = format!("k,{}\n", if name == "a" { "v" } else { "w" });
        for i in 0..rows {
            text.push_str(&format!("{},{}\n", i % 97, i));
        }
        std::fs::write(dir.path().join(name).join(format!("{name}.csv")), text).unwrap();
    }
    dir
}

#[test]
fn an_aggregate_feeding_a_join_on_its_key_is_not_shuffled_again() {
    let dir = small_tables();
    let d = dir.path().to_string_lossy().to_string();
    // Both sides hash-partitioned (no broadcast): the aggregate's output is
    // already partitioned on k, so only b is shuffled for the join.
    let q = "select s.k, s.total, count(*) from (select k, sum(v) total from a group by k) s \
             join b on s.k = b.k group by s.k, s.total";
    // Over the CSV tables at parallelism 2, never broadcasting; `extra`
    // before the query.
    let run_q = |extra: &[&str]| {
        let mut args = vec!["-D", "table.optimizer.join.broadcast-threshold=0"];
        args.extend_from_slice(extra);
        args.extend(["-e", q]);
        csv_sql_p(&d, "2", &args)
    };
    let o = run_q(&["--explain"]);
    let plan = String::from_utf8_lossy(&o.stdout).to_string();
    assert_success(&o);
    // a -> final aggregate, b -> join; the join's output is partitioned on
    // s.k already, so the outer group by needs no exchange either.
    assert_eq!(plan.matches("HASH").count(), 2, "{plan}");
    assert_eq!(plan.matches("BROADCAST").count(), 0, "{plan}");
    let run = run_q(&[]);
    assert_success(&run);
    let out = String::from_utf8_lossy(&run.stdout);
    assert_eq!(out.lines().count(), 1 + 97);
}

#[test]
fn a_left_join_with_a_small_preserved_side_is_not_broadcast_and_counts_once() {
    let dir = small_tables();
    std::fs::create_dir(dir.path().join("c")).unwrap();
    let mut text = String::from("ck\n");
    for k in (0..10).chain(200..210) {
        text.push_str(&format!("{k}\n"));
    }
    std::fs::write(dir.path().join("c/c.csv"), text).unwrap();
    let d = dir.path().to_string_lossy().to_string();
    let q = "select count(*) n, count(v) matched from c left join a on ck = k";
    // Keys 0..9 match 52 rows of a each (i % 97 over 0..5000); 200..209 match none.
    let expected = format!("n,matched\n{},{}\n", 10 * 52 + 10, 10 * 52);
    for p in ["1", "2", "4"] {
        let o = csv_sql_p(&d, p, &["-e", q]);
        assert_success(&o);
        assert_eq!(String::from_utf8_lossy(&o.stdout), expected, "p={p}");
    }
    let o = csv_sql_p(&d, "2", &["--explain", "-e", q]);
    let plan = String::from_utf8_lossy(&o.stdout);
    assert!(plan.contains("HashJoin[Left, Partitioned]"), "{plan}");
    assert!(!plan.contains("BROADCAST"), "{plan}");
}

/// Every file under `dir`, relative, sorted.
fn files_under(dir: &std::path::Path) -> Vec<String> {
    fn walk(base: &std::path::Path, d: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().to_string_lossy().to_string());
            }
        }
    }
    let mut out = Vec::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out.sort();
    out
}

#[test]
fn copy_to_writes_through_staged_files_renamed_into_place_when_the_job_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let data = tpcds_data().to_string_lossy().to_string();
    // One file.
    let one = dir.path().join("years.csv");
    let q = format!(
        "COPY (SELECT d_year, count(*) AS n FROM date_dim GROUP BY d_year ORDER BY d_year) \
         TO '{}' STORED AS CSV",
        one.display()
    );
    let o = sql(&["--tables", &data, "-p", "2", "-e", &q]);
    assert_success(&o);
    let select = sql(&[
        "--tables",
        &data,
        "-e",
        "SELECT d_year, count(*) AS n FROM date_dim GROUP BY d_year ORDER BY d_year",
    ]);
    assert_eq!(
        std::fs::read_to_string(&one).unwrap(),
        String::from_utf8_lossy(&select.stdout),
        "the file holds the query's rows"
    );
    assert_eq!(
        files_under(dir.path()),
        vec!["years.csv"],
        "no staged leftovers"
    );

    // A directory, partitioned: every file committed, none hidden.
    let parts = dir.path().join("by_year");
    let q = format!(
        "COPY (SELECT d_date_sk, d_year FROM date_dim WHERE d_year BETWEEN 1990 AND 1999) \
         TO '{}/' STORED AS PARQUET PARTITIONED BY (d_year)",
        parts.display()
    );
    let o = sql(&["--tables", &data, "-p", "2", "-e", &q]);
    assert_success(&o);
    let files = files_under(&parts);
    assert_eq!(files.len(), 10, "{files:?}");
    assert!(
        files
            .iter()
            .all(|f| f.starts_with("d_year=199") && !f.contains("/.")),
        "{files:?}"
    );
}

/// `fluvia sql` over the CSV tables of `dir`.
fn csv_sql(dir: &str, query: &str) -> Output {
    sql(&["--tables", dir, "--format", "csv", "-e", query])
}

#[test]
fn a_declared_csv_schema_is_used_and_a_row_that_does_not_fit_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("zips");
    std::fs::create_dir(&t).unwrap();
    // Inferred, "00501" would be the integer 501.
    std::fs::write(
        t.join("_schema.json"),
        r#"{"fields": [{"name": "zip", "type": "Utf8"}, {"name": "n", "type": "Int64"}]}"#,
    )
    .unwrap();
    std::fs::write(t.join("a.csv"), "zip,n\n00501,1\n10001,2\n").unwrap();
    let d = dir.path().to_string_lossy().to_string();
    let o = csv_sql(
        &d,
        "select substr(zip, 1, 3) p, sum(n) s from zips group by p order by p",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("inferred"), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "p,s\n005,1\n100,2\n");

    // A table without a schema file is inferred, and the client says so.
    let u = dir.path().join("guessed");
    std::fs::create_dir(&u).unwrap();
    std::fs::write(u.join("a.csv"), "k\n1\n").unwrap();
    let o = csv_sql(&d, "select count(*) from guessed");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("guessed") && err.contains("inferred"), "{err}");

    // A value that does not fit its declared type: file, line and column.
    std::fs::write(t.join("b.csv"), "zip,n\n20001,3\n20002,three\n").unwrap();
    let o = csv_sql(&d, "select sum(n) from zips");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("b.csv") && err.contains("line 3") && err.contains("'n'"),
        "{err}"
    );
}

/// `fluvia sql` arguments running `query` over the SF 0.1 tables at
/// parallelism 2 with every join partitioned (no broadcast) and the bytes
/// exchanged printed, then `extra`.
fn partitioned_join_args(data: &str, query: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--tables",
        data,
        "-p",
        "2",
        "--stats",
        "-D",
        "table.optimizer.join.broadcast-threshold=0",
        "-e",
        query,
    ]
    .map(String::from)
    .to_vec();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Runs an `--explain` variant of such arguments (without `--stats`).
fn explain_without_stats(mut args: Vec<String>) -> Output {
    args.retain(|a| a != "--stats");
    sql(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// A hash join whose build side comes out empty never reads its probe
/// side. With `table.exec.release-unread-inputs` (the default) the join
/// releases that input, and the scan feeding it ends early instead of
/// shipping the whole fact table to be thrown away; off, the join reads it
/// to the end. Same answer either way: on the embedded mini-cluster, on two
/// embedded TaskManagers (released over TCP) and on a cluster of processes.
#[test]
fn a_join_whose_build_side_is_empty_releases_its_probe_input_and_the_scan_ends_early() {
    let data = tpcds_data().to_string_lossy().to_string();
    let q = "select count(*), sum(ss_net_paid) from store_sales join item \
             on ss_item_sk = i_item_sk where i_category = 'No such category'";
    let args = |extra: &[&str]| partitioned_join_args(&data, q, extra);
    // Both sides hash-partitioned: store_sales reaches the join through an
    // exchange of its own.
    let o = explain_without_stats(args(&["--explain"]));
    let plan = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(plan.contains("] Source: store_sales\n"), "{plan}");
    assert_eq!(
        plan.matches("HASH (pipelined_bounded)").count(),
        2,
        "{plan}"
    );

    // Read to the end, the probe side is the projected fact table (about
    // 4.9 MB at SF 0.1); released, at most what the scan wrote before the
    // join gave up: its output pool (12 buffers of 32 KiB) and a batch, per
    // subtask, about 1 MB in all.
    let (drained_rows, drained_bytes) = ending_early_sends_less(
        &args(&[]),
        &args(&["-D", "table.exec.release-unread-inputs=false"]),
        4_000_000,
    );

    let cluster = Cluster::start(&[], 2, &["--slots", "4"]);
    for extra in [
        &["-D", "local.number-taskmanager=2"][..],
        &[
            "--jobmanager",
            cluster.rpc.as_str(),
            "-D",
            "execution.batch-shuffle-mode=ALL_EXCHANGES_PIPELINED",
        ][..],
    ] {
        let (rows, bytes) = rows_and_network_bytes(&args(extra));
        assert_eq!(rows, drained_rows, "{extra:?}");
        assert!(bytes * 2 < drained_bytes, "{extra:?}: {bytes} bytes");
    }
}

/// Bytes the `--stats` line of the edge out of `producer` reports.
fn edge_bytes(stderr: &str, producer: &str) -> u64 {
    stderr
        .lines()
        .find(|l| l.contains(&format!("{producer}  =>")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("no edge out of {producer} in {stderr}"))
}

/// A scan its consumer reads only after another input starts on the
/// consumer's first poll (`table.exec.source.start-on-demand`, the
/// default): behind a join whose build side came out empty, the probe
/// side's `store_sales` scan never reads a row and ships nothing, where a
/// scan started at deployment ships what its pool holds before the join
/// releases it. The first poll reaches the producer locally, over TCP
/// between two embedded TaskManagers, and between TaskManager processes.
#[test]
fn a_scan_read_after_an_empty_build_side_never_starts() {
    let data = tpcds_data().to_string_lossy().to_string();
    // The build side, written first and kept first, is `catalog_sales`
    // under a filter no statistics can prune and no row passes: it comes
    // out empty only after a whole scan, time enough for a `store_sales`
    // scan started at deployment to ship.
    let q = "select count(*), sum(ss_net_paid) from \
             (select cs_item_sk from catalog_sales where cs_net_paid * 2 < -1) t \
             join store_sales on ss_item_sk = t.cs_item_sk";
    let run = |extra: &[&str]| {
        let keep_order = ["-D", "datafusion.optimizer.join_reordering=false"];
        let args = partitioned_join_args(&data, q, &[&keep_order[..], extra].concat());
        let o = sql(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{err}");
        let rows = String::from_utf8_lossy(&o.stdout).to_string();
        (rows, edge_bytes(&err, "Source: store_sales"))
    };
    let (eager_rows, eager_bytes) = run(&["-D", "table.exec.source.start-on-demand=false"]);
    assert!(eager_rows.contains("\n0,"), "{eager_rows}");
    assert!(eager_bytes > 0, "the eager scan shipped nothing");
    let cluster = Cluster::start(&[], 2, &["--slots", "4"]);
    for extra in [
        &[][..],
        &["-D", "local.number-taskmanager=2"][..],
        &[
            "--jobmanager",
            cluster.rpc.as_str(),
            "-D",
            "execution.batch-shuffle-mode=ALL_EXCHANGES_PIPELINED",
        ][..],
    ] {
        let (rows, bytes) = run(extra);
        assert_eq!(rows, eager_rows, "{extra:?}");
        assert_eq!(bytes, 0, "{extra:?}: the store_sales scan shipped data");
    }
}

/// The other way round: a hash join whose probe side comes out empty stops
/// reading its build side (`table.exec.hash-join.end-on-empty-probe`, the
/// default). Here the build side is `store_sales`, hash-partitioned to the
/// join, and the probe side an aggregate of `item` whose HAVING keeps no
/// group: the join ends once the probe side did, its build side's channels
/// are released and the `store_sales` scans end early instead of shipping
/// the fact table to a join that can output nothing. Off, the join reads
/// its whole build side first. Same answer either way.
#[test]
fn a_join_whose_probe_side_is_empty_stops_reading_its_build_side() {
    let data = tpcds_data().to_string_lossy().to_string();
    // Six columns of store_sales: a build side far longer to ship than the
    // probe side takes to come out empty.
    let q = "select count(*), sum(ss_net_paid * c + ss_sales_price + ss_ext_tax \
             + ss_coupon_amt + ss_list_price) from store_sales join \
             (select i_item_sk, count(*) c from item group by i_item_sk having count(*) > 1) t \
             on ss_item_sk = t.i_item_sk";
    // The join keeps the order written: store_sales builds.
    let args = |extra: &[&str]| {
        let keep_order = ["-D", "datafusion.optimizer.join_reordering=false"];
        partitioned_join_args(&data, q, &[&keep_order[..], extra].concat())
    };
    let o = explain_without_stats(args(&["--explain"]));
    let plan = String::from_utf8_lossy(&o.stdout).to_string();
    // The first input of the join's task (its build side) is store_sales.
    let source = plan
        .lines()
        .find_map(|l| l.strip_suffix("] Source: store_sales"))
        .unwrap_or_else(|| panic!("{plan}"));
    let join = plan
        .split("\n[")
        .find(|t| t.contains("HashJoin[Inner, Partitioned]"))
        .unwrap_or_else(|| panic!("{plan}"));
    let first_input = join.lines().find(|l| l.contains("<- [")).unwrap_or("");
    assert!(
        first_input.contains(&format!("<- [{}]", source.trim_start_matches('['))),
        "{plan}"
    );

    // Read to the end, the build side is the projected fact table (about
    // 20 MB at SF 0.1); stopped, what the scans wrote before the item
    // aggregate ended (about 3 MB).
    ending_early_sends_less(
        &args(&[]),
        &args(&["-D", "table.exec.hash-join.end-on-empty-probe=false"]),
        15_000_000,
    );
}

/// q18 joins `catalog_sales` with `date_dim` (`d_year = 2001`) only in the
/// task after the exchange its `customer` joins feed. The runtime filter
/// plants the filtered `date_dim` as a semi join over the `catalog_sales`
/// scan in the scan's own task, so the rows of other years are dropped
/// before that exchange.
#[test]
fn a_runtime_filter_drops_probe_rows_in_the_scan_task_before_the_exchange() {
    let explain = sql(&query_args("q18", "2", &["--explain"])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    let plan = String::from_utf8_lossy(&explain.stdout).to_string();
    assert!(explain.status.success(), "{plan}");
    let scan_task = plan
        .lines()
        .find(|l| l.contains("Source: catalog_sales"))
        .unwrap_or_else(|| panic!("no catalog_sales task in {plan}"));
    assert!(
        scan_task.contains("HashJoin[RightSemi, CollectLeft]")
            && scan_task.contains("Source: date_dim"),
        "{scan_task}"
    );
    let mut results = Vec::new();
    let mut bytes = Vec::new();
    for on in ["true", "false"] {
        // Released inputs end on the consumer's timing; read to the end,
        // the bytes are the plan's.
        let (rows, sent) = rows_and_network_bytes(&query_args(
            "q18",
            "2",
            &[
                "--stats",
                "-D",
                "table.exec.release-unread-inputs=false",
                "-D",
                &format!("table.optimizer.runtime-filter.enabled={on}"),
            ],
        ));
        println!("runtime filter {on}: {sent} bytes");
        results.push(rows);
        bytes.push(sent);
    }
    assert_eq!(results[0], results[1]);
    assert!(!results[0].trim().is_empty());
    assert!(
        bytes[0] * 10 < bytes[1] * 9,
        "with the filter {} bytes, without {}",
        bytes[0],
        bytes[1]
    );
}
