//! The producer side of the TCP data plane (Flink's `PartitionRequestQueue`
//! and `CreditBasedSequenceNumberingViewReader`).
//!
//! Each accepted connection gets a reader thread (partition requests,
//! credit, cancellations) and a writer thread. A partition request creates a
//! *reader* over the requested subpartitions with the receiver's initial
//! credit. Readers that can send — data and credit, or an event — wait in a
//! queue; the writer takes the first, sends one buffer with the current
//! backlog, and puts it back at the tail if it can still send: round robin
//! across all channels of the connection. A reader without credit is simply
//! not in the queue, so a stalled consumer costs the others nothing.

use super::protocol::{
    DataType, FrameDecoder, Message, ReceiverId, ResultPartitionId, encode,
    encode_buffer_response_header,
};
use crate::buffer::lock_state;
use crate::partition::{AvailabilityListener, BufferOrEvent, NextKind, ResultPartition};
use crate::view::{SubpartitionView, ViewPoll};
use fluvia_core::{FluviaError, Result};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
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
    pub connections_accepted: AtomicU64,
}

/// Listens for partition requests from other TaskManagers.
pub struct PartitionRequestServer {
    address: SocketAddr,
    shutdown: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<Weak<ServerConnection>>>>,
    metrics: Arc<ServerMetrics>,
}

impl std::fmt::Debug for PartitionRequestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionRequestServer")
            .field("address", &self.address)
            .finish()
    }
}

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
    /// Whether the writer is blocked (only then is it signalled).
    writer_waiting: bool,
}

struct ServerConnection {
    peer: SocketAddr,
    stream: TcpStream,
    partitions: Arc<ResultPartitionManager>,
    config: ServerConfig,
    metrics: Arc<ServerMetrics>,
    state: Mutex<ConnState>,
    wake: Condvar,
    me: Weak<ServerConnection>,
    /// Readers queued plus control messages, readable without the lock.
    work_hint: AtomicU64,
    /// The sending half. Whoever holds it takes elements off the queue and
    /// writes them, so each receiver's buffers go out in sequence order
    /// whichever thread sends them.
    write_side: Mutex<WriteSide>,
}

struct WriteSide {
    w: std::io::BufWriter<TcpStream>,
    header: Vec<u8>,
}

/// Elements a thread other than the writer sends before it leaves the rest
/// to the writer: a producer that found the connection idle sends its own
/// buffer (still in its cache) instead of waking the writer for it, but
/// does not become the connection's writer.
const INLINE_SEND_LIMIT: usize = 8;

/// Tells the connection that a reader's subpartition has data.
struct ReaderListener {
    connection: Weak<ServerConnection>,
    receiver: ReceiverId,
}

impl AvailabilityListener for ReaderListener {
    fn notify_available(&self, _channel: usize) {
        if let Some(c) = self.connection.upgrade() {
            c.enqueue_and_send(self.receiver);
        }
    }
}

