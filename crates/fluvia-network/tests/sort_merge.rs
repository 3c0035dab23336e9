//! Sort-merge blocking partitions end to end: the files written, range reads
//! locally and over TCP, concurrent readers, corruption and bad indexes.

#![allow(clippy::unwrap_used, clippy::needless_range_loop)]

use fluvia_network::net::environment::{NetworkConfig, NetworkEnvironment, RemoteChannelSpec};
use fluvia_network::net::protocol::ResultPartitionId;
use fluvia_network::sortmerge::{
    PartitionFile, ReadScheduler, SortMergeConfig, SortMergePartition,
};
use fluvia_network::{
    CancelToken, ChannelDeserializers, GateEvent, InputChannel, InputGate, LocalInputChannel,
    NetworkBufferPool, PartitionWriter, ResultPartition, Target,
};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

const SEGMENT: usize = 4096;

struct Written {
    partition: Arc<ResultPartition>,
    pool: Arc<fluvia_network::LocalBufferPool>,
}

/// A read scheduler with `budget` bytes of read buffers, and a directory
/// for the partition files.
fn scheduler_and_dir(budget: u64) -> (Arc<ReadScheduler>, tempfile::TempDir) {
    let scheduler = ReadScheduler::start(budget, SEGMENT).unwrap();
    (scheduler, tempfile::tempdir().unwrap())
}

fn config(sort_buffers: usize, compression: bool) -> SortMergeConfig {
    SortMergeConfig {
        segment_size: SEGMENT,
        sort_buffers,
        compression,
    }
}

/// A record of subpartition `sp`, number `seq`, `len` bytes (at least 12).
fn record(sp: usize, seq: u64, len: usize) -> Vec<u8> {
    let mut r = vec![(seq % 251) as u8; len.max(12)];
    r[0..4].copy_from_slice(&(sp as u32).to_le_bytes());
    r[4..12].copy_from_slice(&seq.to_le_bytes());
    r
}

fn write(
    dir: &Path,
    n: usize,
    cfg: SortMergeConfig,
    scheduler: &Arc<ReadScheduler>,
    records: impl IntoIterator<Item = (Target, Vec<u8>)>,
) -> Written {
    let global = NetworkBufferPool::new(64 << 20, SEGMENT).unwrap();
    let pool = global.create_local_pool(cfg.sort_buffers).unwrap();
    let smp =
        SortMergePartition::create("test", n, dir, "p", cfg, Arc::clone(scheduler), 7).unwrap();
    let partition = Arc::new(ResultPartition::sort_merge(smp));
    let mut w = PartitionWriter::new(
        Arc::clone(&partition),
        Arc::clone(&pool),
        CancelToken::new(),
        None,
    );
    for (t, r) in records {
        w.emit(t, &r).unwrap();
    }
    w.finish().unwrap();
    Written { partition, pool }
}

/// [`write`]s the records of `exp` (per subpartition) interleaved, into
/// as many subpartitions.
fn write_expected(
    dir: &Path,
    cfg: SortMergeConfig,
    scheduler: &Arc<ReadScheduler>,
    exp: &[Vec<Vec<u8>>],
) -> Written {
    write(dir, exp.len(), cfg, scheduler, interleaved(exp))
}

/// Per channel, `(subpartition, record)` in arrival order.
type Received = Vec<Vec<(u32, Vec<u8>)>>;

/// Reads `channels` through one gate; returns per channel and subpartition
/// (absolute, given each channel's first) the records in arrival order.
fn read_all(channels: Vec<(Arc<dyn InputChannel>, u32)>) -> fluvia_core::Result<Received> {
    let firsts: Vec<u32> = channels.iter().map(|c| c.1).collect();
    let mut gate = InputGate::single_input(channels.into_iter().map(|(channel, _)| channel));
    let mut deser = ChannelDeserializers::new(gate.num_channels());
    let mut out = vec![Vec::new(); gate.num_channels()];
    let cancel = CancelToken::new();
    while let Some(ev) = gate.get_next(&cancel)? {
        match ev {
            GateEvent::Buffer {
                channel,
                subpartition,
                buffer,
            } => {
                let sp = firsts[channel] + subpartition;
                let out = &mut out[channel];
                deser
                    .get(channel, subpartition)
                    .feed(buffer.as_slice(), |r| {
                        out.push((sp, r.to_vec()));
                        Ok(())
                    })?;
            }
            GateEvent::ChannelFinished { channel } => {
                assert!(!deser.has_partial_record(channel));
            }
            GateEvent::Event { event, .. } => panic!("a blocking partition carried {event:?}"),
        }
    }
    Ok(out)
}

