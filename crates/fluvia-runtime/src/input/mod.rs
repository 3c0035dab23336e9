//! The input side of a task: one [`StreamInputProcessor`] reads the task's
//! [`InputGate`], hands records to the task's [`DataOutput`] and every event
//! to one place: barrier alignment ([`barrier`]) and the watermark valve
//! ([`valve`]). DataStream tasks and SQL's exchange readers both read
//! through it, so an event added to the data plane is handled once.
//!
//! This module knows bytes, channels and events; it does not know record
//! types, operators or DataFusion (the [`DataOutput`] does).

pub mod barrier;
pub mod valve;

use barrier::{BarrierAction, CheckpointBarrierHandler};
use fluvia_core::{FluviaError, Result};
use fluvia_network::gate::GateEvent;
use fluvia_network::metrics::IoCounters;
use fluvia_network::{
    CancelToken, ChannelDeserializers, CheckpointBarrier, Event, InputGate, RecordBytes, StopMode,
    WatermarkStatus,
};
use std::sync::Arc;
use valve::StatusWatermarkValve;

/// What the input processor hands on (Flink's `DataOutput` of a
/// `StreamTaskInput`). Only records are required; the rest defaults to
/// nothing, for readers that have no use for it (a batch SQL exchange).
pub trait DataOutput {
    /// One encoded record of logical input `input`.
    fn emit_record(&mut self, input: usize, record: RecordBytes<'_>) -> Result<()>;
    /// The task's combined watermark advanced (never backwards).
    fn emit_watermark(&mut self, _watermark: i64) -> Result<()> {
        Ok(())
    }
    /// Every input channel became idle, or one became active again.
    fn emit_watermark_status(&mut self, _status: WatermarkStatus) -> Result<()> {
        Ok(())
    }
    /// Every channel of `input` delivered its last record (end of data or
    /// end of partition); called once per input.
    fn end_input(&mut self, _input: usize) -> Result<()> {
        Ok(())
    }
    /// Barriers of `barrier` arrived as its alignment asks: the task takes
    /// its snapshot now (Flink's `triggerCheckpointOnBarrier`).
    fn trigger_checkpoint(&mut self, _barrier: CheckpointBarrier) -> Result<()> {
        Ok(())
    }
    /// Checkpoint `id` was abandoned before this task completed it.
    fn abort_checkpoint(&mut self, _id: u64) -> Result<()> {
        Ok(())
    }
    /// An event the runtime does not interpret arrived on `channel`.
    fn user_event(&mut self, _channel: usize, _kind: u32, _payload: &[u8]) -> Result<()> {
        Ok(())
    }
}

/// What [`StreamInputProcessor::process`] found (Flink's `DataInputStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputStatus {
    /// Something was processed; more may be readable.
    MoreAvailable,
    /// Nothing is readable now.
    NothingAvailable,
    /// Every channel has ended.
    EndOfInput,
}

/// Reads one task's gate (see the [module docs](self)).
pub struct StreamInputProcessor {
    gate: InputGate,
    deserializers: ChannelDeserializers,
    barriers: CheckpointBarrierHandler,
    valve: StatusWatermarkValve,
    /// Per channel: it delivered its last record.
    data_ended: Vec<bool>,
    /// Per logical input: `end_input` was called.
    input_ended: Vec<bool>,
    /// Hand records gathered from several buffers over in their own vector.
    owned_records: bool,
    counters: Option<Arc<IoCounters>>,
    records_in: u64,
}

debug_fields!(StreamInputProcessor, |s| {
    gate: s.gate,
    records_in: s.records_in,
});

impl StreamInputProcessor {
    pub fn new(gate: InputGate) -> Self {
        let n = gate.num_channels();
        let inputs = (0..n).map(|c| gate.input_index(c) + 1).max().unwrap_or(0);
        StreamInputProcessor {
            deserializers: ChannelDeserializers::new(n),
            barriers: CheckpointBarrierHandler::new(n),
            valve: StatusWatermarkValve::new(n),
            data_ended: vec![false; n],
            input_ended: vec![false; inputs],
            owned_records: false,
            counters: None,
            records_in: 0,
            gate,
        }
    }

    /// Publishes records, bytes and buffers in to `counters` as they are read.
    pub fn with_counters(mut self, counters: Arc<IoCounters>) -> Self {
        self.counters = Some(counters);
        self
    }

    /// Records reassembled from several buffers are handed over as
    /// [`RecordBytes::Reassembled`] (a decoder may keep the vector).
    pub fn with_owned_records(mut self, owned: bool) -> Self {
        self.owned_records = owned;
        self
    }

    pub fn gate(&self) -> &InputGate {
        &self.gate
    }

    pub fn gate_mut(&mut self) -> &mut InputGate {
        &mut self.gate
    }

    /// Records read so far.
    pub fn records_in(&self) -> u64 {
        self.records_in
    }

    /// The id of the checkpoint being aligned, if one is.
    pub fn pending_checkpoint(&self) -> Option<u64> {
        self.barriers.pending()
    }

    /// Processes what is readable now: the records of one buffer, or one
    /// event.
    pub fn process<O: DataOutput + ?Sized>(&mut self, out: &mut O) -> Result<InputStatus> {
        if self.gate.is_finished() {
            return Ok(InputStatus::EndOfInput);
        }
        match self.gate.poll_next()? {
            Some(ev) => self.handle(ev, out),
            None => Ok(self.idle_status()),
        }
    }

