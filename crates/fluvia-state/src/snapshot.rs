//! The snapshot of one operator subtask, as restored and as written to a
//! state file: named operator (non-keyed) list state and keyed state cut
//! by key group.
//!
//! This module owns the file format and nothing else: it does not know
//! where files live ([`crate::storage`]), how key groups move between
//! subtasks ([`crate::redistribute`]) or what the keyed bytes mean
//! ([`crate::keyed`]).
//!
//! # File format (version 1, little-endian)
//!
//! ```text
//! header      magic "FLVSTATE" (8) | version u32 | operator-section length u64 | key-group count u32
//! operators   count u32, then per state: name (u32 len + UTF-8) | mode u8 (0 split, 1 union)
//!             | element count u32 | elements (u32 len + bytes each)
//! index       per key group, ascending: group u32 | offset u64 | length u64
//!             (offset relative to the start of the data section)
//! data        the key groups' bytes, back to back
//! ```
//!
//! The fixed header and the index let a reader that restores a subset of
//! key groups slice out only those (and, with range reads, fetch only
//! those); the other groups' bytes are never looked at.

use crate::codec::{Reader, len_u32, put_bytes32, put_u8, put_u32, put_u64};
use crate::error::{Result, StateError};
use std::collections::BTreeMap;
use std::ops::RangeInclusive;

/// First bytes of every snapshot file.
pub const MAGIC: &[u8; 8] = b"FLVSTATE";
/// The format version [`encode`] writes and [`decode`] reads.
pub const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 8 + 4 + 8 + 4;
const INDEX_ENTRY_LEN: usize = 4 + 8 + 8;

/// How operator list state is handed out when the parallelism changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperatorStateMode {
    /// Flink's `SPLIT_DISTRIBUTE`: the elements of all subtasks are split
    /// evenly among the new subtasks.
    Split,
    /// Flink's `UNION`: every new subtask gets every element.
    Union,
}

/// One named operator list state of one subtask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorListState {
    pub mode: OperatorStateMode,
    /// Each element is opaque to this crate (the operator encodes it).
    pub elements: Vec<Vec<u8>>,
}

/// The state of one operator subtask: operator list state by name, and
/// keyed state by key group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorStateSnapshot {
    pub operator_state: BTreeMap<String, OperatorListState>,
    /// Key group → the bytes of that key group's entries.
    pub keyed_state: BTreeMap<usize, Vec<u8>>,
}

impl OperatorStateSnapshot {
    pub fn is_empty(&self) -> bool {
        self.operator_state.is_empty() && self.keyed_state.is_empty()
    }
}

/// Encodes a snapshot as a state file. Fails only on sizes the format
/// cannot hold (more than 2^32 elements, states or key groups).
pub fn encode(snapshot: &OperatorStateSnapshot) -> Result<Vec<u8>> {
    let mut ops = Vec::new();
    put_u32(
        &mut ops,
        len_u32(snapshot.operator_state.len(), "operator states")?,
    );
    for (name, state) in &snapshot.operator_state {
        put_bytes32(&mut ops, name.as_bytes(), name)?;
        put_u8(
            &mut ops,
            match state.mode {
                OperatorStateMode::Split => 0,
                OperatorStateMode::Union => 1,
            },
        );
        put_u32(&mut ops, len_u32(state.elements.len(), name)?);
        for e in &state.elements {
            put_bytes32(&mut ops, e, name)?;
        }
    }

    let groups = &snapshot.keyed_state;
    let data_len: usize = groups.values().map(Vec::len).sum();
    let mut out =
        Vec::with_capacity(HEADER_LEN + ops.len() + groups.len() * INDEX_ENTRY_LEN + data_len);
    out.extend_from_slice(MAGIC);
    put_u32(&mut out, FORMAT_VERSION);
    put_u64(&mut out, ops.len() as u64);
    put_u32(&mut out, len_u32(groups.len(), "key groups")?);
    out.extend_from_slice(&ops);
    let mut offset = 0u64;
    for (group, bytes) in groups {
        put_u32(&mut out, len_u32(*group, "key group")?);
        put_u64(&mut out, offset);
        put_u64(&mut out, bytes.len() as u64);
        offset += bytes.len() as u64;
    }
    for bytes in groups.values() {
        out.extend_from_slice(bytes);
    }
    Ok(out)
}

