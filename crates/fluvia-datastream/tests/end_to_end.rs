//! End-to-end jobs on the embedded runtime: results are checked against
//! plain-Rust oracles, and must not change with chaining, object reuse,
//! parallelism or runtime mode.

#![allow(clippy::unwrap_used)]

use fluvia_core::keygroup::{KeyHash, key_group_for_hash};
use fluvia_datastream::prelude::*;
use fluvia_datastream::sinks::{TextFileSink, TwoPhaseCommitSinkOp};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Real text: this crate's own sources, plus a generated file, several MiB in
/// all so that the text source splits files between readers.
fn input_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let generated = dir.join("generated.txt");
    let words = [
        "stream", "graph", "Job", "vertex", "chain", "buffer", "credit", "slot", "ÆØÅ", "key",
    ];
    let mut text = String::new();
    let mut x = 12345u64;
    for line in 0..60_000 {
        for _ in 0..(line % 11) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            text.push_str(words[(x % words.len() as u64) as usize]);
            text.push(if x.is_multiple_of(7) { '\t' } else { ' ' });
        }
        text.push('\n');
    }
    std::fs::write(&generated, text).unwrap();
    files.push(generated);
    files
}

fn tokenize(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
}

fn reference_counts(files: &[PathBuf]) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for f in files {
        for line in std::fs::read_to_string(f).unwrap().lines() {
            for w in tokenize(line) {
                *counts.entry(w).or_insert(0) += 1;
            }
        }
    }
    counts
}

#[derive(Debug, Clone, Copy)]
struct Variant {
    parallelism: usize,
    chaining: bool,
    object_reuse: bool,
    mode: RuntimeMode,
}

fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for parallelism in [1, 2, 4] {
        for chaining in [true, false] {
            for object_reuse in [false, true] {
                for mode in [RuntimeMode::Batch, RuntimeMode::Streaming] {
                    v.push(Variant {
                        parallelism,
                        chaining,
                        object_reuse,
                        mode,
                    });
                }
            }
        }
    }
    v
}

fn env_for(v: Variant) -> StreamExecutionEnvironment {
    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(v.parallelism).set_runtime_mode(v.mode);
    if !v.chaining {
        env.disable_operator_chaining();
    }
    if v.object_reuse {
        env.enable_object_reuse();
    }
    env
}

/// Final count per word: in streaming mode the reduce emits running counts,
/// so keep the largest per word (counts only grow).
fn final_counts(pairs: Vec<(String, i64)>) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (w, c) in pairs {
        let e = out.entry(w).or_insert(0);
        *e = (*e).max(c);
    }
    out
}

#[test]
fn word_count_matches_a_plain_rust_count_in_every_variant() {
    let dir = tempfile::tempdir().unwrap();
    let files = input_files(dir.path());
    let expected = reference_counts(&files);
    assert!(expected.len() > 100);
    for v in variants() {
        let env = env_for(v);
        let (_, handle) = env
            .read_text_files(files.clone())
            .flat_map(|line: String, out| tokenize(&line).for_each(|w| out.collect((w, 1i64))))
            .key_by(|(w, _): &(String, i64)| w.clone())
            .sum(|(_, n)| n)
            .collect();
        let result = env.execute("word count").unwrap();
        let pairs = handle.take();
        if v.mode == RuntimeMode::Batch {
            assert_eq!(
                pairs.len(),
                expected.len(),
                "{v:?}: batch emits one result per word"
            );
        }
        assert_eq!(final_counts(pairs), expected, "{v:?}");
        let tasks = result.vertices.len();
        if v.chaining {
            assert_eq!(tasks, 2, "{v:?}: source->flat map, then reduce->sink");
        } else {
            assert_eq!(tasks, 4, "{v:?}: every operator is its own task");
        }
    }
}

#[test]
fn word_count_is_the_same_across_task_managers_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let files = input_files(dir.path());
    let expected = reference_counts(&files);
    for (parallelism, task_managers, codec, mode) in [
        (2, 2, "NONE", RuntimeMode::Streaming),
        (4, 2, "LZ4", RuntimeMode::Streaming),
        (3, 3, "NONE", RuntimeMode::Batch),
        (4, 2, "LZ4", RuntimeMode::Batch),
    ] {
        let env = StreamExecutionEnvironment::new();
        env.set_parallelism(parallelism)
            .set_runtime_mode(mode)
            .set_config("local.number-taskmanager", &task_managers.to_string())
            .set_config("taskmanager.network.compression.codec", codec);
        let (_, handle) = env
            .read_text_files(files.clone())
            .flat_map(|line: String, out| tokenize(&line).for_each(|w| out.collect((w, 1i64))))
            .rebalance()
            .map(|x| x)
            .key_by(|(w, _): &(String, i64)| w.clone())
            .sum(|(_, n)| n)
            .collect();
        env.execute("word count over TCP").unwrap();
        assert_eq!(
            final_counts(handle.take()),
            expected,
            "p{parallelism} on {task_managers} TMs, {codec}, {mode}"
        );
    }
}

#[test]
fn keyed_state_stays_with_the_key_group_owner_at_any_parallelism() {
    let data: Vec<(u32, i64)> = (0..20_000u32).map(|i| (i % 997, i as i64)).collect();
    let mut results = Vec::new();
    for p in [1usize, 2, 4] {
        let env = StreamExecutionEnvironment::new();
        env.set_parallelism(p).set_max_parallelism(128);
        let (_, handle) = env
            .from_collection(data.clone())
            .rebalance()
            .map(|r| r)
            .key_by(|(k, _): &(u32, i64)| *k)
            .process(|ctx: &mut KeyedContext<'_, u32, (u64, i64)>, (k, v), out| {
                let (lo, hi) = ctx.key_group_range;
                if ctx.key_group() < lo || ctx.key_group() > hi {
                    return Err(format!(
                        "key {k} in group {} outside {lo}..={hi}",
                        ctx.key_group()
                    )
                    .into());
                }
                if ctx.key_group() != key_group_for_hash(k.key_hash(), 128) {
                    return Err("key group differs from Flink's formula".into());
                }
                let state = ctx.state.get_or_insert((0, 0));
                state.0 += 1;
                state.1 += v;
                out.collect((k, state.0, state.1, ctx.subtask_index));
                Ok(())
            })
            .collect();
        env.execute("keyed state").unwrap();
        let mut finals: BTreeMap<u32, (u64, i64)> = BTreeMap::new();
        let mut owners: BTreeMap<u32, usize> = BTreeMap::new();
        for (k, n, sum, subtask) in handle.take() {
            let e = finals.entry(k).or_insert((0, 0));
            *e = (*e).max((n, sum));
            // A key is only ever processed by one subtask.
            assert_eq!(
                *owners.entry(k).or_insert(subtask),
                subtask,
                "key {k} moved"
            );
        }
        if p > 1 {
            let distinct: std::collections::BTreeSet<_> = owners.values().collect();
            assert_eq!(distinct.len(), p, "keys spread over all subtasks");
        }
        results.push(finals);
    }
    let mut expected: BTreeMap<u32, (u64, i64)> = BTreeMap::new();
    for (k, v) in &data {
        let e = expected.entry(*k).or_insert((0, 0));
        e.0 += 1;
        e.1 += v;
    }
    for r in results {
        assert_eq!(r, expected);
    }
}

