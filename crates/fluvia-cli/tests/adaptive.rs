//! The adaptive batch scheduler on a cluster of separate processes: a batch
//! word count without `-p` gets the parallelism of its counting vertex from
//! the bytes the tokenizer wrote, the REST API shows it (undecided vertices
//! as -1 while they wait), the answer is right, and with one hot key the
//! counting subtasks read balanced inputs except the one holding that key.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Cluster, assert_success, corpus, get, job_id};
use fluvia_scheduler::adaptive::{self, BlockingResultInfo, DeciderConfig};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// 512 KiB per counting subtask: the 12 MB the tokenizer writes give about
/// two dozen subtasks.
const AVG: u64 = 512 * 1024;

/// A cluster of two TaskManagers with four slots each, both registered.
fn two_task_managers() -> Cluster {
    let cluster = Cluster::start(&[], 2, &["--slots", "4"]);
    cluster.wait_for_task_managers(2);
    cluster
}

/// Runs the word count without `-p` over a corpus of 60 000 lines with
/// `hot_percent` of one hot word, on a cluster of two four-slot
/// TaskManagers, and returns the job's REST details after checking the
/// output.
fn run_wordcount(hot_percent: u64) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("corpus.txt");
    let out = dir.path().join("counts.txt");
    let expected = corpus(&input, 60_000, 3000, hot_percent);
    let cluster = two_task_managers();
    let avg = format!("execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task={AVG}");
    let o = cluster.wordcount(&input, &out, &["-D", &avg]);
    assert_success(&o);
    let mut want = String::new();
    for (w, n) in &expected {
        writeln!(want, "{w},{n}").unwrap();
    }
    assert_eq!(std::fs::read_to_string(&out).unwrap(), want);
    let id = job_id(&o);
    let details = get(&cluster.rest, &format!("/jobs/{id}"));
    let plan = get(&cluster.rest, &format!("/jobs/{id}/plan"));
    for (v, node) in details["vertices"]
        .as_array()
        .unwrap()
        .iter()
        .zip(plan["plan"]["nodes"].as_array().unwrap())
    {
        assert_eq!(
            v["parallelism"], node["parallelism"],
            "plan and details agree"
        );
        assert_eq!(
            v["subtasks"].as_array().unwrap().len() as u64,
            v["parallelism"].as_u64().unwrap()
        );
    }
    details
}

/// What the tokenizer wrote, per producer subtask and subpartition.
fn tokenizer_bytes(details: &Value) -> Vec<Vec<u64>> {
    details["vertices"][0]["subtasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["subpartition-bytes"][0]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap())
                .collect()
        })
        .collect()
}

fn decider() -> DeciderConfig {
    DeciderConfig {
        avg_data_volume_per_task: AVG,
        ..DeciderConfig::default()
    }
}

#[test]
fn a_batch_word_count_without_p_gets_the_parallelism_its_data_volume_gives() {
    let details = run_wordcount(0);
    let vertices = details["vertices"].as_array().unwrap();
    assert_eq!(vertices[1]["name"], "Keyed Aggregation");
    // The source kept the default source parallelism; the counting vertex
    // writes 128 key groups' worth of subpartitions for its consumer.
    assert_eq!(vertices[0]["parallelism"], 1);
    let bytes = tokenizer_bytes(&details);
    assert_eq!(bytes[0].len(), 128, "one subpartition per key group");
    let total: u64 = bytes.iter().flatten().sum();
    let decided = vertices[1]["parallelism"].as_u64().unwrap() as usize;
    let decision = adaptive::decide(
        128,
        None,
        &[BlockingResultInfo::all_to_all(bytes)],
        &decider(),
    )
    .unwrap();
    assert_eq!(decided, decision.parallelism);
    let lower = total.div_ceil(AVG) as usize;
    assert!(
        (lower..=lower + 2).contains(&decided),
        "{total} bytes at {AVG} per task: {decided} subtasks"
    );
    // The sort after the count was set to 1 by the program: kept.
    assert_eq!(vertices[2]["parallelism"], 1);
}

#[test]
fn with_one_hot_key_the_counting_subtasks_read_balanced_inputs_except_the_hot_one() {
    let details = run_wordcount(90);
    let bytes = tokenizer_bytes(&details);
    let per_subpartition: Vec<u64> = (0..128).map(|s| bytes.iter().map(|p| p[s]).sum()).collect();
    let hot = (0..128).max_by_key(|&s| per_subpartition[s]).unwrap();
    let total: u64 = per_subpartition.iter().sum();
    assert!(
        per_subpartition[hot] * 10 > total * 8,
        "the hot key dominates"
    );
    // What each counting subtask read: the hot one reads about the hot
    // subpartition, every other one at most the target volume.
    let counting = details["vertices"][1]["subtasks"].as_array().unwrap();
    assert!(counting.len() > 2, "{} subtasks", counting.len());
    let reads: Vec<u64> = counting
        .iter()
        .map(|s| s["metrics"]["read-bytes"].as_u64().unwrap())
        .collect();
    let max = *reads.iter().max().unwrap();
    let others: Vec<u64> = reads.iter().copied().filter(|&r| r != max).collect();
    println!(
        "hot subpartition {} bytes; reads {reads:?}",
        per_subpartition[hot]
    );
    // Balanced ranges give the hot subpartition a subtask of its own.
    assert!(max * 10 >= per_subpartition[hot] * 9, "{reads:?}");
    assert!(
        max <= per_subpartition[hot] + per_subpartition[hot] / 20,
        "{reads:?}"
    );
    for r in &others {
        assert!(
            *r <= AVG + AVG / 4,
            "a balanced subtask read {r} bytes: {reads:?}"
        );
    }
}

