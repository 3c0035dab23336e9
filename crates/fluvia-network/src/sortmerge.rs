//! Sort-merge blocking partitions (Flink's FLIP-148).
//!
//! **Write.** The producer's records go into one sort area of a fixed number
//! of segments taken from the partition's buffer pool, whatever the number of
//! subpartitions. When the area is full it is flushed as a *region*: its
//! records grouped by subpartition, each subpartition's records packed into
//! buffers and written contiguously, the subpartitions in a per-producer
//! rotation `(k + shift) % n` so that consumers reading many producers do not
//! all hit the same file offsets at once. Broadcast records are collected
//! apart and written once as a *broadcast region* whose index entries all
//! point at the same bytes. A record larger than the whole area is a region
//! of its own. Each region's subpartition ends on a record boundary.
//!
//! **Files.** One data file and one index file per partition:
//! `<prefix>.shuffle.data` holds the regions, each buffer as a 12-byte header
//! (`u8 kind | u8 flags | u16 0 | u32 length | u32 crc32`, little-endian) and
//! its payload, LZ4-compressed when that is smaller and compression is on;
//! `<prefix>.shuffle.index` holds a header (magic, version, subpartitions,
//! regions, segment size, data file length), per region and subpartition
//! `(u64 offset, u64 bytes, u32 buffers)`, and a CRC-32 of all of it.
//! Every length read back is checked against what the format allows before
//! anything is allocated; a checksum mismatch is an error naming the
//! partition and offset, never data.
//!
//! **Read.** Every consumer gets its own [`SortMergeView`] with its own
//! cursor (region by region, its subpartitions in order). Views do no I/O on
//! the caller's thread: they tell the TaskManager-wide [`ReadScheduler`]
//! how many buffers their consumer can take (its credit), and its I/O
//! thread serves waiting views in file-offset order (near-sequential reads)
//! into buffers from a bounded read budget
//! (`taskmanager.memory.framework.off-heap.batch-shuffle.size`).
//!
//! This module knows nothing of records' contents, jobs or the network.

use crate::availability::AvailabilityListener;
use crate::buffer::{Buffer, BufferBuilder, BufferRecycler, LocalBufferPool, lock_state};
use crate::cancel::CancelToken;
use crate::event::{BufferOrEvent, Event, NextKind};
use crate::view::{SubpartitionView, ViewPoll};
use fluvia_core::{FluviaError, Result};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

pub const DATA_SUFFIX: &str = "shuffle.data";
pub const INDEX_SUFFIX: &str = "shuffle.index";
const BUFFER_HEADER: usize = 12;
const KIND_DATA: u8 = 0;
const FLAG_COMPRESSED: u8 = 1;
const INDEX_MAGIC: u32 = u32::from_be_bytes(*b"FLVI");
const INDEX_VERSION: u32 = 1;
const INDEX_HEADER: usize = 4 + 4 + 4 + 4 + 4 + 8;
const INDEX_ENTRY: usize = 8 + 8 + 4;
/// The most subpartitions a partition may have (the largest parallelism).
pub const MAX_SUBPARTITIONS: usize = 32_768;
/// The largest segment size the format accepts.
pub const MAX_SEGMENT_SIZE: usize = 16 * 1024 * 1024;
/// The largest index file read into memory.
const MAX_INDEX_BYTES: u64 = 1 << 30;

/// How a sort-merge partition writes.
#[derive(Debug, Clone)]
pub struct SortMergeConfig {
    pub segment_size: usize,
    /// Segments of the sort area (`taskmanager.network.sort-shuffle.min-buffers`).
    pub sort_buffers: usize,
    /// LZ4 per buffer (`taskmanager.network.blocking-shuffle.compression.enabled`).
    pub compression: bool,
}

/// One index entry: where a subpartition's data of one region lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexEntry {
    pub offset: u64,
    pub bytes: u64,
    pub buffers: u32,
}

/// A finished partition: its data file open for positioned reads and its
/// index in memory.
#[derive(Debug)]
pub struct PartitionFile {
    name: String,
    data_path: PathBuf,
    index_path: PathBuf,
    data: File,
    num_subpartitions: usize,
    segment_size: usize,
    /// `regions × subpartitions` entries, region-major.
    index: Vec<IndexEntry>,
}

fn corrupt(name: &str, what: impl std::fmt::Display) -> FluviaError {
    FluviaError::Execution(format!("sort-merge partition {name}: {what}"))
}

impl PartitionFile {
    pub fn num_subpartitions(&self) -> usize {
        self.num_subpartitions
    }

    pub fn num_regions(&self) -> usize {
        self.index.len() / self.num_subpartitions.max(1)
    }

    pub fn entry(&self, region: usize, subpartition: usize) -> IndexEntry {
        self.index[region * self.num_subpartitions + subpartition]
    }

    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    pub fn index_path(&self) -> &Path {
        &self.index_path
    }

    /// Buffers of `first..=last` over all regions.
    fn buffers_of(&self, first: usize, last: usize) -> u64 {
        (0..self.num_regions())
            .flat_map(|r| (first..=last).map(move |s| (r, s)))
            .map(|(r, s)| self.entry(r, s).buffers as u64)
            .sum()
    }

