//! Identifiers. Vertex and data-set ids are derived deterministically from the
//! graph (a stable hash), so the same program builds the same ids in every
//! process: that is what lets a TaskManager running the job's own binary find
//! operators by id. Job ids are random per submission.

use serde::{Deserialize, Serialize};
use std::fmt;

/// FNV-1a over bytes, two lanes, giving 128 bits. Not cryptographic: it only
/// has to be stable across processes and builds, which `std`'s hasher is not.
#[derive(Debug, Clone)]
pub struct StableHasher {
    a: u64,
    b: u64,
}

impl Default for StableHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl StableHasher {
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub fn new() -> Self {
        StableHasher {
            a: 0xcbf2_9ce4_8422_2325,
            b: 0x6c62_272e_07bb_0142,
        }
    }

    pub fn write(&mut self, bytes: &[u8]) -> &mut Self {
        for &byte in bytes {
            self.a = (self.a ^ byte as u64).wrapping_mul(Self::PRIME);
            self.b = (self.b ^ (byte as u64).rotate_left(3)).wrapping_mul(Self::PRIME);
        }
        // A separator so that ("ab","c") and ("a","bc") differ.
        self.a = (self.a ^ 0xff).wrapping_mul(Self::PRIME);
        self.b = (self.b ^ 0xfe).wrapping_mul(Self::PRIME);
        self
    }

    pub fn write_str(&mut self, s: &str) -> &mut Self {
        self.write(s.as_bytes())
    }

    pub fn write_u64(&mut self, v: u64) -> &mut Self {
        self.write(&v.to_le_bytes())
    }

    pub fn finish128(&self) -> u128 {
        ((self.a as u128) << 64) | self.b as u128
    }
}

macro_rules! hex_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(into = "String", try_from = "String")]
        pub struct $name(pub u128);

        impl $name {
            pub fn from_hash(h: &StableHasher) -> Self {
                $name(h.finish128())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:032x}", self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:032x})", stringify!($name), self.0)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.to_string()
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                u128::from_str_radix(&s, 16)
                    .map($name)
                    .map_err(|e| format!("invalid {} '{}': {}", stringify!($name), s, e))
            }
        }
    };
}

hex_id!(
    /// A job, 32 hex digits like Flink's JobID.
    JobId
);
hex_id!(
    /// A JobVertex (one operator chain), a stable hash of its chain head.
    JobVertexId
);
hex_id!(
    /// The data produced by one non-chained output of a JobVertex.
    IntermediateDataSetId
);

impl JobId {
    /// A fresh id from the clock and the process id: unique enough for a
    /// cluster without pulling in a random-number crate.
    pub fn generate() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut h = StableHasher::new();
        h.write(&nanos.to_le_bytes())
            .write_u64(std::process::id() as u64);
        JobId(h.finish128())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_json_as_hex() {
        let id = JobVertexId(0xabc);
        let s = serde_json::to_string(&id).unwrap();
        assert_eq!(s, "\"00000000000000000000000000000abc\"");
        let back: JobVertexId = serde_json::from_str(&s).unwrap();
        assert_eq!(back, id);
    }

    #[test]
    fn stable_hash_separates_fields() {
        let mut a = StableHasher::new();
        a.write_str("ab").write_str("c");
        let mut b = StableHasher::new();
        b.write_str("a").write_str("bc");
        assert_ne!(a.finish128(), b.finish128());
    }
}
