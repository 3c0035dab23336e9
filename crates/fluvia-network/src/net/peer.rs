//! One side of a network exchange between two processes (the
//! `fluvia-net-peer` binary and the network benchmarks use it).
//!
//! A producer serves P partitions of C subpartitions; a consumer reads
//! subpartition j of every producer in consumer j and checks that every
//! record arrives exactly once and in order per channel. A record is
//! `producer u32 | subpartition u32 | sequence u64 | padding`.

use crate::gate::{GateEvent, InputChannel};
use crate::net::environment::{NetworkConfig, NetworkEnvironment, RemoteChannelSpec};
use crate::net::protocol::ResultPartitionId;
use crate::{CancelToken, InputGate, PartitionWriter, RecordDeserializer, ResultPartition, Target};
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

const DATA_SET: u128 = 0x00c0_ffee;

/// What a peer does and with how much data.
#[derive(Debug, Clone)]
pub struct PeerArgs {
    /// `produce` or `consume`.
    pub mode: String,
    pub peer: Option<SocketAddr>,
    pub producers: usize,
    pub consumers: usize,
    pub records: u64,
    pub size: usize,
    pub compression: bool,
}

/// Parses `produce|consume [--peer A] [--producers P] [--consumers C] [--records N] [--size B] [--lz4]`.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<PeerArgs, String> {
    let mut it = args.into_iter();
    let mode = it
        .next()
        .ok_or("usage: fluvia-net-peer produce|consume [options]")?;
    let mut a = PeerArgs {
        mode,
        peer: None,
        producers: 2,
        consumers: 2,
        records: 1_000_000,
        size: 100,
        compression: false,
    };
    while let Some(flag) = it.next() {
        if flag == "--lz4" {
            a.compression = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--peer" => a.peer = Some(value.parse().map_err(|e| bad(&e))?),
            "--producers" => a.producers = value.parse().map_err(|e| bad(&e))?,
            "--consumers" => a.consumers = value.parse().map_err(|e| bad(&e))?,
            "--records" => a.records = value.parse().map_err(|e| bad(&e))?,
            "--size" => a.size = value.parse().map_err(|e| bad(&e))?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if a.size < 16 {
        return Err("--size must be at least 16".into());
    }
    Ok(a)
}

fn pid(producer: usize) -> ResultPartitionId {
    ResultPartitionId {
        data_set: DATA_SET,
        producer_subtask: producer as u32,
        attempt: 0,
    }
}

fn start_env(compression: bool) -> Result<Arc<NetworkEnvironment>, String> {
    NetworkEnvironment::start(
        NetworkConfig {
            compression,
            total_memory: 256 << 20,
            ..NetworkConfig::default()
        },
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .map_err(|e| e.to_string())
}

/// Serves the partitions: prints `ADDR <address>` on stdout, writes every
/// record, then serves until stdin closes.
pub fn produce(a: &PeerArgs) -> Result<(), String> {
    let env = start_env(a.compression)?;
    let mut writers = Vec::new();
    for p in 0..a.producers {
        let partition = Arc::new(ResultPartition::pipelined(
            format!("producer {p}"),
            a.consumers,
            32 * 1024,
        ));
        env.register_partition(pid(p), Arc::clone(&partition));
        let pool = env
            .buffer_pool()
            .create_local_pool(a.consumers * 2 + 8)
            .map_err(|e| e.to_string())?;
        writers.push(PartitionWriter::new(
            partition,
            pool,
            CancelToken::new(),
            None,
        ));
    }
    println!("ADDR {}", env.data_address());
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let (records, size, consumers) = (a.records, a.size, a.consumers);
    let threads: Vec<_> = writers
        .into_iter()
        .enumerate()
        .map(|(p, mut w)| {
            std::thread::spawn(move || -> Result<(), String> {
                let mut rec = vec![0u8; size];
                rec[0..4].copy_from_slice(&(p as u32).to_le_bytes());
                for seq in 0..records {
                    for sp in 0..consumers {
                        rec[4..8].copy_from_slice(&(sp as u32).to_le_bytes());
                        rec[8..16].copy_from_slice(&seq.to_le_bytes());
                        w.emit(Target::One(sp), &rec).map_err(|e| e.to_string())?;
                    }
                }
                w.finish().map_err(|e| e.to_string())
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| "producer thread panicked".to_string())??;
    }
    // Keep serving until the consumer is done and closes our stdin.
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    env.shutdown();
    Ok(())
}

/// Reads and checks everything; prints `OK records=.. bytes=.. seconds=..`.
pub fn consume(a: &PeerArgs) -> Result<(), String> {
    let peer = a.peer.ok_or("consume needs --peer")?;
    let env = start_env(false)?;
    let started = Instant::now();
    let mut threads = Vec::new();
    for c in 0..a.consumers {
        let specs: Vec<RemoteChannelSpec> = (0..a.producers)
            .map(|p| RemoteChannelSpec {
                peer,
                partition: pid(p),
                first_subpartition: c as u32,
                last_subpartition: c as u32,
            })
            .collect();
        let (_pool, channels) = env
            .open_remote_channels(&specs)
            .map_err(|e| e.to_string())?;
        let (records, size) = (a.records, a.size);
        threads.push(std::thread::spawn(move || -> Result<(u64, u64), String> {
            let mut gate = InputGate::single_input(
                channels.iter().map(|ch| Arc::clone(ch) as Arc<dyn InputChannel>),
            );
            let mut next = vec![0u64; channels.len()];
            let mut deser: Vec<RecordDeserializer> = channels.iter().map(|_| RecordDeserializer::new()).collect();
            let cancel = CancelToken::new();
            let mut count = 0u64;
            while let Some(ev) = gate.get_next(&cancel).map_err(|e| e.to_string())? {
                let GateEvent::Buffer { channel, buffer, .. } = ev else { continue };
                deser[channel]
                    .feed(buffer.as_slice(), |r| {
                        let producer = u32::from_le_bytes([r[0], r[1], r[2], r[3]]) as usize;
                        let sp = u32::from_le_bytes([r[4], r[5], r[6], r[7]]) as usize;
                        let mut s = [0u8; 8];
                        s.copy_from_slice(&r[8..16]);
                        let seq = u64::from_le_bytes(s);
                        if producer != channel || sp != c || seq != next[channel] || r.len() != size {
                            return Err(fluvia_core::FluviaError::Execution(format!(
                                "consumer {c} channel {channel}: got producer {producer} subpartition {sp} \
                                 sequence {seq} ({} bytes), expected sequence {}",
                                r.len(),
                                next[channel]
                            )));
                        }
                        next[channel] += 1;
                        count += 1;
                        Ok(())
                    })
                    .map_err(|e| e.to_string())?;
            }
            if next.iter().any(|&n| n != records) {
                return Err(format!("consumer {c} got {next:?} records per channel, expected {records}"));
            }
            Ok((count, gate.bytes_received()))
        }));
    }
    let (mut records, mut bytes) = (0u64, 0u64);
    for t in threads {
        let (r, b) = t
            .join()
            .map_err(|_| "consumer thread panicked".to_string())??;
        records += r;
        bytes += b;
    }
    println!(
        "OK records={records} bytes={bytes} seconds={:.6} connections={}",
        started.elapsed().as_secs_f64(),
        env.connections().num_connections()
    );
    env.shutdown();
    Ok(())
}

/// Runs the mode named in `a`.
pub fn run(a: &PeerArgs) -> Result<(), String> {
    match a.mode.as_str() {
        "produce" => produce(a),
        "consume" => consume(a),
        other => Err(format!("unknown mode '{other}' (produce or consume)")),
    }
}
