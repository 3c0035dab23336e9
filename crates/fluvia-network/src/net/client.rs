//! The consumer side of the TCP data plane.
//!
//! A [`ClientConnection`] is the one connection from this TaskManager to one
//! remote TaskManager. A reader thread decodes frames and hands each
//! BufferResponse to its [`RemoteInputChannel`] by receiver id; a writer
//! thread sends partition requests and cancellations. Credit is written by
//! the thread that recycled the segment (the writer only when that cannot
//! go at once).
//!
//! Credit-based flow control (Flink's `RemoteInputChannel` and
//! `BufferManager`): a channel starts with `initial_credit` exclusive
//! segments and announces them in its partition request. Every data buffer
//! the sender sends consumes one credit, so the receiver always has a segment
//! to copy it into. Each response carries the sender's backlog; the channel
//! then borrows floating segments from its gate's [`GateBufferPool`] until it
//! holds `backlog + initial_credit`. Segments the consumer recycles become
//! new credit (announced as `AddCredit`, coalesced per channel); surplus
//! floating segments go back to the gate pool, where other channels may wait
//! for them. A slow consumer thus only stops its own channel: the sender has
//! no credit for it and serves the other channels of the connection.

use super::protocol::{
    BufferHeader, DataType, Frame, FrameDecoder, Message, ReceiverId, ResultPartitionId, encode,
};
use crate::availability::AvailabilityListener;
use crate::buffer::{BufferBuilder, BufferRecycler, LocalBufferPool, lock_state};
use crate::event::{BufferOrEvent, Event, push_in_priority_order};
use crate::gate::{InputChannel, Polled};
use fluvia_core::{FluviaError, Result};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

/// Segments for the remote channels of one input gate: their exclusive
/// segments and the floating ones they share. Its size is reserved from the
/// TaskManager's network budget when the gate is created.
#[derive(Debug)]
pub struct GateBufferPool {
    segment_size: usize,
    max: usize,
    _reservation: Arc<LocalBufferPool>,
    state: Mutex<GatePoolState>,
}

#[derive(Debug, Default)]
struct GatePoolState {
    free: Vec<Vec<u8>>,
    allocated: usize,
    waiters: VecDeque<Weak<RemoteInputChannel>>,
}

impl GateBufferPool {
    pub fn new(reservation: Arc<LocalBufferPool>) -> Arc<Self> {
        Arc::new(GateBufferPool {
            segment_size: reservation.segment_size(),
            max: reservation.max_buffers(),
            _reservation: reservation,
            state: Mutex::new(GatePoolState::default()),
        })
    }

    fn take(&self) -> Option<Vec<u8>> {
        let mut st = lock_state(&self.state);
        if let Some(s) = st.free.pop() {
            return Some(s);
        }
        if st.allocated < self.max {
            st.allocated += 1;
            return Some(Vec::with_capacity(self.segment_size));
        }
        None
    }

    fn wait_for_floating(&self, channel: Weak<RemoteInputChannel>) {
        lock_state(&self.state).waiters.push_back(channel);
    }

    /// A segment comes back; a channel waiting for floating buffers gets it.
    fn give_back(&self, mut segment: Vec<u8>) {
        loop {
            let waiter = {
                let mut st = lock_state(&self.state);
                match st.waiters.pop_front() {
                    Some(w) => w,
                    None => {
                        st.free.push(segment);
                        return;
                    }
                }
            };
            if let Some(ch) = waiter.upgrade() {
                match ch.offer_floating(segment) {
                    None => return,
                    Some(back) => segment = back,
                }
            }
        }
    }

    /// Segments allocated and not free: held by channels or their consumers.
    pub fn in_use(&self) -> usize {
        let st = lock_state(&self.state);
        st.allocated - st.free.len()
    }

    pub fn max_buffers(&self) -> usize {
        self.max
    }
}

#[derive(Default)]
struct RemoteState {
    /// Elements with their subpartition (absolute).
    received: VecDeque<(BufferOrEvent, u32)>,
    /// Segments ready to receive into.
    free: Vec<Vec<u8>>,
    /// Segments this channel holds (free, or in a buffer the consumer has).
    owned: usize,
    /// How many of `owned` are floating.
    floating: usize,
    /// `backlog + initial credit` as last reported.
    required: usize,
    unannounced: u32,
    /// Credit the sender holds: announced minus data buffers received.
    sender_credit: u32,
    /// An AddCredit for this channel is queued at the writer.
    announce_scheduled: bool,
    expected_sequence: u32,
    waiting_for_floating: bool,
    error: Option<String>,
    listener: Option<(Arc<dyn AvailabilityListener>, usize)>,
    released: bool,
    finished: bool,
    /// The sender was told the consumer reads (`ConsumerDemand`).
    demanded: bool,
}

