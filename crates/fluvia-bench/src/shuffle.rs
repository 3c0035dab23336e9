//! `fluvia-bench shuffle`: blocking result partitions written to disk and
//! read back, beside a plain sequential file of the same bytes.
//!
//! - sort-merge (one data and one index file, FLIP-148) vs one spill file
//!   per subpartition, at several consumer parallelisms (subpartitions);
//! - both vs a plain file written through a 1 MiB `BufWriter` and read with
//!   1 MiB reads, in the same directory;
//! - sort-merge with LZ4 on and off.
//!
//! Every case writes the same records (fixed size, pseudo-random
//! subpartition) through a `PartitionWriter`, then reads every subpartition
//! back, one consumer (a `LocalInputChannel`) per subpartition, all through
//! input gates on `--readers` threads. Every record is checked: it arrives
//! at its subpartition, in the order written, and each subpartition gets
//! exactly the records written to it.

use anyhow::{Context, Result, anyhow, ensure};
use fluvia_network::sortmerge::{ReadScheduler, SortMergeConfig, SortMergePartition};
use fluvia_network::{
    CancelToken, ChannelDeserializers, GateEvent, InputChannel, InputGate, LocalBufferPool,
    LocalInputChannel, NetworkBufferPool, PartitionWriter, ResultPartition, Target,
};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SEGMENT: usize = 32 * 1024;
/// Bytes at the start of a record: sequence number, subpartition, timestamp.
const RECORD_HEADER: usize = 8 + 4 + 8;

#[derive(clap::Args)]
pub struct Args {
    /// Payload bytes written per case (records × record size).
    #[arg(long, default_value_t = 256 << 20)]
    bytes: u64,
    /// Bytes per record (at least 20).
    #[arg(long, default_value_t = 100)]
    record_size: usize,
    /// Consumer parallelisms (subpartitions per partition), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 128, 1000])]
    parallelism: Vec<usize>,
    /// Parallelism of the LZ4 on/off comparison.
    #[arg(long, default_value_t = 128)]
    compression_parallelism: usize,
    /// Segments of the sort-merge writer's sort area
    /// (`taskmanager.network.sort-shuffle.min-buffers`).
    #[arg(long, default_value_t = 64)]
    sort_buffers: usize,
    /// Read buffer budget of the sort-merge read scheduler
    /// (`taskmanager.memory.framework.off-heap.batch-shuffle.size`).
    #[arg(long, default_value_t = 64 << 20)]
    read_memory: u64,
    /// Reading threads, each with one input gate over its share of the consumers.
    #[arg(long, default_value_t = 1)]
    readers: usize,
    /// Runs per case; the median write and read times are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Directory for the files (default: the system temp directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Run only the cases whose name contains this text (the plain file,
    /// the baseline of the ratios, always runs).
    #[arg(long)]
    only: Option<String>,
}

/// The records of one case, back to back, and where each goes.
struct Data {
    record_size: usize,
    records: Vec<u8>,
    targets: Vec<u32>,
    /// Records per subpartition.
    expected: Vec<u64>,
}

impl Data {
    /// Records of `record_size` bytes: a sequence number, the subpartition,
    /// a timestamp, then words of a 256-word vocabulary (text-like, so LZ4
    /// has something to find).
    fn generate(bytes: u64, record_size: usize, n: usize) -> Data {
        let count = (bytes / record_size as u64) as usize;
        let mut rng = fluvia_core::random::SplitMix64(42);
        let vocabulary: Vec<Vec<u8>> = (0..256)
            .map(|_| {
                let len = 3 + (rng.next_u64() % 8) as usize;
                (0..len)
                    .map(|_| b'a' + (rng.next_u64() % 26) as u8)
                    .collect()
            })
            .collect();
        let mut records = Vec::with_capacity(count * record_size);
        let mut targets = Vec::with_capacity(count);
        let mut expected = vec![0u64; n];
        for seq in 0..count as u64 {
            let r = rng.next_u64();
            let sp = (r % n as u64) as u32;
            let start = records.len();
            records.extend_from_slice(&seq.to_le_bytes());
            records.extend_from_slice(&sp.to_le_bytes());
            records.extend_from_slice(&(1_764_000_000_000 + seq * 7).to_le_bytes());
            let mut w = r >> 32;
            while records.len() - start < record_size {
                if w < 256 {
                    w = rng.next_u64();
                }
                records.extend_from_slice(&vocabulary[(w & 255) as usize]);
                records.push(b' ');
                w >>= 8;
            }
            records.truncate(start + record_size);
            targets.push(sp);
            expected[sp as usize] += 1;
        }
        Data {
            record_size,
            records,
            targets,
            expected,
        }
    }