#[test]
fn union_merges_and_connect_feeds_two_inputs() {
    for chaining in [true, false] {
        let env = StreamExecutionEnvironment::new();
        env.set_parallelism(2);
        if !chaining {
            env.disable_operator_chaining();
        }
        let a = env.from_sequence(1, 1000);
        let b = env.from_sequence(1001, 2000);
        let c = env.from_sequence(2001, 2500);
        let (_, union) = a.union(&[&b, &c]).map(|x| x * 2).collect();
        let words = env.from_collection(vec!["x".to_string(), "yy".to_string()]);
        let (_, connected) = a
            .connect(&words)
            .map(|n: i64| n, |s: String| -(s.len() as i64))
            .collect();
        let (_, keyed) = b
            .connect(&c)
            .key_by(|x: &i64| x % 10, |y: &i64| y % 10)
            .flat_map(
                |x: i64, out| out.collect((x % 10, 1u32)),
                |y: i64, out| out.collect((y % 10, 2u32)),
            )
            .collect();
        env.execute("union and connect").unwrap();

        let mut u = union.take();
        u.sort();
        assert_eq!(u, (1..=2500).map(|x| x * 2).collect::<Vec<i64>>());
        let mut c2 = connected.take();
        c2.sort();
        let mut expected: Vec<i64> = (1..=1000).collect();
        expected.extend([-2, -1]);
        expected.sort();
        assert_eq!(c2, expected);
        let mut k = keyed.take();
        k.sort();
        assert_eq!(k.len(), 1500);
        assert_eq!(k.iter().filter(|(_, t)| *t == 2).count(), 500);
    }
}

/// A process function splits a stream: the main output and two side
/// outputs of other types, read chained and over the network (keyed), at
/// every parallelism, with and without chaining, in both runtime modes.
#[test]
fn side_outputs_reach_their_consumers_chained_and_over_the_network() {
    for v in variants() {
        let env = env_for(v);
        let odd: OutputTag<String> = OutputTag::new("odd");
        let big: OutputTag<(i64, u8)> = OutputTag::new("big");
        let unread: OutputTag<i64> = OutputTag::new("unread");
        let (o, b, u) = (odd.clone(), big.clone(), unread.clone());
        let split = env.from_sequence(1, 5000).process(move |x: i64, out| {
            if x % 2 == 1 {
                out.output(&o, format!("odd-{x}"));
            } else {
                out.collect(x);
            }
            if x > 4000 {
                out.output(&b, (x, (x % 3) as u8));
            }
            // No consumer: dropped, as in Flink.
            out.output(&u, x);
            Ok(())
        });
        let (_, main) = split.collect();
        // Chained (forward) consumer of one side output ...
        let (_, odds) = split
            .get_side_output(&odd)
            .map(|s| s.len() as i64)
            .collect();
        // ... and a keyed (network) consumer of the other.
        let (_, bigs) = split
            .get_side_output(&big)
            .key_by(|(_, m)| *m)
            .reduce(|a, b| (a.0 + b.0, a.1))
            .collect();
        env.execute("side outputs").unwrap();

        let mut m = main.take();
        m.sort();
        assert_eq!(m, (1..=2500).map(|x| x * 2).collect::<Vec<i64>>(), "{v:?}");
        let odds = odds.take();
        assert_eq!(odds.len(), 2500, "{v:?}");
        let expected_len: i64 = (1..=5000)
            .filter(|x| x % 2 == 1)
            .map(|x: i64| format!("odd-{x}").len() as i64)
            .sum();
        assert_eq!(odds.iter().sum::<i64>(), expected_len, "{v:?}");
        let mut sums = BTreeMap::new();
        for (s, m) in bigs.take() {
            let e = sums.entry(m).or_insert(0);
            *e = (*e).max(s);
        }
        let mut expected = BTreeMap::new();
        for x in 4001..=5000i64 {
            *expected.entry((x % 3) as u8).or_insert(0) += x;
        }
        assert_eq!(sums, expected, "{v:?}");
    }
}

/// A rate-limited source emits every record, and no faster than its rate:
/// 2 subtasks at 400 records a second each take at least 0.2 s for 200
/// records (the first of each goes out at once).
#[test]
fn a_rate_limited_generator_emits_everything_at_its_rate() {
    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(2)
        .set_runtime_mode(RuntimeMode::Streaming);
    let (_, got) = env.from_generator_with_rate(200, 400.0, |i| i).collect();
    let started = std::time::Instant::now();
    env.execute("rate").unwrap();
    let elapsed = started.elapsed();
    let mut got = got.take();
    got.sort();
    assert_eq!(got, (0..200).collect::<Vec<u64>>());
    assert!(
        elapsed >= std::time::Duration::from_millis(200),
        "{elapsed:?}"
    );
}

/// Records the checkpoints its subtask is told completed.
struct CheckpointWatcher {
    completed: Arc<std::sync::Mutex<Vec<u64>>>,
    snapshots: Arc<AtomicU64>,
}

impl OneInputOperator<(u64, u64), (u64, u64)> for CheckpointWatcher {
    fn process_element(
        &mut self,
        record: (u64, u64),
        out: &mut Collector<'_, (u64, u64)>,
    ) -> Result<(), UserError> {
        out.collect(record);
        Ok(())
    }
    fn snapshot_state(
        &mut self,
        _ctx: &mut fluvia_runtime::state::StateSnapshotContext,
    ) -> Result<(), UserError> {
        self.snapshots.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn notify_checkpoint_complete(&mut self, id: u64) -> Result<(), UserError> {
        self.completed.lock().unwrap().push(id);
        Ok(())
    }
}

/// A streaming job with `execution.checkpointing.interval` takes periodic
/// checkpoints through the whole path: the JobManager's coordinator
/// triggers the sources over RPC, barriers cross a keyed exchange and are
/// aligned, every task snapshots and acknowledges, `_metadata` is written,
/// and every task is told the checkpoint completed. The job's answer does
/// not change.
#[test]
fn periodic_checkpoints_complete_and_are_notified_to_every_task() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Configuration::new();
    config
        .set("execution.checkpointing.interval", "100 ms")
        .set(
            "execution.checkpointing.dir",
            dir.path().display().to_string(),
        )
        .set(
            "execution.checkpointing.externalized-checkpoint-retention",
            "RETAIN_ON_CANCELLATION",
        );
    let env = StreamExecutionEnvironment::with_config(config).unwrap();
    env.set_parallelism(2)
        .set_runtime_mode(RuntimeMode::Streaming);
    let completed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let snapshots = Arc::new(AtomicU64::new(0));
    let (c, s) = (Arc::clone(&completed), Arc::clone(&snapshots));
    let (_, sums) = env
        .from_generator_with_rate(3000, 2000.0, |i| (i % 7, i))
        .key_by(|(k, _): &(u64, u64)| *k)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .transform("Watch", move |_| CheckpointWatcher {
            completed: Arc::clone(&c),
            snapshots: Arc::clone(&s),
        })
        .collect();
    let result = env.execute("checkpointed").unwrap();
    let summary = result.checkpoints.clone().unwrap();
    assert!(summary.completed >= 2, "{summary:?}");

