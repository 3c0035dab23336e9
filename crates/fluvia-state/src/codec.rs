//! Little-endian framing shared by the snapshot file and the per-key-group
//! blobs: a bounds-checked reader that turns every short or malformed input
//! into [`StateError::Corrupt`] naming its source, and the matching writers.

use crate::error::{Result, StateError};

pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A length as u32; lengths beyond 4 GiB are a caller's error, not a
/// silent truncation.
pub(crate) fn len_u32(len: usize, what: &str) -> Result<u32> {
    u32::try_from(len).map_err(|_| StateError::Internal {
        state: what.to_string(),
        reason: format!("length {len} does not fit the file format's 32 bits"),
    })
}

pub(crate) fn put_bytes32(out: &mut Vec<u8>, bytes: &[u8], what: &str) -> Result<()> {
    put_u32(out, len_u32(bytes.len(), what)?);
    out.extend_from_slice(bytes);
    Ok(())
}

/// Overwrites the u64 at `at` (a length placeholder written earlier).
pub(crate) fn patch_u64(out: &mut [u8], at: usize, v: u64) {
    out[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn patch_u32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// A cursor over untrusted bytes.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    source: &'a str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], source: &'a str) -> Self {
        Reader {
            buf,
            pos: 0,
            source,
        }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn corrupt(&self, reason: impl Into<String>) -> StateError {
        StateError::Corrupt {
            file: self.source.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn bytes(&mut self, len: usize, what: &str) -> Result<&'a [u8]> {
        if len > self.remaining() {
            return Err(self.corrupt(format!(
                "truncated: {what} needs {len} bytes at offset {}, {} left",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N, what)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 length that must fit in what is left of the input.
    pub(crate) fn len64(&mut self, what: &str) -> Result<usize> {
        let len = self.u64(what)?;
        match usize::try_from(len) {
            Ok(l) if l <= self.remaining() => Ok(l),
            _ => Err(self.corrupt(format!(
                "{what} {len} exceeds the {} bytes left at offset {}",
                self.remaining(),
                self.pos
            ))),
        }
    }

    /// A u32-length-prefixed byte string.
    pub(crate) fn bytes32(&mut self, what: &str) -> Result<&'a [u8]> {
        let len = self.u32(what)? as usize;
        self.bytes(len, what)
    }

    pub(crate) fn str32(&mut self, what: &str) -> Result<&'a str> {
        let b = self.bytes32(what)?;
        std::str::from_utf8(b).map_err(|e| self.corrupt(format!("{what} is not UTF-8: {e}")))
    }
}