/// A SQL aggregation without `-p` on the cluster: the scans run at the
/// configured default parallelism, the final aggregation's parallelism is
/// decided from the bytes the partial aggregations hashed into 128 key
/// groups, and the answer matches the same query at a fixed parallelism.
#[test]
fn a_sql_query_without_p_gets_the_parallelism_of_its_hash_stages_from_the_data() {
    let data = common::tpcds_data();
    let cluster = two_task_managers();
    let sql = "select ss_item_sk, count(*) as n, sum(ss_quantity) as q from store_sales \
               group by ss_item_sk order by ss_item_sk";
    let run = |extra: &[&str]| {
        let o = common::fluvia()
            .args(["sql", "--jobmanager", &cluster.rpc, "--tables"])
            .arg(data)
            .args(["-e", sql])
            .args(extra)
            .output()
            .unwrap();
        assert_success(&o);
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    // `store_sales` at SF 0.1 is one row group: on DataFusion's byte
    // ranges its scan runs at the default parallelism (split on row groups
    // it would run one subtask).
    let adaptive = run(&[
        "-D",
        "parallelism.default=3",
        "-D",
        "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task=16kb",
        "-D",
        "table.exec.parquet.split-on-row-groups=false",
    ]);
    assert_eq!(adaptive, run(&["-p", "2"]), "same rows either way");
    let jobs = get(&cluster.rest, "/jobs");
    let first = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .find(|id| {
            get(&cluster.rest, &format!("/jobs/{id}"))["vertices"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["maxParallelism"] == 128)
        })
        .expect("the adaptive job");
    let details = get(&cluster.rest, &format!("/jobs/{first}"));
    let vertices = details["vertices"].as_array().unwrap();
    assert!(
        vertices[0]["name"]
            .as_str()
            .unwrap()
            .contains("store_sales")
    );
    assert_eq!(
        vertices[0]["parallelism"], 3,
        "scans at the default parallelism"
    );
    let bytes = tokenizer_bytes(&details);
    let adaptive_vertex = vertices
        .iter()
        .find(|v| v["maxParallelism"] == 128)
        .unwrap();
    let decision = adaptive::decide(
        128,
        None,
        &[BlockingResultInfo::all_to_all(bytes)],
        &DeciderConfig {
            avg_data_volume_per_task: 16 * 1024,
            ..DeciderConfig::default()
        },
    )
    .unwrap();
    assert!(
        decision.parallelism > 1,
        "{} subtasks",
        decision.parallelism
    );
    assert_eq!(adaptive_vertex["parallelism"], decision.parallelism as u64);
    assert_eq!(adaptive_vertex["parallelism-decided"], true);
}

/// Tables `probe` (four CSV files; half of the rows carry key 0) and
/// `build` (one row per key), and the answer of [`JOIN`] over them.
fn skewed_tables(dir: &Path) -> (std::path::PathBuf, String) {
    let tables = dir.join("tables");
    let (rows, keys) = (60_000u64, 6_000u64);
    // Four probe files: four scan subtasks, the partitions a hot
    // subpartition is split by.
    let mut probe = vec![String::from("k,v\n"); 4];
    let mut build = String::from("k,w\n");
    let (mut expected_sum, mut state) = (0u64, 7u64);
    let mut w = vec![0u64; keys as usize];
    for (k, slot) in w.iter_mut().enumerate() {
        *slot = (k as u64 * 7919) % 1000;
        writeln!(build, "{k},{slot}").unwrap();
    }
    for i in 0..rows {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let k = if i % 2 == 0 { 0 } else { (state >> 33) % keys };
        let v = (state >> 20) % 1000;
        writeln!(probe[(i / 2 % 4) as usize], "{k},{v}").unwrap();
        expected_sum += v + w[k as usize];
    }
    std::fs::create_dir_all(tables.join("probe")).unwrap();
    for (i, text) in probe.iter().enumerate() {
        std::fs::write(tables.join("probe").join(format!("part-{i}.csv")), text).unwrap();
    }
    std::fs::create_dir_all(tables.join("build")).unwrap();
    std::fs::write(tables.join("build").join("build.csv"), build).unwrap();
    (tables, format!("n,s\n{rows},{expected_sum}\n"))
}

const JOIN: &str =
    "select count(*) as n, sum(p.v + b.w) as s from probe p join build b on p.k = b.k";

/// Runs [`JOIN`] on the cluster without `-p`, scans at 4, with `extra`
/// settings; returns its output.
fn run_join(cluster: &Cluster, tables: &Path, extra: &[&str]) -> String {
    let mut cmd = common::fluvia();
    cmd.args([
        "sql",
        "--jobmanager",
        &cluster.rpc,
        "--format",
        "csv",
        "--tables",
    ])
    .arg(tables)
    .args(["-e", JOIN, "-D", "parallelism.default=4"]);
    for kv in extra {
        cmd.args(["-D", kv]);
    }
    let o = cmd.output().unwrap();
    assert_success(&o);
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// The join vertex of every job on the cluster, oldest job first.
fn join_vertices(cluster: &Cluster) -> Vec<Value> {
    let jobs = get(&cluster.rest, "/jobs");
    let mut details: Vec<Value> = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            get(
                &cluster.rest,
                &format!("/jobs/{}", j["id"].as_str().unwrap()),
            )
        })
        .collect();
    details.sort_by_key(|d| d["start-time"].as_u64().unwrap());
    details
        .iter()
        .map(|d| {
            d["vertices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"].as_str().unwrap().contains("HashJoin"))
                .unwrap()
                .clone()
        })
        .collect()
}

