//! Flink's rescaling rules: what each subtask of a new parallelism restores
//! from the snapshots of all subtasks of the old one.
//!
//! - Keyed state moves as whole key groups: new subtask `i` gets exactly
//!   the groups of `key_group_range_for_operator(max_p, p_new, i)`. Max
//!   parallelism may not change (it is the number of key groups).
//! - Split list state (Flink's `RoundRobinOperatorStateRepartitioner`):
//!   the elements of all old subtasks, in subtask order, are cut into
//!   `p_new` contiguous runs whose sizes differ by at most one, the first
//!   `total % p_new` subtasks taking one more. At unchanged parallelism
//!   every subtask keeps its own elements, as Flink does.
//! - Union list state: every new subtask gets every element.
//!
//! This module works on decoded snapshots; it does not know files,
//! operators' ids or the coordinator that calls it.

use crate::error::{Result, StateError};
use crate::snapshot::{OperatorListState, OperatorStateMode, OperatorStateSnapshot};
use fluvia_core::keygroup::key_group_range_for_operator;
use std::collections::BTreeMap;

/// The snapshot one old subtask wrote, with what it owned.
#[derive(Debug, Clone)]
pub struct SubtaskState {
    /// The inclusive key-group range the subtask owned.
    pub key_group_range: (usize, usize),
    pub max_parallelism: usize,
    pub snapshot: OperatorStateSnapshot,
}

/// What every subtask of parallelism `new_parallelism` restores, index `i`
/// for subtask `i`. `old` holds all old subtasks of `operator` (named in
/// errors) in subtask order.
pub fn redistribute(
    operator: &str,
    old: &[SubtaskState],
    max_parallelism: usize,
    new_parallelism: usize,
) -> Result<Vec<OperatorStateSnapshot>> {
    let err = |reason: String| StateError::Rescale {
        operator: operator.to_string(),
        reason,
    };
    if new_parallelism == 0 || new_parallelism > max_parallelism {
        return Err(err(format!(
            "new parallelism {new_parallelism} must be within 1..={max_parallelism} (the max parallelism)"
        )));
    }
    for (i, s) in old.iter().enumerate() {
        if s.max_parallelism != max_parallelism {
            return Err(err(format!(
                "old subtask {i} has max parallelism {}, the new job {max_parallelism}; max parallelism may not change",
                s.max_parallelism
            )));
        }
    }

    let mut new: Vec<OperatorStateSnapshot> =
        vec![OperatorStateSnapshot::default(); new_parallelism];

    // Keyed state: every key group to the one new subtask that owns it.
    let mut owner_of_group = vec![usize::MAX; max_parallelism];
    for i in 0..new_parallelism {
        let (first, last) = key_group_range_for_operator(max_parallelism, new_parallelism, i);
        for owner in &mut owner_of_group[first..=last] {
            *owner = i;
        }
    }
    let mut seen = BTreeMap::new();
    for (old_index, s) in old.iter().enumerate() {
        let (first, last) = s.key_group_range;
        for (group, bytes) in &s.snapshot.keyed_state {
            if *group < first || *group > last || *group >= max_parallelism {
                return Err(err(format!(
                    "old subtask {old_index} wrote key group {group} outside its range {first}..={last}"
                )));
            }
            if let Some(other) = seen.insert(*group, old_index) {
                return Err(err(format!(
                    "key group {group} written by old subtasks {other} and {old_index}"
                )));
            }
            new[owner_of_group[*group]]
                .keyed_state
                .insert(*group, bytes.clone());
        }
    }

    // Operator list state, by name.
    let mut modes: BTreeMap<&str, OperatorStateMode> = BTreeMap::new();
    for s in old {
        for (name, state) in &s.snapshot.operator_state {
            if let Some(m) = modes.insert(name, state.mode)
                && m != state.mode
            {
                return Err(err(format!(
                    "operator state '{name}' is {m:?} in one subtask and {:?} in another",
                    state.mode
                )));
            }
        }
    }
    for (name, mode) in modes {
        let per_old = old.iter().map(|s| {
            s.snapshot
                .operator_state
                .get(name)
                .map(|st| st.elements.as_slice())
                .unwrap_or_default()
        });
        let assigned: Vec<Vec<Vec<u8>>> = match mode {
            OperatorStateMode::Union => {
                let all: Vec<Vec<u8>> = per_old.flatten().cloned().collect();
                vec![all; new_parallelism]
            }
            OperatorStateMode::Split if old.len() == new_parallelism => {
                per_old.map(<[Vec<u8>]>::to_vec).collect()
            }
            OperatorStateMode::Split => {
                let all: Vec<&Vec<u8>> = per_old.flatten().collect();
                split_evenly(&all, new_parallelism)
            }
        };
        for (target, elements) in new.iter_mut().zip(assigned) {
            target
                .operator_state
                .insert(name.to_string(), OperatorListState { mode, elements });
        }
    }
    Ok(new)
}