/// The records of subpartition `sp` among one channel's, in order.
fn records_of(got: &[(u32, Vec<u8>)], sp: usize) -> Vec<Vec<u8>> {
    got.iter()
        .filter(|(s, _)| *s as usize == sp)
        .map(|(_, r)| r.clone())
        .collect()
}

/// Reads each of the `n` subpartitions of `p` through a channel of its
/// own, all at once; returns the records of each, in order.
fn read_each_subpartition(p: &Arc<ResultPartition>, n: usize) -> Vec<Vec<Vec<u8>>> {
    let got = read_all((0..n as u32).map(|sp| local(p, sp, sp)).collect()).unwrap();
    got.iter()
        .enumerate()
        .map(|(sp, recs)| {
            assert!(
                recs.iter().all(|(s, _)| *s as usize == sp),
                "subpartition {sp}"
            );
            records_of(recs, sp)
        })
        .collect()
}

/// Checks that channel `ch` of `got`, reading subpartitions `first..=last`
/// of `exp`'s, received exactly theirs, in order.
fn assert_ranges(got: &Received, ranges: &[(usize, usize, usize)], exp: &[Vec<Vec<u8>>]) {
    for &(ch, first, last) in ranges {
        for (sp, exp) in exp.iter().enumerate() {
            let recs = records_of(&got[ch], sp);
            if (first..=last).contains(&sp) {
                assert_eq!(&recs, exp, "channel {ch} subpartition {sp}");
            } else {
                assert!(recs.is_empty(), "channel {ch} got subpartition {sp}");
            }
        }
    }
}

