//! The heap keyed state backend: every state kind, key scoping,
//! registration rules, snapshot/restore across key-group ranges,
//! copy-on-write snapshots and TTL.
#![allow(clippy::unwrap_used)]

use fluvia_core::keygroup::{KeyHash, key_group_for_hash, key_group_range_for_operator};
use fluvia_state::keyed::*;
use fluvia_state::{KeyedStateBackend, StateError};
use std::collections::BTreeMap;
use std::time::Duration;

const MAX_P: usize = 128;

fn backend() -> KeyedStateBackend<String> {
    KeyedStateBackend::new((0, MAX_P - 1), MAX_P).unwrap()
}

fn set(b: &mut KeyedStateBackend<String>, key: &str) {
    b.set_current_key(key.to_string(), key.key_hash()).unwrap();
}

/// Registers the `u64` value state "v".
fn value_v(b: &mut KeyedStateBackend<String>) -> ValueState<u64> {
    b.value_state(&ValueStateDescriptor::<u64>::new("v"))
        .unwrap()
}

struct Avg;
impl AggregateFunction<i64, (i64, i64), f64> for Avg {
    fn create_accumulator(&self) -> (i64, i64) {
        (0, 0)
    }
    fn add(&self, v: i64, acc: (i64, i64)) -> (i64, i64) {
        (acc.0 + v, acc.1 + 1)
    }
    fn get_result(&self, acc: &(i64, i64)) -> f64 {
        acc.0 as f64 / acc.1 as f64
    }
    fn merge(&self, a: (i64, i64), b: (i64, i64)) -> (i64, i64) {
        (a.0 + b.0, a.1 + b.1)
    }
}

#[test]
fn every_state_kind_is_scoped_to_the_current_key() {
    let mut b = backend();
    let value = value_v(&mut b);
    let list = b
        .list_state(&ListStateDescriptor::<String>::new("l"))
        .unwrap();
    let map = b
        .map_state(&MapStateDescriptor::<String, i32>::new("m"))
        .unwrap();
    let sum = b
        .reducing_state(&ReducingStateDescriptor::new("r", |a: i64, c: i64| a + c))
        .unwrap();
    let avg = b
        .aggregating_state(&AggregatingStateDescriptor::new("a", Avg))
        .unwrap();

    for (i, key) in ["alice", "bob", "carol"].iter().enumerate() {
        set(&mut b, key);
        assert_eq!(value.value(&mut b).unwrap(), None);
        value.update(&mut b, i as u64 * 10).unwrap();
        list.add(&mut b, format!("{key}-1")).unwrap();
        list.add(&mut b, format!("{key}-2")).unwrap();
        map.put(&mut b, "x".into(), i as i32).unwrap();
        map.put(&mut b, key.to_string(), 7).unwrap();
        for v in 1..=4 {
            sum.add(&mut b, v * (i as i64 + 1)).unwrap();
            avg.add(&mut b, v).unwrap();
        }
    }
    for (i, key) in ["alice", "bob", "carol"].iter().enumerate() {
        set(&mut b, key);
        assert_eq!(value.value(&mut b).unwrap(), Some(i as u64 * 10));
        assert_eq!(
            list.get(&mut b).unwrap(),
            vec![format!("{key}-1"), format!("{key}-2")]
        );
        assert_eq!(map.get(&mut b, &"x".to_string()).unwrap(), Some(i as i32));
        assert!(map.contains(&mut b, &key.to_string()).unwrap());
        assert!(!map.contains(&mut b, &"nobody".to_string()).unwrap());
        let mut entries = map.iter(&mut b).unwrap();
        entries.sort();
        let mut expected = vec![("x".to_string(), i as i32), (key.to_string(), 7)];
        expected.sort();
        assert_eq!(entries, expected);
        assert_eq!(sum.get(&mut b).unwrap(), Some(10 * (i as i64 + 1)));
        assert_eq!(avg.get(&mut b).unwrap(), Some(2.5));
    }

    set(&mut b, "bob");
    value.clear(&mut b).unwrap();
    list.update(&mut b, vec!["only".into()]).unwrap();
    map.remove(&mut b, &"x".to_string()).unwrap();
    sum.clear(&mut b).unwrap();
    avg.clear(&mut b).unwrap();
    assert_eq!(value.value(&mut b).unwrap(), None);
    assert_eq!(list.get(&mut b).unwrap(), vec!["only".to_string()]);
    assert_eq!(map.iter(&mut b).unwrap(), vec![("bob".to_string(), 7)]);
    assert_eq!(sum.get(&mut b).unwrap(), None);
    assert_eq!(avg.get(&mut b).unwrap(), None);
    list.clear(&mut b).unwrap();
    map.clear(&mut b).unwrap();
    assert!(list.get(&mut b).unwrap().is_empty());
    assert!(map.iter(&mut b).unwrap().is_empty());

    // Other keys untouched.
    set(&mut b, "alice");
    assert_eq!(value.value(&mut b).unwrap(), Some(0));
    assert_eq!(sum.get(&mut b).unwrap(), Some(10));
}

