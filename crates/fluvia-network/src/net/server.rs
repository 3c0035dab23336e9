//! The producer side of the TCP data plane (Flink's `PartitionRequestQueue`
//! and `CreditBasedSequenceNumberingViewReader`).
//!
//! Each accepted connection gets a reader thread (partition requests,
//! credit, cancellations) and a standby writer. A partition request creates a
//! *reader* over the requested subpartitions with the receiver's initial
//! credit. Readers that can send — data and credit, or an event — wait in a
//! queue; the sender takes the first, stages one buffer with the current
//! backlog, and puts it back at the tail if it can still send: round robin
//! across all channels of the connection. Whatever else is ready is staged
//! too and the batch goes out in one `writev`. A reader without credit is
//! simply not in the queue, so a stalled consumer costs the others nothing.
//!
//! The sender is whichever thread made something sendable (see
//! `ServerConnection::send_ready`); the standby writer only finishes what
//! the kernel could not take at once.

use super::protocol::{
    BufferHeader, DataType, FrameDecoder, Message, ReceiverId, ResultPartitionId, encode,
    encode_buffer_response_header,
};
use crate::availability::AvailabilityListener;
use crate::buffer::lock_state;
use crate::event::{BufferOrEvent, NextKind};
use crate::partition::ResultPartition;
use crate::view::{SubpartitionView, ViewPoll};
use fluvia_core::{FluviaError, Result};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

/// Finds partitions by id (Flink's `ResultPartitionManager`).
#[derive(Debug, Default)]
pub struct ResultPartitionManager {
    partitions: Mutex<HashMap<ResultPartitionId, Arc<ResultPartition>>>,
}

impl ResultPartitionManager {
    pub fn register(&self, id: ResultPartitionId, partition: Arc<ResultPartition>) {
        lock_state(&self.partitions).insert(id, partition);
    }

    pub fn release(&self, id: &ResultPartitionId) {
        lock_state(&self.partitions).remove(id);
    }

    pub fn get(&self, id: &ResultPartitionId) -> Option<Arc<ResultPartition>> {
        lock_state(&self.partitions).get(id).cloned()
    }

    pub fn len(&self) -> usize {
        lock_state(&self.partitions).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Sender settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Compress data buffers with LZ4 (when it makes them smaller).
    pub compression: bool,
    /// The secret a connection must present in its first message.
    pub secret: Option<String>,
}

/// Counters over all connections of a server.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    pub buffers_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    /// Writes (system calls) that carried frames; below `buffers_sent`
    /// when buffers ready together left together.
    pub writes: AtomicU64,
    /// Batches the kernel could not take at once, left to a connection's
    /// standby writer so that the thread that sent them went on.
    pub handoffs: AtomicU64,
    pub connections_accepted: AtomicU64,
}

/// Listens for partition requests from other TaskManagers.
pub struct PartitionRequestServer {
    address: SocketAddr,
    shutdown: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<Weak<ServerConnection>>>>,
    metrics: Arc<ServerMetrics>,
}

debug_fields!(PartitionRequestServer, |this| { address: this.address });

impl PartitionRequestServer {
    /// Binds `bind` (port 0 picks a free one) and starts accepting.
    pub fn start(
        bind: SocketAddr,
        partitions: Arc<ResultPartitionManager>,
        config: ServerConfig,
    ) -> Result<Self> {
        let listener = TcpListener::bind(bind)
            .map_err(|e| FluviaError::io(format!("binding the data port {bind}"), e))?;
        let address = listener
            .local_addr()
            .map_err(|e| FluviaError::io("reading the data port", e))?;
        let shutdown = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<Vec<Weak<ServerConnection>>>> = Arc::default();
        let metrics = Arc::new(ServerMetrics::default());
        let (stop, conns, m) = (
            Arc::clone(&shutdown),
            Arc::clone(&connections),
            Arc::clone(&metrics),
        );
        std::thread::Builder::new()
            .name(format!("net-server {address}"))
            .spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    m.connections_accepted.fetch_add(1, Ordering::Relaxed);
                    match ServerConnection::start(
                        stream,
                        Arc::clone(&partitions),
                        config.clone(),
                        Arc::clone(&m),
                    ) {
                        Ok(c) => lock_state(&conns).push(Arc::downgrade(&c)),
                        Err(e) => tracing::warn!("accepting a data connection failed: {e}"),
                    }
                }
            })
            .map_err(|e| FluviaError::io("starting the data server", e))?;
        Ok(PartitionRequestServer {
            address,
            shutdown,
            connections,
            metrics,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn metrics(&self) -> &ServerMetrics {
        &self.metrics
    }

    /// Stops accepting and closes every connection.
    pub fn shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.address);
        for c in lock_state(&self.connections).drain(..) {
            if let Some(c) = c.upgrade() {
                c.close();
            }
        }
    }
}