    let mut finals = BTreeMap::new();
    for (k, v) in sums.take() {
        let e = finals.entry(k).or_insert(0);
        *e = (*e).max(v);
    }
    let mut expected = BTreeMap::new();
    for i in 0..3000u64 {
        *expected.entry(i % 7).or_insert(0) += i;
    }
    assert_eq!(finals, expected);
    let completed = completed.lock().unwrap().clone();
    // Two subtasks of the watcher are each told of each completed checkpoint.
    assert!(completed.len() >= 4, "{completed:?}");
    let mut ids = completed.clone();
    ids.sort();
    ids.dedup();
    assert!(ids.len() >= 2, "{completed:?}");
    assert!(snapshots.load(Ordering::SeqCst) >= 4);
}

/// Sums, counts and keeps per key with every kind of keyed state.
#[derive(Clone, Default)]
struct Stats {
    count: Option<ValueState<u64>>,
    seen: Option<ListState<u64>>,
    by_parity: Option<MapState<u8, u64>>,
    max: Option<ReducingState<u64>>,
    mean: Option<AggregatingState<u64, (u64, u64), u64>>,
}

struct Mean;

impl AggregateFunction<u64, (u64, u64), u64> for Mean {
    fn create_accumulator(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, v: u64, (sum, n): (u64, u64)) -> (u64, u64) {
        (sum + v, n + 1)
    }
    fn get_result(&self, (sum, n): &(u64, u64)) -> u64 {
        sum / (*n).max(1)
    }
    fn merge(&self, a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
        (a.0 + b.0, a.1 + b.1)
    }
}

type StatsRow = (u64, u64, usize, u64, u64, u64);

impl KeyedProcessFunction<u64, (u64, u64), StatsRow> for Stats {
    fn open(&mut self, state: &mut KeyedStateBackend<u64>) -> Result<(), UserError> {
        self.count = Some(state.value_state(&ValueStateDescriptor::new("count"))?);
        self.seen = Some(state.list_state(&ListStateDescriptor::new("seen"))?);
        self.by_parity = Some(state.map_state(&MapStateDescriptor::new("by-parity"))?);
        self.max = Some(state.reducing_state(&ReducingStateDescriptor::new("max", u64::max))?);
        self.mean = Some(state.aggregating_state(&AggregatingStateDescriptor::new("mean", Mean))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        (k, v): (u64, u64),
        state: &mut KeyedStateBackend<u64>,
        out: &mut Collector<'_, StatsRow>,
    ) -> Result<(), UserError> {
        assert_eq!(state.current_key(), Some(&k));
        let (Some(count), Some(seen), Some(by_parity), Some(max), Some(mean)) = (
            &self.count,
            &self.seen,
            &self.by_parity,
            &self.max,
            &self.mean,
        ) else {
            return Err("not opened".into());
        };
        let n = count.value(state)?.unwrap_or(0) + 1;
        count.update(state, n)?;
        seen.add(state, v)?;
        let parity = (v % 2) as u8;
        let p = by_parity.get(state, &parity)?.unwrap_or(0) + 1;
        by_parity.put(state, parity, p)?;
        max.add(state, v)?;
        mean.add(state, v)?;
        out.collect((
            k,
            n,
            seen.get(state)?.len(),
            by_parity.get(state, &0)?.unwrap_or(0),
            max.get(state)?.unwrap_or(0),
            mean.get(state)?.unwrap_or(0),
        ));
        Ok(())
    }
}

/// A keyed process function with value, list, map, reducing and
/// aggregating state gives the plain-Rust answer at any parallelism.
#[test]
fn every_kind_of_keyed_state_gives_the_plain_answer_at_any_parallelism() {
    for p in [1, 3] {
        let env = StreamExecutionEnvironment::new();
        env.set_parallelism(p)
            .set_runtime_mode(RuntimeMode::Streaming);
        let (_, rows) = env
            .from_generator(6000, |i| (i % 13, (i * 7919) % 1000))
            .key_by(|(k, _): &(u64, u64)| *k)
            .process_function(Stats::default())
            .collect();
        env.execute("keyed state").unwrap();
        let mut last: BTreeMap<u64, StatsRow> = BTreeMap::new();
        for r in rows.take() {
            let e = last.entry(r.0).or_insert(r);
            if r.1 > e.1 {
                *e = r;
            }
        }
        let mut expected: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for i in 0..6000u64 {
            expected.entry(i % 13).or_default().push((i * 7919) % 1000);
        }
        assert_eq!(last.len(), 13, "p{p}");
        for (k, vs) in expected {
            let n = vs.len() as u64;
            let evens = vs.iter().filter(|v| *v % 2 == 0).count() as u64;
            let want = (
                k,
                n,
                vs.len(),
                evens,
                *vs.iter().max().unwrap(),
                vs.iter().sum::<u64>() / n,
            );
            assert_eq!(last[&k], want, "p{p}");
        }
    }
}

/// Value state with a time-to-live: a key not written for longer than its
/// TTL starts over (processing time; the source is slowed to cross it).
#[derive(Clone, Default)]
struct Expiring(Option<ValueState<u64>>);

impl KeyedProcessFunction<u64, u64, (u64, u64)> for Expiring {
    fn open(&mut self, state: &mut KeyedStateBackend<u64>) -> Result<(), UserError> {
        let mut d = ValueStateDescriptor::new("count");
        d.enable_time_to_live(
            StateTtlConfig::new_builder(std::time::Duration::from_millis(100)).build(),
        );
        self.0 = Some(state.value_state(&d)?);
        Ok(())
    }

    fn process_element(
        &mut self,
        v: u64,
        state: &mut KeyedStateBackend<u64>,
        out: &mut Collector<'_, (u64, u64)>,
    ) -> Result<(), UserError> {
        let count = self.0.as_ref().ok_or("not opened")?;
        let n = count.value(state)?.unwrap_or(0) + 1;
        count.update(state, n)?;
        out.collect((v, n));
        Ok(())
    }
}

#[test]
fn keyed_state_with_a_ttl_expires_between_slow_records() {
    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(1)
        .set_runtime_mode(RuntimeMode::Streaming);
    // 4 records a second, one key: 250 ms apart, past the 100 ms TTL.
    let (_, rows) = env
        .from_generator_with_rate(4, 4.0, |i| i)
        .key_by(|_: &u64| 0u64)
        .process_function(Expiring::default())
        .collect();
    env.execute("ttl").unwrap();
    let mut rows = rows.take();
    rows.sort();
    // The first record goes out at once and the next without waiting if
    // the limiter had credit; later ones are 250 ms apart.
    assert!(
        rows.iter().filter(|(_, n)| *n == 1).count() >= 3,
        "{rows:?}"
    );
}

/// Barriers cross unions, two-input operators, broadcast and keyed edges:
/// checkpoints of such a job complete, over TCP between two TaskManagers
/// too, and its answer does not change.
#[test]
fn checkpoints_complete_across_unions_two_input_operators_and_broadcasts() {
    for task_managers in ["1", "2"] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Configuration::new();
        config
            .set("execution.checkpointing.interval", "50 ms")
            .set(
                "execution.checkpointing.dir",
                dir.path().display().to_string(),
            )
            .set("local.number-taskmanager", task_managers);
        let env = StreamExecutionEnvironment::with_config(config).unwrap();
        env.set_parallelism(2)
            .set_runtime_mode(RuntimeMode::Streaming);
        let a = env.from_generator_with_rate(1500, 3000.0, |i| i as i64);
        let b = env.from_generator_with_rate(1500, 3000.0, |i| 10_000 + i as i64);
        let rules = env.from_collection(vec![3i64]).broadcast();
        let (_, out) = a
            .union(&[&b])
            .connect(&rules)
            .key_by(|x: &i64| x % 5, |r: &i64| r % 5)
            .flat_map(|x: i64, out| out.collect((x % 7, x)), |_r: i64, _out| {})
            .key_by(|(k, _): &(i64, i64)| *k)
            .reduce(|a, b| (a.0, a.1 + b.1))
            .collect();
        let result = env.execute("checkpointed topology").unwrap();
        let summary = result.checkpoints.clone().unwrap();
        assert!(summary.completed >= 2, "{task_managers} TMs: {summary:?}");
        let mut finals = BTreeMap::new();
        for (k, sum) in out.take() {
            // Running sums only grow (every input is non-negative).
            let e = finals.entry(k).or_insert(0i64);
            *e = (*e).max(sum);
        }
        let mut expected = BTreeMap::new();
        for x in (0..1500i64).chain(10_000..11_500) {
            *expected.entry(x % 7).or_insert(0) += x;
        }
        assert_eq!(finals, expected, "{task_managers} TMs");
    }
}