    /// Opens a partition from its two files, checking the index against the
    /// format and the data file before trusting any length in it.
    pub fn load(name: &str, data_path: &Path, index_path: &Path) -> Result<Self> {
        let data = File::open(data_path).map_err(|e| {
            FluviaError::io(
                format!("opening shuffle data file {}", data_path.display()),
                e,
            )
        })?;
        let data_len = data
            .metadata()
            .map_err(|e| FluviaError::io(format!("reading {}", data_path.display()), e))?
            .len();
        let index_len = std::fs::metadata(index_path)
            .map_err(|e| FluviaError::io(format!("reading {}", index_path.display()), e))?
            .len();
        if index_len > MAX_INDEX_BYTES || index_len < (INDEX_HEADER + 4) as u64 {
            return Err(corrupt(
                name,
                format!(
                    "index file {} has {index_len} bytes, outside what the format allows",
                    index_path.display()
                ),
            ));
        }
        let bytes = std::fs::read(index_path)
            .map_err(|e| FluviaError::io(format!("reading {}", index_path.display()), e))?;
        // What was read counts, not what the metadata said a moment before.
        if bytes.len() < INDEX_HEADER + 4 {
            return Err(corrupt(
                name,
                format!(
                    "index file {} has {} bytes, fewer than its header",
                    index_path.display(),
                    bytes.len()
                ),
            ));
        }
        let (body, trailer) = bytes.split_at(bytes.len() - 4);
        let u32_at =
            |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |b: &[u8], at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(a)
        };
        if crc32fast::hash(body) != u32_at(trailer, 0) {
            return Err(corrupt(
                name,
                format!("index file {} fails its checksum", index_path.display()),
            ));
        }
        if u32_at(body, 0) != INDEX_MAGIC || u32_at(body, 4) != INDEX_VERSION {
            return Err(corrupt(
                name,
                format!(
                    "{} is not a version-{INDEX_VERSION} shuffle index",
                    index_path.display()
                ),
            ));
        }
        let n = u32_at(body, 8) as usize;
        let regions = u32_at(body, 12) as usize;
        let segment_size = u32_at(body, 16) as usize;
        let recorded_len = u64_at(body, 20);
        if n == 0 || n > MAX_SUBPARTITIONS || segment_size == 0 || segment_size > MAX_SEGMENT_SIZE {
            return Err(corrupt(
                name,
                format!("index declares {n} subpartitions of segment size {segment_size}"),
            ));
        }
        let expected = regions
            .checked_mul(n)
            .and_then(|e| e.checked_mul(INDEX_ENTRY))
            .and_then(|e| e.checked_add(INDEX_HEADER));
        if expected != Some(body.len()) {
            return Err(corrupt(
                name,
                format!(
                    "index declares {regions} regions of {n} subpartitions but has {} bytes",
                    body.len()
                ),
            ));
        }
        if recorded_len != data_len {
            return Err(corrupt(
                name,
                format!(
                    "data file {} has {data_len} bytes, its index says {recorded_len}",
                    data_path.display()
                ),
            ));
        }
        let mut index = Vec::with_capacity(regions * n);
        for k in 0..regions * n {
            let at = INDEX_HEADER + k * INDEX_ENTRY;
            let e = IndexEntry {
                offset: u64_at(body, at),
                bytes: u64_at(body, at + 8),
                buffers: u32_at(body, at + 16),
            };
            let end = e.offset.checked_add(e.bytes);
            let max_bytes = e.buffers as u64 * (BUFFER_HEADER + segment_size) as u64;
            if end.is_none_or(|end| end > data_len)
                || e.bytes > max_bytes
                || e.bytes < e.buffers as u64 * BUFFER_HEADER as u64
            {
                return Err(corrupt(
                    name,
                    format!(
                        "index entry {k} ({} bytes in {} buffers at offset {}) lies outside \
                         the {data_len}-byte data file or the format",
                        e.bytes, e.buffers, e.offset
                    ),
                ));
            }
            index.push(e);
        }
        Ok(PartitionFile {
            name: name.to_string(),
            data_path: data_path.to_path_buf(),
            index_path: index_path.to_path_buf(),
            data,
            num_subpartitions: n,
            segment_size,
            index,
        })
    }

    /// Reads the bytes at `offset` (positioned: readers share the handle).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.data.read_exact_at(buf, offset).map_err(|e| {
            FluviaError::io(
                format!(
                    "reading shuffle data file {} of partition {} at offset {offset}",
                    self.data_path.display(),
                    self.name
                ),
                e,
            )
        })
    }
}

/// The shared state of one sort-merge partition: its files, and once the
/// producer finished, the [`PartitionFile`] its views read.
pub struct SortMergePartition {
    name: String,
    num_subpartitions: usize,
    data_path: PathBuf,
    index_path: PathBuf,
    config: SortMergeConfig,
    rotation: usize,
    scheduler: Arc<ReadScheduler>,
    /// Taken by the one writer.
    pending: Mutex<Option<File>>,
    finished: Mutex<Option<Arc<PartitionFile>>>,
    /// Views created before the producer finished.
    waiting: Mutex<Vec<Weak<SortMergeView>>>,
    /// Whether the files are removed on drop (not once handed over).
    owns_files: AtomicBool,
}

debug_fields!(SortMergePartition, |this| { name: this.name, data: this.data_path });

