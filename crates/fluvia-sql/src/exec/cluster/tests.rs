//! Tests of clustered build sides: the rewrite rules, the node, and the
//! build sides the subtasks of one process share.

use super::exec::*;
use super::hash::*;
use super::rules::*;
use super::shared::*;
use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::array::{Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::Count;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use std::collections::HashSet;
use std::sync::Arc;

fn batch(keys: Vec<i64>) -> RecordBatch {
    let n = keys.len();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("row", DataType::Utf8, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(StringArray::from(
                (0..n).map(|i| i.to_string()).collect::<Vec<_>>(),
            )),
        ],
    )
    .expect("batch")
}

fn key() -> Vec<Arc<dyn PhysicalExpr>> {
    vec![Arc::new(Column::new("k", 0))]
}

fn keys_of(b: &RecordBatch) -> &Int64Array {
    b.column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("k")
}

/// Rows as (key, the other columns), sorted, to compare contents.
fn contents(batches: &[RecordBatch]) -> Vec<(i64, Vec<String>)> {
    let mut out = Vec::new();
    for b in batches {
        let k = keys_of(b);
        let others: Vec<&StringArray> = b.columns()[1..]
            .iter()
            .map(|c| c.as_any().downcast_ref::<StringArray>().expect("utf8"))
            .collect();
        for i in 0..b.num_rows() {
            let rest = others.iter().map(|c| c.value(i).to_string()).collect();
            out.push((k.value(i), rest));
        }
    }
    out.sort();
    out
}

/// Each key's rows form one run.
fn runs_of_one_key(batches: &[RecordBatch]) -> bool {
    let mut done = std::collections::HashSet::new();
    let mut last = None;
    for b in batches {
        let k = keys_of(b);
        for i in 0..b.num_rows() {
            let v = k.value(i);
            if last != Some(v) {
                if !done.insert(v) {
                    return false;
                }
                last = Some(v);
            }
        }
    }
    true
}

#[test]
fn the_distinct_count_is_within_two_percent_up_to_the_sample_size() {
    for (rows, keys) in [
        (65_536, 65_536),
        (65_536, 32_768),
        (65_536, 3_641),
        (1_000, 10),
    ] {
        let column: ArrayRef = Arc::new(Int64Array::from(
            (0..rows).map(|i| (i * 7_919) % keys).collect::<Vec<i64>>(),
        ));
        let mut distinct = DistinctCount::default();
        for h in hash_rows(&[column]).expect("hashes") {
            distinct.add(h);
        }
        let error = (distinct.estimate() - keys as f64).abs() / keys as f64;
        assert!(
            error < 0.02,
            "{keys} keys counted as {}",
            distinct.estimate()
        );
    }
}

#[test]
fn repeated_keys_end_up_side_by_side_and_no_row_is_lost() {
    // 40,000 rows over 1,000 keys, interleaved: 40 rows per key.
    let input: Vec<RecordBatch> = (0..5)
        .map(|b| batch((0..8_000).map(|i| (b * 8_000 + i) % 1_000).collect()))
        .collect();
    assert!(!runs_of_one_key(&input));
    let sorted = Count::new();
    let (out, _) = cluster(input.clone(), &key(), &sorted).expect("cluster");
    assert_eq!(sorted.value(), 1);
    assert!(runs_of_one_key(&out));
    assert_eq!(contents(&out), contents(&input));
}

