//! A cursor over a byte slice that reads big-endian integers, shared by the
//! wire protocol's frame decoder and the event decoder.

/// How a decoder reports that its input ended too early.
pub(crate) trait Truncation {
    type Error;
    /// `needed` more bytes were wanted at offset `at`; `has` were left.
    fn truncated(&self, needed: usize, at: usize, has: usize) -> Self::Error;
}

/// Reads fields from `bytes` in order, failing on truncation with the error
/// its context `C` builds.
pub(crate) struct ByteReader<'a, C> {
    pub(crate) bytes: &'a [u8],
    pub(crate) pos: usize,
    pub(crate) context: C,
}

impl<'a, C: Truncation> ByteReader<'a, C> {
    pub(crate) fn new(bytes: &'a [u8], context: C) -> Self {
        ByteReader {
            bytes,
            pos: 0,
            context,
        }
    }

    /// The bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], C::Error> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                self.context
                    .truncated(n, self.pos, self.bytes.len().saturating_sub(self.pos))
            })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], C::Error> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, C::Error> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, C::Error> {
        self.array().map(u32::from_be_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, C::Error> {
        self.array().map(u64::from_be_bytes)
    }

    pub(crate) fn u128(&mut self) -> Result<u128, C::Error> {
        self.array().map(u128::from_be_bytes)
    }
}