    fn payload_bytes(&self) -> u64 {
        self.records.len() as u64
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    SortMerge { compression: bool },
    FilePerSubpartition,
}

/// One run of one case, or the summary of several (see [`summarize`]).
struct Run {
    write: Duration,
    read: Duration,
    files: usize,
    disk_bytes: u64,
    writer_memory: usize,
    read_memory: usize,
}

/// Files in `dir` and their total size.
fn dir_usage(dir: &Path) -> Result<(usize, u64)> {
    let mut files = 0;
    let mut bytes = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        files += 1;
        bytes += e.metadata()?.len();
    }
    Ok((files, bytes))
}

/// What one reading thread saw, per subpartition of its share.
struct ReadCounts {
    records: Vec<u64>,
    bytes: u64,
}

/// Reads subpartitions `range` of `partition`, one local channel per
/// subpartition, through one gate; checks each record's subpartition and order.
fn read_share(
    partition: &Arc<ResultPartition>,
    range: std::ops::Range<usize>,
    record_size: usize,
) -> Result<ReadCounts> {
    let first = range.start;
    let mut channels = Vec::with_capacity(range.len());
    for sp in range.clone() {
        let channel = LocalInputChannel::new(Arc::clone(partition), sp as u32, sp as u32)?;
        channels.push(channel as Arc<dyn InputChannel>);
    }
    let mut gate = InputGate::single_input(channels);
    let mut deser = ChannelDeserializers::new(gate.num_channels());
    let mut records = vec![0u64; range.len()];
    // The next sequence number each subpartition may see (order check).
    let mut next_seq = vec![0u64; range.len()];
    let mut bytes = 0u64;
    let mut bad = 0u64;
    let cancel = CancelToken::new();
    while let Some(ev) = gate.get_next(&cancel)? {
        let GateEvent::Buffer {
            channel,
            subpartition,
            buffer,
        } = ev
        else {
            continue;
        };
        let sp = first + channel;
        deser
            .get(channel, subpartition)
            .feed(buffer.as_slice(), |rec| {
                let ok = rec.len() == record_size && {
                    let seq = u64::from_le_bytes(rec[0..8].try_into().unwrap_or_default());
                    let target = u32::from_le_bytes(rec[8..12].try_into().unwrap_or_default());
                    let in_order = seq >= next_seq[channel];
                    next_seq[channel] = seq + 1;
                    target as usize == sp && in_order
                };
                bad += u64::from(!ok);
                records[channel] += 1;
                bytes += rec.len() as u64;
                Ok(())
            })?;
    }
    ensure!(
        bad == 0,
        "{bad} records of subpartitions {range:?} came back wrong or out of order"
    );
    for channel in 0..gate.num_channels() {
        ensure!(
            !deser.has_partial_record(channel),
            "subpartition {} ended inside a record",
            first + channel
        );
    }
    Ok(ReadCounts { records, bytes })
}