#[test]
fn access_without_a_current_key_is_an_error() {
    let mut b = backend();
    let value = value_v(&mut b);
    let e = value.value(&mut b).unwrap_err();
    assert!(
        matches!(e, StateError::NoCurrentKey { ref state } if state == "v"),
        "{e}"
    );
}

#[test]
fn registering_a_name_again_returns_the_same_state() {
    let mut b = backend();
    let a = value_v(&mut b);
    set(&mut b, "k");
    a.update(&mut b, 5).unwrap();
    let again = value_v(&mut b);
    assert_eq!(again.value(&mut b).unwrap(), Some(5));
    assert_eq!(b.state_names(), vec!["v"]);
}

#[test]
fn a_name_with_another_kind_type_or_ttl_is_an_error() {
    let mut b = backend();
    value_v(&mut b);
    let e = b
        .value_state(&ValueStateDescriptor::<String>::new("v"))
        .err()
        .unwrap();
    assert!(matches!(e, StateError::StateMismatch { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("'v'") && msg.contains("u64") && msg.contains("String"),
        "{msg}"
    );

    let e = b
        .list_state(&ListStateDescriptor::<u64>::new("v"))
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("Value state") && e.to_string().contains("List state"),
        "{e}"
    );
    let e = b
        .reducing_state(&ReducingStateDescriptor::new("v", |a: u64, c: u64| a + c))
        .err()
        .unwrap();
    assert!(e.to_string().contains("Reducing"), "{e}");

    let mut with_ttl = ValueStateDescriptor::<u64>::new("v");
    with_ttl.enable_time_to_live(StateTtlConfig::new_builder(Duration::from_secs(1)).build());
    assert!(b.value_state(&with_ttl).is_err());
}

#[test]
fn a_key_outside_the_range_is_an_error_naming_group_and_range() {
    let range = key_group_range_for_operator(MAX_P, 4, 1);
    let mut b: KeyedStateBackend<i32> = KeyedStateBackend::new(range, MAX_P).unwrap();
    let outside = (0..)
        .find(|k: &i32| {
            let g = key_group_for_hash(*k, MAX_P);
            g < range.0 || g > range.1
        })
        .unwrap();
    let group = key_group_for_hash(outside, MAX_P);
    let e = b.set_current_key(outside, outside.key_hash()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("key group {group}"))
            && msg.contains(&format!("{}..={}", range.0, range.1)),
        "{msg}"
    );
    let inside = (0..)
        .find(|k: &i32| (range.0..=range.1).contains(&key_group_for_hash(*k, MAX_P)))
        .unwrap();
    b.set_current_key(inside, inside).unwrap();
    assert_eq!(
        b.current_key_group(),
        Some(key_group_for_hash(inside, MAX_P))
    );
    assert!(KeyedStateBackend::<i32>::new((10, 5), MAX_P).is_err());
    assert!(KeyedStateBackend::<i32>::new((0, MAX_P), MAX_P).is_err());
}

type ValueListMap = (ValueState<i64>, ListState<i64>, MapState<String, i64>);

/// Registers the value "v", list "l" and map "m" states `filled` fills.
fn value_list_map(b: &mut KeyedStateBackend<i64>) -> ValueListMap {
    let value = b
        .value_state(&ValueStateDescriptor::<i64>::new("v"))
        .unwrap();
    let list = b.list_state(&ListStateDescriptor::<i64>::new("l")).unwrap();
    let map = b
        .map_state(&MapStateDescriptor::<String, i64>::new("m"))
        .unwrap();
    (value, list, map)
}