/// An input channel fed over TCP.
pub struct RemoteInputChannel {
    receiver: ReceiverId,
    partition: ResultPartitionId,
    first_subpartition: u32,
    last_subpartition: u32,
    peer: SocketAddr,
    initial_credit: usize,
    segment_size: usize,
    pool: Arc<GateBufferPool>,
    connection: Arc<ClientConnection>,
    me: Weak<RemoteInputChannel>,
    state: Mutex<RemoteState>,
}

debug_fields!(RemoteInputChannel, |this| {
    partition: this.partition.to_string(),
    first_subpartition: this.first_subpartition,
    last_subpartition: this.last_subpartition,
    peer: this.peer,
});

impl RemoteInputChannel {
    /// Takes `n` exclusive segments for a channel from the gate's pool. A
    /// gate takes the exclusive segments of all its channels before it opens
    /// any: once a channel is open, data arriving on it may take floating
    /// segments from the same pool.
    pub fn exclusive_segments(pool: &GateBufferPool, n: usize) -> Result<Vec<Vec<u8>>> {
        (0..n)
            .map(|_| {
                pool.take().ok_or_else(|| {
                    FluviaError::Internal(
                        "gate buffer pool smaller than its exclusive buffers".into(),
                    )
                })
            })
            .collect()
    }

    /// Creates the channel over subpartitions `first..=last` with its
    /// exclusive segments and sends the partition request announcing them
    /// as initial credit.
    pub fn request(
        connection: &Arc<ClientConnection>,
        pool: &Arc<GateBufferPool>,
        partition: ResultPartitionId,
        (first, last): (u32, u32),
        exclusive: Vec<Vec<u8>>,
    ) -> Result<Arc<Self>> {
        if first > last {
            return Err(FluviaError::Internal(format!(
                "empty subpartition range {first}..={last} of partition {partition}"
            )));
        }
        let receiver = connection.next_receiver_id();
        let initial_credit = exclusive.len();
        let free = exclusive;
        let channel = Arc::new_cyclic(|me| RemoteInputChannel {
            receiver,
            partition,
            first_subpartition: first,
            last_subpartition: last,
            peer: connection.peer,
            initial_credit,
            segment_size: pool.segment_size,
            pool: Arc::clone(pool),
            connection: Arc::clone(connection),
            me: me.clone(),
            state: Mutex::new(RemoteState {
                owned: initial_credit,
                required: initial_credit,
                sender_credit: initial_credit as u32,
                free,
                ..Default::default()
            }),
        });
        connection.register(&channel)?;
        connection.send(Message::PartitionRequest {
            partition,
            first_subpartition: first,
            last_subpartition: last,
            receiver,
            initial_credit: initial_credit as u32,
        })?;
        Ok(channel)
    }

    pub fn receiver_id(&self) -> ReceiverId {
        self.receiver
    }

    fn describe(&self) -> String {
        format!(
            "partition {} subpartitions {}..={} from {}",
            self.partition, self.first_subpartition, self.last_subpartition, self.peer
        )
    }

    fn notify(&self, st: std::sync::MutexGuard<'_, RemoteState>, was_empty: bool) {
        if was_empty && let Some((l, ch)) = &st.listener {
            let (l, ch) = (Arc::clone(l), *ch);
            drop(st);
            l.notify_available(ch);
        }
    }

    fn notify_priority(&self, st: std::sync::MutexGuard<'_, RemoteState>) {
        if let Some((l, ch)) = &st.listener {
            let (l, ch) = (Arc::clone(l), *ch);
            drop(st);
            l.notify_priority(ch);
        }
    }

