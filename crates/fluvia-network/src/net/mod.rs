//! The TCP data plane between TaskManagers.
//!
//! - [`protocol`]: frames and messages (Flink's `NettyMessage`).
//! - [`server`]: serves partition requests; one writer per connection sends
//!   buffers of all requested subpartitions round robin, each data buffer
//!   against one credit of its receiver, events for free.
//! - [`client`]: one connection per remote TaskManager, multiplexing every
//!   [`RemoteInputChannel`](client::RemoteInputChannel) by receiver id; a
//!   channel owns exclusive buffers, borrows floating ones from its gate for
//!   the sender's backlog, and returns credit as the consumer recycles them.
//! - [`environment`]: the [`NetworkEnvironment`](environment::NetworkEnvironment)
//!   of one TaskManager: buffer budget, partition registry, server, client.

pub mod client;
pub mod environment;
pub mod peer;
pub mod protocol;
pub mod server;

/// LZ4 block compression with the uncompressed size prepended.
pub(crate) fn compress(payload: &[u8]) -> Vec<u8> {
    lz4_flex::block::compress_prepend_size(payload)
}

/// Decompresses into `out` (cleared first), refusing sizes above `max`.
pub(crate) fn decompress_into(payload: &[u8], out: &mut Vec<u8>, max: usize) -> Result<(), String> {
    if payload.len() < 4 {
        return Err("compressed buffer shorter than its size header".into());
    }
    let size = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
    if size > max {
        return Err(format!(
            "compressed buffer claims {size} bytes, more than a segment ({max})"
        ));
    }
    out.clear();
    out.resize(size, 0);
    let n = lz4_flex::block::decompress_into(&payload[4..], out)
        .map_err(|e| format!("corrupt LZ4 buffer: {e}"))?;
    if n != size {
        return Err(format!(
            "LZ4 buffer decompressed to {n} bytes, header says {size}"
        ));
    }
    Ok(())
}