/// A side output read as another type than it is written fails the job
/// with an error that names the tag, not with a wrong answer.
#[test]
fn a_side_output_read_as_another_type_fails_naming_the_tag() {
    let env = StreamExecutionEnvironment::new();
    let written: OutputTag<String> = OutputTag::new("mixed");
    let read: OutputTag<i64> = OutputTag::new("mixed");
    let split = env
        .from_sequence(1, 10)
        .process(move |x: i64, out| {
            out.output(&written, x.to_string());
            out.collect(x);
            Ok(())
        })
        .name("Split");
    split.get_side_output(&read).discard();
    split.discard();
    assert_fails_naming(&env, "mixed types", &["side output 'mixed'", "Split"]);
}

/// Executing `env` as `job` fails with an error naming every one of `parts`.
fn assert_fails_naming(env: &StreamExecutionEnvironment, job: &str, parts: &[&str]) {
    let err = env.execute(job).unwrap_err().to_string();
    assert!(parts.iter().all(|p| err.contains(p)), "{err}");
}

#[test]
fn partitioners_route_as_flink_does() {
    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(3);
    let src = env.from_sequence(1, 3000);
    let tag =
        |s: DataStream<i64>| s.transform("Tag", |ctx: &OperatorContext| Tagger(ctx.subtask_index));
    let (_, broadcast) = tag(src.broadcast()).collect();
    let (_, global) = tag(src.global()).collect();
    let (_, rebalance) = tag(src.rebalance()).collect();
    let (_, shuffle) = tag(src.shuffle()).collect();
    let (_, rescale) = tag(src.rescale()).set_parallelism(3).collect();
    let (_, forward) = tag(src.forward()).collect();
    env.execute("partitioners").unwrap();

    let per_subtask = |v: Vec<(i64, usize)>| {
        let mut c = [0usize; 3];
        for (_, s) in v {
            c[s] += 1;
        }
        c
    };
    assert_eq!(per_subtask(broadcast.take()), [3000, 3000, 3000]);
    assert_eq!(per_subtask(global.take()), [3000, 0, 0]);
    // Each producer deals its 1000 records round robin from a random start.
    let rb = per_subtask(rebalance.take());
    assert_eq!(rb.iter().sum::<usize>(), 3000);
    assert!(rb.iter().all(|n| (997..=1003).contains(n)), "{rb:?}");
    let sh = per_subtask(shuffle.take());
    assert_eq!(sh.iter().sum::<usize>(), 3000);
    assert!(sh.iter().all(|&n| n > 700), "{sh:?}");
    assert_eq!(per_subtask(rescale.take()), [1000, 1000, 1000]);
    // Forward keeps each subtask's records where they are: the sequence is
    // split into contiguous thirds.
    for (x, s) in forward.take() {
        assert_eq!(s, ((x - 1) / 1000) as usize);
    }
}

/// What a [`Tagger`] keeps of a record.
trait Tagged: 'static {
    type Value: 'static;
    fn value(self) -> Self::Value;
}

impl Tagged for i64 {
    type Value = i64;
    fn value(self) -> i64 {
        self
    }
}

/// Tags each record's value with the subtask it reached.
struct Tagger(usize);
impl<T: Tagged> OneInputOperator<T, (T::Value, usize)> for Tagger {
    fn process_element(
        &mut self,
        r: T,
        out: &mut Collector<'_, (T::Value, usize)>,
    ) -> Result<(), UserError> {
        out.collect((r.value(), self.0));
        Ok(())
    }
}

#[test]
fn a_slow_sink_back_pressures_the_producer_within_its_buffer_pool() {
    const RECORDS: u64 = 40_000;
    let produced = Arc::new(AtomicU64::new(0));
    let consumed = Arc::new(AtomicU64::new(0));
    let max_in_flight = Arc::new(AtomicU64::new(0));
    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(1)
        .set_runtime_mode(RuntimeMode::Streaming);
    let p = Arc::clone(&produced);
    let (c, m) = (Arc::clone(&consumed), Arc::clone(&max_in_flight));
    let p2 = Arc::clone(&produced);
    env.from_generator(RECORDS, |i| format!("{i:0>96}"))
        .map(move |s| {
            p.fetch_add(1, Ordering::SeqCst);
            s
        })
        .rebalance()
        .add_sink(move |s: String| {
            let done = c.fetch_add(1, Ordering::SeqCst) + 1;
            let in_flight = p2.load(Ordering::SeqCst) - done;
            m.fetch_max(in_flight, Ordering::SeqCst);
            if done % 100 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(s.len(), 96);
            Ok(())
        });
    let result = env.execute("back-pressure").unwrap();
    assert_eq!(consumed.load(Ordering::SeqCst), RECORDS);
    let source = &result.vertices[0];
    // The producer really waited for buffers, and never held more than its pool.
    assert!(source.backpressure_waits > 0, "{source:?}");
    assert!(source.output_buffers_max_in_use <= source.output_buffers_limit);
    assert_eq!(
        source.output_buffers_max_in_use,
        source.output_buffers_limit
    );
    // Records in flight are bounded by the pool: each 32 KiB buffer holds
    // 32768 / (4 + 8 + 96) = 303 records; the consumer holds one buffer, and
    // the producer has at most one record outside a buffer.
    let per_buffer = 32 * 1024 / (4 + 8 + 96);
    let bound = (source.output_buffers_limit as u64 + 1) * per_buffer + 1;
    let seen = max_in_flight.load(Ordering::SeqCst);
    assert!(seen <= bound, "in flight {seen} > bound {bound}");
    assert!(seen < RECORDS / 4, "the producer ran ahead: {seen}");

    // Task metrics: the producer spent most of its time back-pressured,
    // and the counters add up.
    let source_task = result
        .task_metrics
        .iter()
        .find(|t| t.task.starts_with("Source"))
        .unwrap();
    let sink_task = result
        .task_metrics
        .iter()
        .find(|t| t.task.starts_with("Sink"))
        .unwrap();
    assert_eq!(source_task.records_out, RECORDS);
    assert_eq!(sink_task.records_in, RECORDS);
    assert_eq!(source_task.bytes_out, sink_task.bytes_in);
    assert!(
        source_task.back_pressured_ms_per_second > 300.0,
        "{source_task:?}"
    );
    assert!(sink_task.busy_ms_per_second > 300.0, "{sink_task:?}");
}

