//! The TCP data plane between two network environments in one process (the
//! two-process test lives in the runtime crate): delivery, ordering, credit
//! isolation, compression and failures.

#![allow(clippy::unwrap_used)]

use fluvia_network::gate::{GateEvent, InputChannel};
use fluvia_network::net::environment::{NetworkConfig, NetworkEnvironment, RemoteChannelSpec};
use fluvia_network::net::protocol::ResultPartitionId;
use fluvia_network::{
    CancelToken, CheckpointBarrier, CheckpointOptions, Event, InputGate, PartitionWriter,
    RecordDeserializer, ResultPartition, Target,
};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn env(compression: bool) -> Arc<NetworkEnvironment> {
    NetworkEnvironment::start(
        NetworkConfig {
            compression,
            ..NetworkConfig::default()
        },
        loopback(),
    )
    .unwrap()
}

fn pid(i: u32) -> ResultPartitionId {
    ResultPartitionId {
        data_set: 0xfeed,
        producer_subtask: i,
        attempt: 0,
    }
}

/// The channel over subpartition 0 of partition `id` served at `peer`.
fn first_subpartition(peer: SocketAddr, id: ResultPartitionId) -> RemoteChannelSpec {
    RemoteChannelSpec {
        peer,
        partition: id,
        first_subpartition: 0,
        last_subpartition: 0,
    }
}

/// Registers a pipelined partition with `n` subpartitions on `producer` and
/// returns a writer for it.
fn producer_partition(
    producer: &NetworkEnvironment,
    id: ResultPartitionId,
    n: usize,
) -> (PartitionWriter, Arc<fluvia_network::LocalBufferPool>) {
    let partition = Arc::new(ResultPartition::pipelined("p", n, 32 * 1024));
    producer.register_partition(id, Arc::clone(&partition));
    let pool = producer.buffer_pool().create_local_pool(n * 2 + 8).unwrap();
    (
        PartitionWriter::new(partition, Arc::clone(&pool), CancelToken::new(), None),
        pool,
    )
}

/// A gate reading `channels`, all as input 0.
fn gate_over<C: InputChannel + 'static>(channels: &[Arc<C>]) -> InputGate {
    InputGate::single_input(
        channels
            .iter()
            .map(|c| Arc::clone(c) as Arc<dyn InputChannel>),
    )
}

/// Reads `gate` to its end, each channel's buffers through a deserializer
/// of its own, handing `on` every record with its channel; events are
/// passed over.
fn for_each_record(
    gate: &mut InputGate,
    mut on: impl FnMut(usize, &[u8]),
) -> fluvia_core::Result<()> {
    let mut deser: Vec<_> = (0..gate.num_channels())
        .map(|_| RecordDeserializer::new())
        .collect();
    let cancel = CancelToken::new();
    while let Some(ev) = gate.get_next(&cancel)? {
        if let GateEvent::Buffer {
            channel, buffer, ..
        } = ev
        {
            deser[channel].feed(buffer.as_slice(), |r| {
                on(channel, r);
                Ok(())
            })?;
        }
    }
    Ok(())
}

/// The sequence number of a [`record`].
fn seq_of(r: &[u8]) -> u64 {
    u64::from_le_bytes(r[4..12].try_into().unwrap())
}

/// Records are (subpartition, sequence) pairs, 16 bytes plus `pad`.
fn record(sp: u32, seq: u64, pad: usize) -> Vec<u8> {
    let mut r = Vec::with_capacity(12 + pad);
    r.extend_from_slice(&sp.to_le_bytes());
    r.extend_from_slice(&seq.to_le_bytes());
    r.resize(12 + pad, (seq % 251) as u8);
    r
}

fn exchange(compression: bool) {
    let (a, b) = (env(compression), env(false));
    const N: u64 = 200_000;
    let (mut w, _pool) = producer_partition(&a, pid(0), 2);
    let specs: Vec<_> = (0..2)
        .map(|sp| RemoteChannelSpec {
            peer: a.data_address(),
            partition: pid(0),
            first_subpartition: sp,
            last_subpartition: sp,
        })
        .collect();
    let (_gate_pool, channels) = b.open_remote_channels(&specs).unwrap();
    let writer = std::thread::spawn(move || {
        for seq in 0..N {
            for sp in 0..2u32 {
                w.emit(
                    Target::One(sp as usize),
                    &record(sp, seq, (seq % 50) as usize),
                )
                .unwrap();
            }
        }
        w.finish().unwrap();
    });
    let mut gate = gate_over(&channels);
    let mut next = [0u64; 2];
    for_each_record(&mut gate, |channel, r| {
        let sp = u32::from_le_bytes(r[0..4].try_into().unwrap());
        let seq = seq_of(r);
        assert_eq!(sp as usize, channel);
        assert_eq!(seq, next[channel], "in order, exactly once");
        assert_eq!(r.len(), 12 + (seq % 50) as usize);
        next[channel] += 1;
    })
    .unwrap();
    writer.join().unwrap();
    assert_eq!(next, [N, N]);
    assert_eq!(
        b.connections().num_connections(),
        1,
        "both channels share one connection"
    );
}