    /// A BufferResponse arrived (reader thread).
    fn on_buffer(&self, header: &BufferHeader, payload: &[u8]) -> std::result::Result<(), String> {
        let &BufferHeader {
            subpartition,
            sequence,
            backlog,
            data_type,
            compressed,
            ..
        } = header;
        let mut st = lock_state(&self.state);
        if st.released {
            return Ok(());
        }
        if sequence != st.expected_sequence {
            return Err(format!(
                "buffer sequence gap on {}: expected {}, got {}",
                self.describe(),
                st.expected_sequence,
                sequence
            ));
        }
        st.expected_sequence = st.expected_sequence.wrapping_add(1);
        if subpartition < self.first_subpartition || subpartition > self.last_subpartition {
            return Err(format!(
                "{} sent a buffer of subpartition {subpartition}",
                self.describe()
            ));
        }
        let was_empty = st.received.is_empty();
        let mut priority = false;
        match data_type {
            DataType::Data => {
                st.sender_credit = st.sender_credit.saturating_sub(1);
                let Some(mut segment) = st.free.pop() else {
                    return Err(format!("{} sent a buffer without credit", self.describe()));
                };
                if compressed {
                    crate::compression::decompress_into(payload, &mut segment, self.segment_size)?;
                } else {
                    if payload.len() > self.segment_size {
                        return Err(format!(
                            "buffer of {} bytes exceeds the segment size {}",
                            payload.len(),
                            self.segment_size
                        ));
                    }
                    segment.clear();
                    segment.extend_from_slice(payload);
                }
                let recycler: Arc<dyn BufferRecycler> = match self.me.upgrade() {
                    Some(me) => me,
                    None => return Ok(()),
                };
                let mut builder =
                    BufferBuilder::with_recycler(Vec::new(), self.segment_size, recycler);
                *builder.data_mut() = segment;
                st.received
                    .push_back((BufferOrEvent::Buffer(builder.finish()), subpartition));
            }
            DataType::EndOfPartition => {
                st.finished = true;
                st.received
                    .push_back((BufferOrEvent::Event(Event::EndOfPartition), subpartition));
            }
            DataType::Event | DataType::PriorityEvent => {
                let event = Event::decode(payload)
                    .map_err(|e| format!("{} sent a bad event: {e}", self.describe()))?;
                priority = data_type == DataType::PriorityEvent;
                push_in_priority_order(
                    &mut st.received,
                    (BufferOrEvent::Event(event), subpartition),
                    priority,
                    |(e, _)| e.is_priority(),
                );
            }
        }
        // Borrow floating segments for the announced backlog.
        st.required = backlog as usize + self.initial_credit;
        let mut gained = 0;
        while st.owned < st.required && !st.finished {
            match self.pool.take() {
                Some(seg) => {
                    st.free.push(seg);
                    st.owned += 1;
                    st.floating += 1;
                    gained += 1;
                }
                None => {
                    if !st.waiting_for_floating {
                        st.waiting_for_floating = true;
                        self.pool.wait_for_floating(self.me.clone());
                    }
                    break;
                }
            }
        }
        let announce = self.add_credit(&mut st, gained);
        if priority {
            self.notify_priority(st);
        } else {
            self.notify(st, was_empty);
        }
        if announce {
            self.connection.schedule_credit(self.receiver);
        }
        Ok(())
    }

    /// Adds credit; true if an announcement should be scheduled now. Credit
    /// is announced once the sender is down to half of what the channel
    /// holds, so one AddCredit carries several buffers' worth instead of one
    /// message (and two wake-ups) per recycled buffer.
    fn add_credit(&self, st: &mut RemoteState, n: u32) -> bool {
        st.unannounced += n;
        let low = (st.sender_credit as usize) * 2 <= st.owned;
        if st.unannounced > 0 && !st.announce_scheduled && low {
            st.announce_scheduled = true;
            return true;
        }
        false
    }

    /// The gate pool offers a floating segment; returns it if not needed.
    fn offer_floating(&self, segment: Vec<u8>) -> Option<Vec<u8>> {
        let mut st = lock_state(&self.state);
        st.waiting_for_floating = false;
        if st.released || st.finished || st.owned >= st.required {
            return Some(segment);
        }
        st.free.push(segment);
        st.owned += 1;
        st.floating += 1;
        if st.owned < st.required {
            st.waiting_for_floating = true;
            self.pool.wait_for_floating(self.me.clone());
        }
        let announce = self.add_credit(&mut st, 1);
        drop(st);
        if announce {
            self.connection.schedule_credit(self.receiver);
        }
        None
    }

    /// Credit not yet sent; resets it (the writer sends it now).
    fn take_unannounced(&self) -> u32 {
        let mut st = lock_state(&self.state);
        let n = std::mem::take(&mut st.unannounced);
        st.sender_credit += n;
        st.announce_scheduled = false;
        n
    }

    /// The connection failed or the sender reported an error.
    fn fail(&self, message: String) {
        let mut st = lock_state(&self.state);
        if st.error.is_none() && !st.finished {
            st.error = Some(message);
            self.notify(st, true);
        }
    }