impl Drop for PartitionRequestServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Reader {
    partition: ResultPartitionId,
    view: Arc<dyn SubpartitionView>,
    credit: u32,
    sequence: u32,
}

/// How long a new data connection has to present the cluster secret.
pub const AUTHENTICATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Default)]
struct ConnState {
    readers: HashMap<ReceiverId, Reader>,
    available: VecDeque<ReceiverId>,
    queued: HashSet<ReceiverId>,
    control: VecDeque<Message>,
    closed: bool,
    /// The peer presented the right secret.
    authenticated: bool,
}

struct ServerConnection {
    peer: SocketAddr,
    stream: TcpStream,
    partitions: Arc<ResultPartitionManager>,
    config: ServerConfig,
    metrics: Arc<ServerMetrics>,
    state: Mutex<ConnState>,
    me: Weak<ServerConnection>,
    /// Readers queued plus control messages, readable without the lock.
    work_hint: AtomicU64,
    /// The send token: whether a thread is sending (see
    /// [`ServerConnection::send_ready`]).
    sending: AtomicBool,
    /// The token holder's batch.
    batch: Mutex<Batch>,
    /// Hands the token and an unfinished batch to the standby writer.
    handoff: Mutex<Handoff>,
    handoff_ready: Condvar,
}

/// One `writev`'s worth: frame headers back to back, each element with
/// where its header ends, and how much of it the kernel has taken.
#[derive(Default)]
struct Batch {
    headers: Vec<u8>,
    items: Vec<(usize, Payload)>,
    written: usize,
}

#[derive(Default)]
struct Handoff {
    /// The standby writer holds the send token and finishes the batch.
    pending: bool,
    closed: bool,
}

/// How a sender left off.
enum Sent {
    /// Nothing more is ready.
    Done,
    /// The kernel's send buffer is full; the batch is unfinished.
    WouldBlock,
    Closed,
}

/// Tells the connection that a reader's subpartition has data.
struct ReaderListener {
    connection: Weak<ServerConnection>,
    receiver: ReceiverId,
}

impl ReaderListener {
    /// Queues the reader with `enqueue` and wakes the connection's writer,
    /// if the connection is still open.
    fn wake(&self, enqueue: fn(&ServerConnection, &mut ConnState, ReceiverId)) {
        if let Some(c) = self.connection.upgrade() {
            let mut st = lock_state(&c.state);
            enqueue(&c, &mut st, self.receiver);
            drop(st);
            c.send_ready();
        }
    }
}

impl AvailabilityListener for ReaderListener {
    fn notify_available(&self, _channel: usize) {
        self.wake(ServerConnection::enqueue);
    }

    /// A priority event overtakes the other readers' queued buffers too:
    /// its reader goes to the front (Flink's `PartitionRequestQueue`
    /// `notifyPriorityEvent`).
    fn notify_priority(&self, _channel: usize) {
        self.wake(ServerConnection::enqueue_first);
    }
}

/// One element to send, taken under the lock and written outside it.
enum Outgoing {
    /// A BufferResponse; `compressed` is decided when it is written.
    Buffer(BufferHeader, Body),
    Control(Message),
}

/// What follows a BufferResponse's header.
enum Body {
    Data(crate::buffer::Buffer),
    /// An event other than the end.
    Event(crate::Event),
    End,
}

