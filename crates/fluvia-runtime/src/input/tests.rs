//! The input processor over real local channels: what a task sees of each
//! kind of event.

#![allow(clippy::unwrap_used)]

use super::*;
use fluvia_network::{
    CheckpointOptions, InputChannelSpec, LocalInputChannel, NetworkBufferPool, PartitionWriter,
    ResultPartition, Target,
};

/// Everything the processor hands on, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Record(usize, u8),
    Watermark(i64),
    Status(WatermarkStatus),
    EndInput(usize),
    Trigger(u64),
    Abort(u64),
}

#[derive(Default)]
struct Recorder(Vec<Seen>);

impl DataOutput for Recorder {
    fn emit_record(&mut self, input: usize, record: RecordBytes<'_>) -> Result<()> {
        self.0.push(Seen::Record(input, record.as_slice()[0]));
        Ok(())
    }
    fn emit_watermark(&mut self, watermark: i64) -> Result<()> {
        self.0.push(Seen::Watermark(watermark));
        Ok(())
    }
    fn emit_watermark_status(&mut self, status: WatermarkStatus) -> Result<()> {
        self.0.push(Seen::Status(status));
        Ok(())
    }
    fn end_input(&mut self, input: usize) -> Result<()> {
        self.0.push(Seen::EndInput(input));
        Ok(())
    }
    fn trigger_checkpoint(&mut self, barrier: CheckpointBarrier) -> Result<()> {
        self.0.push(Seen::Trigger(barrier.id));
        Ok(())
    }
    fn abort_checkpoint(&mut self, id: u64) -> Result<()> {
        self.0.push(Seen::Abort(id));
        Ok(())
    }
}

/// `n` producers, one channel each (all of input 0), and their writers.
fn setup(n: usize) -> (StreamInputProcessor, Vec<PartitionWriter>) {
    let network = NetworkBufferPool::new(64 * 1024, 1024).unwrap();
    let mut writers = Vec::new();
    let mut channels = Vec::new();
    for i in 0..n {
        let p = Arc::new(ResultPartition::pipelined(format!("p{i}"), 1, 1024));
        let pool = network.create_local_pool(16).unwrap();
        channels.push(InputChannelSpec {
            channel: LocalInputChannel::new(Arc::clone(&p), 0, 0).unwrap(),
            input_index: 0,
        });
        writers.push(PartitionWriter::new(p, pool, CancelToken::new(), None));
    }
    (StreamInputProcessor::new(InputGate::new(channels)), writers)
}

fn record(w: &mut PartitionWriter, value: u8) {
    w.emit(Target::One(0), &[value]).unwrap();
    w.flush_all().unwrap();
}

/// Processes everything readable now.
fn drain(p: &mut StreamInputProcessor, out: &mut Recorder) {
    while p.process(out).unwrap() == InputStatus::MoreAvailable {}
}

/// Two channels, channel 0 blocked on the aligned barrier of `id`.
fn aligning(id: u64) -> (StreamInputProcessor, Vec<PartitionWriter>, Recorder) {
    let (mut p, mut w) = setup(2);
    let mut out = Recorder::default();
    w[0].broadcast_event(&aligned(id)).unwrap();
    drain(&mut p, &mut out);
    assert!(p.gate().is_blocked(0));
    (p, w, out)
}

fn aligned(id: u64) -> Event {
    Event::CheckpointBarrier(CheckpointBarrier {
        id,
        timestamp: 0,
        options: CheckpointOptions::aligned(),
    })
}

#[test]
fn an_aligned_barrier_blocks_its_channel_until_every_channel_delivered_it() {
    let (mut p, mut w) = setup(2);
    record(&mut w[0], 1);
    w[0].broadcast_event(&aligned(1)).unwrap();
    record(&mut w[0], 2);
    record(&mut w[1], 10);
    record(&mut w[1], 11);
    let mut out = Recorder::default();
    drain(&mut p, &mut out);
    // Record 2 waits behind channel 0's barrier; channel 1 goes on.
    assert_eq!(
        out.0,
        vec![Seen::Record(0, 1), Seen::Record(0, 10), Seen::Record(0, 11)]
    );
    assert!(p.gate().is_blocked(0) && !p.gate().is_blocked(1));
    assert_eq!(p.pending_checkpoint(), Some(1));
    w[1].broadcast_event(&aligned(1)).unwrap();
    record(&mut w[1], 12);
    drain(&mut p, &mut out);
    assert_eq!(out.0[3], Seen::Trigger(1), "{:?}", out.0);
    let mut rest = out.0[4..].to_vec();
    rest.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(rest, vec![Seen::Record(0, 12), Seen::Record(0, 2)]);
    assert!(!p.gate().is_blocked(0));
}