#[test]
fn a_panicking_user_function_fails_the_job_naming_operator_and_subtask() {
    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(2);
    let (_, handle) = env
        .from_sequence(1, 100_000)
        .map(|x| {
            if x == 77_777 {
                panic!("bad record {x}");
            }
            x
        })
        .name("Explode")
        .key_by(|x: &i64| *x)
        .reduce(|a, b| a + b)
        .collect();
    let err = env.execute("panics").unwrap_err().to_string();
    // 77_777 is in the second half of the sequence: subtask 2 of 2.
    assert!(err.contains("operator 'Explode'"), "{err}");
    assert!(err.contains("(2/2)"), "{err}");
    assert!(err.contains("bad record 77777"), "{err}");
    assert!(handle.take().is_empty(), "no partial result is reported");
}

#[test]
fn a_user_error_downstream_cancels_the_whole_job() {
    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(2)
        .set_runtime_mode(RuntimeMode::Streaming);
    env.from_generator(u64::MAX / 2, |i| i)
        .rebalance()
        .try_map(|x: u64| {
            if x > 50_000 {
                Err(format!("value {x} too large").into())
            } else {
                Ok(x)
            }
        })
        .name("Check")
        .discard();
    assert_fails_naming(&env, "fails", &["operator 'Check'", "too large"]);
}

#[test]
fn bad_jobs_are_rejected_before_anything_runs() {
    let env = StreamExecutionEnvironment::new();
    env.read_text_file("/definitely/not/here.txt").discard();
    let err = env.execute("missing").unwrap_err().to_string();
    assert!(err.contains("/definitely/not/here.txt"), "{err}");

    let env = StreamExecutionEnvironment::new();
    env.from_sequence(1, 10)
        .map(|x| x)
        .set_parallelism(0)
        .discard();
    let err = env.execute("zero").unwrap_err().to_string();
    assert!(err.contains("'Map'") && err.contains("at least 1"), "{err}");

    let env = StreamExecutionEnvironment::new();
    env.from_sequence(1, 10)
        .set_parallelism(2)
        .forward()
        .map(|x| x)
        .set_parallelism(3)
        .discard();
    let err = env.execute("forward").unwrap_err().to_string();
    assert!(
        err.contains("Forward partitioning does not allow change of parallelism"),
        "{err}"
    );

    let env = StreamExecutionEnvironment::new();
    env.set_max_parallelism(4);
    env.from_sequence(1, 10)
        .map(|x| x)
        .set_parallelism(8)
        .discard();
    let err = env.execute("too parallel").unwrap_err().to_string();
    assert!(err.contains("larger than its max parallelism 4"), "{err}");

    let env = StreamExecutionEnvironment::new();
    let s = env.from_sequence(1, 10);
    s.union(&[&s]).set_parallelism(2).discard();
    assert_fails_naming(
        &env,
        "settings on union",
        &["set_parallelism() applies to an operator"],
    );
}

#[test]
fn text_sink_writes_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("nested").join("out.txt");
    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(2);
    env.from_sequence(1, 5000)
        .map(|x| format!("n={x}"))
        .global()
        .write_as_text(&out)
        .set_parallelism(1);
    env.execute("text sink").unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    let mut expected: Vec<String> = (1..=5000).map(|x| format!("n={x}")).collect();
    expected.sort();
    assert_eq!(lines, expected);
}

#[test]
fn a_failed_job_leaves_no_output_file_visible_and_removes_what_it_staged() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let target = out.clone();
    let job = std::thread::spawn(move || {
        let env = StreamExecutionEnvironment::new();
        env.set_parallelism(2).set_runtime_mode(RuntimeMode::Batch);
        env.from_sequence(1, 20_000)
            .try_map(|x: i64| {
                // The last record, in subtask 2: subtask 1 has written all
                // of its part by then.
                if x == 20_000 {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    return Err("record 20000 is bad".into());
                }
                Ok(format!("n={x}"))
            })
            .write_as_text(&target);
        env.execute("fails late").unwrap_err().to_string()
    });
    let names = || -> Vec<String> {
        std::fs::read_dir(&out)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    // While the job runs, subtask 1's part exists under its staged name.
    let mut staged_seen = false;
    while !job.is_finished() {
        let now = names();
        assert!(!now.iter().any(|n| n.starts_with("part-")), "{now:?}");
        staged_seen |= now
            .iter()
            .any(|n| n.starts_with(".part-0.attempt-0.") && n.ends_with(".inprogress"));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let err = job.join().unwrap();
    assert!(err.contains("record 20000 is bad"), "{err}");
    assert!(
        staged_seen,
        "the finished subtask's staged file was never seen"
    );
    // Staged files go when the job is released, just after it ends.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !names().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(names(), Vec::<String>::new(), "nothing of the failed job");
}

#[test]
fn chained_and_unchained_job_graphs_are_named_like_flink() {
    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(2);
    let words = env
        .read_text_file("lines.txt")
        .name("lines")
        .flat_map(|l: String, out| out.collect(l))
        .filter(|w: &String| !w.is_empty());
    words.map(|w| (w, 1i64)).discard();
    words.print();
    let jg = env.job_graph("names").unwrap();
    assert_eq!(jg.vertices.len(), 1);
    assert_eq!(
        jg.vertices[0].name,
        "Source: lines -> Flat Map -> Filter -> (Map -> Sink: Discard, Sink: Print to Std. Out)"
    );
}

/// Sleeps on subtask 1 to make it the slow consumer.
struct SlowOnSecond(usize);
impl OneInputOperator<String, usize> for SlowOnSecond {
    fn process_element(
        &mut self,
        r: String,
        out: &mut Collector<'_, usize>,
    ) -> Result<(), UserError> {
        assert_eq!(r.len(), 1000);
        if self.0 == 1 {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        out.collect(self.0);
        Ok(())
    }
}

#[test]
fn load_aware_rebalance_sends_less_to_a_slow_consumer() {
    const N: u64 = 6_000;
    let mut shares = Vec::new();
    for adaptive in [false, true] {
        let env = StreamExecutionEnvironment::new();
        env.set_parallelism(1)
            .set_runtime_mode(RuntimeMode::Streaming)
            .set_config(
                "taskmanager.network.adaptive-partitioner.enabled",
                &adaptive.to_string(),
            );
        let (_, handle) = env
            .from_generator(N, |i| format!("{i:0>1000}"))
            .rebalance()
            .transform("Consume", |ctx: &OperatorContext| {
                SlowOnSecond(ctx.subtask_index)
            })
            .set_parallelism(2)
            .collect();
        env.execute("load-aware rebalance").unwrap();
        let got = handle.take();
        assert_eq!(got.len() as u64, N, "nothing lost");
        let slow = got.iter().filter(|&&s| s == 1).count() as f64 / N as f64;
        shares.push(slow);
    }
    assert!(
        (shares[0] - 0.5).abs() < 0.01,
        "round robin splits evenly: {shares:?}"
    );
    assert!(shares[1] < 0.4, "the slow consumer got less: {shares:?}");
}

static ENCODES: AtomicU64 = AtomicU64::new(0);

/// A record that counts how often it is serialised.
#[derive(Debug, Clone, serde::Deserialize)]
struct Counted(u64);

impl serde::Serialize for Counted {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ENCODES.fetch_add(1, Ordering::SeqCst);
        s.serialize_newtype_struct("Counted", &self.0)
    }
}

#[test]
fn broadcast_encodes_each_record_once_and_delivers_it_to_every_consumer() {
    const N: u64 = 10_000;
    for task_managers in [1, 3] {
        ENCODES.store(0, Ordering::SeqCst);
        let env = StreamExecutionEnvironment::new();
        env.set_parallelism(1)
            .set_config("local.number-taskmanager", &task_managers.to_string());
        let (_, handle) = env
            .from_generator(N, Counted)
            .broadcast()
            .transform("Tag", |ctx: &OperatorContext| Tagger(ctx.subtask_index))
            .set_parallelism(3)
            .collect();
        let result = env.execute("broadcast").unwrap();
        let got = handle.take();
        assert_eq!(ENCODES.load(Ordering::SeqCst), N, "encoded once per record");
        assert_eq!(got.len() as u64, 3 * N, "delivered to each of 3 consumers");
        for s in 0..3 {
            let mut mine: Vec<u64> = got
                .iter()
                .filter(|(_, t)| *t == s)
                .map(|(v, _)| *v)
                .collect();
            mine.sort();
            assert_eq!(mine, (0..N).collect::<Vec<_>>());
        }
        // The source wrote each buffer once, shared by the three subpartitions.
        let source = &result.vertices[0];
        let per_consumer: u64 = result.vertices[1].bytes_in / 3;
        assert_eq!(source.bytes_out, per_consumer, "{task_managers} TMs");
    }
}

impl Tagged for Counted {
    type Value = u64;
    fn value(self) -> u64 {
        self.0
    }
}

// ------------------------------------------------- exactly-once sinks

fn file_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn checkpointed_env(dir: &std::path::Path, parallelism: usize) -> StreamExecutionEnvironment {
    let mut config = Configuration::new();
    config.set("execution.checkpointing.interval", "50 ms").set(
        "execution.checkpointing.dir",
        dir.join("checkpoints").display().to_string(),
    );
    let env = StreamExecutionEnvironment::with_config(config).unwrap();
    env.set_parallelism(parallelism)
        .set_runtime_mode(RuntimeMode::Streaming);
    env
}

/// A temporary directory, its "out" directory for a text sink and a
/// checkpointed environment of parallelism 2 writing its state there.
fn checkpointed_text_job() -> (tempfile::TempDir, PathBuf, StreamExecutionEnvironment) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let env = checkpointed_env(dir.path(), 2);
    (dir, out, env)
}