/// One element to send, taken under the lock and written outside it.
enum Outgoing {
    Data {
        receiver: ReceiverId,
        subpartition: u32,
        sequence: u32,
        backlog: u32,
        buffer: crate::buffer::Buffer,
    },
    End {
        receiver: ReceiverId,
        subpartition: u32,
        sequence: u32,
    },
    Control(Message),
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
        let write_half = stream
            .try_clone()
            .map_err(|e| FluviaError::io(format!("connection from {peer}"), e))?;
        let write_side = Mutex::new(WriteSide {
            w: std::io::BufWriter::with_capacity(256 * 1024, write_half),
            header: Vec::with_capacity(64),
        });
        let conn = Arc::new_cyclic(|me| ServerConnection {
            write_side,
            peer,
            stream,
            partitions,
            config,
            metrics,
            state: Mutex::new(ConnState::default()),
            wake: Condvar::new(),
            me: me.clone(),
            work_hint: AtomicU64::new(0),
        });
        let (r, w) = (Arc::clone(&conn), Arc::clone(&conn));
        std::thread::Builder::new()
            .name(format!("net-server-read {peer}"))
            .spawn(move || r.read_loop(read_half))
            .map_err(|e| FluviaError::io("starting a network thread", e))?;
        std::thread::Builder::new()
            .name(format!("net-server-write {peer}"))
            .spawn(move || w.write_loop())
            .map_err(|e| FluviaError::io("starting a network thread", e))?;
        Ok(conn)
    }

    fn enqueue(&self, st: &mut ConnState, receiver: ReceiverId) {
        if st.readers.contains_key(&receiver) && st.queued.insert(receiver) {
            st.available.push_back(receiver);
            self.work_hint
                .store(st.available.len() as u64, Ordering::Release);
            if st.writer_waiting {
                self.wake.notify_one();
            }
        }
    }

    /// Queues `receiver` (it has data, or credit) and, if no thread is
    /// sending, sends what is ready on this thread instead of waking the
    /// writer: the data was just written or the credit just read here.
    fn enqueue_and_send(&self, receiver: ReceiverId) {
        let mut side = match self.write_side.try_lock() {
            Ok(side) => side,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                // A sender is at work; it or the writer takes this one.
                let mut st = lock_state(&self.state);
                self.enqueue(&mut st, receiver);
                return;
            }
        };
        {
            let mut st = lock_state(&self.state);
            if st.readers.contains_key(&receiver) && st.queued.insert(receiver) {
                st.available.push_back(receiver);
                self.work_hint.store(
                    (st.available.len() + st.control.len()) as u64,
                    Ordering::Release,
                );
            }
        }
        let more = self.send_ready(&mut side, INLINE_SEND_LIMIT);
        drop(side);
        if more {
            // Left to the writer.
            let st = lock_state(&self.state);
            if st.writer_waiting {
                self.wake.notify_one();
            }
        }
    }

    fn close(&self) {
        lock_state(&self.state).closed = true;
        self.wake.notify_all();
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn send_control(&self, msg: Message) {
        let mut st = lock_state(&self.state);
        st.control.push_back(msg);
        self.work_hint.store(
            (st.available.len() + st.control.len()) as u64,
            Ordering::Release,
        );
        drop(st);
        self.wake.notify_one();
    }

    fn read_loop(self: Arc<Self>, mut stream: TcpStream) {
        // A peer that never says hello must not hold a thread and a socket.
        let _ = stream.set_read_timeout(Some(AUTHENTICATION_TIMEOUT));
        let mut decoder = FrameDecoder::new();
        loop {
            let n = match decoder.read_from(&mut stream, 16 * 1024) {
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
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!("closing data connection from {}: {e}", self.peer);
                        self.send_control(Message::ErrorResponse {
                            receiver: None,
                            message: e.to_string(),
                        });
                        // Give the writer a moment to send the error, then close.
                        std::thread::sleep(std::time::Duration::from_millis(50));
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
                let known = {
                    let mut st = lock_state(&self.state);
                    match st.readers.get_mut(&receiver) {
                        Some(r) => {
                            r.credit = r.credit.saturating_add(credit);
                            true
                        }
                        None => false,
                    }
                };
                if known {
                    self.enqueue_and_send(receiver);
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

    /// Waits until something may be ready to send; false once the
    /// connection is closed.
    fn wait_for_work(&self) -> bool {
        let mut st = lock_state(&self.state);
        loop {
            if st.closed {
                return false;
            }
            if !st.available.is_empty() || !st.control.is_empty() {
                return true;
            }
            drop(st);
            // Data or credit usually arrives within a few yields; a
            // blocked writer costs the waker a system call.
            for _ in 0..crate::gate::SPINS_BEFORE_BLOCKING {
                std::thread::yield_now();
                if self.work_hint.load(Ordering::Acquire) > 0 {
                    break;
                }
            }
            st = lock_state(&self.state);
            if st.available.is_empty() && st.control.is_empty() && !st.closed {
                st.writer_waiting = true;
                st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                st.writer_waiting = false;
            }
        }
    }

    /// Takes the next element to send, if one is ready. Called only with
    /// the write side held, so that elements go out in the order taken.
    fn pop_outgoing(&self) -> Option<Outgoing> {
        let mut st = lock_state(&self.state);
        loop {
            if st.closed {
                return None;
            }
            if let Some(m) = st.control.pop_front() {
                return Some(Outgoing::Control(m));
            }
            let popped = st.available.pop_front();
            self.work_hint.store(
                (st.available.len() + st.control.len()) as u64,
                Ordering::Release,
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
            let out = match item {
                BufferOrEvent::Buffer(buffer) => {
                    reader.credit -= 1;
                    let backlog = reader.view.backlog();
                    let resend = match next {
                        NextKind::Event => true,
                        NextKind::Data => reader.credit > 0,
                        NextKind::Nothing => false,
                    };
                    if resend && st.queued.insert(receiver) {
                        // The thread sending now goes on with it, or
                        // wakes the writer when it stops.
                        st.available.push_back(receiver);
                        self.work_hint.store(
                            (st.available.len() + st.control.len()) as u64,
                            Ordering::Release,
                        );
                    }
                    Outgoing::Data {
                        receiver,
                        subpartition,
                        sequence,
                        backlog: backlog as u32,
                        buffer,
                    }
                }
                BufferOrEvent::Event(_) => {
                    let partition = reader.partition;
                    st.readers.remove(&receiver);
                    tracing::debug!("partition {partition} fully sent to {}", self.peer);
                    Outgoing::End {
                        receiver,
                        subpartition,
                        sequence,
                    }
                }
            };
            return Some(out);
        }
    }

    /// Sends up to `limit` ready elements and flushes; true if more are
    /// ready. A failed write closes the connection.
    fn send_ready(&self, side: &mut WriteSide, limit: usize) -> bool {
        for _ in 0..limit {
            let Some(next) = self.pop_outgoing() else {
                self.flush_side(side);
                return false;
            };
            if let Err(e) = self.write_one(side, next) {
                tracing::debug!("data connection to {} closed: {e}", self.peer);
                self.close();
                return false;
            }
        }
        self.flush_side(side) && self.work_hint.load(Ordering::Acquire) > 0
    }

    fn flush_side(&self, side: &mut WriteSide) -> bool {
        match side.w.flush() {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!("data connection to {} closed: {e}", self.peer);
                self.close();
                false
            }
        }
    }

    fn write_one(&self, side: &mut WriteSide, next: Outgoing) -> std::io::Result<()> {
        let WriteSide { w, header } = side;
        header.clear();
        match next {
            Outgoing::Data {
                receiver,
                subpartition,
                sequence,
                backlog,
                buffer,
            } => {
                let compressed = if self.config.compression {
                    let c = super::compress(buffer.as_slice());
                    (c.len() < buffer.len()).then_some(c)
                } else {
                    None
                };
                let payload: &[u8] = compressed.as_deref().unwrap_or(buffer.as_slice());
                encode_buffer_response_header(
                    header,
                    receiver,
                    subpartition,
                    sequence,
                    backlog,
                    DataType::Data,
                    compressed.is_some(),
                    payload.len(),
                );
                self.metrics.buffers_sent.fetch_add(1, Ordering::Relaxed);
                self.metrics
                    .bytes_sent
                    .fetch_add(payload.len() as u64, Ordering::Relaxed);
                // Control frames buffered before this one go first.
                if !w.buffer().is_empty() {
                    w.flush()?;
                }
                super::write_all_vectored(
                    w.get_mut(),
                    &mut [
                        std::io::IoSlice::new(header),
                        std::io::IoSlice::new(payload),
                    ],
                )
                // `buffer` drops here: the segment returns to its producer.
            }
            Outgoing::End {
                receiver,
                subpartition,
                sequence,
            } => {
                encode_buffer_response_header(
                    header,
                    receiver,
                    subpartition,
                    sequence,
                    0,
                    DataType::EndOfPartition,
                    false,
                    0,
                );
                w.write_all(header)
            }
            Outgoing::Control(m) => {
                encode(&m, header);
                w.write_all(header)
            }
        }
    }

    /// The writer thread: sends whatever no other thread sends.
    fn write_loop(self: Arc<Self>) {
        while self.wait_for_work() {
            let mut side = lock_state(&self.write_side);
            while self.send_ready(&mut side, usize::MAX) {}
        }
        let _ = lock_state(&self.write_side).w.flush();
    }
}