#[test]
fn an_unaligned_barrier_overtakes_queued_records_and_triggers_at_once() {
    let (mut p, mut w) = setup(2);
    for v in 0..5 {
        record(&mut w[0], v);
    }
    w[0].broadcast_event(&Event::CheckpointBarrier(CheckpointBarrier {
        id: 7,
        timestamp: 0,
        options: CheckpointOptions::unaligned(),
    }))
    .unwrap();
    let mut out = Recorder::default();
    drain(&mut p, &mut out);
    assert_eq!(out.0[0], Seen::Trigger(7), "{:?}", out.0);
    assert_eq!(
        out.0[1..],
        (0..5).map(|v| Seen::Record(0, v)).collect::<Vec<_>>()[..]
    );
    assert!(!p.gate().is_blocked(0), "unaligned barriers block nothing");
}

#[test]
fn watermarks_pass_as_the_minimum_over_active_channels() {
    let (mut p, mut w) = setup(2);
    let mut out = Recorder::default();
    record(&mut w[0], 1);
    w[0].broadcast_event(&Event::Watermark(5)).unwrap();
    drain(&mut p, &mut out);
    assert_eq!(out.0, vec![Seen::Record(0, 1)], "channel 1 holds it back");
    w[1].broadcast_event(&Event::Watermark(3)).unwrap();
    drain(&mut p, &mut out);
    w[1].broadcast_event(&Event::Watermark(9)).unwrap();
    drain(&mut p, &mut out);
    w[0].broadcast_event(&Event::WatermarkStatus(WatermarkStatus::Idle))
        .unwrap();
    drain(&mut p, &mut out);
    assert_eq!(
        out.0[1..],
        [Seen::Watermark(3), Seen::Watermark(5), Seen::Watermark(9)]
    );
    w[1].broadcast_event(&Event::WatermarkStatus(WatermarkStatus::Idle))
        .unwrap();
    drain(&mut p, &mut out);
    assert_eq!(out.0.last(), Some(&Seen::Status(WatermarkStatus::Idle)));
}

#[test]
fn end_of_data_ends_an_input_once_and_a_cancel_marker_aborts_the_alignment() {
    let (mut p, mut w, mut out) = aligning(2);
    w[1].broadcast_event(&Event::CancelCheckpointMarker { checkpoint_id: 2 })
        .unwrap();
    w[0].broadcast_event(&Event::EndOfData(StopMode::Drain))
        .unwrap();
    w[1].broadcast_event(&Event::EndOfData(StopMode::Drain))
        .unwrap();
    for x in &mut w {
        x.finish().unwrap();
    }
    loop {
        if p.process(&mut out).unwrap() == InputStatus::EndOfInput {
            break;
        }
    }
    assert_eq!(out.0, vec![Seen::Abort(2), Seen::EndInput(0)]);
}

#[test]
fn a_newer_barrier_aborts_the_alignment_and_blocks_its_own_channel() {
    let (mut p, mut w, mut out) = aligning(1);
    // Channel 1 skipped checkpoint 1 (cancelled upstream) and brings 2.
    w[1].broadcast_event(&aligned(2)).unwrap();
    record(&mut w[1], 5);
    record(&mut w[0], 1);
    drain(&mut p, &mut out);
    assert_eq!(out.0, vec![Seen::Abort(1), Seen::Record(0, 1)]);
    assert!(!p.gate().is_blocked(0), "checkpoint 1's block is lifted");
    assert!(p.gate().is_blocked(1), "channel 1 waits for checkpoint 2");
    assert_eq!(p.pending_checkpoint(), Some(2));
}