#[test]
fn records_cross_tcp_exactly_once_and_in_order() {
    exchange(false);
}

/// Buffers queued before their consumer asks are sent, once credit covers
/// them, several per write: fewer writes than buffers, all in order.
#[test]
fn buffers_ready_together_leave_in_one_write() {
    let (a, b) = (env(false), env(false));
    let (mut w, _pool) = producer_partition(&a, pid(3), 1);
    const N: u64 = 8;
    for seq in 0..N {
        // One record fills one 32 KiB buffer.
        w.emit(Target::One(0), &record(0, seq, 32 * 1024 - 16 - 4))
            .unwrap();
    }
    w.finish().unwrap();
    let specs = [first_subpartition(a.data_address(), pid(3))];
    let (_gate_pool, channels) = b.open_remote_channels(&specs).unwrap();
    let mut gate = gate_over(&channels);
    let mut next = 0u64;
    for_each_record(&mut gate, |_, r| {
        assert_eq!(seq_of(r), next, "in order, exactly once");
        next += 1;
    })
    .unwrap();
    assert_eq!(next, N);
    let m = a.server().metrics();
    let buffers = m.buffers_sent.load(std::sync::atomic::Ordering::Relaxed);
    let writes = m.writes.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(buffers, N);
    // The first write carries the two buffers of the initial credit, the
    // next the rest once the backlog's credit arrives (plus the end of the
    // partition): one write per buffer would be nine.
    assert!(writes < buffers, "{writes} writes for {buffers} buffers");
}

#[test]
fn compressed_buffers_arrive_intact() {
    exchange(true);
}