/// Decodes a state file read from `source` (named in every error). With
/// `key_groups`, only the key groups in that range are decoded; the index
/// is still checked whole, so a corrupt file is noticed by every reader.
pub fn decode(
    bytes: &[u8],
    source: &str,
    key_groups: Option<RangeInclusive<usize>>,
) -> Result<OperatorStateSnapshot> {
    let mut r = Reader::new(bytes, source);
    let magic = r.bytes(MAGIC.len(), "magic")?;
    if magic != MAGIC {
        return Err(r.corrupt(format!(
            "not a state file: magic {magic:02x?}, expected {MAGIC:02x?}"
        )));
    }
    let version = r.u32("version")?;
    if version != FORMAT_VERSION {
        return Err(StateError::UnsupportedVersion {
            file: source.to_string(),
            version,
            supported: FORMAT_VERSION,
        });
    }
    let ops_len = r.len64("operator section length")?;
    let group_count = r.u32("key-group count")? as usize;
    let ops = r.bytes(ops_len, "operator section")?;
    let operator_state = decode_operator_section(ops, source)?;

    let index_len = group_count
        .checked_mul(INDEX_ENTRY_LEN)
        .filter(|l| *l <= r.remaining())
        .ok_or_else(|| {
            r.corrupt(format!(
                "index of {group_count} key groups exceeds the {} bytes left",
                r.remaining()
            ))
        })?;
    let index = r.bytes(index_len, "key-group index")?;
    let data_start = r.pos();
    let data = &bytes[data_start..];
    let mut ir = Reader::new(index, source);
    let mut keyed_state = BTreeMap::new();
    let mut previous: Option<usize> = None;
    for _ in 0..group_count {
        let group = ir.u32("key group")? as usize;
        let offset = ir.u64("key-group offset")?;
        let len = ir.u64("key-group length")?;
        if previous.is_some_and(|p| p >= group) {
            return Err(r.corrupt(format!(
                "key-group index not ascending: {group} after {previous:?}"
            )));
        }
        previous = Some(group);
        let end = offset
            .checked_add(len)
            .and_then(|e| usize::try_from(e).ok())
            .filter(|e| *e <= data.len())
            .ok_or_else(|| {
                r.corrupt(format!(
                    "key group {group} at offset {offset} length {len} is outside the {} data bytes",
                    data.len()
                ))
            })?;
        if key_groups.as_ref().is_none_or(|kg| kg.contains(&group)) {
            // `end` fits usize and offset <= end, so this cannot overflow.
            let start = end - len as usize;
            keyed_state.insert(group, data[start..end].to_vec());
        }
    }
    Ok(OperatorStateSnapshot {
        operator_state,
        keyed_state,
    })
}

