//! Record framing: each record is written as a 4-byte little-endian length and
//! its bytes, packed into fixed-size buffers. A record that does not fit in
//! what is left of a buffer continues in the next one (Flink's spanning
//! records), so any record size works with any buffer size.
//!
//! The [`PartitionWriter`] keeps one open buffer per subpartition and hands it
//! over when it is full, when a flush is due (`execution.buffer-timeout`,
//! signalled through a shared flush epoch) and at the end. The
//! [`RecordDeserializer`] of a channel hands out complete records, directly
//! from the buffer when a record lies inside one, else from a reassembly area.

use crate::buffer::{BufferBuilder, LocalBufferPool};
use crate::cancel::CancelToken;
use crate::partition::ResultPartition;
use crate::partitioner::Target;
use fluvia_core::{FluviaError, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const HEADER: usize = 4;
/// Records above this size are treated as corruption, not allocated.
pub const MAX_RECORD_SIZE: usize = 1 << 30;

/// Writes records into one result partition.
pub struct PartitionWriter {
    partition: Arc<ResultPartition>,
    pool: Arc<LocalBufferPool>,
    builders: Vec<Option<BufferBuilder>>,
    /// The open buffer of broadcast records, shared by every subpartition
    /// once sealed (serialise once, as Flink's `BroadcastRecordWriter`).
    broadcast: Option<BufferBuilder>,
    cancel: CancelToken,
    flush_epoch: Option<Arc<AtomicU64>>,
    seen_epoch: u64,
    records_out: u64,
    bytes_out: u64,
    buffers_out: u64,
    /// Per subpartition, and for broadcast data (counted once, read by all).
    subpartition_records: Vec<u64>,
    subpartition_bytes: Vec<u64>,
    broadcast_records: u64,
    broadcast_bytes: u64,
    finished: bool,
    /// Shared counters, published at every buffer hand-over.
    counters: Option<Arc<crate::metrics::IoCounters>>,
    published_records: u64,
    published_bytes: u64,
    /// Set for a sort-merge partition: records go to its sort area
    /// instead of per-subpartition buffers.
    sort_merge: Option<crate::sortmerge::SortMergeWriter>,
}

debug_fields!(PartitionWriter, |this| { partition: this.partition.name() });

impl PartitionWriter {
    /// `flush_epoch`, when given, is bumped by a timer; the writer flushes
    /// every open buffer when it sees a new value.
    pub fn new(
        partition: Arc<ResultPartition>,
        pool: Arc<LocalBufferPool>,
        cancel: CancelToken,
        flush_epoch: Option<Arc<AtomicU64>>,
    ) -> Self {
        let n = partition.num_subpartitions();
        let sort_merge = partition
            .as_sort_merge()
            .map(|p| p.writer(Arc::clone(&pool), cancel.clone()));
        PartitionWriter {
            sort_merge,
            published_bytes: 0,
            partition,
            pool,
            builders: (0..n).map(|_| None).collect(),
            broadcast: None,
            cancel,
            flush_epoch,
            seen_epoch: 0,
            records_out: 0,
            bytes_out: 0,
            buffers_out: 0,
            subpartition_records: vec![0; n],
            subpartition_bytes: vec![0; n],
            broadcast_records: 0,
            broadcast_bytes: 0,
            finished: false,
            counters: None,
            published_records: 0,
        }
    }

    /// Publishes records, bytes and buffers out to `counters` as buffers
    /// are handed over.
    pub fn with_counters(mut self, counters: Arc<crate::metrics::IoCounters>) -> Self {
        self.counters = Some(counters);
        self
    }

    /// Publishes what was handed over since the last call: `buffers` more
    /// buffers, and the records and bytes written.
    fn publish(&mut self, buffers: u64) {
        if let Some(c) = &self.counters {
            use crate::metrics::IoCounters;
            IoCounters::add(&c.bytes_out, self.bytes_out - self.published_bytes);
            IoCounters::add(&c.buffers_out, buffers);
            IoCounters::add(&c.records_out, self.records_out - self.published_records);
            self.published_records = self.records_out;
            self.published_bytes = self.bytes_out;
        }
    }

    /// The sort-merge path of [`emit`](Self::emit).
    fn emit_sorted(&mut self, target: Target, record: &[u8]) -> Result<()> {
        let Some(w) = self.sort_merge.as_mut() else {
            return Ok(());
        };
        let framed = (HEADER + record.len()) as u64;
        match target {
            Target::One(sp) => {
                w.append(sp, record)?;
                self.subpartition_records[sp] += 1;
                self.subpartition_bytes[sp] += framed;
            }
            Target::All => {
                w.broadcast(record)?;
                self.broadcast_records += 1;
                self.broadcast_bytes += framed;
            }
        }
        self.records_out += 1;
        self.bytes_out += framed;
        let written = w.buffers_written();
        if written != self.buffers_out {
            let delta = written - self.buffers_out;
            self.buffers_out = written;
            self.publish(delta);
        }
        Ok(())
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether every consumer of the (pipelined) partition stopped reading,
    /// readable from another thread; `None` for a blocking partition.
    pub fn consumers_released(&self) -> Option<crate::ConsumersReleased> {
        self.partition.consumers_released()
    }

    pub fn num_subpartitions(&self) -> usize {
        self.builders.len()
    }

    pub fn pool(&self) -> &Arc<LocalBufferPool> {
        &self.pool
    }

    pub fn records_out(&self) -> u64 {
        self.records_out
    }

    pub fn bytes_out(&self) -> u64 {
        self.bytes_out
    }

    pub fn buffers_out(&self) -> u64 {
        self.buffers_out
    }

    /// Records written to each subpartition (a broadcast record counts for
    /// every one).
    pub fn subpartition_records(&self) -> Vec<u64> {
        self.subpartition_records
            .iter()
            .map(|n| n + self.broadcast_records)
            .collect()
    }

    /// Bytes handed to each subpartition (broadcast buffers count for every
    /// one, though they are stored once).
    pub fn subpartition_bytes(&self) -> Vec<u64> {
        self.subpartition_bytes
            .iter()
            .map(|n| n + self.broadcast_bytes)
            .collect()
    }

    /// Writes one encoded record to `target`.
    #[inline]
    pub fn emit(&mut self, target: Target, record: &[u8]) -> Result<()> {
        self.emit_parts(target, &[record])
    }

    /// Writes one record made of `parts`, one after another, to `target`:
    /// a record encoded in pieces (a header, then a body) goes into the
    /// network buffers without first being copied into one slice.
    #[inline]
    pub fn emit_parts(&mut self, target: Target, parts: &[&[u8]]) -> Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if self.finished {
            return Err(FluviaError::Internal(format!(
                "record written to finished partition {}",
                self.partition.name()
            )));
        }
        if len > MAX_RECORD_SIZE {
            return Err(FluviaError::Serialization(format!(
                "record of {len} bytes exceeds the maximum record size {MAX_RECORD_SIZE}"
            )));
        }
        if self.sort_merge.is_some() {
            return match parts {
                [record] => self.emit_sorted(target, record),
                _ => self.emit_sorted(target, &parts.concat()),
            };
        }
        match target {
            Target::One(sp) => {
                if self.broadcast.is_some() {
                    self.hand_over_broadcast()?;
                }
                self.write_record(sp, len, parts)?;
                self.subpartition_records[sp] += 1;
            }
            Target::All => {
                if self.builders.iter().any(Option::is_some) {
                    for sp in 0..self.builders.len() {
                        self.hand_over(sp)?;
                    }
                }
                self.write_broadcast(len, parts)?;
                self.broadcast_records += 1;
            }
        }
        self.records_out += 1;
        if let Some(epoch) = &self.flush_epoch {
            let now = epoch.load(Ordering::Relaxed);
            if now != self.seen_epoch {
                self.seen_epoch = now;
                self.flush_all()?;
            }
        }
        Ok(())
    }

    fn write_record(&mut self, sp: usize, len: usize, parts: &[&[u8]]) -> Result<()> {
        let header = (len as u32).to_le_bytes();
        if let Some(b) = &mut self.builders[sp]
            && b.remaining() >= HEADER + len
        {
            b.append(&header);
            for part in parts {
                b.append(part);
            }
        } else {
            self.write_spanning(sp, &header)?;
            for part in parts {
                self.write_spanning(sp, part)?;
            }
        }
        if self.builders[sp]
            .as_ref()
            .is_some_and(|b| b.remaining() == 0)
        {
            self.hand_over(sp)?;
        }
        Ok(())
    }

    fn write_spanning(&mut self, sp: usize, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let builder = match &mut self.builders[sp] {
                Some(b) => b,
                slot @ None => slot.insert(self.pool.request(&self.cancel)?),
            };
            let n = builder.append(bytes);
            bytes = &bytes[n..];
            if builder.remaining() == 0 {
                self.hand_over(sp)?;
            }
        }
        Ok(())
    }

    /// Writes a record once into the shared broadcast buffer.
    fn write_broadcast(&mut self, len: usize, parts: &[&[u8]]) -> Result<()> {
        let header = (len as u32).to_le_bytes();
        for mut bytes in std::iter::once(&header[..]).chain(parts.iter().copied()) {
            while !bytes.is_empty() {
                let builder = match &mut self.broadcast {
                    Some(b) => b,
                    slot @ None => slot.insert(self.pool.request(&self.cancel)?),
                };
                let n = builder.append(bytes);
                bytes = &bytes[n..];
                if builder.remaining() == 0 {
                    self.hand_over_broadcast()?;
                }
            }
        }
        Ok(())
    }

    /// Seals the broadcast buffer and gives every subpartition a reference
    /// to the same segment.
    fn hand_over_broadcast(&mut self) -> Result<()> {
        if let Some(b) = self.broadcast.take() {
            if b.is_empty() {
                return Ok(());
            }
            self.bytes_out += b.len() as u64;
            self.broadcast_bytes += b.len() as u64;
            self.buffers_out += 1;
            self.publish(1);
            let buffer = b.finish();
            for sp in 0..self.builders.len() {
                self.partition.subpartition(sp).add_buffer(buffer.clone())?;
            }
        }
        Ok(())
    }

    fn hand_over(&mut self, sp: usize) -> Result<()> {
        if let Some(b) = self.builders[sp].take() {
            if b.is_empty() {
                return Ok(());
            }
            self.bytes_out += b.len() as u64;
            self.subpartition_bytes[sp] += b.len() as u64;
            self.buffers_out += 1;
            self.publish(1);
            self.partition.subpartition(sp).add_buffer(b.finish())?;
        }
        Ok(())
    }

    /// Hands over every partly filled buffer.
    pub fn flush_all(&mut self) -> Result<()> {
        self.hand_over_broadcast()?;
        for sp in 0..self.builders.len() {
            self.hand_over(sp)?;
        }
        Ok(())
    }

    /// Writes `event` to every subpartition. An ordinary event follows
    /// every record written before it, so partly filled buffers are handed
    /// over first; a priority event overtakes them and whatever is queued.
    pub fn broadcast_event(&mut self, event: &crate::Event) -> Result<()> {
        if self.finished {
            return Err(FluviaError::Internal(format!(
                "event {event:?} written to finished partition {}",
                self.partition.name()
            )));
        }
        if *event == crate::Event::EndOfPartition {
            return self.finish();
        }
        if !event.is_priority() {
            self.flush_all()?;
        }
        self.partition.broadcast_event(event)
    }

    /// Flushes and ends every subpartition.
    /// Idempotent: only the first call ends the partition.
    pub fn finish(&mut self) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        self.flush_all()?;
        if let Some(w) = self.sort_merge.as_mut() {
            w.finish()?;
            let written = w.buffers_written();
            let delta = written - self.buffers_out;
            self.buffers_out = written;
            self.publish(delta);
        }
        self.finished = true;
        self.partition.finish()
    }
}