/// A backend over every key group.
fn full_range<K: StateKey>() -> KeyedStateBackend<K> {
    KeyedStateBackend::new((0, MAX_P - 1), MAX_P).unwrap()
}

/// A full-range backend restored from every key group of `groups`.
fn restored(groups: &BTreeMap<usize, Vec<u8>>) -> KeyedStateBackend<i64> {
    let mut r = full_range::<i64>();
    r.restore(groups.iter().map(|(g, b)| (*g, b.as_slice())))
        .unwrap();
    r
}

/// Fills value, list and map state for keys 0..n of a full-range backend.
fn filled(n: i64) -> (KeyedStateBackend<i64>, BTreeMap<i64, i64>) {
    let mut b = full_range();
    let (value, list, map) = value_list_map(&mut b);
    let mut expected = BTreeMap::new();
    for k in 0..n {
        b.set_current_key(k, k.key_hash()).unwrap();
        value.update(&mut b, k * 3).unwrap();
        list.add(&mut b, k).unwrap();
        list.add(&mut b, -k).unwrap();
        map.put(&mut b, format!("{k}"), k).unwrap();
        expected.insert(k, k * 3);
    }
    (b, expected)
}

#[test]
fn snapshot_restores_into_another_range_with_exactly_its_keys() {
    let (mut b, expected) = filled(500);
    let groups = b.snapshot().encode().unwrap();
    assert!(groups.keys().all(|g| *g < MAX_P));

    for p in [1usize, 2, 3] {
        let mut seen = 0;
        for i in 0..p {
            let range = key_group_range_for_operator(MAX_P, p, i);
            let mut r: KeyedStateBackend<i64> = KeyedStateBackend::new(range, MAX_P).unwrap();
            // Restore before registration: entries stay raw until then.
            r.restore(
                groups
                    .range(range.0..=range.1)
                    .map(|(g, b)| (*g, b.as_slice())),
            )
            .unwrap();
            assert_eq!(r.state_names(), vec!["l", "m", "v"]);
            let (value, list, map) = value_list_map(&mut r);
            for (&k, &v) in &expected {
                let g = key_group_for_hash(k.key_hash(), MAX_P);
                if g < range.0 || g > range.1 {
                    continue;
                }
                seen += 1;
                r.set_current_key(k, k.key_hash()).unwrap();
                assert_eq!(value.value(&mut r).unwrap(), Some(v));
                assert_eq!(list.get(&mut r).unwrap(), vec![k, -k]);
                assert_eq!(map.get(&mut r, &format!("{k}")).unwrap(), Some(k));
            }
            // Snapshotting the restored backend writes exactly its range.
            let again = r.snapshot().encode().unwrap();
            let theirs: BTreeMap<usize, Vec<u8>> = groups
                .range(range.0..=range.1)
                .map(|(g, b)| (*g, b.clone()))
                .collect();
            assert_eq!(
                again.keys().collect::<Vec<_>>(),
                theirs.keys().collect::<Vec<_>>()
            );
        }
        assert_eq!(seen, expected.len());
    }
}

#[test]
fn restore_after_registration_and_unregistered_states_survive_a_snapshot() {
    let (mut b, _) = filled(50);
    let groups = b.snapshot().encode().unwrap();
    let mut r = full_range::<i64>();
    let value = r
        .value_state(&ValueStateDescriptor::<i64>::new("v"))
        .unwrap();
    r.restore(groups.iter().map(|(g, b)| (*g, b.as_slice())))
        .unwrap();
    r.set_current_key(7, 7).unwrap();
    assert_eq!(value.value(&mut r).unwrap(), Some(21));
    // "l" and "m" were never registered: the next snapshot still has them.
    let next = r.snapshot().encode().unwrap();
    let mut r2 = restored(&next);
    let list = r2
        .list_state(&ListStateDescriptor::<i64>::new("l"))
        .unwrap();
    r2.set_current_key(7, 7).unwrap();
    assert_eq!(list.get(&mut r2).unwrap(), vec![7, -7]);
}