impl ServerConnection {
    fn start(
        stream: TcpStream,
        partitions: Arc<ResultPartitionManager>,
        config: ServerConfig,
        metrics: Arc<ServerMetrics>,
    ) -> Result<Arc<Self>> {
        let peer = stream
            .peer_addr()
            .map_err(|e| FluviaError::io("reading a peer address", e))?;
        let _ = stream.set_nodelay(true);
        let read_half = stream
            .try_clone()
            .map_err(|e| FluviaError::io(format!("connection from {peer}"), e))?;
        let conn = Arc::new_cyclic(|me| ServerConnection {
            peer,
            stream,
            partitions,
            config,
            metrics,
            state: Mutex::new(ConnState::default()),
            me: me.clone(),
            work_hint: AtomicU64::new(0),
            sending: AtomicBool::new(false),
            batch: Mutex::new(Batch::default()),
            handoff: Mutex::new(Handoff::default()),
            handoff_ready: Condvar::new(),
        });
        let (r, w) = (Arc::clone(&conn), Arc::clone(&conn));
        super::spawn_connection_thread(format!("net-server-read {peer}"), move || {
            r.read_loop(read_half)
        })?;
        super::spawn_connection_thread(format!("net-server-write {peer}"), move || {
            w.standby_writer()
        })?;
        Ok(conn)
    }

    fn enqueue(&self, st: &mut ConnState, receiver: ReceiverId) {
        if !st.closed && st.readers.contains_key(&receiver) && st.queued.insert(receiver) {
            st.available.push_back(receiver);
            self.work_hint.store(
                (st.available.len() + st.control.len()) as u64,
                Ordering::SeqCst,
            );
        }
    }

    /// Like [`enqueue`](Self::enqueue), at the front of the queue.
    fn enqueue_first(&self, st: &mut ConnState, receiver: ReceiverId) {
        if st.closed || !st.readers.contains_key(&receiver) {
            return;
        }
        if !st.queued.insert(receiver)
            && let Some(at) = st.available.iter().position(|r| *r == receiver)
        {
            st.available.remove(at);
        }
        st.available.push_front(receiver);
        self.work_hint.store(
            (st.available.len() + st.control.len()) as u64,
            Ordering::SeqCst,
        );
    }