/// Only finished parts are left in `out` and together they hold each of
/// the records `0..count` once: their names.
fn finished_parts_hold_every_record_once(out: &std::path::Path, count: u64) -> Vec<String> {
    let names = file_names(out);
    assert!(
        names.iter().all(|n| n.starts_with("part-")),
        "only finished parts are left: {names:?}"
    );
    let mut lines = Vec::new();
    for name in &names {
        let text = std::fs::read_to_string(out.join(name)).unwrap();
        lines.extend(text.lines().map(|l| l.parse::<u64>().unwrap()));
    }
    lines.sort();
    assert_eq!(lines, (0..count).collect::<Vec<u64>>());
    names
}

/// Looks at each record a [`Checked`] operator passes on, knowing whether
/// a checkpoint completed in its chain yet.
trait RecordCheck: 'static {
    fn check(&mut self, completed: bool, record: u64) -> Result<(), UserError>;
}

/// Passes `u64` records on after its check accepted them.
struct Checked<C> {
    check: C,
    completed: bool,
}

fn checked<C: RecordCheck>(check: C) -> Checked<C> {
    Checked {
        check,
        completed: false,
    }
}

impl<C: RecordCheck> OneInputOperator<u64, u64> for Checked<C> {
    fn process_element(
        &mut self,
        record: u64,
        out: &mut Collector<'_, u64>,
    ) -> Result<(), UserError> {
        self.check.check(self.completed, record)?;
        out.collect(record);
        Ok(())
    }

    fn notify_checkpoint_complete(&mut self, _id: u64) -> Result<(), UserError> {
        self.completed = true;
        Ok(())
    }
}

/// Chained in front of the text sink: until its own chain hears of a
/// completed checkpoint (it is told before the sink behind it), no
/// finished part file of its subtask may exist.
struct CommitWatcher {
    dir: PathBuf,
    subtask: usize,
    checks_before: Arc<AtomicU64>,
    /// Checks that saw a finished part while the job ran.
    seen_committed: Arc<AtomicU64>,
    violations: Arc<std::sync::Mutex<Vec<String>>>,
}

impl RecordCheck for CommitWatcher {
    fn check(&mut self, completed: bool, record: u64) -> Result<(), UserError> {
        if record.is_multiple_of(10) {
            let prefix = format!("part-{}-", self.subtask);
            let visible: Vec<String> = file_names(&self.dir)
                .into_iter()
                .filter(|n| n.starts_with(&prefix))
                .collect();
            if !completed {
                self.checks_before.fetch_add(1, Ordering::SeqCst);
                self.violations.lock().unwrap().extend(visible);
            } else if !visible.is_empty() {
                self.seen_committed.fetch_add(1, Ordering::SeqCst);
            }
        }
        Ok(())
    }
}

/// STREAMING with checkpointing: the text sink writes hidden in-progress
/// part files, and a part gets its final name only when a checkpoint that
/// recorded it completes; at the end every record is in exactly one
/// finished part and nothing in progress is left.
#[test]
fn streaming_text_sink_commits_part_files_only_when_checkpoints_complete() {
    let (_dir, out, env) = checkpointed_text_job();
    let checks_before = Arc::new(AtomicU64::new(0));
    let seen_committed = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (d, c, v) = (
        out.clone(),
        Arc::clone(&checks_before),
        Arc::clone(&violations),
    );
    let s = Arc::clone(&seen_committed);
    env.from_generator_with_rate(3000, 2000.0, |i| i)
        .transform("Watch", move |ctx: &OperatorContext| {
            checked(CommitWatcher {
                dir: d.clone(),
                subtask: ctx.subtask_index,
                checks_before: Arc::clone(&c),
                seen_committed: Arc::clone(&s),
                violations: Arc::clone(&v),
            })
        })
        .write_as_text(&out);
    env.execute("exactly-once text").unwrap();

    assert!(checks_before.load(Ordering::SeqCst) > 0);
    assert_eq!(*violations.lock().unwrap(), Vec::<String>::new());
    // Parts were committed at checkpoints while the job ran, not only at
    // its end.
    assert!(seen_committed.load(Ordering::SeqCst) > 0);
    let names = finished_parts_hold_every_record_once(&out, 3000);
    // Rolled at every checkpoint: more parts than subtasks.
    assert!(names.len() > 2, "{names:?}");
}