impl SortMergePartition {
    /// Creates `dir/<prefix>.shuffle.data` for a partition of
    /// `num_subpartitions`; `rotation_seed` picks the producer's rotation.
    pub fn create(
        name: impl Into<String>,
        num_subpartitions: usize,
        dir: &Path,
        prefix: &str,
        config: SortMergeConfig,
        scheduler: Arc<ReadScheduler>,
        rotation_seed: u64,
    ) -> Result<Arc<Self>> {
        let name = name.into();
        if num_subpartitions == 0 || num_subpartitions > MAX_SUBPARTITIONS {
            return Err(FluviaError::Internal(format!(
                "partition {name} with {num_subpartitions} subpartitions"
            )));
        }
        if config.segment_size > MAX_SEGMENT_SIZE
            || (config.sort_buffers as u64) * (config.segment_size as u64) >= u32::MAX as u64
        {
            return Err(FluviaError::Config(format!(
                "a sort area of {} segments of {} bytes is larger than 4 GiB \
                 (taskmanager.network.sort-shuffle.min-buffers)",
                config.sort_buffers, config.segment_size
            )));
        }
        let data_path = dir.join(format!("{prefix}.{DATA_SUFFIX}"));
        let index_path = dir.join(format!("{prefix}.{INDEX_SUFFIX}"));
        let file = File::create(&data_path).map_err(|e| {
            FluviaError::io(
                format!("creating shuffle data file {}", data_path.display()),
                e,
            )
        })?;
        // A splitmix step spreads consecutive subtask seeds over the rotation.
        let mut z = rotation_seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Ok(Arc::new(SortMergePartition {
            name,
            num_subpartitions,
            data_path,
            index_path,
            rotation: (z % num_subpartitions as u64) as usize,
            config,
            scheduler,
            pending: Mutex::new(Some(file)),
            finished: Mutex::new(None),
            waiting: Mutex::new(Vec::new()),
            owns_files: AtomicBool::new(true),
        }))
    }