    fn close(&self) {
        lock_state(&self.state).closed = true;
        lock_state(&self.handoff).closed = true;
        self.handoff_ready.notify_all();
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn send_control(&self, msg: Message) {
        let mut st = lock_state(&self.state);
        st.control.push_back(msg);
        self.work_hint.store(
            (st.available.len() + st.control.len()) as u64,
            Ordering::SeqCst,
        );
        drop(st);
        self.send_ready();
    }

    fn read_loop(self: Arc<Self>, stream: TcpStream) {
        // A peer that never says hello must not hold a thread and a socket.
        let _ = stream.set_read_timeout(Some(AUTHENTICATION_TIMEOUT));
        let mut decoder = FrameDecoder::new();
        loop {
            let n = match super::read_socket(&mut decoder, &stream, 16 * 1024) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            if n == 0 {
                self.close();
                return;
            }
            loop {
                match decoder.next_message() {
                    Ok(Some(msg)) => {
                        if !self.handle(msg) {
                            self.close();
                            return;
                        }
                    }
                    Ok(None) => {
                        // Credit and requests of the whole read, sent for at once.
                        self.send_ready();
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("closing data connection from {}: {e}", self.peer);
                        self.send_control(Message::ErrorResponse {
                            receiver: None,
                            message: e.to_string(),
                        });
                        self.close();
                        return;
                    }
                }
            }
        }
    }

    /// Handles one request; false closes the connection.
    fn handle(&self, msg: Message) -> bool {
        if !lock_state(&self.state).authenticated {
            let refusal = match (&msg, &self.config.secret) {
                (Message::Hello { .. }, None) => None,
                (Message::Hello { secret }, Some(expected)) if secret == expected => None,
                (Message::Hello { secret }, Some(_)) if secret.is_empty() => {
                    Some("refused: no cluster secret presented")
                }
                (Message::Hello { .. }, Some(_)) => Some("refused: wrong cluster secret"),
                _ => Some("refused: the connection did not start with a hello"),
            };
            if let Some(reason) = refusal {
                tracing::warn!("data connection from {}: {reason}", self.peer);
                self.send_control(Message::ErrorResponse {
                    receiver: None,
                    message: reason.to_string(),
                });
                std::thread::sleep(std::time::Duration::from_millis(50));
                return false;
            }
            lock_state(&self.state).authenticated = true;
            let _ = self.stream.set_read_timeout(None);
            return true;
        }
        match msg {
            Message::PartitionRequest {
                partition,
                first_subpartition,
                last_subpartition,
                receiver,
                initial_credit,
            } => {
                let Some(p) = self.partitions.get(&partition) else {
                    self.send_control(Message::ErrorResponse {
                        receiver: Some(receiver),
                        message: format!("partition {partition} not found"),
                    });
                    return true;
                };
                let listener = Arc::new(ReaderListener {
                    connection: self.me.clone(),
                    receiver,
                });
                let view = match p.create_view(first_subpartition, last_subpartition, listener, 0) {
                    Ok(v) => v,
                    Err(e) => {
                        self.send_control(Message::ErrorResponse {
                            receiver: Some(receiver),
                            message: format!("partition {partition}: {e}"),
                        });
                        return true;
                    }
                };
                let mut st = lock_state(&self.state);
                st.readers.insert(
                    receiver,
                    Reader {
                        partition,
                        view,
                        credit: initial_credit,
                        sequence: 0,
                    },
                );
                self.enqueue(&mut st, receiver);
                true
            }
            Message::AddCredit { receiver, credit } => {
                let mut st = lock_state(&self.state);
                if let Some(r) = st.readers.get_mut(&receiver) {
                    r.credit = r.credit.saturating_add(credit);
                    self.enqueue(&mut st, receiver);
                }
                true
            }
            Message::CancelPartitionRequest { receiver } => {
                let removed = {
                    let mut st = lock_state(&self.state);
                    st.queued.remove(&receiver);
                    st.readers.remove(&receiver)
                };
                // The consumer stopped reading: a pipelined producer stops
                // holding data for it.
                if let Some(r) = removed {
                    r.view.release();
                }
                true
            }
            Message::ConsumerDemand { receiver } => {
                let view = lock_state(&self.state)
                    .readers
                    .get(&receiver)
                    .map(|r| Arc::clone(&r.view));
                // Outside the lock: the producer's watchers run here.
                if let Some(v) = view {
                    v.demand();
                }
                true
            }
            Message::CloseRequest => false,
            Message::Hello { .. } => true,
            other => {
                self.send_control(Message::ErrorResponse {
                    receiver: None,
                    message: format!("unexpected server-bound message id {}", other.id()),
                });
                false
            }
        }
    }

    /// Takes the next thing ready to send; `None` if nothing is (or the
    /// connection is closed).
    fn next_outgoing(&self) -> Option<Outgoing> {
        let mut st = lock_state(&self.state);
        loop {
            if st.closed {
                self.work_hint.store(0, Ordering::SeqCst);
                return None;
            }
            if let Some(m) = st.control.pop_front() {
                return Some(Outgoing::Control(m));
            }
            let popped = st.available.pop_front();
            self.work_hint.store(
                (st.available.len() + st.control.len()) as u64,
                Ordering::SeqCst,
            );
            let receiver = popped?;
            st.queued.remove(&receiver);
            let Some(reader) = st.readers.get_mut(&receiver) else {
                continue;
            };
            let (item, subpartition, next) = match reader.view.poll(reader.credit) {
                Ok(ViewPoll::Item {
                    item,
                    subpartition,
                    next,
                }) => (item, subpartition, next),
                Ok(ViewPoll::Nothing | ViewPoll::NeedsCredit) => {
                    continue; // wait for data or credit
                }
                Err(e) => {
                    // This reader's partition is unreadable; the
                    // connection's other channels go on.
                    let partition = reader.partition;
                    st.readers.remove(&receiver);
                    return Some(Outgoing::Control(Message::ErrorResponse {
                        receiver: Some(receiver),
                        message: format!("reading partition {partition}: {e}"),
                    }));
                }
            };
            let sequence = reader.sequence;
            reader.sequence = reader.sequence.wrapping_add(1);
            if matches!(item, BufferOrEvent::Buffer(_)) {
                reader.credit -= 1; // events take no credit
            }
            let last = matches!(item, BufferOrEvent::Event(crate::Event::EndOfPartition));
            // More to send for this reader now: an event, or data with credit.
            let resend = !last
                && match next {
                    NextKind::Event => true,
                    NextKind::Data => reader.credit > 0,
                    NextKind::Nothing => false,
                };
            let backlog = if last {
                0
            } else {
                reader.view.backlog() as u32
            };
            let partition = reader.partition;
            if resend {
                self.enqueue(&mut st, receiver);
            }
            let (data_type, body) = match item {
                BufferOrEvent::Buffer(buffer) => (DataType::Data, Body::Data(buffer)),
                BufferOrEvent::Event(event) if !last => {
                    let data_type = if event.is_priority() {
                        DataType::PriorityEvent
                    } else {
                        DataType::Event
                    };
                    (data_type, Body::Event(event))
                }
                BufferOrEvent::Event(_) => {
                    st.readers.remove(&receiver);
                    tracing::debug!("partition {partition} fully sent to {}", self.peer);
                    (DataType::EndOfPartition, Body::End)
                }
            };
            let header = BufferHeader {
                receiver,
                subpartition,
                sequence,
                backlog,
                data_type,
                compressed: false,
            };
            return Some(Outgoing::Buffer(header, body));
        }
    }

    /// Sends everything ready, on the calling thread: the producer that
    /// made a buffer available, the reader thread that received credit, or
    /// the thread with a control message. One thread sends at a time (it
    /// holds the send token); one that finds another sending leaves its
    /// work to it, and the sender looks again after it lets go of the
    /// token, so nothing ready is left behind.
    ///
    /// The calling thread never blocks on the socket: what the kernel
    /// cannot take now goes, with the token, to the connection's standby
    /// writer. A writer thread taking every buffer cost a wake-up per
    /// hand-off, and one more thread competing for the cores.
    fn send_ready(&self) {
        loop {
            if self.sending.swap(true, Ordering::SeqCst) {
                return;
            }
            match self.send_batches(false) {
                Sent::Done => {}
                Sent::WouldBlock => {
                    self.metrics.handoffs.fetch_add(1, Ordering::Relaxed);
                    lock_state(&self.handoff).pending = true;
                    self.handoff_ready.notify_one();
                    return;
                }
                Sent::Closed => return,
            }
            self.sending.store(false, Ordering::SeqCst);
            // Work queued by a thread that found the token taken.
            if self.work_hint.load(Ordering::SeqCst) == 0 {
                return;
            }
        }
    }

    /// The standby writer: finishes a batch the kernel could not take at
    /// once, blocking on the socket as long as it takes, then sends what
    /// else is ready before it lets go of the token.
    fn standby_writer(self: Arc<Self>) {
        loop {
            {
                let mut h = lock_state(&self.handoff);
                while !h.pending && !h.closed {
                    h = self
                        .handoff_ready
                        .wait(h)
                        .unwrap_or_else(|e| e.into_inner());
                }
                if h.closed {
                    return;
                }
                h.pending = false;
            }
            loop {
                match self.send_batches(true) {
                    Sent::Done | Sent::WouldBlock => {}
                    Sent::Closed => return,
                }
                self.sending.store(false, Ordering::SeqCst);
                if self.work_hint.load(Ordering::SeqCst) == 0
                    || self.sending.swap(true, Ordering::SeqCst)
                {
                    break;
                }
            }
        }
    }

    /// With the send token: finishes the unfinished batch, then writes
    /// batches until nothing is ready. Every element ready when the first
    /// is taken goes out with it (up to [`MAX_BATCH`] frames or
    /// [`MAX_BATCH_BYTES`]), so one system call, one TCP push and one
    /// wake-up of the receiving thread carry several buffers; nothing waits
    /// to fill a batch. `block`: wait for room in the socket instead of
    /// returning [`Sent::WouldBlock`].
    fn send_batches(&self, block: bool) -> Sent {
        let mut guard = lock_state(&self.batch);
        let batch = &mut *guard;
        loop {
            if batch.items.is_empty() {
                let Some(first) = self.next_outgoing() else {
                    return Sent::Done;
                };
                batch.headers.clear();
                batch.written = 0;
                let mut bytes = self.stage(first, &mut batch.headers, &mut batch.items);
                while batch.items.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                    match self.next_outgoing() {
                        Some(next) => {
                            bytes += self.stage(next, &mut batch.headers, &mut batch.items)
                        }
                        None => break,
                    }
                }
                self.metrics.writes.fetch_add(1, Ordering::Relaxed);
            }
            match self.write_batch(batch, block) {
                Ok(true) => {
                    // The segments return to their producers here.
                    batch.items.clear();
                }
                Ok(false) => return Sent::WouldBlock,
                Err(e) => {
                    tracing::debug!("data connection to {} closed: {e}", self.peer);
                    batch.items.clear();
                    drop(guard);
                    self.close();
                    return Sent::Closed;
                }
            }
        }
    }