/// The deserializers of a gate: one per channel and subpartition of its
/// range, created as buffers arrive.
#[derive(Debug, Default)]
pub struct ChannelDeserializers {
    channels: Vec<Vec<RecordDeserializer>>,
}

impl ChannelDeserializers {
    pub fn new(num_channels: usize) -> Self {
        ChannelDeserializers {
            channels: (0..num_channels).map(|_| Vec::new()).collect(),
        }
    }

    /// The deserializer of `subpartition` (relative) of `channel`.
    pub fn get(&mut self, channel: usize, subpartition: u32) -> &mut RecordDeserializer {
        if channel >= self.channels.len() {
            self.channels.resize_with(channel + 1, Vec::new);
        }
        let c = &mut self.channels[channel];
        let sp = subpartition as usize;
        if sp >= c.len() {
            c.resize_with(sp + 1, RecordDeserializer::new);
        }
        &mut c[sp]
    }

    /// Whether any subpartition of `channel` holds a cut-off record.
    pub fn has_partial_record(&self, channel: usize) -> bool {
        self.channels
            .get(channel)
            .is_some_and(|c| c.iter().any(RecordDeserializer::has_partial_record))
    }
}

/// Reassembles records of one subpartition of one input channel.
#[derive(Debug, Default)]
pub struct RecordDeserializer {
    partial: Vec<u8>,
}