/// `p` contiguous runs of `all`, sizes differing by at most one, the first
/// `len % p` runs one longer (Flink's split of `SPLIT_DISTRIBUTE` state).
fn split_evenly(all: &[&Vec<u8>], p: usize) -> Vec<Vec<Vec<u8>>> {
    let base = all.len() / p;
    let remainder = all.len() % p;
    let mut start = 0;
    (0..p)
        .map(|i| {
            let n = base + usize::from(i < remainder);
            let run = all[start..start + n].iter().map(|e| (*e).clone()).collect();
            start += n;
            run
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MAX_P: usize = 128;

    /// Old subtasks of parallelism `p`, each holding every key group of its
    /// range (the bytes say which), `elements_per` split elements and one
    /// union element.
    fn old_state(p: usize, elements_per: usize) -> Vec<SubtaskState> {
        (0..p)
            .map(|i| {
                let range = key_group_range_for_operator(MAX_P, p, i);
                let mut snapshot = OperatorStateSnapshot::default();
                for g in range.0..=range.1 {
                    snapshot
                        .keyed_state
                        .insert(g, (g as u32).to_le_bytes().to_vec());
                }
                snapshot.operator_state.insert(
                    "split".into(),
                    OperatorListState {
                        mode: OperatorStateMode::Split,
                        elements: (0..elements_per)
                            .map(|e| format!("{i}/{e}").into_bytes())
                            .collect(),
                    },
                );
                snapshot.operator_state.insert(
                    "union".into(),
                    OperatorListState {
                        mode: OperatorStateMode::Union,
                        elements: vec![format!("u{i}").into_bytes()],
                    },
                );
                SubtaskState {
                    key_group_range: range,
                    max_parallelism: MAX_P,
                    snapshot,
                }
            })
            .collect()
    }

    fn check(p_old: usize, p_new: usize, elements_per: usize) {
        let old = old_state(p_old, elements_per);
        let new = redistribute("op", &old, MAX_P, p_new).unwrap();
        assert_eq!(new.len(), p_new);
        let mut groups = Vec::new();
        let mut split = Vec::new();
        let union_all: Vec<Vec<u8>> = (0..p_old).map(|i| format!("u{i}").into_bytes()).collect();
        let mut sizes = Vec::new();
        for (i, s) in new.iter().enumerate() {
            let (first, last) = key_group_range_for_operator(MAX_P, p_new, i);
            assert_eq!(
                s.keyed_state.keys().copied().collect::<Vec<_>>(),
                (first..=last).collect::<Vec<_>>(),
                "subtask {i} of {p_new}"
            );
            for (g, b) in &s.keyed_state {
                assert_eq!(b, &(*g as u32).to_le_bytes().to_vec());
            }
            groups.extend(s.keyed_state.keys().copied());
            let el = &s.operator_state["split"].elements;
            sizes.push(el.len());
            split.extend(el.iter().cloned());
            assert_eq!(s.operator_state["union"].elements, union_all);
        }
        groups.sort_unstable();
        assert_eq!(groups, (0..MAX_P).collect::<Vec<_>>());
        let mut expected: Vec<Vec<u8>> = (0..p_old)
            .flat_map(|i| (0..elements_per).map(move |e| format!("{i}/{e}").into_bytes()))
            .collect();
        split.sort();
        expected.sort();
        assert_eq!(split, expected, "every split element exactly once");
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(max - min <= 1, "even split: {sizes:?}");
    }

    #[test]
    fn scale_up_2_to_3() {
        check(2, 3, 4);
    }

    #[test]
    fn scale_down_2_to_1() {
        check(2, 1, 3);
    }

    #[test]
    fn scale_down_3_to_2() {
        check(3, 2, 5);
    }

    #[test]
    fn same_parallelism_keeps_split_state_in_place() {
        let old = old_state(3, 2);
        let new = redistribute("op", &old, MAX_P, 3).unwrap();
        for (o, n) in old.iter().zip(&new) {
            assert_eq!(
                o.snapshot.operator_state["split"],
                n.operator_state["split"]
            );
            assert_eq!(o.snapshot.keyed_state, n.keyed_state);
        }
    }

    #[test]
    fn max_parallelism_may_not_change() {
        let old = old_state(2, 1);
        let e = redistribute("my-op", &old, 256, 2).unwrap_err();
        assert!(
            e.to_string().contains("max parallelism may not change"),
            "{e}"
        );
        assert!(e.to_string().contains("my-op"), "{e}");
    }

    #[test]
    fn overlapping_or_foreign_key_groups_are_errors() {
        let mut old = old_state(2, 1);
        old[0].snapshot.keyed_state.insert(100, vec![]);
        let e = redistribute("op", &old, MAX_P, 2).unwrap_err();
        assert!(e.to_string().contains("key group 100"), "{e}");
        let mut old = old_state(2, 1);
        old[1].key_group_range = (0, 127);
        old[1].snapshot.keyed_state.insert(3, vec![]);
        let e = redistribute("op", &old, MAX_P, 2).unwrap_err();
        assert!(e.to_string().contains("key group 3"), "{e}");
    }
}