/// The metric `sorted` summed over a plan's ClusterByKeyExecs.
fn sorted_count(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let mut n = 0;
    plan.apply(|node| {
        if node.is::<ClusterByKeyExec>() {
            n += node
                .metrics()
                .and_then(|m| m.sum_by_name("sorted"))
                .map_or(0, |v| v.as_usize());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("walk");
    n
}

#[test]
fn a_join_over_a_clustered_build_side_returns_the_same_rows() {
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::logical_expr::JoinType;
    use datafusion::physical_plan::collect;

    // Build: 40,000 rows over 500 keys; probe: keys 0..1,000 twice.
    let build = batch((0..40_000).map(|i| (i * 7) % 500).collect());
    let probe = batch((0..2_000).map(|i| i % 1_000).collect());
    let scan = |b: &RecordBatch| {
        MemorySourceConfig::try_new_exec(&[vec![b.clone()]], b.schema(), None).expect("scan")
            as Arc<dyn ExecutionPlan>
    };
    // Two joins: a rewritten join keeps the build-side state of the
    // one it was made from, so that one must not have run.
    let join = || -> Arc<dyn ExecutionPlan> {
        Arc::new(crate::exec::collect_left_join(
            scan(&build),
            scan(&probe),
            vec![(key()[0].clone(), key()[0].clone())],
            &JoinType::Inner,
            Some(vec![0, 1, 3]),
        ))
    };
    let clustered = cluster_build_sides(join()).expect("rewrite");
    let ctx = Arc::new(TaskContext::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let plain = rt
        .block_on(collect(join(), Arc::clone(&ctx)))
        .expect("plain");
    let out = rt
        .block_on(collect(Arc::clone(&clustered), ctx))
        .expect("clustered");
    assert_eq!(sorted_count(&clustered), 1);
    // Keys 0..500 match 80 build rows each, twice over in the probe.
    assert_eq!(contents(&out).len(), 500 * 80 * 2);
    assert_eq!(contents(&out), contents(&plain));
}

#[test]
fn unique_keys_keep_their_order() {
    let input = vec![batch((0..40_000).rev().collect())];
    let sorted = Count::new();
    let (out, _) = cluster(input.clone(), &key(), &sorted).expect("cluster");
    assert_eq!(sorted.value(), 0);
    assert_eq!(out, input);
}

/// The hashes in the order `order_by_hash` gives, and whether it is a
/// permutation of the rows.
fn ordered(hashes: &[u64]) -> (Vec<u64>, bool) {
    let order = order_by_hash(hashes).unwrap();
    let mut seen = vec![false; hashes.len()];
    for &r in &order {
        seen[r as usize] = true;
    }
    let all = order.len() == hashes.len() && seen.iter().all(|&s| s);
    (order.iter().map(|&r| hashes[r as usize]).collect(), all)
}

#[test]
fn the_linear_order_by_hash_is_the_sorted_order_of_every_row() {
    // xorshift: spread hashes, with repeats (every value drawn 3 times),
    // a run of equal hashes and the extremes.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut hashes: Vec<u64> = (0..30_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
        .flat_map(|h| [h, h, h])
        .collect();
    hashes.extend([0, u64::MAX, 0, u64::MAX]);
    hashes.extend(std::iter::repeat_n(42, 1000));
    for n in [0, 1, 2, 17, hashes.len()] {
        let mut want = hashes[..n].to_vec();
        want.sort_unstable();
        let (got, permutation) = ordered(&hashes[..n]);
        assert!(permutation, "{n} rows: a row lost or repeated");
        assert_eq!(got, want, "{n} rows");
    }
}

#[test]
fn small_build_sides_are_passed_through() {
    let input = vec![batch((0..1_000).map(|i| i % 3).collect())];
    let sorted = Count::new();
    let (out, _) = cluster(input.clone(), &key(), &sorted).expect("cluster");
    assert_eq!(sorted.value(), 0);
    assert_eq!(out, input);
}

/// A clustering of `input` (one partition) that shares its result as
/// member of `key` in `shared`.
fn shared_node(
    input: &[RecordBatch],
    shared: &Arc<SharedClusters>,
    slot: SlotKey,
) -> Arc<dyn ExecutionPlan> {
    use datafusion::datasource::memory::MemorySourceConfig;
    let scan =
        MemorySourceConfig::try_new_exec(&[input.to_vec()], input[0].schema(), None).expect("scan");
    let mut node = ClusterByKeyExec::new(scan, key());
    node.share = Some(Arc::new(SharedClusters::join(shared, slot)));
    Arc::new(node)
}

fn metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    plan.metrics()
        .and_then(|m| m.sum_by_name(name))
        .map_or(0, |v| v.as_usize())
}

fn run(plan: &Arc<dyn ExecutionPlan>) -> Vec<RecordBatch> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(datafusion::physical_plan::collect(
        Arc::clone(plan),
        Arc::new(TaskContext::default()),
    ))
    .expect("run")
}

fn repeating(n: i64) -> Vec<RecordBatch> {
    (0..4)
        .map(|b| batch((0..n / 4).map(|i| (b * n / 4 + i) % 1_000).collect()))
        .collect()
}

#[test]
fn subtasks_with_the_same_build_rows_cluster_them_once() {
    let shared = Arc::new(SharedClusters::default());
    let input = repeating(40_000);
    let first = shared_node(&input, &shared, (3, "j0".into(), 0));
    let second = shared_node(&input, &shared, (3, "j0".into(), 0));
    let a = run(&first);
    let b = run(&second);
    assert_eq!(
        (metric(&first, "sorted"), metric(&first, "shared_taken")),
        (1, 0)
    );
    assert_eq!(
        (metric(&second, "sorted"), metric(&second, "shared_taken")),
        (0, 1)
    );
    assert!(runs_of_one_key(&b));
    assert_eq!(contents(&a), contents(&input));
    assert_eq!(contents(&b), contents(&input));
    drop((first, second));
    assert!(shared.is_empty(), "the entry outlived its subtasks' plans");
}

#[test]
fn a_subtask_whose_rows_differ_in_number_clusters_its_own() {
    let shared = Arc::new(SharedClusters::default());
    let full = repeating(40_000);
    // Cut short (its join stopped reading): fewer rows.
    let cut = full[..3].to_vec();
    let first = shared_node(&cut, &shared, (3, "j0".into(), 0));
    let second = shared_node(&full, &shared, (3, "j0".into(), 0));
    run(&first);
    let b = run(&second);
    assert_eq!(metric(&second, "shared_taken"), 0);
    assert_eq!(contents(&b), contents(&full));
    // Another join of the same stage shares nothing with these.
    let other = shared_node(&cut, &shared, (3, "j1".into(), 0));
    run(&other);
    assert_eq!(metric(&other, "shared_taken"), 0);
}

#[test]
fn a_claim_given_up_lets_the_waiting_subtask_cluster_its_own() {
    let shared = Arc::new(SharedClusters::default());
    let (m1, m2) = (
        SharedClusters::join(&shared, (0, "j0".into(), 0)),
        SharedClusters::join(&shared, (0, "j0".into(), 0)),
    );
    let Turn::Claim(claim) = m1.turn(10) else {
        panic!("the first subtask claims the clustering");
    };
    let Turn::Wait(mut rx) = m2.turn(10) else {
        panic!("the second waits for it");
    };
    // The claiming task was cancelled before it clustered.
    drop(claim);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let state = rt
        .block_on(rx.wait_for(|s| !matches!(s, SlotState::Claimed { .. })))
        .map(|s| s.clone())
        .expect("state");
    assert!(matches!(state, SlotState::Abandoned), "{state:?}");
    assert!(matches!(m2.turn(10), Turn::Own));
}

#[test]
fn only_build_sides_of_broadcast_inputs_are_shared() {
    use crate::exec::exchange::{ExchangeReaderExec, ReaderFacts};
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::union::UnionExec;
    let schema = batch(vec![1]).schema();
    let reader = |stage| -> Arc<dyn ExecutionPlan> {
        Arc::new(
            ExchangeReaderExec::new(stage, Arc::clone(&schema), 1, ReaderFacts::default())
                .expect("reader"),
        )
    };
    let filtered = |input| -> Arc<dyn ExecutionPlan> {
        let predicate = datafusion::physical_expr::expressions::binary(
            key()[0].clone(),
            datafusion::logical_expr::Operator::Gt,
            datafusion::physical_expr::expressions::lit(0i64),
            &schema,
        )
        .expect("predicate");
        Arc::new(FilterExec::try_new(predicate, input).expect("filter"))
    };
    // Stage 1 is broadcast, stage 2 hash-partitioned.
    let builds: Vec<Arc<dyn ExecutionPlan>> = vec![
        Arc::new(ClusterByKeyExec::new(filtered(reader(1)), key())),
        Arc::new(ClusterByKeyExec::new(reader(2), key())),
        Arc::new(ClusterByKeyExec::new(
            UnionExec::try_new(vec![reader(1), reader(2)]).expect("union"),
            key(),
        )),
    ];
    let plan = UnionExec::try_new(builds).expect("union");
    let shared = Arc::new(SharedClusters::default());
    let plan = share_broadcast_builds(plan, &shared, (7, 0), &|s| s == 1, true).expect("share");
    let mut marked = Vec::new();
    plan.apply(|node| {
        if let Some(c) = node.downcast_ref::<ClusterByKeyExec>() {
            marked.push(c.share.is_some());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("walk");
    assert_eq!(marked, vec![true, false, false]);
    assert_eq!(shared.len(), 1);
}

/// A subtask may run other union branches than its sibling: the first
/// clustering of one subtask's plan and of the other's read different
/// inputs, possibly with as many rows. They must not meet.
#[test]
fn builds_of_other_inputs_at_the_same_place_are_not_shared() {
    use crate::exec::exchange::{ExchangeReaderExec, ReaderFacts};
    let schema = batch(vec![1]).schema();
    let plan_reading = |stage| -> Arc<dyn ExecutionPlan> {
        let reader = ExchangeReaderExec::new(stage, Arc::clone(&schema), 1, ReaderFacts::default())
            .expect("reader");
        Arc::new(ClusterByKeyExec::new(Arc::new(reader), key()))
    };
    let shared = Arc::new(SharedClusters::default());
    let broadcast = |_| true;
    let a = share_broadcast_builds(plan_reading(5), &shared, (9, 0), &broadcast, true).expect("a");
    let b = share_broadcast_builds(plan_reading(8), &shared, (9, 0), &broadcast, true).expect("b");
    assert_eq!(shared.len(), 2, "one entry per input");
    let c = share_broadcast_builds(plan_reading(8), &shared, (9, 0), &broadcast, true).expect("c");
    assert_eq!(shared.len(), 2, "the same input: the same entry");
    drop((a, b, c));
    assert!(shared.is_empty());
}

/// Unique keys are not sorted: the others keep their own rows and skip
/// the sample, and nothing is held for them beside the joins' copies.
#[test]
fn a_build_side_not_worth_sorting_is_left_as_it_is_by_every_subtask() {
    let shared = Arc::new(SharedClusters::default());
    let input: Vec<RecordBatch> = (0..4)
        .map(|b| batch((b * 10_000..(b + 1) * 10_000).collect()))
        .collect();
    let first = shared_node(&input, &shared, (1, "j".into(), 0));
    let second = shared_node(&input, &shared, (1, "j".into(), 0));
    let a = run(&first);
    {
        let entries = shared.entries.lock().expect("entries");
        let (_, slot) = entries.values().next().expect("entry");
        assert!(
            matches!(*slot.0.borrow(), SlotState::AsIs { rows: 40_000 }),
            "{:?}",
            slot.0.borrow()
        );
    }
    let b = run(&second);
    assert_eq!(metric(&first, "sorted") + metric(&second, "sorted"), 0);
    assert_eq!(metric(&second, "shared_taken"), 0);
    assert_eq!(contents(&a), contents(&input));
    assert_eq!(contents(&b), contents(&input));
}

/// A clustering of `input` read once for the members of `slot`, its
/// input wrapped in `wrap`.
fn read_once_node(
    input: &[RecordBatch],
    shared: &Arc<SharedClusters>,
    slot: SlotKey,
    wrap: impl FnOnce(Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan>,
) -> Arc<dyn ExecutionPlan> {
    use datafusion::datasource::memory::MemorySourceConfig;
    let scan =
        MemorySourceConfig::try_new_exec(&[input.to_vec()], input[0].schema(), None).expect("scan");
    let mut node = ClusterByKeyExec::new(wrap(scan), key());
    node.share = Some(Arc::new(SharedClusters::join(shared, slot)));
    node.read_once = true;
    Arc::new(node)
}

/// The second subtask never runs its input, and what the first row of
/// that input would have started (a probe side's scans) still starts.
#[test]
fn a_build_side_read_once_is_read_by_one_subtask_for_all() {
    use crate::exec::pass_through::PassThroughExec;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let shared = Arc::new(SharedClusters::default());
    let input = repeating(40_000);
    let (opened, first_rows) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let wrap = |scan: Arc<dyn ExecutionPlan>| -> Arc<dyn ExecutionPlan> {
        let counted = Arc::new(PassThroughExec::of(
            scan,
            "OpenedExec",
            crate::exec::pass_through::CountExecutions(Arc::clone(&opened)),
        ));
        let rows = Arc::clone(&first_rows);
        Arc::new(crate::exec::first_row::FirstRowExec::new(
            counted,
            Arc::new(move || {
                rows.fetch_add(1, Ordering::SeqCst);
            }),
        ))
    };
    let first = read_once_node(&input, &shared, (2, "j".into(), 0), wrap);
    let second = read_once_node(&input, &shared, (2, "j".into(), 0), wrap);
    let a = run(&first);
    let b = run(&second);
    assert_eq!(opened.load(Ordering::SeqCst), 1, "the input was read twice");
    assert_eq!(
        first_rows.load(Ordering::SeqCst),
        2,
        "one first row per subtask"
    );
    assert_eq!(metric(&second, "shared_taken"), 1);
    assert_eq!(contents(&a), contents(&input));
    assert_eq!(contents(&b), contents(&input));
    assert!(runs_of_one_key(&b), "the clustering is handed on");
    drop((first, second));
    assert!(shared.is_empty(), "the entry outlived its subtasks' plans");
}

/// The first subtask's leaf was stopped (its join needed no more): the
/// part it read is not handed on, and the other reads all of its own.
#[test]
fn a_build_side_cut_short_is_not_handed_on() {
    use crate::exec::released::{EndSignal, end_leaf_when};
    let shared = Arc::new(SharedClusters::default());
    let input = repeating(40_000);
    let stop = Arc::new(crate::exec::exchange::ReaderStop::default());
    stop.stop();
    let first = read_once_node(&input, &shared, (2, "j".into(), 0), |scan| {
        end_leaf_when(scan, EndSignal::Stopped(Arc::clone(&stop)))
    });
    let second = read_once_node(&input, &shared, (2, "j".into(), 0), |scan| scan);
    assert!(run(&first).is_empty(), "the stopped leaf read nothing");
    let b = run(&second);
    assert_eq!(metric(&second, "shared_taken"), 0);
    assert_eq!(contents(&b), contents(&input));
}

/// A scan read whole is the same in every subtask unless it reads a
/// dynamic filter that is not known to be the same everywhere.
#[test]
fn a_scan_is_shared_only_with_dynamic_filters_of_shared_build_sides() {
    use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
    use datafusion::physical_plan::filter::FilterExec;
    let schema = batch(vec![1]).schema();
    let dynamic = Arc::new(DynamicFilterPhysicalExpr::new(
        key(),
        datafusion::physical_expr::expressions::lit(true),
    ));
    let id = dynamic.expression_id().expect("a dynamic filter has an id");
    let scan = datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
        &[vec![batch(vec![1, 2])]],
        Arc::clone(&schema),
        None,
    )
    .expect("scan");
    let filtered: Arc<dyn ExecutionPlan> =
        Arc::new(FilterExec::try_new(dynamic, scan).expect("filter"));
    let broadcast = |_| true;
    assert!(
        !same_in_every_subtask(&filtered, &broadcast, &HashSet::new()).expect("walk"),
        "a filter of unknown keys"
    );
    assert!(
        same_in_every_subtask(&filtered, &broadcast, &HashSet::from([id])).expect("walk"),
        "a filter of a build side the same everywhere"
    );
}

/// Its input's rows, after one wait (a file read), as a scan.
struct WaitsOnce;

impl crate::exec::pass_through::PassThrough for WaitsOnce {
    fn wrap(&self, rows: SendableRecordBatchStream) -> DfResult<SendableRecordBatchStream> {
        use futures::StreamExt;
        let schema = rows.schema();
        let waited = futures::stream::once(tokio::task::yield_now())
            .filter_map(|()| async { None::<DfResult<RecordBatch>> });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            waited.chain(rows),
        )))
    }
}

/// The first subtask's thread blocks after the read started (as an
/// exchange reader blocks it while waiting for data another subtask
/// holds up): the read goes on without it, and the waiting subtask gets
/// the rows.
#[test]
fn a_build_side_read_for_all_goes_on_while_the_first_subtasks_thread_is_blocked() {
    use futures::StreamExt;
    let shared = Arc::new(SharedClusters::default());
    let input = repeating(40_000);
    // A scan waits for its file read once before its rows come.
    let slow = |scan| -> Arc<dyn ExecutionPlan> {
        Arc::new(crate::exec::pass_through::PassThroughExec::of(
            scan,
            "WaitsOnceExec",
            WaitsOnce,
        ))
    };
    let first = read_once_node(&input, &shared, (4, "j".into(), 0), slow);
    let second = read_once_node(&input, &shared, (4, "j".into(), 0), slow);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut stream = first
        .execute(0, Arc::new(TaskContext::default()))
        .expect("stream");
    // The first poll claims the read and starts it.
    let started = rt.block_on(async { futures::poll!(stream.next()) });
    assert!(started.is_pending(), "the scan waits once");
    let (tx, rx) = std::sync::mpsc::channel();
    let waiting = std::thread::spawn(move || {
        let _ = tx.send(run(&second));
    });
    // This thread now blocks, its runtime unpolled.
    let taken = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the waiting subtask never got the rows");
    waiting.join().expect("the waiting subtask");
    assert_eq!(contents(&taken), contents(&input));
    let own: Vec<RecordBatch> = rt
        .block_on(stream.collect::<Vec<_>>())
        .into_iter()
        .collect::<DfResult<_>>()
        .expect("the first's rows");
    assert_eq!(contents(&own), contents(&input));
}
