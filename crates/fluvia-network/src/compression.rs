//! LZ4 block compression of network buffers and shuffle-file regions: one
//! format for the wire and for sort-merge files, so neither owns the other.

/// LZ4 block compression with the uncompressed size prepended.
pub fn compress(payload: &[u8]) -> Vec<u8> {
    lz4_flex::block::compress_prepend_size(payload)
}

/// Decompresses into `out` (cleared first), refusing sizes above `max`.
pub fn decompress_into(payload: &[u8], out: &mut Vec<u8>, max: usize) -> Result<(), String> {
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
