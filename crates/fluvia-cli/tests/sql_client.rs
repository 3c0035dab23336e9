//! `fluvia sql` as a SQL client: sessions with DDL, INSERT INTO, SET and
//! RESET, EXPLAIN, and the interactive prompt driven through a
//! pseudo-terminal.

#![allow(clippy::unwrap_used)]

mod common;

use common::fluvia;
use std::path::{Path, PathBuf};
use std::process::Output;

fn sql(args: &[&str]) -> Output {
    fluvia().arg("sql").args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// A temporary directory with [`orders`] in it.
fn orders_in_temp(files: usize, rows: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = orders(dir.path(), files, rows);
    (dir, path)
}

/// `n` header-less CSV files of `rows` lines each: `id,zip,qty` with zip
/// codes that keep their leading zeros only as strings.
fn orders(dir: &Path, files: usize, rows: usize) -> PathBuf {
    let d = dir.join("orders");
    std::fs::create_dir_all(&d).unwrap();
    for f in 0..files {
        let mut text = String::new();
        for r in 0..rows {
            let id = f * rows + r;
            text.push_str(&format!("{id},{:05},{}\n", id % 97, id % 7));
        }
        std::fs::write(d.join(format!("orders-{f}.csv")), text).unwrap();
    }
    d
}

fn create_orders(path: &Path) -> String {
    format!(
        "CREATE TABLE orders (id BIGINT NOT NULL, zip STRING, qty INT) WITH (\
         'connector' = 'filesystem', 'path' = '{}', 'format' = 'csv')",
        path.display()
    )
}

/// Every visible and hidden entry of a folder, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn sorted_lines(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text.lines().map(str::to_string).collect();
    v.sort();
    v
}