impl RecordDeserializer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a record is cut off (an error at the end of the channel).
    pub fn has_partial_record(&self) -> bool {
        !self.partial.is_empty()
    }

    /// Calls `on_record` for every record completed by `buf`.
    pub fn feed(
        &mut self,
        buf: &[u8],
        mut on_record: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        self.feed_records(buf, false, |r| on_record(r.as_slice()))
    }

    /// Calls `on_record` for every record completed by `buf`. With `owned`,
    /// a record reassembled from several buffers is handed over in the
    /// vector it was gathered in (a decoder may keep it instead of copying
    /// it); otherwise that vector is reused for the next one.
    pub fn feed_records(
        &mut self,
        buf: &[u8],
        owned: bool,
        mut on_record: impl FnMut(RecordBytes<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut pos = 0;
        while pos < buf.len() || self.partial_complete() {
            if !self.partial.is_empty() {
                let want = self.partial_target()?;
                // Gathered in one allocation, not grown buffer by buffer.
                self.partial.reserve_exact(want - self.partial.len());
                let take = (want - self.partial.len()).min(buf.len() - pos);
                self.partial.extend_from_slice(&buf[pos..pos + take]);
                pos += take;
                if self.partial_complete() {
                    if owned {
                        on_record(RecordBytes::Reassembled(std::mem::take(&mut self.partial)))?;
                    } else {
                        on_record(RecordBytes::InBuffer(&self.partial[HEADER..]))?;
                        self.partial.clear();
                    }
                }
                continue;
            }
            let rest = &buf[pos..];
            if rest.len() >= HEADER {
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                if len > MAX_RECORD_SIZE {
                    return Err(corrupt(len));
                }
                if rest.len() >= HEADER + len {
                    on_record(RecordBytes::InBuffer(&rest[HEADER..HEADER + len]))?;
                    pos += HEADER + len;
                    continue;
                }
                self.partial.reserve_exact(HEADER + len);
            }
            // The record continues in the next buffer.
            self.partial.extend_from_slice(rest);
            pos = buf.len();
            let _ = self.partial_target()?;
        }
        Ok(())
    }

    /// Bytes the reassembly area must reach: the header, then header + record.
    fn partial_target(&self) -> Result<usize> {
        if self.partial.len() < HEADER {
            return Ok(HEADER);
        }
        let len = u32::from_le_bytes([
            self.partial[0],
            self.partial[1],
            self.partial[2],
            self.partial[3],
        ]) as usize;
        if len > MAX_RECORD_SIZE {
            return Err(corrupt(len));
        }
        Ok(HEADER + len)
    }

    fn partial_complete(&self) -> bool {
        self.partial.len() >= HEADER && self.partial_target().is_ok_and(|t| self.partial.len() == t)
    }
}