    /// Stops reading: cancels the request and frees the segments.
    pub fn release(&self) {
        let (segments, received) = {
            let mut st = lock_state(&self.state);
            if st.released {
                return;
            }
            st.released = true;
            (
                std::mem::take(&mut st.free),
                std::mem::take(&mut st.received),
            )
        };
        // Received buffers recycle into this channel: dropped unlocked.
        drop(received);
        for s in segments {
            self.pool.give_back(s);
        }
        self.connection.unregister(self.receiver);
    }

    /// Segments the channel holds (free or with its consumer).
    pub fn owned_buffers(&self) -> usize {
        lock_state(&self.state).owned
    }
}

impl BufferRecycler for RemoteInputChannel {
    fn recycle(&self, segment: Vec<u8>) {
        let mut st = lock_state(&self.state);
        if st.released || (st.floating > 0 && st.owned > st.required) || st.finished {
            st.owned = st.owned.saturating_sub(1);
            if st.floating > 0 {
                st.floating -= 1;
            }
            drop(st);
            self.pool.give_back(segment);
            return;
        }
        st.free.push(segment);
        let announce = self.add_credit(&mut st, 1);
        drop(st);
        if announce {
            self.connection.schedule_credit(self.receiver);
        }
    }
}

impl InputChannel for RemoteInputChannel {
    fn set_listener(&self, target: Arc<dyn AvailabilityListener>, channel: usize) {
        let mut st = lock_state(&self.state);
        let readable = !st.received.is_empty() || st.error.is_some();
        st.listener = Some((Arc::clone(&target), channel));
        drop(st);
        if readable {
            target.notify_available(channel);
        }
    }

    fn poll(&self) -> Result<Option<Polled>> {
        let mut st = lock_state(&self.state);
        if let Some(e) = &st.error {
            return Err(FluviaError::Execution(e.clone()));
        }
        let next = st.received.pop_front();
        let more = !st.received.is_empty();
        Ok(next.map(|(item, sp)| Polled {
            item,
            subpartition: sp - self.first_subpartition,
            more,
        }))
    }

    fn failure(&self) -> Option<String> {
        lock_state(&self.state).error.clone()
    }

    fn release(&self) {
        RemoteInputChannel::release(self);
    }

    fn demand(&self) {
        let mut st = lock_state(&self.state);
        if st.demanded || st.released {
            return;
        }
        st.demanded = true;
        drop(st);
        // A closed connection fails the channel through its reader anyway.
        let _ = self.connection.send(Message::ConsumerDemand {
            receiver: self.receiver,
        });
    }
}

impl Drop for RemoteInputChannel {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for s in std::mem::take(&mut st.free) {
            self.pool.give_back(s);
        }
    }
}

struct Outbox {
    messages: VecDeque<Message>,
    /// The rest of a frame another thread began to write: goes first.
    unfinished: Vec<u8>,
    closed: bool,
    /// Whether the writer is blocked (only then is it signalled).
    writer_waiting: bool,
}

/// The one connection from this TaskManager to one remote TaskManager.
pub struct ClientConnection {
    peer: SocketAddr,
    stream: TcpStream,
    channels: Mutex<HashMap<ReceiverId, Weak<RemoteInputChannel>>>,
    outbox: Mutex<Outbox>,
    wake: Condvar,
    /// Held while a whole frame is written, so frames from the writer
    /// thread and credit written by other threads never interleave.
    write_lock: Mutex<()>,
    next_receiver: AtomicU64,
    error: Mutex<Option<String>>,
}

debug_fields!(ClientConnection, |this| { peer: this.peer });