#[test]
fn ddl_declares_tables_and_views_that_the_statements_after_it_see() {
    let (_dir, path) = orders_in_temp(2, 50);
    let script = format!(
        "{};
         SHOW TABLES;
         DESCRIBE orders;
         SELECT zip, count(*) AS n FROM orders WHERE zip = '00003' GROUP BY zip;
         CREATE TEMPORARY VIEW busy AS SELECT qty, count(*) AS n FROM orders GROUP BY qty;
         SELECT n FROM busy WHERE qty = 0;
         SHOW VIEWS;
         DROP VIEW busy;
         SHOW TABLES",
        create_orders(&path)
    );
    let o = sql(&["-e", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    // zip stays a string: '00003' keeps its zeros (inference would make it 3).
    // qty = 0 for ids 0, 7, ..., 98: 15 of 100.
    assert_eq!(
        stdout(&o),
        "table name\norders\n\n\
         name,type,null\nid,BIGINT,false\nzip,STRING,true\nqty,INT,true\n\n\
         zip,n\n00003,1\n\n\
         n\n15\n\n\
         view name\nbusy\n\n\
         table name\norders\n"
    );
    let err = stderr(&o);
    assert!(err.contains("table 'orders' created"), "{err}");
    assert!(err.contains("view 'busy' created"), "{err}");
    assert!(err.contains("view 'busy' dropped"), "{err}");

    // DataFusion's own DDL persists for the session too; CREATE OR REPLACE
    // TABLE swaps a declaration.
    let o = sql(&[
        "-e",
        &format!(
            "CREATE EXTERNAL TABLE p2 (id BIGINT, zip VARCHAR, qty INT) STORED AS CSV \
             LOCATION '{}/' OPTIONS ('format.has_header' 'false');
             SELECT count(*) AS n FROM p2;
             {};
             CREATE OR REPLACE TABLE orders (id BIGINT, zip STRING, qty BIGINT) WITH (\
               'connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
             SELECT id FROM orders ORDER BY id LIMIT 2",
            path.display(),
            create_orders(&path).replace("(id BIGINT NOT NULL, zip STRING, qty INT)", "(a INT)"),
            path.display()
        ),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "n\n100\n\nid\n0\n1\n");

    // Quoted names keep their case; a view whose table is gone fails when
    // it is read, not for every statement after the DROP.
    let o = sql(&[
        "-e",
        &format!(
            "{}; CREATE VIEW v AS SELECT id FROM \"Orders\"; DROP TABLE \"Orders\";
             SELECT 1 AS still_fine; SELECT * FROM v",
            create_orders(&path).replace("TABLE orders", "TABLE \"Orders\"")
        ),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stdout(&o), "still_fine\n1\n");
    assert!(
        stderr(&o).contains("view 'v' no longer plans"),
        "{}",
        stderr(&o)
    );

    // A row with a field too many: its file and line.
    std::fs::write(
        path.join("orders-1.csv"),
        "100,00003,1\n101,00004,2,extra\n",
    )
    .unwrap();
    let o = sql(&[
        "-e",
        &format!("{}; SELECT count(*) FROM orders", create_orders(&path)),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("orders-1.csv: line 2: Csv error: incorrect number of fields"),
        "{}",
        stderr(&o)
    );

    // A dropped view is gone for the statements after the DROP.
    let o = sql(&[
        "-e",
        &format!(
            "{}; CREATE VIEW v AS SELECT 1 AS x; DROP VIEW v; SELECT * FROM v",
            create_orders(&path)
        ),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("public.v' not found"), "{}", stderr(&o));
}

#[test]
fn ddl_errors_name_the_option_the_type_the_path_or_the_row() {
    let (dir, path) = orders_in_temp(1, 5);
    let p = path.display().to_string();
    let cases = [
        (
            format!("CREATE TABLE t (a INT) WITH ('connector' = 'filesystem', 'path' = '{p}', 'format' = 'csv', 'csv.delimiter' = ';')"),
            "unknown option 'csv.delimiter'",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'filesystem', 'format' = 'csv')".to_string(),
            "missing option 'path'",
        ),
        (
            format!("CREATE TABLE t (a INT, b MONEY) WITH ('connector' = 'filesystem', 'path' = '{p}', 'format' = 'csv')"),
            "column 'b' has type MONEY",
        ),
        (
            format!("CREATE TABLE t (a INT) WITH ('connector' = 'filesystem', 'path' = '{p}', 'format' = 'avro')"),
            "format 'avro' is not supported",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'filesystem', 'path' = '/no/such/folder', 'format' = 'csv'); SELECT * FROM t".to_string(),
            "path '/no/such/folder' does not exist",
        ),
    ];
    for (statement, expected) in cases {
        let o = sql(&["-e", &statement]);
        assert_eq!(o.status.code(), Some(2), "{statement}: {}", stderr(&o));
        assert!(stderr(&o).contains(expected), "{statement}: {}", stderr(&o));
    }

    // A row that does not fit the declared schema: file, line and column.
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("b.csv"), "1,a,2.50\n2,b,2.75\n3,c,lots\n").unwrap();
    let create = |extra: &str| {
        format!(
            "CREATE TABLE prices (id INT, name STRING, price DECIMAL(5, 2)) WITH (\
             'connector' = 'filesystem', 'path' = '{}', 'format' = 'csv'{extra})",
            bad.display()
        )
    };
    let o = sql(&["-e", &format!("{}; SELECT * FROM prices", create(""))]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("b.csv: line 3, column 'price' (Decimal128(5, 2))"),
        "{err}"
    );
    // ... or NULL with csv.ignore-parse-errors, as Flink does.
    let o = sql(&[
        "-e",
        &format!(
            "{}; SELECT id, price FROM prices ORDER BY id",
            create(", 'csv.ignore-parse-errors' = 'true'")
        ),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "id,price\n1,2.50\n2,2.75\n3,\n");
}

#[test]
fn insert_into_at_parallelism_4_writes_4_part_files_whose_union_is_the_query_result() {
    let (dir, path) = orders_in_temp(4, 2_000);
    let sink = dir.path().join("big");
    let select = "SELECT id, zip, qty * 10 AS qty10 FROM orders WHERE qty > 2";
    let script = format!(
        "{};
         CREATE TABLE big (id BIGINT, zip STRING, qty10 INT) WITH (
           'connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
         INSERT INTO big {select};
         {select}",
        create_orders(&path),
        sink.display()
    );
    let o = sql(&["-p", "4", "-e", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let expected: Vec<String> = sorted_lines(out.split_once('\n').unwrap().1);
    // qty > 2 for 4 of every 7 ids.
    assert!(expected.len() > 4_000, "{}", expected.len());
    assert!(
        stderr(&o).contains(&format!("{} rows written into 'big'", expected.len())),
        "{}",
        stderr(&o)
    );
    let files = entries(&sink);
    assert_eq!(files.len(), 4, "{files:?}");
    let mut subtasks: Vec<String> = files
        .iter()
        .map(|f| {
            assert!(f.starts_with("part-") && f.ends_with("-0.csv"), "{f}");
            let stem = f.trim_end_matches("-0.csv");
            stem.rsplit('-').next().unwrap().to_string()
        })
        .collect();
    subtasks.sort();
    assert_eq!(subtasks, ["0", "1", "2", "3"]);
    let mut union = String::new();
    for f in &files {
        let text = std::fs::read_to_string(sink.join(f)).unwrap();
        assert!(!text.is_empty(), "{f} is empty");
        union.push_str(&text);
    }
    assert_eq!(sorted_lines(&union), expected);

    // INSERT appends a new set of part files; INSERT OVERWRITE replaces them.
    let again = format!(
        "{}; CREATE TABLE big (id BIGINT, zip STRING, qty10 INT) WITH (
           'connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
         INSERT INTO big {select};
         SELECT count(*) AS n FROM big;
         INSERT OVERWRITE big SELECT id, zip, qty FROM orders WHERE id < 10;
         SELECT count(*) AS n FROM big",
        create_orders(&path),
        sink.display()
    );
    let o = sql(&["-p", "4", "-e", &again]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("n\n{}\n\nn\n10\n", 2 * expected.len()));
}

#[test]
fn parquet_and_json_tables_round_trip_through_insert() {
    let (dir, path) = orders_in_temp(2, 500);
    for format in ["parquet", "json"] {
        let sink = dir.path().join(format);
        let script = format!(
            "{};
             CREATE TABLE s (zip STRING, total BIGINT, id_max BIGINT) WITH (
               'connector' = 'filesystem', 'path' = '{}', 'format' = '{format}');
             INSERT INTO s SELECT zip, sum(qty), max(id) FROM orders GROUP BY zip;
             SELECT count(*) AS n, sum(total) AS t, max(id_max) AS m, min(zip) AS z FROM s",
            create_orders(&path),
            sink.display()
        );
        let o = sql(&["-p", "2", "-e", &script]);
        assert!(o.status.success(), "{format}: {}", stderr(&o));
        let total: usize = (0..1000).map(|id| id % 7).sum();
        assert_eq!(
            stdout(&o),
            format!("n,t,m,z\n97,{total},999,00000\n"),
            "{format}"
        );
        assert!(
            entries(&sink)
                .iter()
                .all(|f| f.starts_with("part-") && f.ends_with(&format!(".{format}"))),
            "{:?}",
            entries(&sink)
        );
    }
}

#[test]
fn csv_options_round_trip_through_insert_and_unwritable_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sink = dir.path().join("piped");
    let script = format!(
        "CREATE TABLE piped (id INT, name STRING, price DECIMAL(5, 2)) WITH (
           'connector' = 'filesystem', 'path' = '{}', 'format' = 'csv',
           'csv.field-delimiter' = '|', 'csv.header' = 'true', 'csv.null-literal' = 'N/A');
         INSERT INTO piped VALUES (1, 'a|b', 1.50), (2, NULL, NULL), (3, 'say \"hi\"', 3.25);
         SELECT id, name, price, name IS NULL AS no_name FROM piped ORDER BY id",
        sink.display()
    );
    let o = sql(&["-p", "1", "-e", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "id,name,price,no_name\n1,a|b,1.50,false\n2,,,true\n3,\"say \"\"hi\"\"\",3.25,false\n"
    );
    let files = entries(&sink);
    assert_eq!(files.len(), 1, "{files:?}");
    let text = std::fs::read_to_string(sink.join(&files[0])).unwrap();
    assert!(text.starts_with("id|name|price\n"), "{text}");
    assert!(text.contains("2|N/A|N/A\n"), "{text}");

    for option in [
        "'csv.allow-comments' = 'true'",
        "'csv.disable-quote-character' = 'true'",
    ] {
        let o = sql(&[
            "-e",
            &format!(
                "CREATE TABLE t (s STRING) WITH ('connector' = 'filesystem', 'path' = '{}', \
                 'format' = 'csv', {option}); INSERT INTO t VALUES ('#1')",
                dir.path().join("t").display()
            ),
        ]);
        assert_eq!(o.status.code(), Some(2), "{option}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("can be read but not written"),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn a_failed_insert_leaves_the_target_folder_as_it_was() {
    let (dir, path) = orders_in_temp(4, 5_000);
    // The last file ends in a row that fails the job after the other
    // subtasks had written their part files.
    let mut last = std::fs::read_to_string(path.join("orders-3.csv")).unwrap();
    last.push_str("20000,00001,not-a-number\n");
    std::fs::write(path.join("orders-3.csv"), last).unwrap();
    let sink = dir.path().join("sink");
    std::fs::create_dir_all(&sink).unwrap();
    std::fs::write(sink.join("part-earlier-0-0.csv"), "1,00001,1\n").unwrap();
    let before = entries(&sink);
    let script = format!(
        "{};
         CREATE TABLE sink (id BIGINT, zip STRING, qty INT) WITH (
           'connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
         INSERT INTO sink SELECT * FROM orders",
        create_orders(&path),
        sink.display()
    );
    let o = sql(&["-p", "4", "-e", &script]);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("orders-3.csv: line 5001"),
        "{}",
        stderr(&o)
    );
    assert_eq!(entries(&sink), before);
    assert_eq!(
        std::fs::read_to_string(sink.join("part-earlier-0-0.csv")).unwrap(),
        "1,00001,1\n"
    );
}

#[test]
fn set_and_reset_change_what_the_next_statements_plan_with() {
    let (_dir, path) = orders_in_temp(4, 100);
    let script = format!(
        "{};
         SET 'parallelism.default' = '4';
         SET;
         EXPLAIN SELECT qty, count(*) FROM orders GROUP BY qty;
         SET 'parallelism.default' = '2';
         EXPLAIN PLAN FOR SELECT qty, count(*) FROM orders GROUP BY qty;
         RESET 'parallelism.default';
         SET",
        create_orders(&path)
    );
    let o = sql(&["-e", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let (first, second) = out.split_once("Job 'sql statement 6'").unwrap();
    assert!(
        first.starts_with("key,value\nparallelism.default,4\n"),
        "{out}"
    );
    assert!(first.contains("parallelism 4"), "{out}");
    assert!(!second.contains("parallelism 4"), "{out}");
    assert!(second.contains("parallelism 2"), "{out}");
    assert!(out.ends_with("key,value\n"), "{out}");

    // RESET gives the next statements the session's first settings back.
    let script = format!(
        "{};
         SET 'parallelism.default' = '4';
         RESET 'parallelism.default';
         EXPLAIN SELECT qty, count(*) FROM orders GROUP BY qty",
        create_orders(&path)
    );
    let o = sql(&["-p", "2", "-e", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("parallelism 2,") && !out.contains("parallelism 4"),
        "{out}"
    );

    for (key, value) in [
        ("parallelism.default", "many"),
        ("execution.batch.speculative.enabled", "maybe"),
        ("datafusion.execution.batch_size", "lots"),
    ] {
        let o = sql(&["-e", &format!("SET '{key}' = '{value}'; SELECT 1 AS one")]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(key), "{key}: {}", stderr(&o));
    }
}

#[test]
fn explain_of_an_insert_shows_its_part_file_sink_and_writes_nothing() {
    let (dir, path) = orders_in_temp(2, 10);
    let sink = dir.path().join("out");
    let script = format!(
        "{};
         CREATE TABLE out (id BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
         EXPLAIN INSERT INTO out SELECT id FROM orders",
        create_orders(&path),
        sink.display()
    );
    let o = sql(&["-p", "2", "-e", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("Sink: out (csv files)"),
        "{}",
        stdout(&o)
    );
    assert!(!sink.exists());
}

#[test]
fn statements_from_standard_input_run_as_one_session() {
    use std::io::Write;
    let (_dir, path) = orders_in_temp(1, 10);
    let mut child = fluvia()
        .arg("sql")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let script = format!(
        "{};\nSELECT count(*) AS n\n  FROM orders; -- ten\n",
        create_orders(&path)
    );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "n\n10\n");
}

/// Types `line` into the interactive client, expects each of `output` in
/// order and then the next prompt.
fn statement(p: &mut rexpect::session::PtySession, line: &str, output: &[&str]) {
    p.send_line(line).unwrap();
    for o in output {
        p.exp_string(o).unwrap();
    }
    p.exp_string("Fluvia SQL>").unwrap();
}

/// Runs `cmd` in a pseudo-terminal, each expectation waiting at most
/// `timeout_ms`.
fn on_a_terminal(cmd: std::process::Command, timeout_ms: u64) -> rexpect::session::PtySession {
    rexpect::session::spawn_with_options(
        cmd,
        rexpect::reader::Options {
            timeout_ms: Some(timeout_ms),
            strip_ansi_escape_codes: true,
        },
    )
    .unwrap()
}

/// The interactive client in a pseudo-terminal, as a user types.
#[test]
fn the_interactive_client_runs_a_session_and_ctrl_c_cancels_only_the_running_query() {
    let (dir, path) = orders_in_temp(1, 20);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fluvia"));
    cmd.arg("sql")
        .env("FLUVIA_SQL_HISTORY", dir.path().join("history"));
    let mut p = on_a_terminal(cmd, 120_000);
    p.exp_string("Fluvia SQL>").unwrap();
    // A statement over two lines.
    // The line editor takes input once it shows its prompt (it may drop
    // what was typed ahead), so every line waits for one.
    p.send_line("CREATE TABLE orders (id BIGINT, zip STRING, qty INT)")
        .unwrap();
    p.exp_string("          >").unwrap();
    p.send_line(&format!(
        "WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');",
        path.display()
    ))
    .unwrap();
    p.exp_string("[INFO] table 'orders' created").unwrap();
    p.exp_string("Fluvia SQL>").unwrap();
    statement(
        &mut p,
        "SET 'parallelism.default' = '2';",
        &["[INFO] set 'parallelism.default' = '2'"],
    );
    statement(
        &mut p,
        "SELECT qty, count(*) AS n FROM orders WHERE qty < 2 GROUP BY qty ORDER BY qty;",
        &["| qty | n |", "| 0   | 3 |", "| 1   | 3 |", "2 rows in"],
    );
    // A query that would run for hours, cancelled with Ctrl-C.
    p.send_line("SELECT count(*) FROM generate_series(1, 100000000000) AS t(x) WHERE x % 7 = 3;")
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    p.send_control('c').unwrap();
    p.exp_string("[INFO] statement cancelled").unwrap();
    p.exp_string("Fluvia SQL>").unwrap();
    // The session goes on, its table still there.
    statement(
        &mut p,
        "SELECT count(*) AS total FROM orders;",
        &["| 20    |"],
    );
    p.send_line("QUIT;").unwrap();
    p.exp_eof().unwrap();
    let history = std::fs::read_to_string(dir.path().join("history")).unwrap();
    assert!(
        history.contains("SET 'parallelism.default' = '2';"),
        "{history}"
    );
}

/// On a terminal a running statement shows its progress on standard
/// error; piped, standard error has only the one-line summary.
#[test]
fn progress_shows_on_a_terminal_and_not_when_piped() {
    let query = "SELECT count(*) AS n FROM generate_series(1, 100000000) AS t(x) WHERE x % 7 = 3";
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fluvia"));
    cmd.args(["sql", "-e", query]);
    let mut p = on_a_terminal(cmd, 300_000);
    p.exp_string("vertices").unwrap();
    p.exp_string("running").unwrap();
    p.exp_string("14285714").unwrap();
    p.exp_eof().unwrap();

    let o = sql(&["-e", "SELECT 1 AS one"]);
    assert!(o.status.success());
    let err = stderr(&o);
    assert!(!err.contains("vertices"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// The statements of one session run on one embedded mini-cluster, started
/// for the first and kept for the next; a change of configuration starts
/// another. The client stops it, and removes its spill directory, on exit.
#[test]
fn a_sessions_statements_share_one_mini_cluster_until_its_configuration_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let o = fluvia()
        .args(["sql", "-p", "1", "-D"])
        .arg(format!("io.tmp.dirs={}", tmp.path().display()))
        .args([
            "-e",
            "SELECT 1; SELECT 2; SELECT 3; \
             SET 'taskmanager.network.memory.buffers-per-channel' = '4'; SELECT 4",
        ])
        .env("RUST_LOG", "fluvia_cluster::minicluster=debug")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    for n in 1..=4 {
        assert!(stdout(&o).contains(&n.to_string()), "{}", stdout(&o));
    }
    assert_eq!(err.matches("mini-cluster (new)").count(), 2, "{err}");
    assert_eq!(err.matches("mini-cluster (kept)").count(), 2, "{err}");
    assert_eq!(entries(tmp.path()), Vec::<String>::new(), "left behind");
}

/// A session's mini-cluster that cannot start (its JobManager refuses the
/// configuration) is an error naming the key, not a panic.
#[test]
fn a_session_cluster_that_cannot_start_names_the_key_it_refused() {
    let o = sql(&["-e", "SELECT 1", "-D", "restart-strategy=bogus"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("restart-strategy"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