    /// A partition another process wrote and finished: its files are
    /// checked, then served (and removed when it is dropped).
    pub fn open(
        name: impl Into<String>,
        data_path: &Path,
        index_path: &Path,
        scheduler: Arc<ReadScheduler>,
    ) -> Result<Arc<Self>> {
        let name = name.into();
        let file = PartitionFile::load(&name, data_path, index_path)?;
        let config = SortMergeConfig {
            segment_size: file.segment_size,
            sort_buffers: 1,
            compression: false,
        };
        Ok(Arc::new(SortMergePartition {
            num_subpartitions: file.num_subpartitions,
            data_path: data_path.to_path_buf(),
            index_path: index_path.to_path_buf(),
            rotation: 0,
            config,
            scheduler,
            pending: Mutex::new(None),
            finished: Mutex::new(Some(Arc::new(file))),
            waiting: Mutex::new(Vec::new()),
            owns_files: AtomicBool::new(true),
            name,
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn num_subpartitions(&self) -> usize {
        self.num_subpartitions
    }

    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    pub fn index_path(&self) -> &Path {
        &self.index_path
    }

    pub fn config(&self) -> &SortMergeConfig {
        &self.config
    }

    /// The finished file, once the producer finished.
    pub fn file(&self) -> Option<Arc<PartitionFile>> {
        lock_state(&self.finished).clone()
    }

    /// The writer for this partition's producer (only one).
    pub fn writer(
        self: &Arc<Self>,
        pool: Arc<LocalBufferPool>,
        cancel: CancelToken,
    ) -> SortMergeWriter {
        let file = lock_state(&self.pending).take();
        SortMergeWriter {
            target: Arc::clone(self),
            file: file.map(|f| BufWriter::with_capacity(1 << 20, f)),
            offset: 0,
            pool,
            cancel,
            segments: Vec::new(),
            current: 0,
            area_len: 0,
            records: Vec::new(),
            broadcast: false,
            index: Vec::new(),
            regions: 0,
            out: Vec::with_capacity(self.config.segment_size),
            region_buffers: 0,
            buffers_written: 0,
            finished: false,
        }
    }

    fn set_finished(&self, file: PartitionFile) {
        let file = Arc::new(file);
        *lock_state(&self.finished) = Some(Arc::clone(&file));
        for v in lock_state(&self.waiting).drain(..) {
            if let Some(v) = v.upgrade() {
                v.attach_file(Arc::clone(&file));
            }
        }
    }

    /// A view of `first..=last` for one consumer.
    pub fn create_view(
        self: &Arc<Self>,
        first: u32,
        last: u32,
        listener: Arc<dyn AvailabilityListener>,
        channel: usize,
    ) -> Arc<SortMergeView> {
        let view = Arc::new_cyclic(|me| SortMergeView {
            partition_name: self.name.clone(),
            first,
            last,
            scheduler: Arc::clone(&self.scheduler),
            me: me.clone(),
            listener,
            channel,
            state: Mutex::new(ViewState {
                file: None,
                queue: VecDeque::new(),
                region: 0,
                next_subpartition: first,
                entry: None,
                unread: 0,
                demand: 0,
                scheduled: false,
                error: None,
                end_delivered: false,
            }),
        });
        let file = {
            let finished = lock_state(&self.finished);
            if finished.is_none() {
                lock_state(&self.waiting).push(Arc::downgrade(&view));
            }
            finished.clone()
        };
        if let Some(f) = file {
            view.attach_file(f);
        }
        view
    }

    /// Keeps the files on disk when this partition is dropped (another
    /// process serves them now).
    pub fn disown_files(&self) {
        self.owns_files.store(false, Ordering::Release);
    }
}

impl Drop for SortMergePartition {
    fn drop(&mut self) {
        // Consumers waiting for a producer that will never finish fail.
        if lock_state(&self.finished).is_none() {
            for v in lock_state(&self.waiting).drain(..) {
                if let Some(v) = v.upgrade() {
                    v.fail(format!(
                        "sort-merge partition {} was released before its producer finished",
                        self.name
                    ));
                }
            }
        }
        if self.owns_files.load(Ordering::Acquire) {
            let _ = std::fs::remove_file(&self.data_path);
            let _ = std::fs::remove_file(&self.index_path);
        }
    }
}

/// Writes one sort-merge partition (owned by the producer's thread).
pub struct SortMergeWriter {
    target: Arc<SortMergePartition>,
    file: Option<BufWriter<File>>,
    offset: u64,
    pool: Arc<LocalBufferPool>,
    cancel: CancelToken,
    /// The sort area: segments of the pool, filled in order.
    segments: Vec<BufferBuilder>,
    current: usize,
    area_len: usize,
    /// `(subpartition, start in the area, framed length)` per record.
    records: Vec<(u32, u32, u32)>,
    /// Whether the area holds broadcast records.
    broadcast: bool,
    index: Vec<IndexEntry>,
    regions: u32,
    /// The buffer being packed for the file.
    out: Vec<u8>,
    region_buffers: u32,
    buffers_written: u64,
    finished: bool,
}

debug_fields!(SortMergeWriter, |this| { partition: this.target.name });

impl SortMergeWriter {
    fn capacity(&self) -> usize {
        self.target.config.sort_buffers * self.target.config.segment_size
    }

    /// Buffers written to the data file so far.
    pub fn buffers_written(&self) -> u64 {
        self.buffers_written
    }

    /// Appends one record for `subpartition`.
    pub fn append(&mut self, subpartition: usize, record: &[u8]) -> Result<()> {
        self.add(Some(subpartition), record)
    }

    /// Appends one record for every subpartition, stored once.
    pub fn broadcast(&mut self, record: &[u8]) -> Result<()> {
        self.add(None, record)
    }

    fn add(&mut self, subpartition: Option<usize>, record: &[u8]) -> Result<()> {
        if self.finished {
            return Err(FluviaError::Internal(format!(
                "record written to finished partition {}",
                self.target.name
            )));
        }
        let broadcast = subpartition.is_none();
        if broadcast != self.broadcast && !self.records.is_empty() {
            self.flush_region()?;
        }
        self.broadcast = broadcast;
        let framed = 4 + record.len();
        if framed > self.capacity() {
            self.flush_region()?;
            return self.write_direct_region(subpartition, record);
        }
        if self.area_len + framed > self.capacity() {
            self.flush_region()?;
        }
        let start = self.area_len as u32;
        self.area_append(&(record.len() as u32).to_le_bytes())?;
        self.area_append(record)?;
        let sp = subpartition.map_or(u32::MAX, |s| s as u32);
        self.records.push((sp, start, framed as u32));
        Ok(())
    }

    fn area_append(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            if self.current == self.segments.len() {
                self.segments.push(self.pool.request(&self.cancel)?);
            }
            let b = &mut self.segments[self.current];
            let n = b.append(bytes);
            bytes = &bytes[n..];
            self.area_len += n;
            if b.remaining() == 0 {
                self.current += 1;
            }
        }
        Ok(())
    }

    /// Copies the record at `(start, len)` of the area to the output.
    fn emit_record(&mut self, start: usize, len: usize) -> Result<()> {
        let seg = self.target.config.segment_size;
        let (mut at, end) = (start, start + len);
        while at < end {
            let (s, off) = (at / seg, at % seg);
            let n = (seg - off).min(end - at);
            // Copy out of the area into the output buffer, in pieces that
            // never exceed what the output buffer has left.
            let mut piece = off;
            let piece_end = off + n;
            while piece < piece_end {
                let room = seg - self.out.len();
                let take = room.min(piece_end - piece);
                let src = &self.segments[s].data()[piece..piece + take];
                self.out.extend_from_slice(src);
                piece += take;
                if self.out.len() == seg {
                    self.emit_buffer()?;
                }
            }
            at += n;
        }
        Ok(())
    }

    fn emit_bytes(&mut self, mut bytes: &[u8]) -> Result<()> {
        let seg = self.target.config.segment_size;
        while !bytes.is_empty() {
            let take = (seg - self.out.len()).min(bytes.len());
            self.out.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.out.len() == seg {
                self.emit_buffer()?;
            }
        }
        Ok(())
    }

    /// Writes the output buffer as one file buffer.
    fn emit_buffer(&mut self) -> Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let compressed = if self.target.config.compression {
            let c = crate::compression::compress(&self.out);
            (c.len() < self.out.len()).then_some(c)
        } else {
            None
        };
        let payload: &[u8] = compressed.as_deref().unwrap_or(&self.out);
        let mut header = [0u8; BUFFER_HEADER];
        header[0] = KIND_DATA;
        header[1] = if compressed.is_some() {
            FLAG_COMPRESSED
        } else {
            0
        };
        header[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        header[8..12].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
        let Some(file) = self.file.as_mut() else {
            return Err(FluviaError::Internal(format!(
                "partition {} has a second writer",
                self.target.name
            )));
        };
        let path = &self.target.data_path;
        file.write_all(&header)
            .and_then(|_| file.write_all(payload))
            .map_err(|e| {
                FluviaError::io(format!("writing shuffle data file {}", path.display()), e)
            })?;
        self.offset += (BUFFER_HEADER + payload.len()) as u64;
        self.region_buffers += 1;
        self.buffers_written += 1;
        self.out.clear();
        Ok(())
    }

    /// Writes the records `(start, length)` of the area as consecutive
    /// buffers, packed into the output buffer. (Gathering them straight
    /// from the area with `writev` was measured slower: a record is ~100
    /// bytes, a few hundred iovecs per buffer cost the kernel more than
    /// the copy.)
    fn emit_run(&mut self, records: impl Iterator<Item = (usize, usize)>) -> Result<()> {
        for (start, len) in records {
            self.emit_record(start, len)?;
        }
        self.emit_buffer()
    }

    /// Writes the sort area as one region and empties it.
    fn flush_region(&mut self) -> Result<()> {
        if self.records.is_empty() {
            return Ok(());
        }
        let n = self.target.num_subpartitions;
        let mut entries = vec![IndexEntry::default(); n];
        let records = std::mem::take(&mut self.records);
        if self.broadcast {
            let (offset, before) = (self.offset, self.region_buffers);
            self.emit_run(records.iter().map(|&(_, s, l)| (s as usize, l as usize)))?;
            let e = IndexEntry {
                offset,
                bytes: self.offset - offset,
                buffers: self.region_buffers - before,
            };
            entries.iter_mut().for_each(|x| *x = e);
        } else {
            // Counting sort by subpartition, stable within one.
            let mut starts = vec![0usize; n + 1];
            for &(sp, _, _) in &records {
                starts[sp as usize + 1] += 1;
            }
            for i in 0..n {
                starts[i + 1] += starts[i];
            }
            let mut order = vec![0u32; records.len()];
            let mut fill = starts.clone();
            for (k, &(sp, _, _)) in records.iter().enumerate() {
                order[fill[sp as usize]] = k as u32;
                fill[sp as usize] += 1;
            }
            for k in 0..n {
                let sp = (k + self.target.rotation) % n;
                let (offset, before) = (self.offset, self.region_buffers);
                self.emit_run(order[starts[sp]..starts[sp + 1]].iter().map(|&r| {
                    let (_, start, len) = records[r as usize];
                    (start as usize, len as usize)
                }))?;
                entries[sp] = IndexEntry {
                    offset,
                    bytes: self.offset - offset,
                    buffers: self.region_buffers - before,
                };
            }
        }
        self.records = records;
        self.records.clear();
        self.end_region(entries);
        for s in &mut self.segments {
            s.data_mut().clear();
        }
        self.current = 0;
        self.area_len = 0;
        Ok(())
    }

    fn end_region(&mut self, entries: Vec<IndexEntry>) {
        self.index.extend(entries);
        self.regions += 1;
        self.region_buffers = 0;
    }

    /// A record larger than the sort area: a region of its own.
    fn write_direct_region(&mut self, subpartition: Option<usize>, record: &[u8]) -> Result<()> {
        let n = self.target.num_subpartitions;
        let mut entries = vec![IndexEntry::default(); n];
        let header = (record.len() as u32).to_le_bytes();
        let write = |w: &mut Self| -> Result<IndexEntry> {
            let (offset, before) = (w.offset, w.region_buffers);
            w.emit_bytes(&header)?;
            w.emit_bytes(record)?;
            w.emit_buffer()?;
            Ok(IndexEntry {
                offset,
                bytes: w.offset - offset,
                buffers: w.region_buffers - before,
            })
        };
        match subpartition {
            None => {
                let e = write(self)?;
                entries.iter_mut().for_each(|x| *x = e);
            }
            Some(target) => {
                for k in 0..n {
                    let sp = (k + self.target.rotation) % n;
                    entries[sp] = if sp == target {
                        write(self)?
                    } else {
                        IndexEntry {
                            offset: self.offset,
                            ..Default::default()
                        }
                    };
                }
            }
        }
        self.end_region(entries);
        Ok(())
    }

    /// Flushes the last region, writes the index and makes the partition
    /// readable. Idempotent.
    pub fn finish(&mut self) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        self.flush_region()?;
        // The sort area goes back to the pool now, not when the task ends.
        self.segments.clear();
        let t = Arc::clone(&self.target);
        let Some(mut file) = self.file.take() else {
            return Err(FluviaError::Internal(format!(
                "partition {} has a second writer",
                t.name
            )));
        };
        file.flush().map_err(|e| {
            FluviaError::io(
                format!("writing shuffle data file {}", t.data_path.display()),
                e,
            )
        })?;
        let mut bytes = Vec::with_capacity(INDEX_HEADER + self.index.len() * INDEX_ENTRY + 4);
        bytes.extend_from_slice(&INDEX_MAGIC.to_le_bytes());
        bytes.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        bytes.extend_from_slice(&(t.num_subpartitions as u32).to_le_bytes());
        bytes.extend_from_slice(&self.regions.to_le_bytes());
        bytes.extend_from_slice(&(t.config.segment_size as u32).to_le_bytes());
        bytes.extend_from_slice(&self.offset.to_le_bytes());
        for e in &self.index {
            bytes.extend_from_slice(&e.offset.to_le_bytes());
            bytes.extend_from_slice(&e.bytes.to_le_bytes());
            bytes.extend_from_slice(&e.buffers.to_le_bytes());
        }
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        std::fs::write(&t.index_path, &bytes).map_err(|e| {
            FluviaError::io(
                format!("writing shuffle index file {}", t.index_path.display()),
                e,
            )
        })?;
        let data = File::open(&t.data_path).map_err(|e| {
            FluviaError::io(
                format!("opening shuffle data file {}", t.data_path.display()),
                e,
            )
        })?;
        t.set_finished(PartitionFile {
            name: t.name.clone(),
            data_path: t.data_path.clone(),
            index_path: t.index_path.clone(),
            data,
            num_subpartitions: t.num_subpartitions,
            segment_size: t.config.segment_size,
            index: std::mem::take(&mut self.index),
        });
        self.finished = true;
        Ok(())
    }
}

/// One consumer's read of a subpartition range of a sort-merge partition.
pub struct SortMergeView {
    partition_name: String,
    first: u32,
    last: u32,
    scheduler: Arc<ReadScheduler>,
    me: Weak<SortMergeView>,
    listener: Arc<dyn AvailabilityListener>,
    channel: usize,
    state: Mutex<ViewState>,
}

debug_fields!(SortMergeView, |this| {
    partition: this.partition_name,
    first: this.first,
    last: this.last,
});

struct ViewState {
    file: Option<Arc<PartitionFile>>,
    queue: VecDeque<(Buffer, u32)>,
    /// The cursor: the next region and subpartition to start, and the rest
    /// of the entry being read `(subpartition, offset, bytes left, buffers left)`.
    region: usize,
    next_subpartition: u32,
    entry: Option<(u32, u64, u64, u32)>,
    /// Buffers not yet read from the file.
    unread: u64,
    /// How many buffers the consumer can take now.
    demand: usize,
    scheduled: bool,
    error: Option<String>,
    end_delivered: bool,
}

impl ViewState {
    /// The entry to read next, advancing the cursor past empty ones.
    fn current_entry(&mut self, first: u32, last: u32) -> Option<(u32, u64, u64, u32)> {
        if self.entry.is_none() {
            let file = self.file.as_ref()?;
            while self.region < file.num_regions() {
                while self.next_subpartition <= last {
                    let sp = self.next_subpartition;
                    self.next_subpartition += 1;
                    let e = file.entry(self.region, sp as usize);
                    if e.buffers > 0 {
                        self.entry = Some((sp, e.offset, e.bytes, e.buffers));
                        return self.entry;
                    }
                }
                self.region += 1;
                self.next_subpartition = first;
            }
        }
        self.entry
    }
}

impl SortMergeView {
    fn attach_file(&self, file: Arc<PartitionFile>) {
        let mut st = lock_state(&self.state);
        if st.file.is_some() {
            return;
        }
        st.unread = file.buffers_of(self.first as usize, self.last as usize);
        st.file = Some(file);
        drop(st);
        self.listener.notify_available(self.channel);
    }

    fn fail(&self, message: String) {
        lock_state(&self.state).error.get_or_insert(message);
        self.listener.notify_available(self.channel);
    }

    /// Reads up to `budget` buffers (scheduler thread). Returns how many it
    /// read and whether the view wants more.
    fn read_some(&self, budget: &ReadScheduler) -> (usize, bool) {
        let (want, queue_empty) = {
            let mut st = lock_state(&self.state);
            st.scheduled = false;
            if st.error.is_some() || st.unread == 0 || st.file.is_none() {
                return (0, false);
            }
            (
                st.demand.saturating_sub(st.queue.len()),
                st.queue.is_empty(),
            )
        };
        if want == 0 {
            return (0, false);
        }
        let granted = budget.take(want.min(64), queue_empty);
        if granted == 0 {
            return (0, true);
        }
        // Entry after entry (small regions hold a buffer or two per
        // subpartition) until the grant is used.
        let mut total = 0;
        let mut failure = None;
        while total < granted {
            let (file, entry) = {
                let mut st = lock_state(&self.state);
                let (first, last) = (self.first, self.last);
                let (Some(entry), Some(file)) = (st.current_entry(first, last), st.file.clone())
                else {
                    break;
                };
                (file, entry)
            };
            let (sp, offset, bytes_left, buffers_left) = entry;
            let (buffers, consumed) = match Self::read_buffers(
                &file,
                budget,
                granted - total,
                offset,
                bytes_left,
                buffers_left,
            ) {
                Ok(r) => r,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let read = buffers.len();
            total += read;
            let mut st = lock_state(&self.state);
            let was_empty = st.queue.is_empty();
            for b in buffers {
                st.queue.push_back((b, sp));
            }
            st.unread -= read as u64;
            let rest = buffers_left - read as u32;
            st.entry = (rest > 0).then_some((sp, offset + consumed, bytes_left - consumed, rest));
            let tell = was_empty || st.unread == 0;
            drop(st);
            if tell {
                self.listener.notify_available(self.channel);
            }
        }
        budget.give_back(granted);
        if let Some(e) = failure {
            self.fail(e.to_string());
            return (total, false);
        }
        let st = lock_state(&self.state);
        (total, st.unread > 0 && st.demand > st.queue.len())
    }

    /// Reads up to `n` buffers of the entry at `offset`, each straight
    /// into its own segment (one copy, the kernel's); returns them and the
    /// bytes consumed.
    fn read_buffers(
        file: &PartitionFile,
        budget: &ReadScheduler,
        n: usize,
        mut offset: u64,
        mut bytes_left: u64,
        buffers_left: u32,
    ) -> Result<(Vec<Buffer>, u64)> {
        let seg = file.segment_size;
        let start = offset;
        let mut buffers = Vec::with_capacity(n);
        while buffers.len() < n && buffers.len() < buffers_left as usize {
            if bytes_left < BUFFER_HEADER as u64 {
                return Err(corrupt(
                    &file.name,
                    format!("index entry ends inside a buffer header at offset {offset}"),
                ));
            }
            // Header and payload in one read; never past the entry.
            let len = (BUFFER_HEADER + seg).min(bytes_left as usize);
            let mut segment = budget.segment(len);
            file.read_at(&mut segment[..len], offset)?;
            let h = &segment[..BUFFER_HEADER];
            let payload_len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
            let crc = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
            let (kind, flags) = (h[0], h[1]);
            if kind != KIND_DATA
                || flags & !FLAG_COMPRESSED != 0
                || payload_len > seg
                || payload_len == 0
            {
                return Err(corrupt(
                    &file.name,
                    format!(
                        "bad buffer header at offset {offset} of {} (kind {kind}, flags {flags}, \
                         length {payload_len})",
                        file.data_path.display()
                    ),
                ));
            }
            let end = BUFFER_HEADER + payload_len;
            if end > len {
                return Err(corrupt(
                    &file.name,
                    format!("buffer at offset {offset} runs past its index entry"),
                ));
            }
            if crc32fast::hash(&segment[BUFFER_HEADER..end]) != crc {
                return Err(corrupt(
                    &file.name,
                    format!(
                        "buffer at offset {offset} of {} fails its checksum",
                        file.data_path.display()
                    ),
                ));
            }
            let buffer = if flags & FLAG_COMPRESSED != 0 {
                let mut out = budget.segment(BUFFER_HEADER + seg);
                crate::compression::decompress_into(&segment[BUFFER_HEADER..end], &mut out, seg)
                    .map_err(|e| corrupt(&file.name, format!("buffer at offset {offset}: {e}")))?;
                budget.recycle_segment(segment);
                let size = out.len();
                budget.wrap(out, 0..size)
            } else {
                budget.wrap(segment, BUFFER_HEADER..end)
            };
            buffers.push(buffer);
            offset += end as u64;
            bytes_left -= end as u64;
        }
        Ok((buffers, offset - start))
    }

    /// Whether to ask the I/O thread for more: only once the queue is down
    /// to half of what the consumer can take (one wake-up per batch, not
    /// per buffer), or empty.
    fn schedule(&self, st: &mut ViewState) -> bool {
        let low = st.queue.is_empty() || st.queue.len() * 2 <= st.demand;
        if !st.scheduled && st.unread > 0 && st.demand > st.queue.len() && low && st.error.is_none()
        {
            st.scheduled = true;
            return true;
        }
        false
    }
}

impl SubpartitionView for SortMergeView {
    fn poll(&self, credit: u32) -> Result<ViewPoll> {
        let mut st = lock_state(&self.state);
        if let Some(e) = &st.error {
            return Err(FluviaError::Execution(e.clone()));
        }
        if st.end_delivered || st.file.is_none() {
            return Ok(ViewPoll::Nothing);
        }
        let outcome = if st.queue.is_empty() {
            if st.unread == 0 {
                st.end_delivered = true;
                ViewPoll::Item {
                    item: BufferOrEvent::Event(Event::EndOfPartition),
                    subpartition: self.last,
                    next: NextKind::Nothing,
                }
            } else {
                st.demand = credit as usize;
                if credit == 0 {
                    ViewPoll::NeedsCredit
                } else {
                    ViewPoll::Nothing
                }
            }
        } else if credit == 0 {
            st.demand = 0;
            ViewPoll::NeedsCredit
        } else {
            let Some((buffer, sp)) = st.queue.pop_front() else {
                return Ok(ViewPoll::Nothing);
            };
            st.demand = credit as usize - 1;
            let next = if !st.queue.is_empty() {
                NextKind::Data
            } else if st.unread == 0 {
                NextKind::Event
            } else {
                NextKind::Nothing
            };
            ViewPoll::Item {
                item: BufferOrEvent::Buffer(buffer),
                subpartition: sp,
                next,
            }
        };
        let submit = self.schedule(&mut st);
        drop(st);
        if submit {
            self.scheduler.submit(self.me.clone());
        }
        Ok(outcome)
    }

    fn backlog(&self) -> usize {
        let st = lock_state(&self.state);
        st.queue.len() + st.unread as usize
    }
}

/// The TaskManager-wide reader of sort-merge partitions (Flink's
/// `SortMergeResultPartitionReadScheduler` over a `BatchShuffleReadBufferPool`):
/// one I/O thread, a budget of read buffers shared by every view.
pub struct ReadScheduler {
    state: Mutex<SchedulerState>,
    wake: Condvar,
    budget: usize,
    segment_size: usize,
    me: Weak<ReadScheduler>,
}

debug_fields!(ReadScheduler, |this| { budget: this.budget });

#[derive(Default)]
struct SchedulerState {
    pending: Vec<Weak<SortMergeView>>,
    /// Read buffers handed out and not yet recycled.
    in_use: usize,
    /// Buffers granted to a read in progress.
    granted: usize,
    free: Vec<Vec<u8>>,
    shutdown: bool,
    /// The most buffers ever in use at once.
    peak: usize,
    in_use_bytes: usize,
    peak_bytes: usize,
}

impl ReadScheduler {
    /// Starts the I/O thread with a budget of `memory` bytes of segments.
    pub fn start(memory: u64, segment_size: usize) -> Result<Arc<Self>> {
        let budget = ((memory / segment_size.max(1) as u64) as usize).max(1);
        let scheduler = Arc::new_cyclic(|me| ReadScheduler {
            state: Mutex::new(SchedulerState::default()),
            wake: Condvar::new(),
            budget,
            segment_size,
            me: me.clone(),
        });
        let weak = Arc::downgrade(&scheduler);
        std::thread::Builder::new()
            .name("batch-shuffle-read".into())
            .spawn(move || Self::run(weak))
            .map_err(|e| FluviaError::io("starting the batch shuffle read thread", e))?;
        Ok(scheduler)
    }

    /// The most read buffers that were in use at once.
    pub fn peak_buffers(&self) -> usize {
        lock_state(&self.state).peak
    }

    /// The most bytes read buffers held at once.
    pub fn peak_bytes(&self) -> usize {
        lock_state(&self.state).peak_bytes
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    fn submit(&self, view: Weak<SortMergeView>) {
        lock_state(&self.state).pending.push(view);
        self.wake.notify_one();
    }

    /// Grants up to `want` buffers; a view whose consumer has nothing queued
    /// gets one even beyond the budget, so no consumer waits forever on
    /// buffers held by consumers that are not reading.
    fn take(&self, want: usize, queue_empty: bool) -> usize {
        let mut st = lock_state(&self.state);
        let free = self.budget.saturating_sub(st.in_use + st.granted);
        let n = match (free.min(want), queue_empty) {
            (0, true) => 1.min(want),
            (n, _) => n,
        };
        st.granted += n;
        n
    }

    /// Returns a grant; the buffers it produced are counted in use by `wrap`.
    fn give_back(&self, granted: usize) {
        lock_state(&self.state).granted -= granted;
    }

    /// A segment of at least `len` bytes to read into: a recycled full
    /// one, or a new one (exactly `len` for a small read, so small
    /// buffers do not hold whole segments).
    fn segment(&self, len: usize) -> Vec<u8> {
        let full = BUFFER_HEADER + self.segment_size;
        if len <= full
            && len > full / 4
            && let Some(v) = lock_state(&self.state).free.pop()
        {
            return v;
        }
        vec![0u8; if len > full / 4 { full.max(len) } else { len }]
    }

    /// Takes back a segment that holds no buffer.
    fn recycle_segment(&self, segment: Vec<u8>) {
        let full = BUFFER_HEADER + self.segment_size;
        let mut st = lock_state(&self.state);
        if segment.len() == full && st.free.len() < self.budget {
            st.free.push(segment);
        }
    }

    fn wrap(&self, segment: Vec<u8>, range: std::ops::Range<usize>) -> Buffer {
        {
            let mut st = lock_state(&self.state);
            st.in_use += 1;
            st.peak = st.peak.max(st.in_use);
            st.in_use_bytes += segment.len();
            st.peak_bytes = st.peak_bytes.max(st.in_use_bytes);
        }
        match self.me.upgrade() {
            Some(me) => Buffer::slice_of(segment, range, me),
            None => Buffer::from_vec(segment[range].to_vec()),
        }
    }

    fn run(weak: Weak<ReadScheduler>) {
        loop {
            let Some(me) = weak.upgrade() else { return };
            let batch: Vec<Arc<SortMergeView>> = {
                let mut st = lock_state(&me.state);
                while st.pending.is_empty() && !st.shutdown {
                    let (g, _) = me
                        .wake
                        .wait_timeout(st, std::time::Duration::from_millis(200))
                        .unwrap_or_else(|e| e.into_inner());
                    st = g;
                    if Arc::strong_count(&me) == 1 {
                        return; // nobody can submit any more
                    }
                }
                if st.shutdown {
                    return;
                }
                std::mem::take(&mut st.pending)
                    .into_iter()
                    .filter_map(|w| w.upgrade())
                    .collect()
            };
            // Readers with nothing queued first, then by file offset.
            let mut keyed: Vec<((bool, u64), Arc<SortMergeView>)> = batch
                .into_iter()
                .map(|v| {
                    let st = lock_state(&v.state);
                    let offset = st.entry.map_or(u64::MAX, |e| e.1);
                    let key = (!st.queue.is_empty(), offset);
                    drop(st);
                    (key, v)
                })
                .collect();
            keyed.sort_by_key(|(k, _)| *k);
            let mut again = Vec::new();
            let mut progress = false;
            for (_, v) in keyed {
                let (read, more) = v.read_some(&me);
                progress |= read > 0;
                if more {
                    again.push(v);
                }
            }
            if !again.is_empty() {
                let mut st = lock_state(&me.state);
                for v in &again {
                    if lock_state(&v.state).scheduled {
                        continue;
                    }
                    lock_state(&v.state).scheduled = true;
                    st.pending.push(Arc::downgrade(v));
                }
                if !progress {
                    // Out of budget: wait for a recycled buffer.
                    let _ = me
                        .wake
                        .wait_timeout(st, std::time::Duration::from_millis(50))
                        .unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }

    /// Stops the I/O thread.
    pub fn shutdown(&self) {
        lock_state(&self.state).shutdown = true;
        self.wake.notify_all();
    }
}

impl BufferRecycler for ReadScheduler {
    fn recycle(&self, mut segment: Vec<u8>) {
        let full = BUFFER_HEADER + self.segment_size;
        let mut st = lock_state(&self.state);
        st.in_use = st.in_use.saturating_sub(1);
        st.in_use_bytes = st.in_use_bytes.saturating_sub(segment.len());
        // Decompressed buffers come back shorter; only full segments are
        // kept (growing one costs a zeroing, like a new one).
        // Cached segments and segments in use stay within the budget.
        if segment.capacity() >= full && st.free.len() + st.in_use < self.budget {
            segment.resize(full, 0);
            st.free.push(segment);
        }
        drop(st);
        self.wake.notify_one();
    }
}