#[test]
fn a_stalled_channel_does_not_slow_the_others_on_its_connection() {
    let (a, b) = (env(false), env(false));
    // Two partitions with one subpartition each, read over one connection.
    let (mut slow_w, slow_pool) = producer_partition(&a, pid(0), 1);
    let (mut fast_w, fast_pool) = producer_partition(&a, pid(1), 1);
    let specs = [0, 1].map(|i| first_subpartition(a.data_address(), pid(i)));
    let (gate_pool, channels) = b.open_remote_channels(&specs).unwrap();
    assert_eq!(b.connections().num_connections(), 1);

    // The slow producer writes until back-pressured (its consumer never reads).
    let slow = std::thread::spawn(move || {
        let mut n = 0u64;
        // Writes block once credit and the pool are exhausted; give up after a while.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && n < 10_000_000 {
            if slow_w.pool().in_use() >= slow_w.pool().max_buffers() {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            slow_w.emit(Target::One(0), &record(0, n, 100)).unwrap();
            n += 1;
        }
        n
    });
    const FAST: u64 = 300_000;
    let fast = std::thread::spawn(move || {
        for seq in 0..FAST {
            fast_w.emit(Target::One(0), &record(0, seq, 100)).unwrap();
        }
        fast_w.finish().unwrap();
    });
    // Read only the fast channel.
    let mut gate = gate_over(&channels[1..]);
    let mut got = 0u64;
    let started = Instant::now();
    for_each_record(&mut gate, |_, _| {
        got += 1;
        assert!(gate_pool.in_use() <= gate_pool.max_buffers());
    })
    .unwrap();
    fast.join().unwrap();
    assert_eq!(
        got, FAST,
        "the fast channel completed while the other is stalled"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let slow_written = slow.join().unwrap();
    // The stalled channel holds only its credit worth of buffers; the
    // producer stopped at its pool limit instead of buffering more.
    assert!(
        channels[0].owned_buffers() <= 2 + 8,
        "{}",
        channels[0].owned_buffers()
    );
    assert_eq!(slow_pool.max_in_use(), slow_pool.max_buffers());
    assert!(fast_pool.max_in_use() <= fast_pool.max_buffers());
    let per_buffer = 32 * 1024 / (4 + 112);
    assert!(
        slow_written <= ((slow_pool.max_buffers() + 10 + 1) * per_buffer) as u64,
        "slow producer wrote {slow_written} records"
    );
}

#[test]
fn a_peer_that_dies_mid_stream_fails_the_channel_naming_it() {
    let (a, b) = (env(false), env(false));
    let (mut w, _pool) = producer_partition(&a, pid(0), 1);
    let (_gp, channels) = b
        .open_remote_channels(&[first_subpartition(a.data_address(), pid(0))])
        .unwrap();
    for seq in 0..1000 {
        w.emit(Target::One(0), &record(0, seq, 10)).unwrap();
    }
    w.flush_all().unwrap();
    let peer = a.data_address();
    let mut gate = gate_over(&channels);
    let cancel = CancelToken::new();
    // Read what was sent, then the producer's TaskManager goes away.
    assert!(matches!(
        gate.get_next(&cancel).unwrap(),
        Some(GateEvent::Buffer { .. })
    ));
    a.shutdown();
    let err = loop {
        match gate.get_next(&cancel) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the channel ended cleanly without its producer"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(err.contains(&peer.to_string()), "{err}");
}

#[test]
fn a_peer_sending_garbage_fails_the_channel_with_a_protocol_error() {
    let listener = std::net::TcpListener::bind(loopback()).unwrap();
    let peer = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(&[0, 0, 0, 9, 1, 2, 3, 4, 0, 0, 0, 0, 0])
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    let b = env(false);
    // The garbage may arrive before or after the channel is registered:
    // either the request or the first read fails, naming the peer.
    let err = match b.open_remote_channels(&[first_subpartition(peer, pid(0))]) {
        Err(e) => e.to_string(),
        Ok((_gp, channels)) => {
            let mut gate = gate_over(&channels);
            gate.get_next(&CancelToken::new()).unwrap_err().to_string()
        }
    };
    assert!(
        err.contains("bad magic") && err.contains(&peer.to_string()),
        "{err}"
    );
    server.join().unwrap();
}

#[test]
fn requesting_an_unknown_partition_is_a_clear_error() {
    let (a, b) = (env(false), env(false));
    let (_gp, channels) = b
        .open_remote_channels(&[first_subpartition(a.data_address(), pid(42))])
        .unwrap();
    let mut gate = gate_over(&channels);
    let err = gate.get_next(&CancelToken::new()).unwrap_err().to_string();
    assert!(err.contains("not found") && err.contains("#42@0"), "{err}");
}

fn env_with_secret(secret: Option<&str>) -> Arc<NetworkEnvironment> {
    NetworkEnvironment::start(
        NetworkConfig {
            secret: secret.map(str::to_string),
            ..NetworkConfig::default()
        },
        loopback(),
    )
    .unwrap()
}

/// Reads one partition of `producer` from `consumer`; returns the records or
/// the error.
fn read_one(
    producer: &NetworkEnvironment,
    consumer: &NetworkEnvironment,
    id: ResultPartitionId,
) -> Result<u64, String> {
    let specs = [first_subpartition(producer.data_address(), id)];
    let (_gp, channels) = consumer
        .open_remote_channels(&specs)
        .map_err(|e| e.to_string())?;
    let mut n = 0;
    for_each_record(&mut gate_over(&channels), |_, _| n += 1).map_err(|e| e.to_string())?;
    Ok(n)
}

#[test]
fn data_connections_must_present_the_cluster_secret() {
    let producer = env_with_secret(Some("right"));
    for (i, _) in [(); 3].iter().enumerate() {
        let (mut w, _pool) = producer_partition(&producer, pid(i as u32), 1);
        for seq in 0..100 {
            w.emit(Target::One(0), &record(0, seq, 4)).unwrap();
        }
        w.finish().unwrap();
    }
    let wrong = read_one(&producer, &env_with_secret(Some("wrong")), pid(0)).unwrap_err();
    assert!(wrong.contains("wrong cluster secret"), "{wrong}");
    let missing = read_one(&producer, &env_with_secret(None), pid(1)).unwrap_err();
    assert!(missing.contains("no cluster secret"), "{missing}");
    assert_eq!(
        read_one(&producer, &env_with_secret(Some("right")), pid(2)).unwrap(),
        100
    );
}

#[test]
fn a_data_connection_that_never_presents_the_secret_is_closed() {
    use std::io::Read;
    let producer = env_with_secret(Some("right"));
    let mut idle = std::net::TcpStream::connect(producer.data_address()).unwrap();
    idle.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 64];
    // The server closes the silent connection: reads end (EOF or reset).
    loop {
        match idle.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_secs(4) && waited < std::time::Duration::from_secs(15),
        "closed after {waited:?}"
    );
    producer.shutdown();
}

/// One pipelined subpartition `id` produced on `producer` and read through
/// a gate on `consumer`.
struct RemoteRead {
    writer: PartitionWriter,
    pool: Arc<fluvia_network::LocalBufferPool>,
    /// What the partition's consumers did (released it, asked for data).
    consumers: fluvia_network::ConsumersReleased,
    gate: InputGate,
    /// The gate's floating buffers: kept as long as the gate reads.
    gate_pool: Arc<fluvia_network::net::client::GateBufferPool>,
}

fn remote_read(
    producer: &NetworkEnvironment,
    consumer: &NetworkEnvironment,
    id: ResultPartitionId,
) -> RemoteRead {
    let (writer, pool) = producer_partition(producer, id, 1);
    let consumers = producer
        .partitions()
        .get(&id)
        .unwrap()
        .consumers_released()
        .unwrap();
    let specs = [first_subpartition(producer.data_address(), id)];
    let (gate_pool, channels) = consumer.open_remote_channels(&specs).unwrap();
    let gate = gate_over(&channels);
    RemoteRead {
        writer,
        pool,
        consumers,
        gate,
        gate_pool,
    }
}

/// A remote consumer that stops reading (its join's build side was empty)
/// releases its channel over the connection: the producer, blocked on its
/// full pool, goes on, and once every consumer released it, it learns
/// that nobody reads it any more.
#[test]
fn a_released_remote_channel_frees_its_producer_and_says_nobody_reads() {
    let (a, b) = (env(false), env(false));
    let RemoteRead {
        writer: mut w,
        pool,
        consumers: released,
        mut gate,
        gate_pool: _gate_pool,
    } = remote_read(&a, &b, pid(7));
    let writer = std::thread::spawn(move || {
        // Far more than the pool and the credit window hold.
        for seq in 0..20_000 {
            w.emit(Target::One(0), &record(0, seq, 1000)).unwrap();
        }
        w.finish().unwrap();
    });
    assert!(matches!(
        gate.get_next(&CancelToken::new()).unwrap(),
        Some(GateEvent::Buffer { .. })
    ));
    assert!(!released.all());
    gate.release();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !writer.is_finished() {
        assert!(Instant::now() < deadline, "the producer is still blocked");
        std::thread::sleep(Duration::from_millis(5));
    }
    writer.join().unwrap();
    assert!(released.all());
    assert_eq!(pool.in_use(), 0, "every buffer went back to the pool");
}

/// A producer that waits for demand (a source whose consumer may never
/// need it) stays idle while its remote consumer's channel is merely open,
/// and starts once the consumer polls: the first poll crosses the
/// connection as a `ConsumerDemand`.
#[test]
fn a_remote_consumers_first_poll_is_the_demand_its_producer_waits_for() {
    let (a, b) = (env(false), env(false));
    let RemoteRead {
        writer: mut w,
        consumers: state,
        mut gate,
        ..
    } = remote_read(&a, &b, pid(8));
    let waiting = state.clone();
    let producer = std::thread::spawn(move || {
        let demanded = waiting.wait_for_demand(&CancelToken::new()).unwrap();
        assert!(demanded, "started without a consumer's demand");
        w.emit(Target::One(0), &record(0, 0, 10)).unwrap();
        w.finish().unwrap();
    });
    // The request (and its credit) reached the producer; no demand yet.
    std::thread::sleep(Duration::from_millis(100));
    assert!(!state.demanded() && !producer.is_finished());
    let deadline = Instant::now() + Duration::from_secs(20);
    match gate
        .get_next_until(&CancelToken::new(), &|| Instant::now() > deadline)
        .unwrap()
    {
        Some(GateEvent::Buffer { .. }) => {}
        other => panic!("expected the producer's buffer, got {other:?}"),
    }
    assert!(state.demanded());
    producer.join().unwrap();
}

#[test]
fn a_producer_goes_on_while_its_consumer_does_not_read_and_nothing_it_sent_is_lost() {
    use fluvia_network::net::protocol::{DataType, Frame, FrameDecoder, Message, encode};
    use std::sync::atomic::Ordering;
    let a = env(false);
    // Far more than the kernel buffers of a loopback connection hold.
    const N: u64 = 1024;
    let partition = Arc::new(ResultPartition::pipelined("p", 1, 32 * 1024));
    a.register_partition(pid(7), Arc::clone(&partition));
    let pool = a.buffer_pool().create_local_pool(N as usize + 2).unwrap();
    let mut w = PartitionWriter::new(partition, pool, CancelToken::new(), None);
    // A consumer that asks for everything at once, then does not read.
    let mut consumer = std::net::TcpStream::connect(a.data_address()).unwrap();
    let mut request = Vec::new();
    encode(
        &Message::Hello {
            secret: String::new(),
        },
        &mut request,
    );
    encode(
        &Message::PartitionRequest {
            partition: pid(7),
            first_subpartition: 0,
            last_subpartition: 0,
            receiver: 1,
            initial_credit: N as u32 + 1,
        },
        &mut request,
    );
    consumer.write_all(&request).unwrap();
    // The request is served before data comes, so the producer's own
    // thread is the one that finds the socket full.
    std::thread::sleep(Duration::from_millis(200));
    // Sending happens on the producer's thread, which must never wait for
    // the socket: the batch the kernel cannot take goes to the standby writer.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let producer = std::thread::spawn(move || {
        for seq in 0..N {
            w.emit(Target::One(0), &record(0, seq, 32 * 1024 - 16 - 4))
                .unwrap();
        }
        w.finish().unwrap();
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the producer waited for a consumer that does not read");
    producer.join().unwrap();
    assert!(a.server().metrics().handoffs.load(Ordering::Relaxed) >= 1);
    // Now read: every buffer, in order, then the end of the partition.
    consumer
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (mut decoder, mut next, mut ended) = (FrameDecoder::new(), 0u64, false);
    let mut d = RecordDeserializer::new();
    while !ended {
        let n = decoder.read_from(&mut consumer, 64 * 1024).unwrap();
        assert!(n > 0, "the connection closed after {next} records");
        while let Some(frame) = decoder.next_frame().unwrap() {
            let Frame::Buffer { header, payload } = frame else {
                panic!("unexpected frame");
            };
            match header.data_type {
                DataType::Data => d
                    .feed(payload, |r| {
                        assert_eq!(seq_of(r), next, "in order, exactly once");
                        next += 1;
                        Ok(())
                    })
                    .unwrap(),
                DataType::EndOfPartition => ended = true,
                DataType::Event | DataType::PriorityEvent => panic!("no event was written"),
            }
        }
    }
    assert_eq!(next, N);
}

/// Events cross the connection without credit: an in-order event (a
/// watermark) arrives after every record written before it and before the
/// ones after it; a priority event (an unaligned barrier) written while
/// buffers wait in the subpartition and in the receiving channel overtakes
/// all of them.
#[test]
fn events_cross_tcp_in_order_and_a_priority_event_overtakes_queued_buffers() {
    let (a, b) = (env(false), env(false));
    let RemoteRead {
        writer: mut w,
        mut gate,
        gate_pool: _gate_pool,
        ..
    } = remote_read(&a, &b, pid(9));
    let barrier = Event::CheckpointBarrier(CheckpointBarrier {
        id: 1,
        timestamp: 5,
        options: CheckpointOptions::unaligned(),
    });
    // 100 records, a watermark, 300 more (about ten full buffers), then the
    // barrier while nothing was read.
    for seq in 0..100 {
        w.emit(Target::One(0), &record(0, seq, 1000)).unwrap();
    }
    w.broadcast_event(&Event::Watermark(100)).unwrap();
    for seq in 100..400 {
        w.emit(Target::One(0), &record(0, seq, 1000)).unwrap();
    }
    w.flush_all().unwrap();
    // Let the credit's worth of buffers reach the receiving channel.
    std::thread::sleep(Duration::from_millis(200));
    w.broadcast_event(&barrier).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let cancel = CancelToken::new();
    match gate.get_next(&cancel).unwrap() {
        Some(GateEvent::Event { event, .. }) => assert_eq!(event, barrier),
        other => panic!("the priority event did not overtake: {other:?}"),
    }
    let writer = std::thread::spawn(move || {
        w.finish().unwrap();
    });
    let (mut next, mut watermark_at) = (0u64, None);
    let mut d = RecordDeserializer::new();
    while let Some(ev) = gate.get_next(&cancel).unwrap() {
        match ev {
            GateEvent::Buffer { buffer, .. } => d
                .feed(buffer.as_slice(), |r| {
                    assert_eq!(seq_of(r), next, "in order, exactly once");
                    next += 1;
                    Ok(())
                })
                .unwrap(),
            GateEvent::Event { event, .. } => {
                assert_eq!(event, Event::Watermark(100));
                assert!(!d.has_partial_record(), "an event splits no record");
                watermark_at = Some(next);
            }
            GateEvent::ChannelFinished { .. } => {}
        }
    }
    writer.join().unwrap();
    assert_eq!(next, 400);
    assert_eq!(watermark_at, Some(100));
}