/// The part file `name` in `out` holds `text`.
fn assert_part(out: &std::path::Path, name: &str, text: &str) {
    assert_eq!(
        std::fs::read_to_string(out.join(name)).unwrap(),
        text,
        "{name}"
    );
}

fn sink_context(subtask: usize, parallelism: usize) -> OperatorContext {
    let mut ctx = OperatorContext::new(
        "sink",
        "Sink: Text File",
        0,
        subtask,
        parallelism,
        128,
        0,
        false,
        false,
    );
    ctx.checkpoint_interval = Some(std::time::Duration::from_millis(50));
    ctx
}

fn write_lines(sink: &mut TextFileSink, lines: &[&str]) {
    let mut out = fluvia_runtime::output::DiscardingOutput;
    let mut c = Collector::new(&mut out, 0);
    for l in lines {
        OneInputOperator::<String, ()>::process_element(sink, l.to_string(), &mut c).unwrap();
    }
}

fn snapshot(sink: &mut TextFileSink, id: u64) -> fluvia_runtime::state::OperatorStateSnapshot {
    let mut ctx = fluvia_runtime::state::StateSnapshotContext::default();
    ctx.checkpoint_id = id;
    OneInputOperator::<String, ()>::snapshot_state(sink, &mut ctx).unwrap();
    ctx.snapshot
}

fn start_sink(
    out: &std::path::Path,
    restore: Option<fluvia_runtime::state::OperatorStateSnapshot>,
) -> TextFileSink {
    let mut sink = TextFileSink::new(out, FileSinkOptions::default());
    let mut init = fluvia_runtime::state::StateInitializationContext::new((0, 127), restore);
    OneInputOperator::<String, ()>::initialize_state(&mut sink, &mut init).unwrap();
    OneInputOperator::<String, ()>::open(&mut sink, &sink_context(1, 2)).unwrap();
    sink
}

/// The part-file lifecycle at the operator: pending files of a checkpoint
/// are committed by a restore from it (idempotently: restoring twice
/// changes nothing), and what was written after it is removed; another
/// subtask's in-progress files are left alone.
#[test]
fn text_sink_restore_commits_the_checkpoints_parts_once_and_drops_later_ones() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut sink = start_sink(&out, None);
    write_lines(&mut sink, &["a1", "a2"]);
    let first = snapshot(&mut sink, 1);
    write_lines(&mut sink, &["b1"]);
    let _second = snapshot(&mut sink, 2);
    write_lines(&mut sink, &["c1"]);
    assert_eq!(sink.pending_part_files().len(), 2);
    // Crash: neither checkpoint was confirmed.
    drop(sink);
    let names = file_names(&out);
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.starts_with(".part-1-") && n.contains(".inprogress.")),
        "{names:?}"
    );
    // Another subtask's file in progress is not this subtask's to remove.
    std::fs::write(out.join(".part-0-0.inprogress.other"), "x\n").unwrap();

    let expected = vec![
        ".part-0-0.inprogress.other".to_string(),
        "part-1-0".to_string(),
    ];
    let restored = start_sink(&out, Some(first.clone()));
    assert_eq!(file_names(&out), expected);
    assert_part(&out, "part-1-0", "a1\na2\n");
    drop(restored);
    // Restoring from the same checkpoint again changes nothing.
    let mut again = start_sink(&out, Some(first));
    assert_eq!(file_names(&out), expected);
    assert_part(&out, "part-1-0", "a1\na2\n");
    // The restored subtask goes on numbering after its committed parts,
    // and commits on completion, every earlier checkpoint included.
    write_lines(&mut again, &["d1"]);
    snapshot(&mut again, 3);
    assert!(!out.join("part-1-1").exists());
    OneInputOperator::<String, ()>::notify_checkpoint_aborted(&mut again, 3).unwrap();
    assert!(!out.join("part-1-1").exists());
    write_lines(&mut again, &["e1"]);
    snapshot(&mut again, 4);
    OneInputOperator::<String, ()>::notify_checkpoint_complete(&mut again, 4).unwrap();
    assert_part(&out, "part-1-1", "d1\n");
    assert_part(&out, "part-1-2", "e1\n");
    assert!(again.pending_part_files().is_empty());
}

type Committed = Arc<std::sync::Mutex<BTreeMap<(usize, u64), Vec<u64>>>>;

/// A transactional test sink: transactions are numbered per subtask;
/// committing moves a transaction's records to `committed` (idempotent:
/// by transaction).
struct LoggingSink {
    subtask: usize,
    next: u64,
    log: Arc<std::sync::Mutex<Vec<String>>>,
    committed: Committed,
}

impl TwoPhaseCommitSink<u64> for LoggingSink {
    type Txn = (u64, Vec<u64>);

    fn begin(&mut self) -> Result<Self::Txn, UserError> {
        self.next += 1;
        self.log
            .lock()
            .unwrap()
            .push(format!("begin {}", self.next));
        Ok((self.next, Vec::new()))
    }
    fn write(&mut self, txn: &mut Self::Txn, value: u64) -> Result<(), UserError> {
        txn.1.push(value);
        Ok(())
    }
    fn pre_commit(&mut self, txn: &mut Self::Txn) -> Result<(), UserError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("pre-commit {}", txn.0));
        Ok(())
    }
    fn commit(&mut self, txn: Self::Txn) -> Result<(), UserError> {
        self.log.lock().unwrap().push(format!("commit {}", txn.0));
        self.committed
            .lock()
            .unwrap()
            .insert((self.subtask, txn.0), txn.1);
        Ok(())
    }
    fn abort(&mut self, txn: Self::Txn) -> Result<(), UserError> {
        self.log.lock().unwrap().push(format!("abort {}", txn.0));
        Ok(())
    }
}