fn local(p: &Arc<ResultPartition>, first: u32, last: u32) -> (Arc<dyn InputChannel>, u32) {
    (
        LocalInputChannel::new(Arc::clone(p), first, last).unwrap(),
        first,
    )
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Records per subpartition, in the order they were written.
fn expected(n: usize, per: u64, len: impl Fn(u64) -> usize) -> Vec<Vec<Vec<u8>>> {
    (0..n)
        .map(|sp| (0..per).map(|s| record(sp, s, len(s))).collect())
        .collect()
}

fn interleaved(exp: &[Vec<Vec<u8>>]) -> Vec<(Target, Vec<u8>)> {
    let per = exp.iter().map(Vec::len).max().unwrap_or(0);
    (0..per)
        .flat_map(|s| {
            exp.iter()
                .enumerate()
                .filter(move |(_, recs)| s < recs.len())
                .map(move |(sp, recs)| (Target::One(sp), recs[s].clone()))
        })
        .collect()
}

#[test]
fn two_files_per_partition_and_every_subpartition_reads_back_whatever_the_parallelism() {
    let scheduler = ReadScheduler::start(8 << 20, SEGMENT).unwrap();
    for n in [1usize, 128, 1000] {
        let dir = tempfile::tempdir().unwrap();
        let exp = expected(n, (2000 / n as u64).max(20), |s| {
            12 + (s as usize * 37) % 300
        });
        // A sort area of 8 segments: several regions, memory fixed.
        let w = write_expected(dir.path(), config(8, true), &scheduler, &exp);
        assert_eq!(
            files_in(dir.path()),
            vec!["p.shuffle.data", "p.shuffle.index"],
            "n={n}"
        );
        assert!(
            w.pool.max_in_use() <= 8,
            "n={n}: {} segments",
            w.pool.max_in_use()
        );
        let file = w.partition.as_sort_merge().unwrap().file().unwrap();
        assert!(file.num_regions() > 1, "n={n}: one region only");
        // One consumer per subpartition, all at once.
        assert!(read_each_subpartition(&w.partition, n) == exp, "n={n}");
        drop(w);
        assert!(
            files_in(dir.path()).is_empty(),
            "n={n}: files left after release"
        );
    }
}

#[test]
fn range_reads_return_exactly_their_subpartitions_in_order_with_records_spanning_buffers() {
    let (scheduler, dir) = scheduler_and_dir(8 << 20);
    let n = 10;
    // Records up to 3 segments long cross buffer boundaries.
    let exp = expected(n, 30, |s| 100 + (s as usize * 977) % (3 * SEGMENT));
    let w = write_expected(dir.path(), config(16, false), &scheduler, &exp);
    let got = read_all(vec![local(&w.partition, 2, 5), local(&w.partition, 9, 9)]).unwrap();
    assert_ranges(&got, &[(0, 2, 5), (1, 9, 9)], &exp);
}

#[test]
fn range_reads_over_tcp_match_local_reads() {
    let net = |compression| NetworkConfig {
        segment_size: SEGMENT,
        compression,
        sort_shuffle_min_buffers: 8,
        ..NetworkConfig::default()
    };
    let a = NetworkEnvironment::start(net(false), SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let b = NetworkEnvironment::start(net(true), SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let n = 6;
    let exp = expected(n, 200, |s| 40 + (s as usize * 131) % (2 * SEGMENT));
    let (partition, pool_size) = a
        .create_result_partition("tcp".into(), n, Some((dir.path(), "tcp")), 1)
        .unwrap();
    let partition = Arc::new(partition);
    assert!(partition.as_sort_merge().is_some());
    let pool = a.buffer_pool().create_local_pool(pool_size).unwrap();
    let mut w = PartitionWriter::new(Arc::clone(&partition), pool, CancelToken::new(), None);
    for (t, r) in interleaved(&exp) {
        w.emit(t, &r).unwrap();
    }
    w.finish().unwrap();
    let id = ResultPartitionId {
        data_set: 5,
        producer_subtask: 0,
        attempt: 0,
    };
    a.register_partition(id, Arc::clone(&partition));
    let spec = |first, last| RemoteChannelSpec {
        peer: a.data_address(),
        partition: id,
        first_subpartition: first,
        last_subpartition: last,
    };
    let (_pool, channels) = b.open_remote_channels(&[spec(1, 4), spec(0, 5)]).unwrap();
    let remote = read_all(vec![
        (Arc::clone(&channels[0]) as Arc<dyn InputChannel>, 1),
        (Arc::clone(&channels[1]) as Arc<dyn InputChannel>, 0),
    ])
    .unwrap();
    assert_ranges(&remote, &[(0, 1, 4), (1, 0, 5)], &exp);
    a.shutdown();
    b.shutdown();
}

#[test]
fn broadcast_data_is_written_once() {
    let (scheduler, dir) = scheduler_and_dir(8 << 20);
    let n = 8;
    let records: Vec<Vec<u8>> = (0..400).map(|s| record(0, s, 200)).collect();
    let bytes: usize = records.iter().map(|r| r.len() + 4).sum();
    let w = write(
        dir.path(),
        n,
        config(8, false),
        &scheduler,
        records.iter().map(|r| (Target::All, r.clone())),
    );
    let len = std::fs::metadata(dir.path().join("p.shuffle.data"))
        .unwrap()
        .len() as usize;
    assert!(
        len < 2 * bytes,
        "data file {len} bytes for {bytes} bytes of broadcast"
    );
    assert_eq!(read_each_subpartition(&w.partition, n), vec![records; n]);
}

#[test]
fn mixed_broadcast_unicast_and_huge_records_keep_their_order() {
    let (scheduler, dir) = scheduler_and_dir(8 << 20);
    let n = 3;
    let mut input = Vec::new();
    let mut exp: Vec<Vec<Vec<u8>>> = vec![Vec::new(); n];
    for s in 0..60u64 {
        // Every 7th record is larger than the whole sort area (2 segments).
        let len = if s % 7 == 0 { 3 * SEGMENT } else { 50 };
        if s % 5 == 0 {
            let r = record(99, s, len);
            for e in exp.iter_mut() {
                e.push(r.clone());
            }
            input.push((Target::All, r));
        } else {
            let sp = (s % n as u64) as usize;
            let r = record(sp, s, len);
            exp[sp].push(r.clone());
            input.push((Target::One(sp), r));
        }
    }
    let w = write(dir.path(), n, config(2, true), &scheduler, input);
    assert_eq!(read_each_subpartition(&w.partition, n), exp);
}

#[test]
fn concurrent_readers_of_one_subpartition_each_read_everything() {
    let (scheduler, dir) = scheduler_and_dir(1 << 20);
    let exp = expected(2, 2000, |_| 300);
    let w = write_expected(dir.path(), config(8, true), &scheduler, &exp);
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let p = Arc::clone(&w.partition);
            std::thread::spawn(move || read_all(vec![local(&p, 1, 1)]).unwrap())
        })
        .collect();
    for r in readers {
        let got = r.join().unwrap();
        assert_eq!(records_of(&got[0], 1), exp[1]);
    }
    // 1 MiB of read buffers, shared: never more than that plus one per reader.
    assert!(scheduler.peak_buffers() <= scheduler.budget() + 4);
}

#[test]
fn a_flipped_byte_is_a_checksum_error_naming_the_partition() {
    let (scheduler, dir) = scheduler_and_dir(8 << 20);
    let exp = expected(2, 200, |_| 100);
    let w = write_expected(dir.path(), config(8, false), &scheduler, &exp);
    let path = dir.path().join("p.shuffle.data");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    // The partition keeps its open handle; a fresh load sees the new bytes
    // either way, and so does the running partition (same inode).
    let err = read_all(vec![local(&w.partition, 0, 1)])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sort-merge partition test")
            && (err.contains("checksum") || err.contains("header")),
        "{err}"
    );
}