/// Reads every subpartition on `readers` threads; returns the time and
/// checks the counts against what was written.
fn read_all(partition: &Arc<ResultPartition>, data: &Data, readers: usize) -> Result<Duration> {
    let n = data.expected.len();
    let readers = readers.clamp(1, n);
    let started = Instant::now();
    let shares: Vec<Result<ReadCounts>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..readers)
            .map(|k| {
                let range = k * n / readers..(k + 1) * n / readers;
                std::thread::Builder::new()
                    .name(format!("shuffle-reader-{k}"))
                    .spawn_scoped(s, move || read_share(partition, range, data.record_size))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h?.join().map_err(|_| anyhow!("reader panicked"))?)
            .collect()
    });
    let t = started.elapsed();
    let mut records = Vec::with_capacity(n);
    let mut bytes = 0;
    for share in shares {
        let share = share?;
        records.extend(share.records);
        bytes += share.bytes;
    }
    ensure!(
        records == data.expected,
        "records per subpartition differ from what was written"
    );
    ensure!(
        bytes == data.payload_bytes(),
        "read {bytes} of {} bytes",
        data.payload_bytes()
    );
    Ok(t)
}

fn write_records(
    partition: Arc<ResultPartition>,
    pool: Arc<LocalBufferPool>,
    data: &Data,
) -> Result<()> {
    let mut w = PartitionWriter::new(partition, pool, CancelToken::new(), None);
    for (rec, &sp) in data
        .records
        .chunks_exact(data.record_size)
        .zip(&data.targets)
    {
        w.emit(Target::One(sp as usize), rec)?;
    }
    w.finish()?;
    Ok(())
}

/// Writes `data` as one blocking partition of `kind` in `dir` and reads it back.
fn partition_run(kind: Kind, data: &Data, args: &Args, dir: &Path) -> Result<Run> {
    let n = data.expected.len();
    let global =
        NetworkBufferPool::new(((n + 1).max(args.sort_buffers) * SEGMENT) as u64, SEGMENT)?;
    let scheduler = ReadScheduler::start(args.read_memory, SEGMENT)?;
    let started = Instant::now();
    let (partition, pool) = match kind {
        Kind::SortMerge { compression } => {
            let config = SortMergeConfig {
                segment_size: SEGMENT,
                sort_buffers: args.sort_buffers,
                compression,
            };
            let p = SortMergePartition::create(
                "bench",
                n,
                dir,
                "bench",
                config,
                Arc::clone(&scheduler),
                0,
            )?;
            (
                ResultPartition::sort_merge(p),
                global.create_local_pool(args.sort_buffers)?,
            )
        }
        Kind::FilePerSubpartition => (
            ResultPartition::blocking("bench", n, SEGMENT, dir, "bench")?,
            global.create_local_pool(n + 1)?,
        ),
    };
    let partition = Arc::new(partition);
    write_records(Arc::clone(&partition), Arc::clone(&pool), data)?;
    let write = started.elapsed();
    let (files, disk_bytes) = dir_usage(dir)?;
    let read = read_all(&partition, data, args.readers)?;
    let read_memory = match kind {
        Kind::SortMerge { .. } => scheduler.peak_bytes(),
        Kind::FilePerSubpartition => 0,
    };
    let run = Run {
        write,
        read,
        files,
        disk_bytes,
        writer_memory: pool.max_in_use() * SEGMENT,
        read_memory,
    };
    drop(partition);
    scheduler.shutdown();
    Ok(run)
}

/// The same bytes, record by record, through a 1 MiB `BufWriter` into one
/// file, and read back with 1 MiB reads. Returns the run and the time of a
/// `sync_all` after the flush (not part of the write time).
/// Reads the plain file again, 1 MiB at a time, and runs the checks the
/// shuffle's consumer runs on every record (target and order): what reading
/// the same records costs without a shuffle.
fn plain_read_checked(path: &Path, data: &Data) -> Result<Duration> {
    let n = data.expected.len();
    let started = Instant::now();
    let mut f = std::fs::File::open(path)?;
    let size = data.record_size;
    let mut buf = vec![0u8; (1 << 20) / size * size];
    let (mut next_seq, mut records) = (vec![0u64; n], vec![0u64; n]);
    let mut bad = 0u64;
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            let k = f.read(&mut buf[filled..])?;
            if k == 0 {
                break;
            }
            filled += k;
        }
        if filled == 0 {
            break;
        }
        for rec in buf[..filled].chunks_exact(size) {
            let seq = u64::from_le_bytes(rec[0..8].try_into().unwrap_or_default());
            let sp = u32::from_le_bytes(rec[8..12].try_into().unwrap_or_default()) as usize;
            let ok = sp < n && seq >= next_seq[sp];
            if ok {
                next_seq[sp] = seq + 1;
                records[sp] += 1;
            }
            bad += u64::from(!ok);
        }
    }
    let t = started.elapsed();
    ensure!(
        bad == 0 && records == data.expected,
        "plain file: records differ"
    );
    Ok(t)
}