fn max_read(v: &Value) -> u64 {
    v["subtasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["metrics"]["read-bytes"].as_u64().unwrap())
        .max()
        .unwrap()
}

/// A join whose probe side has one hot key: with skew splitting the hot
/// subpartition is shared out among several join subtasks by producer
/// partitions (REST lists the split), no join subtask reads it whole, and
/// the answer is the one without splitting.
#[test]
fn a_skewed_join_subpartition_is_split_across_subtasks_with_the_same_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (tables, want) = skewed_tables(dir.path());
    let cluster = two_task_managers();
    // No broadcast, planned or at runtime: the skew path alone.
    let common = [
        "table.optimizer.join.broadcast-threshold=0",
        "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task=32kb",
        "table.optimizer.skewed-join-optimization.skewed-threshold=1kb",
    ];
    let with = |strategy: &'static str| {
        let mut v = common.to_vec();
        v.push(strategy);
        v
    };
    let off = with("table.optimizer.skewed-join-optimization.strategy=NONE");
    let on = with("table.optimizer.skewed-join-optimization.strategy=AUTO");
    assert_eq!(run_join(&cluster, &tables, &off), want);
    assert_eq!(run_join(&cluster, &tables, &on), want);
    let joins = join_vertices(&cluster);
    assert_eq!(joins.len(), 2);
    assert_eq!(joins[0]["skew-splits"].as_array().unwrap().len(), 0);
    let splits = joins[1]["skew-splits"].as_array().unwrap();
    assert_eq!(splits.len(), 1, "{splits:?}");
    assert!(splits[0]["pieces"].as_u64().unwrap() >= 2);
    // Without splitting one subtask reads the whole hot key; with it, the
    // biggest read shrinks by at least a third.
    let (off, on) = (max_read(&joins[0]), max_read(&joins[1]));
    assert!(
        on * 3 <= off * 2,
        "largest join input {off} bytes off, {on} on"
    );
}

/// With no broadcast on estimates the planner hash-partitions both sides;
/// once they finished, the build side's real bytes are under
/// `table.optimizer.join.broadcast-threshold`: every join subtask reads it
/// whole and the probe side is cut by bytes alone (FLIP-470 at runtime).
#[test]
fn a_join_side_found_small_at_runtime_is_broadcast() {
    let dir = tempfile::tempdir().unwrap();
    let (tables, want) = skewed_tables(dir.path());
    let cluster = two_task_managers();
    let avg = "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task=32kb";
    let none = run_join(
        &cluster,
        &tables,
        &[
            avg,
            "table.optimizer.adaptive-broadcast-join.strategy=NONE",
            "table.optimizer.join.broadcast-threshold=0",
        ],
    );
    assert_eq!(none, want);
    assert_eq!(
        run_join(
            &cluster,
            &tables,
            &[
                avg,
                "table.optimizer.adaptive-broadcast-join.strategy=RUNTIME_ONLY"
            ],
        ),
        want
    );
    let joins = join_vertices(&cluster);
    assert_eq!(joins[0]["adaptive-broadcast-input"], Value::Null);
    assert!(
        joins[1]["adaptive-broadcast-input"].is_u64(),
        "{}",
        joins[1]
    );
    // Every subtask reads the whole build side: none reads less than it.
    let build_bytes: u64 = joins[1]["subtasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["metrics"]["read-bytes"].as_u64().unwrap())
        .min()
        .unwrap();
    assert!(build_bytes > 0);
    // Cut by bytes, the hot key no longer sits in one subtask.
    assert!(max_read(&joins[1]) * 3 <= max_read(&joins[0]) * 2);
}