#[test]
fn a_bad_index_is_refused_before_anything_is_allocated() {
    let (scheduler, dir) = scheduler_and_dir(8 << 20);
    let exp = expected(4, 50, |_| 100);
    let w = write_expected(dir.path(), config(8, false), &scheduler, &exp);
    w.partition.as_sort_merge().unwrap().disown_files();
    drop(w);
    let (data, index) = (
        dir.path().join("p.shuffle.data"),
        dir.path().join("p.shuffle.index"),
    );
    assert!(PartitionFile::load("ok", &data, &index).is_ok());
    let good = std::fs::read(&index).unwrap();
    // A region count claiming billions of entries, with its checksum fixed
    // up so only the length check can catch it.
    let mut bad = good.clone();
    bad[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    let body = bad.len() - 4;
    let crc = crc32fast::hash(&bad[..body]);
    bad[body..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&index, &bad).unwrap();
    let err = PartitionFile::load("bad", &data, &index)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sort-merge partition bad") && err.contains("regions"),
        "{err}"
    );
    // A flipped byte without the fix-up fails the checksum.
    let mut flipped = good.clone();
    flipped[30] ^= 1;
    std::fs::write(&index, &flipped).unwrap();
    let err = PartitionFile::load("bad", &data, &index)
        .unwrap_err()
        .to_string();
    assert!(err.contains("checksum"), "{err}");
    // A truncated data file no longer matches its index.
    std::fs::write(&index, &good).unwrap();
    let d = std::fs::read(&data).unwrap();
    std::fs::write(&data, &d[..d.len() - 1]).unwrap();
    let err = PartitionFile::load("bad", &data, &index)
        .unwrap_err()
        .to_string();
    assert!(err.contains("its index says"), "{err}");
}

#[test]
fn the_load_aware_partitioner_leaves_a_sort_merge_partition_alone() {
    use fluvia_core::PartitionerKind;
    use fluvia_network::ChannelSelector;
    let (scheduler, dir) = scheduler_and_dir(8 << 20);
    let w = write(dir.path(), 4, config(8, false), &scheduler, Vec::new());
    // A sort-merge partition has no per-subpartition queues to compare.
    let mut sel = ChannelSelector::new(PartitionerKind::Rebalance, 4, 128, 1)
        .load_aware(Arc::clone(&w.partition), 4);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..8 {
        if let Target::One(ch) = sel.select(0) {
            seen.insert(ch);
        }
    }
    assert_eq!(seen.len(), 4, "plain round robin");
}