fn plain_run(data: &Data, dir: &Path) -> Result<(Run, Duration, Duration)> {
    let path = dir.join("plain.data");
    let started = Instant::now();
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
    for rec in data.records.chunks_exact(data.record_size) {
        w.write_all(rec)?;
    }
    let file = w.into_inner().map_err(|e| e.into_error())?;
    let write = started.elapsed();
    let synced = Instant::now();
    file.sync_all()?;
    let sync = synced.elapsed();
    drop(file);
    let (files, disk_bytes) = dir_usage(dir)?;

    let started = Instant::now();
    let mut f = std::fs::File::open(&path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        got += k as u64;
    }
    let read = started.elapsed();
    ensure!(
        got == data.payload_bytes(),
        "plain file: read {got} of {} bytes",
        data.payload_bytes()
    );
    let checked = plain_read_checked(&path, data)?;
    std::fs::remove_file(&path)?;
    Ok((
        Run {
            write,
            read,
            files,
            disk_bytes,
            writer_memory: 1 << 20,
            read_memory: 1 << 20,
        },
        sync,
        checked,
    ))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The medians of `runs` runs of one case (sizes and memory: the largest seen).
fn summarize(runs: Vec<Run>) -> Run {
    Run {
        write: median(runs.iter().map(|r| r.write).collect()),
        read: median(runs.iter().map(|r| r.read).collect()),
        files: runs.iter().map(|r| r.files).max().unwrap_or(0),
        disk_bytes: runs.iter().map(|r| r.disk_bytes).max().unwrap_or(0),
        writer_memory: runs.iter().map(|r| r.writer_memory).max().unwrap_or(0),
        read_memory: runs.iter().map(|r| r.read_memory).max().unwrap_or(0),
    }
}

/// A fresh, empty directory for one run.
fn run_dir(base: &Path, name: &str) -> Result<PathBuf> {
    let d = base.join(name);
    if d.exists() {
        std::fs::remove_dir_all(&d)?;
    }
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

pub fn run(args: Args) -> Result<()> {
    ensure!(
        args.record_size >= RECORD_HEADER,
        "--record-size must be at least {RECORD_HEADER}"
    );
    ensure!(
        args.parallelism.iter().all(|&n| n > 0) && args.compression_parallelism > 0,
        "parallelism must be positive"
    );
    let runs = args.runs.max(1);
    let base = args
        .dir
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("fluvia-bench-shuffle-{}", std::process::id()));
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let result = run_cases(&args, runs, &base);
    let _ = std::fs::remove_dir_all(&base);
    result
}

fn run_cases(args: &Args, runs: usize, base: &Path) -> Result<()> {
    let gbps = |bytes: u64, t: Duration| bytes as f64 / t.as_secs_f64() / 1e9;
    let first_n = args.parallelism.first().copied().unwrap_or(1);
    let data = Data::generate(args.bytes, args.record_size, first_n);
    let bytes = data.payload_bytes();
    println!(
        "{} records of {} bytes ({}) per case, segment {} KiB, sort area {} segments, \
         read budget {}, {} reading thread(s), {runs} runs (median), dir {}\n",
        data.targets.len(),
        args.record_size,
        mib(bytes),
        SEGMENT / 1024,
        args.sort_buffers,
        mib(args.read_memory),
        args.readers.max(1),
        base.display()
    );
    println!(
        "| case | files | on disk | write s | write GB/s | read s | read GB/s | write vs plain | read vs plain | writer memory | read buffers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");

    let mut plain = Vec::new();
    let mut syncs = Vec::new();
    let mut checked = Vec::new();
    for r in 0..runs {
        let (run, sync, c) = plain_run(&data, &run_dir(base, &format!("plain-{r}"))?)?;
        plain.push(run);
        syncs.push(sync);
        checked.push(c);
    }
    let plain = summarize(plain);
    let sync = median(syncs);
    let checked = median(checked);
    let (pw, pr) = (gbps(bytes, plain.write), gbps(bytes, plain.read));
    println!(
        "| plain file, 1 MiB BufWriter / 1 MiB reads | {} | {} | {:.3} | {pw:.2} | {:.3} | {pr:.2} | 1.00 | 1.00 | 1.0 MiB | 1.0 MiB |",
        plain.files,
        mib(plain.disk_bytes),
        plain.write.as_secs_f64(),
        plain.read.as_secs_f64(),
    );
    let ws = plain.write + sync;
    println!(
        "| plain file, write + sync_all | | | {:.3} | {:.2} | | | {:.2} | | | |",
        ws.as_secs_f64(),
        gbps(bytes, ws),
        gbps(bytes, ws) / pw
    );
    println!(
        "| plain file, read + the consumer's record checks | | | | | {:.3} | {:.2} | | {:.2} | | |",
        checked.as_secs_f64(),
        gbps(bytes, checked),
        gbps(bytes, checked) / pr
    );

    let row = |name: String, s: &Run| {
        let (w, r) = (gbps(bytes, s.write), gbps(bytes, s.read));
        let read_buffers = if s.read_memory > 0 {
            mib(s.read_memory as u64)
        } else {
            "—".to_string()
        };
        println!(
            "| {name} | {} | {} | {:.3} | {w:.2} | {:.3} | {r:.2} | {:.2} | {:.2} | {} | {read_buffers} |",
            s.files,
            mib(s.disk_bytes),
            s.write.as_secs_f64(),
            s.read.as_secs_f64(),
            w / pw,
            r / pr,
            mib(s.writer_memory as u64),
        );
    };
    let case = |kind: Kind, n: usize, data: &Data| -> Result<Run> {
        let mut v = Vec::new();
        for r in 0..runs {
            v.push(partition_run(
                kind,
                data,
                args,
                &run_dir(base, &format!("p{n}-{r}"))?,
            )?);
        }
        Ok(summarize(v))
    };

    let want = |name: &str| args.only.as_deref().is_none_or(|o| name.contains(o));
    let data_for =
        |n: usize| (n != first_n).then(|| Data::generate(args.bytes, args.record_size, n));
    let lz4_n = args.compression_parallelism;
    let mut lz4_off = None;
    for &n in &args.parallelism {
        let other = data_for(n);
        let d = other.as_ref().unwrap_or(&data);
        let name = format!("sort-merge, p{n}");
        if want(&name) {
            let s = case(Kind::SortMerge { compression: false }, n, d)?;
            row(name, &s);
            if n == lz4_n {
                lz4_off = Some(s);
            }
        }
        let name = format!("one file per subpartition, p{n}");
        if want(&name) {
            row(name, &case(Kind::FilePerSubpartition, n, d)?);
        }
    }
    let other = data_for(lz4_n);
    let d = other.as_ref().unwrap_or(&data);
    let name = format!("sort-merge, p{lz4_n}, LZ4 off");
    if want(&name) {
        let off = match lz4_off {
            Some(s) => s,
            None => case(Kind::SortMerge { compression: false }, lz4_n, d)?,
        };
        row(name, &off);
    }
    let name = format!("sort-merge, p{lz4_n}, LZ4 on");
    if want(&name) {
        row(
            name,
            &case(Kind::SortMerge { compression: true }, lz4_n, d)?,
        );
    }
    Ok(())
}