#[test]
fn restore_errors_are_typed() {
    let (mut b, _) = filled(50);
    let groups = b.snapshot().encode().unwrap();
    let mut r: KeyedStateBackend<i64> = KeyedStateBackend::new((0, 63), MAX_P).unwrap();
    let (g, bytes) = groups.range(64..).next().unwrap();
    let e = r.restore([(*g, bytes.as_slice())]).unwrap_err();
    assert!(matches!(e, StateError::KeyGroupOutOfRange { .. }), "{e}");

    let (g, bytes) = groups.range(..64).next().unwrap();
    let e = r.restore([(*g, &bytes[..bytes.len() - 3])]).unwrap_err();
    assert!(e.to_string().contains(&format!("key group {g}")), "{e}");

    // Registered with another kind than restored.
    r.restore([(*g, bytes.as_slice())]).unwrap();
    let e = r
        .list_state(&ListStateDescriptor::<i64>::new("v"))
        .err()
        .unwrap();
    assert!(matches!(e, StateError::StateMismatch { .. }), "{e}");
    // Registered with another type: a decode error naming the state.
    let e = r
        .value_state(&ValueStateDescriptor::<String>::new("v"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("'v'"), "{e}");
    // The right registration still works afterwards.
    let v = r
        .value_state(&ValueStateDescriptor::<i64>::new("v"))
        .unwrap();
    let k = (0..50)
        .find(|k: &i64| key_group_for_hash(k.key_hash(), MAX_P) == *g)
        .unwrap();
    r.set_current_key(k, k.key_hash()).unwrap();
    assert_eq!(v.value(&mut r).unwrap(), Some(k * 3));
}

#[test]
fn writes_after_a_snapshot_do_not_change_it() {
    let (mut b, _) = filled(300);
    let before = b.snapshot().encode().unwrap();
    let snapshot = b.snapshot();

    // Mutate every kind of state, clear some keys, add new ones.
    let (value, list, map) = value_list_map(&mut b);
    for k in 0..400i64 {
        b.set_current_key(k, k.key_hash()).unwrap();
        if k % 3 == 0 {
            value.clear(&mut b).unwrap();
            list.clear(&mut b).unwrap();
        } else {
            value.update(&mut b, -1).unwrap();
            list.add(&mut b, 99).unwrap();
        }
        map.put(&mut b, "new".into(), k).unwrap();
    }
    // Encode on another thread while the backend keeps running.
    let handle = std::thread::spawn(move || snapshot.encode().unwrap());
    b.set_current_key(1, 1).unwrap();
    value.update(&mut b, 12345).unwrap();
    let encoded = handle.join().unwrap();
    assert_eq!(encoded, before);
    // The backend sees its own writes.
    assert_eq!(value.value(&mut b).unwrap(), Some(12345));
}

#[test]
fn ttl_expires_on_create_and_write() {
    let mut b = backend();
    let mut d = ValueStateDescriptor::<u64>::new("v");
    d.enable_time_to_live(StateTtlConfig::new_builder(Duration::from_millis(100)).build());
    let v = b.value_state(&d).unwrap();
    set(&mut b, "k");
    b.set_current_time(1_000);
    v.update(&mut b, 1).unwrap();
    b.set_current_time(1_099);
    // Reading does not refresh with OnCreateAndWrite.
    assert_eq!(v.value(&mut b).unwrap(), Some(1));
    b.set_current_time(1_100);
    assert_eq!(v.value(&mut b).unwrap(), None);
    // A write refreshes.
    v.update(&mut b, 2).unwrap();
    b.set_current_time(1_150);
    v.update(&mut b, 3).unwrap();
    b.set_current_time(1_249);
    assert_eq!(v.value(&mut b).unwrap(), Some(3));
}

#[test]
fn ttl_on_read_and_write_refreshes_on_read() {
    let mut b = backend();
    let mut d = ListStateDescriptor::<u64>::new("l");
    d.enable_time_to_live(
        StateTtlConfig::new_builder(Duration::from_millis(100))
            .set_update_type(UpdateType::OnReadAndWrite)
            .build(),
    );
    let l = b.list_state(&d).unwrap();
    set(&mut b, "k");
    b.set_current_time(0);
    l.add(&mut b, 1).unwrap();
    b.set_current_time(50);
    l.add(&mut b, 2).unwrap();
    for t in [90, 180, 270] {
        b.set_current_time(t);
        assert_eq!(l.get(&mut b).unwrap(), vec![1, 2], "at {t}");
    }
    b.set_current_time(370);
    assert!(l.get(&mut b).unwrap().is_empty());
}

#[test]
fn ttl_visibility_return_expired_if_not_cleaned_up() {
    let mut b = backend();
    let return_expired = StateTtlConfig::new_builder(Duration::from_millis(10))
        .set_state_visibility(StateVisibility::ReturnExpiredIfNotCleanedUp)
        .build();
    let mut d = MapStateDescriptor::<String, u64>::new("m");
    d.enable_time_to_live(return_expired.clone());
    let m = b.map_state(&d).unwrap();
    let mut rd = ReducingStateDescriptor::new("r", |a: u64, c: u64| a + c);
    rd.enable_time_to_live(return_expired);
    let r = b.reducing_state(&rd).unwrap();
    let mut never = ReducingStateDescriptor::new("never", |a: u64, c: u64| a + c);
    never.enable_time_to_live(StateTtlConfig::new_builder(Duration::from_millis(10)).build());
    let never = b.reducing_state(&never).unwrap();
    set(&mut b, "k");
    m.put(&mut b, "a".into(), 1).unwrap();
    r.add(&mut b, 5).unwrap();
    never.add(&mut b, 5).unwrap();
    b.set_current_time(10);
    // Expired but not cleaned up: returned once, then gone.
    assert_eq!(m.get(&mut b, &"a".to_string()).unwrap(), Some(1));
    assert_eq!(m.get(&mut b, &"a".to_string()).unwrap(), None);
    assert_eq!(r.get(&mut b).unwrap(), Some(5));
    assert_eq!(r.get(&mut b).unwrap(), None);
    // An add onto an expired value: kept only if expired values are visible.
    never.add(&mut b, 1).unwrap();
    assert_eq!(never.get(&mut b).unwrap(), Some(1));
}

#[test]
fn expired_entries_are_left_out_of_snapshots() {
    let mut b = full_range::<i64>();
    let ttl = StateTtlConfig::new_builder(Duration::from_millis(100)).build();
    let mut vd = ValueStateDescriptor::<i64>::new("v");
    vd.enable_time_to_live(ttl.clone());
    let mut ld = ListStateDescriptor::<i64>::new("l");
    ld.enable_time_to_live(ttl.clone());
    let v = b.value_state(&vd).unwrap();
    let l = b.list_state(&ld).unwrap();
    for k in 0..100i64 {
        b.set_current_time(if k < 50 { 0 } else { 60 });
        b.set_current_key(k, k.key_hash()).unwrap();
        v.update(&mut b, k).unwrap();
        l.add(&mut b, k).unwrap();
    }
    // Old list elements of young keys expire too.
    b.set_current_time(0);
    b.set_current_key(70, 70).unwrap();
    l.add(&mut b, -70).unwrap();
    b.set_current_time(100);
    let groups = b.snapshot().encode().unwrap();

    let mut r = restored(&groups);
    let v = r.value_state(&vd).unwrap();
    let l = r.list_state(&ld).unwrap();
    // Restored entries keep their timestamps; read at a time none expire.
    r.set_current_time(0);
    for k in 0..100i64 {
        r.set_current_key(k, k.key_hash()).unwrap();
        let expect = (k >= 50).then_some(k);
        assert_eq!(v.value(&mut r).unwrap(), expect, "key {k}");
        let expect: Vec<i64> = expect.into_iter().collect();
        assert_eq!(l.get(&mut r).unwrap(), expect, "key {k}");
    }
}

#[test]
fn many_keys_stay_isolated_across_key_groups() {
    let mut b = full_range::<u64>();
    let sum = b
        .reducing_state(&ReducingStateDescriptor::new("sum", |a: u64, c: u64| a + c))
        .unwrap();
    for round in 1..=3u64 {
        for k in 0..2_000u64 {
            b.set_current_key(k, k.key_hash()).unwrap();
            sum.add(&mut b, k * round).unwrap();
        }
    }
    for k in 0..2_000u64 {
        b.set_current_key(k, k.key_hash()).unwrap();
        assert_eq!(sum.get(&mut b).unwrap(), Some(6 * k));
    }
}

fn _snapshot_is_send() {
    fn is_send<T: Send>() {}
    is_send::<KeyedSnapshot>();
    is_send::<KeyedStateBackend<String>>();
}