    /// Writes the rest of `batch`; false if the kernel would block first
    /// (only without `block`).
    fn write_batch(&self, batch: &mut Batch, block: bool) -> std::io::Result<bool> {
        let mut slices = Vec::with_capacity(2 * batch.items.len());
        let mut start = 0;
        for (end, payload) in &batch.items {
            slices.push(std::io::IoSlice::new(&batch.headers[start..*end]));
            start = *end;
            if !payload.bytes().is_empty() {
                slices.push(std::io::IoSlice::new(payload.bytes()));
            }
        }
        let mut rest = &mut slices[..];
        std::io::IoSlice::advance_slices(&mut rest, batch.written);
        // A closed peer is an error to return, not a signal to die of.
        let flags = libc::MSG_NOSIGNAL | if block { 0 } else { libc::MSG_DONTWAIT };
        let socket = socket2::SockRef::from(&self.stream);
        while !rest.is_empty() {
            match socket.send_vectored_with_flags(rest, flags) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    batch.written += n;
                    std::io::IoSlice::advance_slices(&mut rest, n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && !block => {
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Encodes `next`'s header into `headers` and adds it to `batch`;
    /// returns the bytes it adds to the write.
    fn stage(
        &self,
        next: Outgoing,
        headers: &mut Vec<u8>,
        batch: &mut Vec<(usize, Payload)>,
    ) -> usize {
        let before = headers.len();
        let payload = match next {
            Outgoing::Buffer(mut header, body) => {
                let payload = match body {
                    Body::Data(buffer) => {
                        let compressed = if self.config.compression {
                            let c = crate::compression::compress(buffer.as_slice());
                            (c.len() < buffer.len()).then_some(c)
                        } else {
                            None
                        };
                        header.compressed = compressed.is_some();
                        match compressed {
                            // The original buffer is recycled at once.
                            Some(c) => Payload::Compressed(c),
                            None => Payload::Buffer(buffer),
                        }
                    }
                    Body::Event(event) => Payload::Compressed(event.to_bytes()),
                    Body::End => Payload::None,
                };
                let len = payload.bytes().len();
                encode_buffer_response_header(headers, &header, len);
                if header.data_type == DataType::Data {
                    self.metrics.buffers_sent.fetch_add(1, Ordering::Relaxed);
                    self.metrics
                        .bytes_sent
                        .fetch_add(len as u64, Ordering::Relaxed);
                }
                payload
            }
            Outgoing::Control(m) => {
                encode(&m, headers);
                Payload::None
            }
        };
        let len = payload.bytes().len();
        batch.push((headers.len(), payload));
        headers.len() - before + len
    }
}

/// Frames one `writev` carries at most (two slices each, far below the
/// kernel's 1024).
const MAX_BATCH: usize = 16;

/// Bytes one `writev` carries at most, so the segments of a batch go back
/// to their producers soon enough.
const MAX_BATCH_BYTES: usize = 256 * 1024;

/// What follows a frame header in a batch.
enum Payload {
    None,
    Buffer(crate::buffer::Buffer),
    /// A compressed buffer, or an event's bytes.
    Compressed(Vec<u8>),
}

impl Payload {
    fn bytes(&self) -> &[u8] {
        match self {
            Payload::None => &[],
            Payload::Buffer(b) => b.as_slice(),
            Payload::Compressed(c) => c,
        }
    }
}