/// The two-phase-commit operator: a transaction is pre-committed at the
/// barrier and committed only once its checkpoint completes (an aborted
/// checkpoint's waits for the next); a restore commits what the checkpoint
/// pre-committed and aborts what was open then.
#[test]
fn two_phase_commit_sink_commits_only_after_the_checkpoint_completes() {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let committed = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let make = |next: u64| {
        TwoPhaseCommitSinkOp::new(LoggingSink {
            subtask: 0,
            next,
            log: Arc::clone(&log),
            committed: Arc::clone(&committed),
        })
    };
    let ctx = OperatorContext::new("sink", "2pc", 0, 0, 1, 128, 0, false, false);
    let snap = |op: &mut TwoPhaseCommitSinkOp<u64, LoggingSink>, id: u64| {
        let mut s = fluvia_runtime::state::StateSnapshotContext::default();
        s.checkpoint_id = id;
        OneInputOperator::<u64, ()>::snapshot_state(op, &mut s).unwrap();
        s.snapshot
    };
    let write = |op: &mut TwoPhaseCommitSinkOp<u64, LoggingSink>, values: &[u64]| {
        let mut out = fluvia_runtime::output::DiscardingOutput;
        let mut c = Collector::new(&mut out, 0);
        for v in values {
            op.process_element(*v, &mut c).unwrap();
        }
    };
    let take = || std::mem::take(&mut *log.lock().unwrap());

    let mut op = make(0);
    let mut init = fluvia_runtime::state::StateInitializationContext::new((0, 127), None);
    op.initialize_state(&mut init).unwrap();
    OneInputOperator::<u64, ()>::open(&mut op, &ctx).unwrap();
    write(&mut op, &[1, 2]);
    snap(&mut op, 1);
    assert_eq!(take(), ["begin 1", "pre-commit 1", "begin 2"]);
    assert!(committed.lock().unwrap().is_empty());
    op.notify_checkpoint_complete(1).unwrap();
    assert_eq!(take(), ["commit 1"]);
    write(&mut op, &[3]);
    snap(&mut op, 2);
    op.notify_checkpoint_aborted(2).unwrap();
    assert_eq!(take(), ["pre-commit 2", "begin 3"]);
    write(&mut op, &[4]);
    let third = snap(&mut op, 3);
    assert_eq!(take(), ["pre-commit 3", "begin 4"]);
    assert_eq!(op.pending_checkpoints(), vec![2, 3]);
    write(&mut op, &[5]);
    // Crash before checkpoint 3 is confirmed.
    drop(op);
    assert_eq!(take(), Vec::<String>::new());

    let mut restored = make(10);
    let mut init = fluvia_runtime::state::StateInitializationContext::new((0, 127), Some(third));
    restored.initialize_state(&mut init).unwrap();
    assert_eq!(take(), ["commit 2", "commit 3", "abort 4"]);
    assert_eq!(
        committed.lock().unwrap().clone(),
        BTreeMap::from([((0, 1), vec![1, 2]), ((0, 2), vec![3]), ((0, 3), vec![4])])
    );
}

/// A two-phase-commit sink in a checkpointed job: every record is
/// committed exactly once, each transaction after its pre-commit.
#[test]
fn two_phase_commit_sink_job_commits_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let env = checkpointed_env(dir.path(), 2);
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let committed = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let (l, c) = (Arc::clone(&log), Arc::clone(&committed));
    env.from_generator_with_rate(2000, 2000.0, |i| i)
        .add_two_phase_commit_sink(move |ctx: &OperatorContext| LoggingSink {
            subtask: ctx.subtask_index,
            next: 0,
            log: Arc::clone(&l),
            committed: Arc::clone(&c),
        });
    env.execute("two-phase commit").unwrap();
    let mut all: Vec<u64> = committed
        .lock()
        .unwrap()
        .values()
        .flatten()
        .copied()
        .collect();
    all.sort();
    assert_eq!(all, (0..2000).collect::<Vec<u64>>());
    assert!(
        committed.lock().unwrap().len() > 2,
        "committed at checkpoints"
    );
    let log = log.lock().unwrap();
    assert!(log.iter().any(|e| e.starts_with("pre-commit")));
}

/// A source that checkpoints its position: subtask `i` of `p` emits
/// `i, i + p, ...` below `count`, a few records per poll.
struct ReplayableSource {
    subtask: u64,
    parallelism: u64,
    count: u64,
    next: u64,
}

impl SourceOperator<u64> for ReplayableSource {
    fn initialize_state(
        &mut self,
        ctx: &mut fluvia_runtime::state::StateInitializationContext,
    ) -> Result<(), UserError> {
        for bytes in ctx.operator_state("positions") {
            let (subtask, next): (u64, u64) = bincode::deserialize(bytes)?;
            if subtask == self.subtask {
                self.next = next;
            }
        }
        Ok(())
    }

    fn snapshot_state(
        &mut self,
        ctx: &mut fluvia_runtime::state::StateSnapshotContext,
    ) -> Result<(), UserError> {
        let bytes = bincode::serialize(&(self.subtask, self.next))?;
        ctx.union_list_state("positions", vec![bytes]);
        Ok(())
    }

    fn poll_next(&mut self, out: &mut Collector<'_, u64>) -> Result<SourceStatus, UserError> {
        for _ in 0..5 {
            let value = self.subtask + self.next * self.parallelism;
            if value >= self.count {
                return Ok(SourceStatus::End);
            }
            out.collect(value);
            self.next += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        Ok(SourceStatus::MoreAvailable)
    }
}

/// Fails the job once, after a checkpoint completed in its chain.
struct FailOnce {
    failed: Arc<std::sync::atomic::AtomicBool>,
}

impl RecordCheck for FailOnce {
    fn check(&mut self, completed: bool, record: u64) -> Result<(), UserError> {
        if completed && record >= 1000 && !self.failed.swap(true, Ordering::SeqCst) {
            return Err("failing once on purpose".into());
        }
        Ok(())
    }
}

/// A failover restores the latest completed checkpoint: the sink commits
/// what it recorded, drops what was written after it, and the source
/// replays from there, so every record ends up in exactly one finished
/// part.
#[test]
fn streaming_text_sink_writes_every_record_once_across_a_failover() {
    let (_dir, out, env) = checkpointed_text_job();
    env.set_config("restart-strategy.type", "fixed-delay")
        .set_config("restart-strategy.fixed-delay.attempts", "1")
        .set_config("restart-strategy.fixed-delay.delay", "100 ms");
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = Arc::clone(&failed);
    env.from_source("Replayable", true, |ctx: &OperatorContext| {
        ReplayableSource {
            subtask: ctx.subtask_index as u64,
            parallelism: ctx.parallelism as u64,
            count: 3000,
            next: 0,
        }
    })
    .transform("Fail Once", move |_| {
        checked(FailOnce {
            failed: Arc::clone(&f),
        })
    })
    .write_as_text(&out);
    env.execute("failover").unwrap();

    assert!(failed.load(Ordering::SeqCst), "the job failed over");
    finished_parts_hold_every_record_once(&out, 3000);
}

/// The rolling policy and part-file names of the sink's options: a part
/// that reached its size is closed into a pending file before the next
/// record, and committed with the checkpoint that follows.
#[test]
fn text_sink_rolls_parts_by_size_and_names_them_as_configured() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let options = FileSinkOptions::new()
        .with_part_prefix("events")
        .with_part_suffix(".txt")
        .with_part_size(6);
    let mut sink = TextFileSink::new(&out, options);
    let mut init = fluvia_runtime::state::StateInitializationContext::new((0, 127), None);
    OneInputOperator::<String, ()>::initialize_state(&mut sink, &mut init).unwrap();
    OneInputOperator::<String, ()>::open(&mut sink, &sink_context(0, 1)).unwrap();
    write_lines(&mut sink, &["aaa", "bbb", "ccc", "d"]);
    assert_eq!(sink.pending_part_files().len(), 1);
    snapshot(&mut sink, 1);
    assert_eq!(sink.pending_part_files().len(), 2);
    assert!(file_names(&out).iter().all(|n| n.starts_with(".events-0-")));
    OneInputOperator::<String, ()>::notify_checkpoint_complete(&mut sink, 1).unwrap();
    assert_eq!(file_names(&out), ["events-0-0.txt", "events-0-1.txt"]);
    assert_part(&out, "events-0-0.txt", "aaa\nbbb\n");
    assert_part(&out, "events-0-1.txt", "ccc\nd\n");
}
