//! The whole path a keyed operator's state takes through a checkpoint and
//! a rescaled restore: backend snapshot, state file in checkpoint storage,
//! partial decode, redistribution, restore into backends of the new
//! parallelism.
#![allow(clippy::unwrap_used)]

use fluvia_core::keygroup::{KeyHash, key_group_for_hash, key_group_range_for_operator};
use fluvia_state::keyed::{ReducingStateDescriptor, ValueStateDescriptor};
use fluvia_state::redistribute::{SubtaskState, redistribute};
use fluvia_state::snapshot::{self, OperatorListState, OperatorStateMode};
use fluvia_state::storage::state_file;
use fluvia_state::{CheckpointStorage, KeyedStateBackend, OperatorStateSnapshot, StateError};
use proptest::prelude::*;
use std::collections::BTreeMap;

const MAX_P: usize = 128;
const JOB: &str = "00112233445566778899aabbccddeeff";

#[test]
fn checkpoint_at_parallelism_2_restores_at_3() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::for_directory(tmp.path().to_str().unwrap()).unwrap();
    let sum_desc = ReducingStateDescriptor::new("sum", |a: u64, b: u64| a + b);
    let mut expected = BTreeMap::new();

    // Two old subtasks count words routed to them by key group.
    let mut old = Vec::new();
    for i in 0..2 {
        let range = key_group_range_for_operator(MAX_P, 2, i);
        let mut b: KeyedStateBackend<String> = KeyedStateBackend::new(range, MAX_P).unwrap();
        let sum = b.reducing_state(&sum_desc).unwrap();
        for n in 0..1000u64 {
            let word = format!("w{}", n % 97);
            let g = key_group_for_hash(word.key_hash(), MAX_P);
            if g < range.0 || g > range.1 {
                continue;
            }
            b.set_current_key(word.clone(), word.key_hash()).unwrap();
            sum.add(&mut b, 1).unwrap();
            *expected.entry(word).or_insert(0u64) += 1;
        }
        let keyed = b.snapshot();
        // The asynchronous phase on another thread, then the file.
        let keyed_state = std::thread::spawn(move || keyed.encode().unwrap())
            .join()
            .unwrap();
        let snap = OperatorStateSnapshot {
            operator_state: BTreeMap::from([(
                "offsets".to_string(),
                OperatorListState {
                    mode: OperatorStateMode::Split,
                    elements: vec![vec![i as u8]],
                },
            )]),
            keyed_state,
        };
        let path = storage
            .put(
                &state_file(JOB, 1, "counter", i, 0),
                snapshot::encode(&snap).unwrap(),
            )
            .unwrap();
        old.push((range, path));
    }

    // Restore: read every old file, redistribute to 3, restore each.
    let old_states: Vec<SubtaskState> = old
        .iter()
        .map(|(range, path)| SubtaskState {
            key_group_range: *range,
            max_parallelism: MAX_P,
            snapshot: snapshot::decode(&storage.get(path).unwrap(), path, None).unwrap(),
        })
        .collect();
    let new = redistribute("counter", &old_states, MAX_P, 3).unwrap();
    let mut restored = BTreeMap::new();
    let mut offsets = Vec::new();
    for (i, snap) in new.iter().enumerate() {
        let range = key_group_range_for_operator(MAX_P, 3, i);
        let mut b: KeyedStateBackend<String> = KeyedStateBackend::new(range, MAX_P).unwrap();
        b.restore(snap.keyed_state.iter().map(|(g, b)| (*g, b.as_slice())))
            .unwrap();
        let sum = b.reducing_state(&sum_desc).unwrap();
        for word in expected.keys() {
            let g = key_group_for_hash(word.key_hash(), MAX_P);
            if g >= range.0 && g <= range.1 {
                b.set_current_key(word.clone(), word.key_hash()).unwrap();
                restored.insert(word.clone(), sum.get(&mut b).unwrap().unwrap());
            }
        }
        offsets.extend(snap.operator_state["offsets"].elements.iter().cloned());
    }
    assert_eq!(restored, expected);
    offsets.sort();
    assert_eq!(offsets, vec![vec![0], vec![1]]);

    // A subtask restoring a subset decodes only its key groups.
    let (range, path) = &old[0];
    let part = snapshot::decode(
        &storage.get(path).unwrap(),
        path,
        Some(range.0..=range.0 + 9),
    )
    .unwrap();
    assert!(
        part.keyed_state
            .keys()
            .all(|g| (range.0..=range.0 + 9).contains(g))
    );
}

#[test]
fn a_corrupt_file_in_storage_names_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::for_directory(tmp.path().to_str().unwrap()).unwrap();
    let path = storage
        .put(
            &state_file(JOB, 3, "op", 0, 0),
            b"FLVSTATE\x01\0\0\0garbage".to_vec(),
        )
        .unwrap();
    let e = snapshot::decode(&storage.get(&path).unwrap(), &path, None).unwrap_err();
    assert!(matches!(e, StateError::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains(&path), "{e}");
}

proptest! {
    /// Restoring random bytes as a key group is an error, never a panic,
    /// before and after the state is registered.
    #[test]
    fn restoring_random_key_group_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut b: KeyedStateBackend<i64> = KeyedStateBackend::new((0, MAX_P - 1), MAX_P).unwrap();
        let _ = b.restore([(5, bytes.as_slice())]);
        let _ = b.value_state(&ValueStateDescriptor::<String>::new("v"));
        let _ = b.restore([(6, bytes.as_slice())]);
    }

    /// Flipping a byte of a real key group never panics on restore.
    #[test]
    fn flipped_key_group_bytes_never_panic(at in 0usize..10_000, bit in 0u8..8) {
        let mut b: KeyedStateBackend<i64> = KeyedStateBackend::new((0, MAX_P - 1), MAX_P).unwrap();
        let v = b.value_state(&ValueStateDescriptor::<String>::new("v")).unwrap();
        for k in 0..200i64 {
            b.set_current_key(k, k.key_hash()).unwrap();
            v.update(&mut b, format!("value {k}")).unwrap();
        }
        let groups = b.snapshot().encode().unwrap();
        let (g, bytes) = groups.iter().next().unwrap();
        let mut bytes = bytes.clone();
        let at = at % bytes.len();
        bytes[at] ^= 1 << bit;
        let mut r: KeyedStateBackend<i64> = KeyedStateBackend::new((0, MAX_P - 1), MAX_P).unwrap();
        if r.restore([(*g, bytes.as_slice())]).is_ok() {
            let _ = r.value_state(&ValueStateDescriptor::<String>::new("v"));
        }
    }
}
