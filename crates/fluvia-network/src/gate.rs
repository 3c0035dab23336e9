//! A consumer task's view of its inputs: one [`InputGate`] over all consumed
//! subpartitions (a union of Flink's per-edge gates, each channel tagged with
//! the input it feeds).
//!
//! Channels with data are queued in arrival order, like Flink's
//! `inputChannelsWithData`: a subpartition that goes from empty to non-empty
//! enqueues its channel, and the gate re-enqueues a channel after taking one
//! buffer if more is waiting, so busy channels are served round robin.
//! A channel with a priority event (an unaligned barrier) goes to the front.
//! Local channels take the producer's buffers without copying them.
//!
//! Events other than a channel's end are handed out as
//! [`GateEvent::Event`]; what they mean is the task's input processor's
//! business. It may [`block`](InputGate::block_channel) a channel (an
//! aligned barrier arrived there) and [`resume`](InputGate::resume_channel)
//! it later: a blocked channel is not read, the others go on.

use crate::availability::AvailabilityListener;
use crate::buffer::{Buffer, lock_state};
use crate::cancel::{CANCEL_POLL, CancelToken, SPINS_BEFORE_BLOCKING};
use crate::event::{BufferOrEvent, Event};
use fluvia_core::{FluviaError, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

/// The source of one input channel: a local subpartition read in place, or
/// a remote channel fed over TCP. The gate does not know which.
pub trait InputChannel: Send + Sync + std::fmt::Debug {
    /// Registers the gate; if data is already readable it is told at once.
    fn set_listener(&self, target: Arc<dyn AvailabilityListener>, channel: usize);
    /// Takes the next buffer or event, with whether more is readable now.
    fn poll(&self) -> Result<Option<Polled>>;
    /// Why the channel could not read its partition (missing, unreachable,
    /// corrupt), if it could not: the producer must run again.
    fn failure(&self) -> Option<String> {
        None
    }
    /// The consumer will read no more: the producer is told, so it neither
    /// waits for this channel nor, once all its consumers are gone, keeps
    /// producing.
    fn release(&self) {}
    /// The consumer polls this channel for the first time: a producer that
    /// waits for demand before it starts (a source whose consumer may never
    /// need it) is told, locally or over the network.
    fn demand(&self) {}
}

/// One element taken from a channel.
#[derive(Debug)]
pub struct Polled {
    pub item: BufferOrEvent,
    /// The buffer's subpartition, counted from the first of the channel's
    /// range: records are reassembled per subpartition.
    pub subpartition: u32,
    /// Whether more is readable right now.
    pub more: bool,
}

/// One channel to create: what it reads and the input it feeds.
#[derive(Debug, Clone)]
pub struct InputChannelSpec {
    pub channel: Arc<dyn InputChannel>,
    /// Which logical input of the consuming operator (0, or 1/2 for two inputs).
    pub input_index: usize,
}

#[derive(Default)]
struct NotifierState {
    queue: VecDeque<usize>,
    queued: Vec<bool>,
    /// Whether the consumer is blocked (only then is it signalled).
    waiting: bool,
}

#[derive(Default)]
struct GateNotifier {
    state: Mutex<NotifierState>,
    available: Condvar,
    /// Channels queued, readable without the lock (for the brief spin).
    pending: std::sync::atomic::AtomicUsize,
}

impl AvailabilityListener for GateNotifier {
    fn notify_available(&self, channel: usize) {
        let mut st = lock_state(&self.state);
        if !st.queued[channel] {
            st.queued[channel] = true;
            st.queue.push_back(channel);
            self.pending
                .fetch_add(1, std::sync::atomic::Ordering::Release);
            let wake = st.waiting;
            drop(st);
            if wake {
                self.available.notify_one();
            }
        }
    }

    fn notify_priority(&self, channel: usize) {
        let mut st = lock_state(&self.state);
        if st.queued[channel] {
            if let Some(at) = st.queue.iter().position(|&c| c == channel) {
                st.queue.remove(at);
            }
        } else {
            st.queued[channel] = true;
            self.pending
                .fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        st.queue.push_front(channel);
        let wake = st.waiting;
        drop(st);
        if wake {
            self.available.notify_one();
        }
    }
}

/// What the gate hands to the task.
#[derive(Debug)]
pub enum GateEvent {
    /// A buffer from `channel`, of the `subpartition`-th subpartition of
    /// its range.
    Buffer {
        channel: usize,
        subpartition: u32,
        buffer: Buffer,
    },
    /// An event from `channel` (any but its end).
    Event { channel: usize, event: Event },
    /// `channel` ended; when it was the last of its input, that input ended.
    ChannelFinished { channel: usize },
}

/// All input channels of one consumer subtask.
pub struct InputGate {
    channels: Vec<InputChannelSpec>,
    finished: Vec<bool>,
    num_finished: usize,
    notifier: Arc<GateNotifier>,
    buffers_received: u64,
    bytes_received: u64,
    /// Whether the channels were told the consumer reads (at the first poll).
    demanded: bool,
    /// Channels not read until resumed.
    blocked: Vec<bool>,
    /// Blocked channels that had something readable when last looked at.
    parked: Vec<bool>,
}

debug_fields!(InputGate, |this| { channels: this.channels.len(), finished: this.num_finished });

impl InputGate {
    /// A gate over `channels`, all feeding input 0 (an operator of one input).
    pub fn single_input(channels: impl IntoIterator<Item = Arc<dyn InputChannel>>) -> Self {
        InputGate::new(
            channels
                .into_iter()
                .map(|channel| InputChannelSpec {
                    channel,
                    input_index: 0,
                })
                .collect(),
        )
    }

    pub fn new(channels: Vec<InputChannelSpec>) -> Self {
        let n = channels.len();
        let notifier = Arc::new(GateNotifier::default());
        lock_state(&notifier.state).queued = vec![false; channels.len()];
        for (i, c) in channels.iter().enumerate() {
            let listener: Arc<dyn AvailabilityListener> = notifier.clone();
            c.channel.set_listener(listener, i);
        }
        InputGate {
            finished: vec![false; channels.len()],
            num_finished: 0,
            channels,
            notifier,
            buffers_received: 0,
            bytes_received: 0,
            demanded: false,
            blocked: vec![false; n],
            parked: vec![false; n],
        }
    }

    /// Stops reading `channel` until [`resume_channel`](Self::resume_channel)
    /// (Flink's `blockConsumption`): what arrives there waits, and its
    /// producer, once out of buffers or credit, waits too; the other
    /// channels go on.
    pub fn block_channel(&mut self, channel: usize) {
        self.blocked[channel] = true;
    }

    /// Reads `channel` again; what arrived while it was blocked is readable.
    pub fn resume_channel(&mut self, channel: usize) {
        if std::mem::take(&mut self.blocked[channel]) && std::mem::take(&mut self.parked[channel]) {
            self.notifier.notify_available(channel);
        }
    }

    /// Whether `channel` is blocked.
    pub fn is_blocked(&self, channel: usize) -> bool {
        self.blocked[channel]
    }

    pub fn num_channels(&self) -> usize {
        self.channels.len()
    }

    pub fn input_index(&self, channel: usize) -> usize {
        self.channels[channel].input_index
    }

    pub fn is_finished(&self) -> bool {
        self.num_finished == self.channels.len()
    }

    /// Whether every channel of `input_index` has ended.
    pub fn is_input_finished(&self, input_index: usize) -> bool {
        self.channels
            .iter()
            .zip(&self.finished)
            .all(|(c, &f)| c.input_index != input_index || f)
    }

    pub fn buffers_received(&self) -> u64 {
        self.buffers_received
    }

    pub fn bytes_received(&self) -> u64 {
        self.bytes_received
    }

    /// The next buffer or channel end if one is ready now.
    pub fn poll_next(&mut self) -> Result<Option<GateEvent>> {
        if !self.demanded {
            self.demanded = true;
            for c in &self.channels {
                c.channel.demand();
            }
        }
        loop {
            let channel = {
                let mut st = lock_state(&self.notifier.state);
                let Some(ch) = st.queue.pop_front() else {
                    return Ok(None);
                };
                self.notifier
                    .pending
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                st.queued[ch] = false;
                ch
            };
            if self.finished[channel] {
                continue;
            }
            if self.blocked[channel] {
                self.parked[channel] = true;
                continue;
            }
            let Some(Polled {
                item,
                subpartition,
                more,
            }) = self.channels[channel].channel.poll()?
            else {
                continue; // a stale notification; the data was taken already
            };
            if more {
                self.notifier.notify_available(channel);
            }
            return Ok(Some(match item {
                BufferOrEvent::Buffer(buffer) => {
                    self.buffers_received += 1;
                    self.bytes_received += buffer.len() as u64;
                    GateEvent::Buffer {
                        channel,
                        subpartition,
                        buffer,
                    }
                }
                BufferOrEvent::Event(Event::EndOfPartition) => {
                    self.finished[channel] = true;
                    self.num_finished += 1;
                    GateEvent::ChannelFinished { channel }
                }
                BufferOrEvent::Event(event) => GateEvent::Event { channel, event },
            }));
        }
    }

    /// Stops reading every channel that has not ended (Flink's
    /// `InputGate.close`): pipelined producers drop what they would send
    /// here instead of waiting for it, and stop once nobody reads them.
    /// Blocking partitions keep their data. The gate reads as finished.
    pub fn release(&mut self) {
        for (c, finished) in self.channels.iter().zip(self.finished.iter_mut()) {
            if !*finished {
                c.channel.release();
                *finished = true;
                self.num_finished += 1;
            }
        }
    }

    /// Wakes a thread waiting in [`get_next_until`](Self::get_next_until)
    /// so it checks its condition again.
    pub fn waker(&self) -> Arc<dyn Fn() + Send + Sync> {
        let notifier = Arc::clone(&self.notifier);
        Arc::new(move || {
            let _st = lock_state(&notifier.state);
            notifier.available.notify_all();
        })
    }

    /// Waits for the next buffer or channel end; `None` once all channels ended.
    pub fn get_next(&mut self, cancel: &CancelToken) -> Result<Option<GateEvent>> {
        self.get_next_until(cancel, &|| false)
    }

    /// [`get_next`](Self::get_next), giving up with `None` (the channels
    /// left as they are) once `stop` holds; a [`waker`](Self::waker) call
    /// makes a waiting thread check it at once.
    pub fn get_next_until(
        &mut self,
        cancel: &CancelToken,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<GateEvent>> {
        loop {
            if self.is_finished() || stop() {
                return Ok(None);
            }
            if let Some(ev) = self.poll_next()? {
                return Ok(Some(ev));
            }
            if cancel.is_cancelled() {
                return Err(FluviaError::Cancelled);
            }
            let mut spins = 0;
            while spins < SPINS_BEFORE_BLOCKING
                && self
                    .notifier
                    .pending
                    .load(std::sync::atomic::Ordering::Acquire)
                    == 0
            {
                std::thread::yield_now();
                spins += 1;
            }
            if spins < SPINS_BEFORE_BLOCKING {
                continue;
            }
            let mut st = lock_state(&self.notifier.state);
            // Checked under the lock a waker takes: a wake-up cannot slip in
            // between the check and the wait.
            if st.queue.is_empty() && !stop() {
                st.waiting = true;
                let (mut st, _) = self
                    .notifier
                    .available
                    .wait_timeout(st, CANCEL_POLL)
                    .unwrap_or_else(|e| e.into_inner());
                st.waiting = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_channel::LocalInputChannel;
    use crate::partition::ResultPartition;

    /// A channel over subpartitions `first..=last` of `p`.
    fn local(p: Arc<ResultPartition>, first: u32, last: u32) -> Arc<dyn InputChannel> {
        LocalInputChannel::new(p, first, last).unwrap()
    }

    #[test]
    fn gate_reads_all_channels_and_reports_ends() {
        let p1 = Arc::new(ResultPartition::pipelined("a", 1, 64));
        let p2 = Arc::new(ResultPartition::pipelined("b", 1, 64));
        let mut gate = InputGate::new(vec![
            InputChannelSpec {
                channel: LocalInputChannel::new(Arc::clone(&p1), 0, 0).unwrap(),
                input_index: 1,
            },
            InputChannelSpec {
                channel: LocalInputChannel::new(Arc::clone(&p2), 0, 0).unwrap(),
                input_index: 2,
            },
        ]);
        let cancel = CancelToken::new();
        let writer = std::thread::spawn(move || {
            for i in 0..100u8 {
                p1.add_test_buffer(0, vec![i]);
                p2.add_test_buffer(0, vec![i]);
            }
            p1.finish().unwrap();
            p2.finish().unwrap();
        });
        let mut seen = [Vec::new(), Vec::new()];
        let mut ends = 0;
        while let Some(ev) = gate.get_next(&cancel).unwrap() {
            match ev {
                GateEvent::Buffer {
                    channel, buffer, ..
                } => seen[channel].push(buffer.as_slice()[0]),
                GateEvent::ChannelFinished { .. } => ends += 1,
                GateEvent::Event { event, .. } => panic!("no event was written: {event:?}"),
            }
        }
        writer.join().unwrap();
        let expected: Vec<u8> = (0..100).collect();
        assert_eq!(seen[0], expected);
        assert_eq!(seen[1], expected);
        assert_eq!(ends, 2);
        assert!(gate.is_input_finished(1) && gate.is_input_finished(2));
        assert_eq!(gate.buffers_received(), 200);
    }

    #[test]
    fn cancel_unblocks_a_waiting_gate() {
        let p = Arc::new(ResultPartition::pipelined("a", 1, 64));
        let mut gate = InputGate::single_input([local(p, 0, 0)]);
        let cancel = CancelToken::new();
        let c2 = cancel.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            c2.cancel();
        });
        assert!(matches!(
            gate.get_next(&cancel),
            Err(FluviaError::Cancelled)
        ));
        t.join().unwrap();
    }

    /// A producer that waits for demand starts at its consumer's first
    /// poll, not when the consumer's gate opens the channel; one whose
    /// consumers all release it unread learns so instead, and a cancelled
    /// wait ends.
    #[test]
    fn a_producer_waits_for_the_first_poll_or_the_release() {
        // A partition of two subpartitions, a gate on each, and a thread
        // waiting for demand on it.
        let consumers = || {
            let p = Arc::new(ResultPartition::pipelined("a", 2, 64));
            let gate = |sp| InputGate::single_input([local(Arc::clone(&p), sp, sp)]);
            let waiting = p.consumers_released().unwrap();
            let producer = std::thread::spawn(move || waiting.wait_for_demand(&CancelToken::new()));
            (gate(0), gate(1), producer)
        };
        let (mut first, mut second, producer) = consumers();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!producer.is_finished(), "started before any poll");
        assert!(second.poll_next().unwrap().is_none());
        assert!(producer.join().unwrap().unwrap(), "the poll is the demand");

        let (mut a, mut b, producer) = consumers();
        a.release();
        b.release();
        assert!(!producer.join().unwrap().unwrap(), "released unread");

        let cancel = CancelToken::new();
        cancel.cancel();
        let r = ResultPartition::pipelined("c", 1, 64);
        assert!(matches!(
            r.consumers_released().unwrap().wait_for_demand(&cancel),
            Err(FluviaError::Cancelled)
        ));
        first.release();
    }

    /// A consumer that stops reading releases its channels: the producer,
    /// blocked on a full pool, goes on (what it writes is dropped) instead of
    /// waiting forever, and once both consumers released the partition it
    /// learns nobody reads it; a gate waiting on its own input wakes.
    #[test]
    fn released_channels_free_a_blocked_producer_and_tell_it_nobody_reads() {
        use crate::buffer::NetworkBufferPool;
        use crate::serialization::PartitionWriter;
        let network = NetworkBufferPool::new(64 * 1024, 1024).unwrap();
        let pool = network.create_local_pool(4).unwrap();
        let p = Arc::new(ResultPartition::pipelined("a", 2, 1024));
        let released = p.consumers_released().unwrap();
        let gate = |sp| InputGate::single_input([local(Arc::clone(&p), sp, sp)]);
        let (mut first, mut second) = (gate(0), gate(1));
        // A third party (another task's gate) waits on its own empty input
        // until the partition is released.
        let other = Arc::new(ResultPartition::pipelined("b", 1, 1024));
        let mut waiting = InputGate::single_input([local(Arc::clone(&other), 0, 0)]);
        released.watch(waiting.waker());
        let r = released.clone();
        let waiter = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let got = waiting.get_next_until(&CancelToken::new(), &|| r.all());
            (got.map(|e| e.is_none()), started.elapsed())
        });
        let (w, cancel, kept) = (Arc::clone(&p), CancelToken::new(), Arc::clone(&pool));
        let producer = std::thread::spawn(move || {
            let mut writer = PartitionWriter::new(w, pool, cancel, None);
            // 1,000 buffers' worth into a pool of 4: only possible if the
            // consumers drop them.
            for i in 0..1000u32 {
                writer.emit(crate::Target::All, &[i as u8; 1000]).unwrap();
            }
            writer.finish().unwrap();
        });
        assert!(first.get_next(&CancelToken::new()).unwrap().is_some());
        first.release();
        assert!(first.is_finished());
        assert!(!released.all(), "one consumer still reads");
        second.release();
        producer.join().unwrap();
        assert!(released.all());
        let (ended, waited) = waiter.join().unwrap();
        assert!(ended.unwrap(), "the waiting gate gave up without an event");
        assert!(waited < std::time::Duration::from_secs(5));
        assert_eq!(kept.in_use(), 0, "every buffer went back to the pool");
    }

    fn local_gate(partitions: &[&Arc<ResultPartition>]) -> InputGate {
        InputGate::single_input(partitions.iter().map(|p| local(Arc::clone(p), 0, 0)))
    }

    /// Two pipelined partitions of one subpartition, and a gate over both.
    fn two_partitions_gate() -> (Arc<ResultPartition>, Arc<ResultPartition>, InputGate) {
        let (p0, p1) = (
            Arc::new(ResultPartition::pipelined("a", 1, 64)),
            Arc::new(ResultPartition::pipelined("b", 1, 64)),
        );
        let gate = local_gate(&[&p0, &p1]);
        (p0, p1, gate)
    }

    /// What the gate hands out now, as (channel, first byte or event).
    fn drain_now(gate: &mut InputGate) -> Vec<(usize, Result<u8, Event>)> {
        let mut out = Vec::new();
        while let Some(ev) = gate.poll_next().unwrap() {
            out.push(match ev {
                GateEvent::Buffer {
                    channel, buffer, ..
                } => (channel, Ok(buffer.as_slice()[0])),
                GateEvent::Event { channel, event } => (channel, Err(event)),
                GateEvent::ChannelFinished { channel } => (channel, Err(Event::EndOfPartition)),
            });
        }
        out
    }

    /// A blocked channel is not read while the others go on; what reached
    /// it meanwhile is read, in order, once it is resumed.
    #[test]
    fn a_blocked_channel_waits_while_the_others_go_on() {
        let (p0, p1, mut gate) = two_partitions_gate();
        gate.block_channel(0);
        assert!(gate.is_blocked(0) && !gate.is_blocked(1));
        for i in 0..3u8 {
            p0.add_test_buffer(0, vec![i]);
            p1.add_test_buffer(0, vec![10 + i]);
        }
        assert_eq!(
            drain_now(&mut gate),
            vec![(1, Ok(10)), (1, Ok(11)), (1, Ok(12))]
        );
        gate.resume_channel(0);
        assert_eq!(
            drain_now(&mut gate),
            vec![(0, Ok(0)), (0, Ok(1)), (0, Ok(2))]
        );
    }

    /// A priority event overtakes the buffers queued in its subpartition
    /// and the channels queued before its own; an ordinary event keeps its
    /// place among the buffers.
    #[test]
    fn a_priority_event_overtakes_and_an_ordinary_one_keeps_its_place() {
        let (p0, p1, mut gate) = two_partitions_gate();
        let barrier = Event::CheckpointBarrier(crate::CheckpointBarrier {
            id: 3,
            timestamp: 0,
            options: crate::CheckpointOptions::unaligned(),
        });
        p0.add_test_buffer(0, vec![0]);
        p0.broadcast_event(&Event::Watermark(7)).unwrap();
        p0.add_test_buffer(0, vec![1]);
        p1.add_test_buffer(0, vec![10]);
        p1.broadcast_event(&barrier).unwrap();
        assert_eq!(
            drain_now(&mut gate),
            vec![
                (1, Err(barrier)),
                (0, Ok(0)),
                (1, Ok(10)),
                (0, Err(Event::Watermark(7))),
                (0, Ok(1)),
            ]
        );
        assert_eq!(p0.subpartition(0).backlog(), 0, "events are no backlog");
    }

    /// A channel over several subpartitions hands out an event once, when
    /// every subpartition of its range reached it, after the data before it
    /// in each.
    #[test]
    fn a_range_channel_hands_out_an_event_once_every_subpartition_reached_it() {
        let p = Arc::new(ResultPartition::pipelined("a", 2, 64));
        let mut gate = InputGate::single_input([local(Arc::clone(&p), 0, 1)]);
        p.add_test_buffer(0, vec![0]);
        p.subpartition(0).add_event(Event::Watermark(5)).unwrap();
        p.add_test_buffer(0, vec![1]);
        assert_eq!(
            drain_now(&mut gate),
            vec![(0, Ok(0))],
            "waits for subpartition 1"
        );
        p.add_test_buffer(1, vec![10]);
        p.subpartition(1).add_event(Event::Watermark(5)).unwrap();
        assert_eq!(
            drain_now(&mut gate),
            vec![(0, Ok(10)), (0, Err(Event::Watermark(5))), (0, Ok(1))]
        );
        // Different events at the heads of one range are an error.
        p.subpartition(0).add_event(Event::Watermark(6)).unwrap();
        p.subpartition(1).add_event(Event::Watermark(8)).unwrap();
        let err = loop {
            match gate.poll_next() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("no error"),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("different events"), "{err}");
    }
}