impl ClientConnection {
    /// Connects, presents `secret` and starts the reader and writer threads.
    pub fn connect(peer: SocketAddr, secret: Option<&str>) -> Result<Arc<Self>> {
        let stream = TcpStream::connect(peer).map_err(|e| {
            FluviaError::io(format!("connecting to TaskManager data port {peer}"), e)
        })?;
        let _ = stream.set_nodelay(true);
        let conn = Arc::new(ClientConnection {
            peer,
            stream,
            channels: Mutex::new(HashMap::new()),
            outbox: Mutex::new(Outbox {
                messages: VecDeque::from([Message::Hello {
                    secret: secret.unwrap_or("").to_string(),
                }]),
                unfinished: Vec::new(),
                closed: false,
                writer_waiting: false,
            }),
            wake: Condvar::new(),
            write_lock: Mutex::new(()),
            next_receiver: AtomicU64::new(1),
            error: Mutex::new(None),
        });
        let (r, w) = (Arc::clone(&conn), Arc::clone(&conn));
        let read_half = conn
            .stream
            .try_clone()
            .map_err(|e| FluviaError::io(format!("connection to {peer}"), e))?;
        let write_half = conn
            .stream
            .try_clone()
            .map_err(|e| FluviaError::io(format!("connection to {peer}"), e))?;
        super::spawn_connection_thread(format!("net-client-read {peer}"), move || {
            r.read_loop(read_half)
        })?;
        super::spawn_connection_thread(format!("net-client-write {peer}"), move || {
            w.write_loop(write_half)
        })?;
        Ok(conn)
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    pub fn is_closed(&self) -> bool {
        lock_state(&self.outbox).closed
    }

    fn next_receiver_id(&self) -> ReceiverId {
        // Unique per connection; the high half tells connections apart in logs.
        let n = self.next_receiver.fetch_add(1, Ordering::Relaxed) as u128;
        ((std::process::id() as u128) << 64) | n
    }

    fn register(&self, channel: &Arc<RemoteInputChannel>) -> Result<()> {
        if let Some(e) = lock_state(&self.error).clone() {
            return Err(FluviaError::Execution(e));
        }
        lock_state(&self.channels).insert(channel.receiver, Arc::downgrade(channel));
        Ok(())
    }

    fn unregister(&self, receiver: ReceiverId) {
        if lock_state(&self.channels).remove(&receiver).is_some() {
            let _ = self.send(Message::CancelPartitionRequest { receiver });
        }
    }

    fn send(&self, msg: Message) -> Result<()> {
        let mut out = lock_state(&self.outbox);
        if out.closed {
            return Err(FluviaError::Execution(format!(
                "connection to {} is closed",
                self.peer
            )));
        }
        out.messages.push_back(msg);
        let wake = out.writer_waiting;
        drop(out);
        if wake {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Announces a channel's new credit on the calling thread (the consumer
    /// that recycled a buffer, or the reader thread): one small write that
    /// never blocks, where a hand-off to the writer thread cost a wake-up on
    /// each side. What cannot go at once (the writer is writing, or the
    /// kernel takes only part of the frame) is left to the writer thread.
    fn schedule_credit(&self, receiver: ReceiverId) {
        let Some(ch) = self.channel(receiver) else {
            return;
        };
        let credit = ch.take_unannounced();
        if credit == 0 {
            return;
        }
        let msg = Message::AddCredit { receiver, credit };
        let Ok(guard) = self.write_lock.try_lock() else {
            let _ = self.send(msg);
            return;
        };
        let mut out = lock_state(&self.outbox);
        if out.closed {
            return;
        }
        if !out.messages.is_empty() || !out.unfinished.is_empty() {
            // Frames go in order: this one after those.
            out.messages.push_back(msg);
            if out.writer_waiting {
                self.wake.notify_one();
            }
            return;
        }
        drop(out);
        let mut frame = Vec::with_capacity(64);
        encode(&msg, &mut frame);
        let socket = socket2::SockRef::from(&self.stream);
        let mut sent = 0;
        let failure = loop {
            match socket.send_with_flags(&frame[sent..], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
                Ok(n) => {
                    sent += n;
                    if sent == frame.len() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break None,
                Err(e) => break Some(e),
            }
        };
        if let Some(e) = failure {
            drop(guard);
            self.fail_all(format!("sending to TaskManager {} failed: {e}", self.peer));
            return;
        }
        // Still holding the write lock: no frame can come between the two
        // parts of this one.
        let mut out = lock_state(&self.outbox);
        out.unfinished.extend_from_slice(&frame[sent..]);
        if out.writer_waiting {
            self.wake.notify_one();
        }
        drop(out);
        drop(guard);
    }

    fn channel(&self, receiver: ReceiverId) -> Option<Arc<RemoteInputChannel>> {
        lock_state(&self.channels)
            .get(&receiver)
            .and_then(Weak::upgrade)
    }

    /// Fails every channel and closes the connection.
    fn fail_all(&self, message: String) {
        {
            let mut e = lock_state(&self.error);
            if e.is_none() {
                *e = Some(message.clone());
            }
        }
        lock_state(&self.outbox).closed = true;
        self.wake.notify_all();
        let channels: Vec<_> = lock_state(&self.channels)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for c in channels {
            c.fail(message.clone());
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Closes the connection politely.
    pub fn close(&self) {
        let _ = self.send(Message::CloseRequest);
        let mut out = lock_state(&self.outbox);
        out.closed = true;
        drop(out);
        self.wake.notify_all();
    }

    fn read_loop(self: Arc<Self>, stream: TcpStream) {
        let mut decoder = FrameDecoder::new();
        loop {
            let n = match super::read_socket(&mut decoder, &stream, 64 * 1024) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if !self.is_closed() {
                        self.fail_all(format!(
                            "connection to TaskManager {} failed: {e}",
                            self.peer
                        ));
                    }
                    return;
                }
            };
            if n == 0 {
                if !self.is_closed() {
                    self.fail_all(format!(
                        "connection to TaskManager {} closed by the peer",
                        self.peer
                    ));
                }
                return;
            }
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => {
                        if let Err(e) = self.dispatch(frame) {
                            self.fail_all(e);
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.fail_all(format!("from TaskManager {}: {e}", self.peer));
                        return;
                    }
                }
            }
        }
    }

    fn dispatch(&self, frame: Frame<'_>) -> std::result::Result<(), String> {
        let msg = match frame {
            Frame::Buffer { header, payload } => {
                // Unknown receivers were cancelled: their data is dropped.
                if let Some(ch) = self.channel(header.receiver)
                    && let Err(e) = ch.on_buffer(&header, payload)
                {
                    ch.fail(e);
                    self.unregister(header.receiver);
                }
                return Ok(());
            }
            Frame::Message(m) => m,
        };
        match msg {
            Message::ErrorResponse {
                receiver: Some(r),
                message,
            } => {
                if let Some(ch) = self.channel(r) {
                    ch.fail(format!("TaskManager {} reports: {message}", self.peer));
                }
                Ok(())
            }
            Message::ErrorResponse {
                receiver: None,
                message,
            } => Err(format!("TaskManager {} reports: {message}", self.peer)),
            other => Err(format!(
                "TaskManager {} sent a client-bound message id {}",
                self.peer,
                other.id()
            )),
        }
    }

    fn write_loop(self: Arc<Self>, mut w: TcpStream) {
        let mut frame = Vec::with_capacity(256);
        loop {
            {
                let mut out = lock_state(&self.outbox);
                while out.messages.is_empty() && out.unfinished.is_empty() && !out.closed {
                    out.writer_waiting = true;
                    out = self.wake.wait(out).unwrap_or_else(|e| e.into_inner());
                    out.writer_waiting = false;
                }
            }
            // What to write is taken under the write lock, so the rest of a
            // frame another thread began comes before anything else.
            let guard = lock_state(&self.write_lock);
            let (messages, closed) = {
                let mut out = lock_state(&self.outbox);
                frame.clear();
                frame.append(&mut out.unfinished);
                (std::mem::take(&mut out.messages), out.closed)
            };
            for m in &messages {
                encode(m, &mut frame);
            }
            let result = w.write_all(&frame);
            drop(guard);
            if let Err(e) = result {
                if !closed {
                    self.fail_all(format!("sending to TaskManager {} failed: {e}", self.peer));
                }
                return;
            }
            if closed {
                let _ = self.stream.shutdown(Shutdown::Write);
                return;
            }
        }
    }
}

/// One [`ClientConnection`] per remote TaskManager, created on first use.
#[derive(Debug, Default)]
pub struct ConnectionManager {
    connections: Mutex<HashMap<SocketAddr, Arc<ClientConnection>>>,
    secret: Option<String>,
}

impl ConnectionManager {
    pub fn new(secret: Option<String>) -> Self {
        ConnectionManager {
            connections: Mutex::default(),
            secret,
        }
    }

    /// The connection to `peer`, connecting if there is none (or the last
    /// one failed).
    pub fn connection(&self, peer: SocketAddr) -> Result<Arc<ClientConnection>> {
        let mut map = lock_state(&self.connections);
        if let Some(c) = map.get(&peer)
            && !c.is_closed()
        {
            return Ok(Arc::clone(c));
        }
        let c = ClientConnection::connect(peer, self.secret.as_deref())?;
        map.insert(peer, Arc::clone(&c));
        Ok(c)
    }

    /// Number of open connections (one per remote TaskManager).
    pub fn num_connections(&self) -> usize {
        lock_state(&self.connections)
            .values()
            .filter(|c| !c.is_closed())
            .count()
    }

    pub fn close_all(&self) {
        for (_, c) in lock_state(&self.connections).drain() {
            c.close();
        }
    }
}
