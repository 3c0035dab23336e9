//! Two network environments in two processes on loopback: a multi-gigabyte
//! stream with parallelism 2×2 arrives exactly once and in order per channel.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn two_processes_exchange_gigabytes_exactly_once_in_order() {
    let peer = env!("CARGO_BIN_EXE_fluvia-net-peer");
    // 2 producers × 2 subpartitions × 2.6 M records × 256 bytes ≈ 2.7 GB.
    let (records, size) = ("2600000", "256");
    let shape = [
        "--producers",
        "2",
        "--consumers",
        "2",
        "--records",
        records,
        "--size",
        size,
    ];
    let mut producer = Command::new(peer)
        .arg("produce")
        .args(shape)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(producer.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().strip_prefix("ADDR ").unwrap().to_string();
    let out = Command::new(peer)
        .args(["consume", "--peer", &addr])
        .args(shape)
        .output()
        .unwrap();
    drop(producer.stdin.take());
    let status = producer.wait().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(status.success());
    assert!(stdout.contains("OK records=10400000"), "{stdout}");
    let bytes: u64 = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("bytes="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(bytes > 2_600_000_000, "{bytes} bytes");
    assert!(
        stdout.contains("connections=1"),
        "one TCP connection between the two: {stdout}"
    );
}