/// One complete record, as [`RecordDeserializer::feed_records`] hands it
/// over.
#[derive(Debug)]
pub enum RecordBytes<'a> {
    /// The record's bytes where they are (in the buffer they arrived in,
    /// or in the deserializer's reassembly area).
    InBuffer(&'a [u8]),
    /// A record gathered from several buffers: the vector holds its
    /// length header ([`RECORD_HEADER`] bytes), then the record.
    Reassembled(Vec<u8>),
}

/// Bytes of the length header before every record.
pub const RECORD_HEADER: usize = HEADER;

impl RecordBytes<'_> {
    /// The record's bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            RecordBytes::InBuffer(b) => b,
            RecordBytes::Reassembled(v) => &v[HEADER..],
        }
    }
}

fn corrupt(len: usize) -> FluviaError {
    FluviaError::Serialization(format!(
        "corrupt record stream: record length {len} exceeds the maximum {MAX_RECORD_SIZE}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::NetworkBufferPool;
    use crate::event::BufferOrEvent;

    fn round_trip(segment: usize, records: &[Vec<u8>]) -> Vec<Vec<u8>> {
        round_trip_as(segment, records, Target::One(0), false)
    }

    /// Writes `records` to `target` (in three parts each with `parts`) and
    /// reads them back from subpartition 0 (taking reassembled records
    /// over with `parts`).
    fn round_trip_as(
        segment: usize,
        records: &[Vec<u8>],
        target: Target,
        parts: bool,
    ) -> Vec<Vec<u8>> {
        let global = NetworkBufferPool::new(1 << 30, segment).unwrap();
        let pool = global.create_local_pool(1 << 14).unwrap();
        let part = Arc::new(ResultPartition::pipelined("p", 2, segment));
        let mut w = PartitionWriter::new(part.clone(), pool, CancelToken::new(), None);
        for r in records {
            if parts {
                let (a, rest) = r.split_at(r.len() / 3);
                let (b, c) = rest.split_at(rest.len() / 2);
                w.emit_parts(target, &[a, b, c]).unwrap();
            } else {
                w.emit(target, r).unwrap();
            }
        }
        w.finish().unwrap();
        let mut d = RecordDeserializer::new();
        let mut out = Vec::new();
        let mut reassembled = 0;
        while let Some((b, _)) = part.subpartition(0).poll().unwrap() {
            match b {
                BufferOrEvent::Buffer(b) => {
                    assert!(b.len() <= segment);
                    d.feed_records(b.as_slice(), parts, |r| {
                        if let RecordBytes::Reassembled(v) = &r {
                            assert_eq!(v.len(), v.capacity(), "gathered in one allocation");
                            reassembled += 1;
                        }
                        out.push(r.as_slice().to_vec());
                        Ok(())
                    })
                    .unwrap()
                }
                BufferOrEvent::Event(_) => break,
            }
        }
        assert!(!d.has_partial_record());
        if parts && records.iter().any(|r| r.len() + HEADER > segment) {
            assert!(reassembled > 0, "records spanning buffers are handed over");
        }
        out
    }

    #[test]
    fn records_written_in_parts_read_back_whole_to_one_target_or_all() {
        let records: Vec<Vec<u8>> = (0..300usize)
            .map(|i| (0..(i * 13) % 500).map(|b| (b * 3 + i) as u8).collect())
            .collect();
        for segment in [64, 65, 100, 4096] {
            for target in [Target::One(0), Target::All] {
                assert_eq!(
                    round_trip_as(segment, &records, target, true),
                    records,
                    "segment {segment}"
                );
            }
        }
    }

    #[test]
    fn records_of_any_size_span_buffers() {
        let records: Vec<Vec<u8>> = (0..300usize)
            .map(|i| (0..(i * 7) % 200).map(|b| (b + i) as u8).collect())
            .collect();
        for segment in [64, 65, 67, 100, 4096] {
            assert_eq!(round_trip(segment, &records), records, "segment {segment}");
        }
    }

    #[test]
    fn broadcast_buffers_are_shared_not_copied() {
        let global = NetworkBufferPool::new(1 << 20, 1024).unwrap();
        let pool = global.create_local_pool(16).unwrap();
        let part = Arc::new(ResultPartition::pipelined("p", 3, 1024));
        let mut w = PartitionWriter::new(part.clone(), pool.clone(), CancelToken::new(), None);
        for i in 0..100u32 {
            w.emit(Target::All, &i.to_le_bytes()).unwrap();
        }
        w.finish().unwrap();
        // 100 records of 8 bytes framed = 800 bytes: one segment, written once.
        assert_eq!(w.bytes_out(), 800);
        assert_eq!(w.buffers_out(), 1);
        let mut seen = Vec::new();
        for sp in 0..3 {
            let mut d = RecordDeserializer::new();
            let mut n = 0;
            while let Some((b, _)) = part.subpartition(sp).poll().unwrap() {
                if let BufferOrEvent::Buffer(b) = b {
                    d.feed(b.as_slice(), |_| {
                        n += 1;
                        Ok(())
                    })
                    .unwrap();
                    seen.push(b);
                }
            }
            assert_eq!(n, 100);
        }
        assert_eq!(
            seen[0].ref_count(),
            3,
            "one segment shared by three subpartitions"
        );
        assert_eq!(pool.in_use(), 1);
        drop(seen);
        assert_eq!(
            pool.in_use(),
            0,
            "the segment returns once the last reader is done"
        );
    }

    #[test]
    fn empty_records_survive() {
        let records = vec![vec![], vec![1], vec![], vec![]];
        assert_eq!(round_trip(64, &records), records);
    }

    #[test]
    fn a_corrupt_length_is_an_error_not_an_allocation() {
        let mut d = RecordDeserializer::new();
        let err = d
            .feed(&[0xff, 0xff, 0xff, 0x7f, 1, 2], |_| Ok(()))
            .unwrap_err();
        assert!(err.to_string().contains("corrupt record stream"));
    }
}