fn decode_operator_section(
    ops: &[u8],
    source: &str,
) -> Result<BTreeMap<String, OperatorListState>> {
    let mut r = Reader::new(ops, source);
    let count = r.u32("operator-state count")?;
    let mut states = BTreeMap::new();
    for _ in 0..count {
        let name = r.str32("operator-state name")?.to_string();
        let mode = match r.u8("operator-state mode")? {
            0 => OperatorStateMode::Split,
            1 => OperatorStateMode::Union,
            m => {
                return Err(r.corrupt(format!("operator state '{name}' has unknown mode {m}")));
            }
        };
        let n = r.u32("element count")?;
        let mut elements = Vec::new();
        for _ in 0..n {
            elements.push(r.bytes32("operator-state element")?.to_vec());
        }
        if states
            .insert(name.clone(), OperatorListState { mode, elements })
            .is_some()
        {
            return Err(r.corrupt(format!("operator state '{name}' appears twice")));
        }
    }
    if r.remaining() != 0 {
        return Err(r.corrupt(format!(
            "{} stray bytes after the operator states",
            r.remaining()
        )));
    }
    Ok(states)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn sample() -> OperatorStateSnapshot {
        OperatorStateSnapshot {
            operator_state: BTreeMap::from([
                (
                    "offsets".to_string(),
                    OperatorListState {
                        mode: OperatorStateMode::Split,
                        elements: vec![vec![1, 2], vec![], vec![3]],
                    },
                ),
                (
                    "config".to_string(),
                    OperatorListState {
                        mode: OperatorStateMode::Union,
                        elements: vec![b"x".to_vec()],
                    },
                ),
            ]),
            keyed_state: (0..10).map(|g| (g * 3, vec![g as u8; g])).collect(),
        }
    }

    #[test]
    fn round_trip() {
        let s = sample();
        let bytes = encode(&s).unwrap();
        assert_eq!(decode(&bytes, "f", None).unwrap(), s);
        let empty = OperatorStateSnapshot::default();
        assert_eq!(decode(&encode(&empty).unwrap(), "f", None).unwrap(), empty);
    }

    #[test]
    fn partial_decode_keeps_only_the_requested_key_groups() {
        let s = sample();
        let bytes = encode(&s).unwrap();
        let part = decode(&bytes, "f", Some(6..=13)).unwrap();
        assert_eq!(part.operator_state, s.operator_state);
        assert_eq!(
            part.keyed_state.keys().copied().collect::<Vec<_>>(),
            vec![6, 9, 12]
        );
        for (g, b) in &part.keyed_state {
            assert_eq!(b, &s.keyed_state[g]);
        }
    }

    #[test]
    fn corruption_is_an_error_naming_the_file() {
        let bytes = encode(&sample()).unwrap();
        let mut bad_magic = bytes.clone();
        bad_magic[0] = b'X';
        let e = decode(&bad_magic, "/ck/chk-1/op-0-0", None).unwrap_err();
        assert!(matches!(e, StateError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("/ck/chk-1/op-0-0"), "{e}");

        let mut future = bytes.clone();
        future[8..12].copy_from_slice(&7u32.to_le_bytes());
        let e = decode(&future, "/ck/f", None).unwrap_err();
        assert!(
            matches!(e, StateError::UnsupportedVersion { version: 7, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("/ck/f"));

        let e = decode(&bytes[..bytes.len() - 1], "/ck/t", None).unwrap_err();
        assert!(
            e.to_string().contains("/ck/t") && e.to_string().contains("outside"),
            "{e}"
        );

        // An index entry pointing past the data.
        let mut oob = bytes.clone();
        let ops_len = u64::from_le_bytes(oob[12..20].try_into().unwrap()) as usize;
        let first_entry = HEADER_LEN + ops_len;
        oob[first_entry + 4..first_entry + 12].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = decode(&oob, "/ck/o", None).unwrap_err();
        assert!(e.to_string().contains("outside"), "{e}");
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes, "random", None);
            let mut with_header = MAGIC.to_vec();
            with_header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
            with_header.extend_from_slice(&bytes);
            let _ = decode(&with_header, "random", Some(0..=5));
        }

        #[test]
        fn truncations_and_flips_are_errors_not_panics(cut in 0usize..400, flip in 0usize..400, bit in 0u8..8) {
            let bytes = encode(&sample()).unwrap();
            let cut = cut.min(bytes.len());
            if cut < bytes.len() {
                let e = decode(&bytes[..cut], "cut", None).unwrap_err();
                prop_assert!(e.to_string().contains("cut"));
            }
            let mut flipped = bytes.clone();
            let at = flip % flipped.len();
            flipped[at] ^= 1 << bit;
            let _ = decode(&flipped, "flipped", None);
        }
    }
}