    /// Like [`process`](Self::process), waiting for input first; gives up
    /// with [`InputStatus::NothingAvailable`] once `stop` holds (a
    /// [`waker`](InputGate::waker) of the gate makes a waiting thread look
    /// at it at once).
    pub fn process_blocking<O: DataOutput + ?Sized>(
        &mut self,
        out: &mut O,
        cancel: &CancelToken,
        stop: &dyn Fn() -> bool,
    ) -> Result<InputStatus> {
        match self.gate.get_next_until(cancel, stop)? {
            Some(ev) => self.handle(ev, out),
            None => Ok(self.idle_status()),
        }
    }

    fn idle_status(&self) -> InputStatus {
        self.unless_finished(InputStatus::NothingAvailable)
    }

    /// `EndOfInput` once every channel finished, else `status`.
    fn unless_finished(&self, status: InputStatus) -> InputStatus {
        if self.gate.is_finished() {
            InputStatus::EndOfInput
        } else {
            status
        }
    }

    fn handle<O: DataOutput + ?Sized>(
        &mut self,
        ev: GateEvent,
        out: &mut O,
    ) -> Result<InputStatus> {
        match ev {
            GateEvent::Buffer {
                channel,
                subpartition,
                buffer,
            } => {
                let input = self.gate.input_index(channel);
                let mut records = 0u64;
                self.deserializers.get(channel, subpartition).feed_records(
                    buffer.as_slice(),
                    self.owned_records,
                    |record| {
                        records += 1;
                        out.emit_record(input, record)
                    },
                )?;
                self.records_in += records;
                if let Some(c) = &self.counters {
                    IoCounters::add(&c.records_in, records);
                    IoCounters::add(&c.bytes_in, buffer.len() as u64);
                    IoCounters::add(&c.buffers_in, 1);
                }
                // `buffer` drops here and returns to the producer's pool.
            }
            GateEvent::ChannelFinished { channel } => {
                if self.deserializers.has_partial_record(channel) {
                    return Err(FluviaError::Serialization(format!(
                        "input channel {channel} ended in the middle of a record"
                    )));
                }
                // An ended channel holds back neither alignment nor time.
                let action = self.barriers.channel_finished(channel);
                self.apply(action, out)?;
                let (wm, status) = self.valve.channel_finished(channel);
                self.emit_time(wm, status, out)?;
                self.channel_data_ended(channel, out)?;
            }
            GateEvent::Event { channel, event } => self.handle_event(channel, event, out)?,
        }
        Ok(self.unless_finished(InputStatus::MoreAvailable))
    }

    fn handle_event<O: DataOutput + ?Sized>(
        &mut self,
        channel: usize,
        event: Event,
        out: &mut O,
    ) -> Result<()> {
        match event {
            Event::CheckpointBarrier(barrier) => {
                let action = self.barriers.barrier(channel, barrier);
                self.apply(action, out)
            }
            Event::CancelCheckpointMarker { checkpoint_id } => {
                let action = self.barriers.cancel(checkpoint_id);
                self.apply(action, out)
            }
            Event::Watermark(ts) => {
                let wm = self.valve.watermark(channel, ts);
                self.emit_time(wm, None, out)
            }
            Event::WatermarkStatus(s) => {
                let (wm, status) = self.valve.status(channel, s);
                self.emit_time(wm, status, out)
            }
            Event::EndOfData(StopMode::Drain | StopMode::NoDrain) => {
                self.channel_data_ended(channel, out)
            }
            Event::User { kind, payload } => out.user_event(channel, kind, &payload),
            // The gate turns a channel's end into `ChannelFinished`.
            Event::EndOfPartition => Ok(()),
        }
    }

    fn apply<O: DataOutput + ?Sized>(&mut self, action: BarrierAction, out: &mut O) -> Result<()> {
        // Resume before blocking: a newer barrier that aborts the alignment
        // in progress resumes its channels and blocks its own.
        if action.resume_all {
            for c in 0..self.gate.num_channels() {
                self.gate.resume_channel(c);
            }
        }
        for &c in &action.block {
            self.gate.block_channel(c);
        }
        if let Some(id) = action.aborted {
            out.abort_checkpoint(id)?;
        }
        if let Some(b) = action.trigger {
            out.trigger_checkpoint(b)?;
        }
        Ok(())
    }

    fn emit_time<O: DataOutput + ?Sized>(
        &mut self,
        watermark: Option<i64>,
        status: Option<WatermarkStatus>,
        out: &mut O,
    ) -> Result<()> {
        // Idle after the last watermark; active before the next.
        if status == Some(WatermarkStatus::Active) {
            out.emit_watermark_status(WatermarkStatus::Active)?;
        }
        if let Some(wm) = watermark {
            out.emit_watermark(wm)?;
        }
        if status == Some(WatermarkStatus::Idle) {
            out.emit_watermark_status(WatermarkStatus::Idle)?;
        }
        Ok(())
    }

    fn channel_data_ended<O: DataOutput + ?Sized>(
        &mut self,
        channel: usize,
        out: &mut O,
    ) -> Result<()> {
        if std::mem::replace(&mut self.data_ended[channel], true) {
            return Ok(());
        }
        let input = self.gate.input_index(channel);
        let all = (0..self.gate.num_channels())
            .filter(|&c| self.gate.input_index(c) == input)
            .all(|c| self.data_ended[c]);
        if all && !std::mem::replace(&mut self.input_ended[input], true) {
            out.end_input(input)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
