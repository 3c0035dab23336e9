//! A cursor over a byte slice that reads big-endian integers, shared by the
//! wire protocol's frame decoder and the event decoder.

/// How a decoder reports that its input ended too early, or holds a value
/// it does not know.
pub(crate) trait Truncation {
    type Error;
    /// `needed` more bytes were wanted at offset `at`; `has` were left.
    fn truncated(&self, needed: usize, at: usize, has: usize) -> Self::Error;
    /// `message`, found before offset `at`.
    fn invalid(&self, message: String, at: usize) -> Self::Error;
}

/// An error of a decoder: its message, shown after `prefix: `.
macro_rules! decode_error {
    ($(#[$attr:meta])* $name:ident, $prefix:literal) => {
        $(#[$attr])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name(pub String);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!($prefix, ": {}"), self.0)
            }
        }

        impl std::error::Error for $name {}
    };
}
pub(crate) use decode_error;

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

    /// A byte that picks one of `values` (0 the first); any other byte is
    /// an error, `what` followed by the byte.
    pub(crate) fn one_of<T: Copy>(&mut self, values: &[T], what: &str) -> Result<T, C::Error> {
        let b = self.u8()?;
        values
            .get(usize::from(b))
            .copied()
            .ok_or_else(|| self.context.invalid(format!("{what} {b}"), self.pos))
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
