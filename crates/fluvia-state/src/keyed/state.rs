//! State descriptors (a name, the value types, an optional TTL and, for
//! reducing and aggregating state, the function) and the typed handles
//! registration returns. A handle is an index plus types: it is used with
//! the backend it came from, scoped to that backend's current key.
//!
//! TTL follows Flink's decorators: a read that meets an expired entry
//! removes it and returns it only with `ReturnExpiredIfNotCleanedUp`; with
//! `OnReadAndWrite` a read refreshes the entry's timestamp. Reads take the
//! backend mutably for that reason; without TTL they never copy a key
//! group.

use super::table::Stored;
use super::ttl::{StateTtlConfig, Ttl};
use super::{KeyedStateBackend, StateData, StateKey, StateKind};
use crate::error::Result;
use rustc_hash::FxHashMap;
use std::marker::PhantomData;
use std::sync::Arc;

/// Flink's `AggregateFunction`: folds inputs into an accumulator and
/// reads a result from it.
pub trait AggregateFunction<IN, ACC, OUT>: Send + Sync {
    fn create_accumulator(&self) -> ACC;
    fn add(&self, value: IN, accumulator: ACC) -> ACC;
    fn get_result(&self, accumulator: &ACC) -> OUT;
    fn merge(&self, a: ACC, b: ACC) -> ACC;
}

macro_rules! descriptor_common {
    ($name:ident < $($t:ident),* >) => {
        impl<$($t),*> $name<$($t),*> {
            pub fn name(&self) -> &str {
                &self.name
            }

            /// Gives the state's entries a time-to-live.
            pub fn enable_time_to_live(&mut self, config: StateTtlConfig) -> &mut Self {
                self.ttl = Some(config);
                self
            }

            pub fn ttl_config(&self) -> Option<&StateTtlConfig> {
                self.ttl.as_ref()
            }
        }

        impl<$($t),*> std::fmt::Debug for $name<$($t),*> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("name", &self.name)
                    .field("ttl", &self.ttl)
                    .finish()
            }
        }
    };
}

/// Describes a [`ValueState`].
pub struct ValueStateDescriptor<V> {
    name: String,
    ttl: Option<StateTtlConfig>,
    _types: PhantomData<fn() -> V>,
}

impl<V> ValueStateDescriptor<V> {
    pub fn new(name: impl Into<String>) -> Self {
        ValueStateDescriptor {
            name: name.into(),
            ttl: None,
            _types: PhantomData,
        }
    }
}
descriptor_common!(ValueStateDescriptor<V>);

/// Describes a [`ListState`].
pub struct ListStateDescriptor<V> {
    name: String,
    ttl: Option<StateTtlConfig>,
    _types: PhantomData<fn() -> V>,
}

impl<V> ListStateDescriptor<V> {
    pub fn new(name: impl Into<String>) -> Self {
        ListStateDescriptor {
            name: name.into(),
            ttl: None,
            _types: PhantomData,
        }
    }
}
descriptor_common!(ListStateDescriptor<V>);

/// Describes a [`MapState`]; TTL applies per map entry.
pub struct MapStateDescriptor<UK, UV> {
    name: String,
    ttl: Option<StateTtlConfig>,
    _types: PhantomData<fn() -> (UK, UV)>,
}

impl<UK, UV> MapStateDescriptor<UK, UV> {
    pub fn new(name: impl Into<String>) -> Self {
        MapStateDescriptor {
            name: name.into(),
            ttl: None,
            _types: PhantomData,
        }
    }
}
descriptor_common!(MapStateDescriptor<UK, UV>);

/// The function of a [`ReducingStateDescriptor`].
pub type ReduceFn<V> = Arc<dyn Fn(V, V) -> V + Send + Sync>;

/// Describes a [`ReducingState`].
pub struct ReducingStateDescriptor<V> {
    name: String,
    ttl: Option<StateTtlConfig>,
    reduce: ReduceFn<V>,
}

impl<V> ReducingStateDescriptor<V> {
    pub fn new(
        name: impl Into<String>,
        reduce: impl Fn(V, V) -> V + Send + Sync + 'static,
    ) -> Self {
        ReducingStateDescriptor {
            name: name.into(),
            ttl: None,
            reduce: Arc::new(reduce),
        }
    }
}
descriptor_common!(ReducingStateDescriptor<V>);

/// Describes an [`AggregatingState`].
pub struct AggregatingStateDescriptor<IN, ACC, OUT> {
    name: String,
    ttl: Option<StateTtlConfig>,
    function: Arc<dyn AggregateFunction<IN, ACC, OUT>>,
}

impl<IN, ACC, OUT> AggregatingStateDescriptor<IN, ACC, OUT> {
    pub fn new(
        name: impl Into<String>,
        function: impl AggregateFunction<IN, ACC, OUT> + 'static,
    ) -> Self {
        AggregatingStateDescriptor {
            name: name.into(),
            ttl: None,
            function: Arc::new(function),
        }
    }
}
descriptor_common!(AggregatingStateDescriptor<IN, ACC, OUT>);

/// A single value per key.
pub struct ValueState<V> {
    index: usize,
    _types: PhantomData<fn() -> V>,
}

/// A list of values per key.
pub struct ListState<V> {
    index: usize,
    _types: PhantomData<fn() -> V>,
}

/// A map per key.
pub struct MapState<UK, UV> {
    index: usize,
    _types: PhantomData<fn() -> (UK, UV)>,
}

/// A value per key that every `add` folds into with the descriptor's
/// reduce function.
pub struct ReducingState<V> {
    index: usize,
    reduce: ReduceFn<V>,
}

/// An accumulator per key that every `add` folds into with the
/// descriptor's [`AggregateFunction`].
pub struct AggregatingState<IN, ACC, OUT> {
    index: usize,
    function: Arc<dyn AggregateFunction<IN, ACC, OUT>>,
}

macro_rules! debug_handle {
    ($name:ident < $($t:ident),* >) => {
        impl<$($t),*> std::fmt::Debug for $name<$($t),*> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("index", &self.index)
                    .finish()
            }
        }
    };
}
debug_handle!(ValueState<V>);
debug_handle!(ListState<V>);
debug_handle!(MapState<UK, UV>);
debug_handle!(ReducingState<V>);
debug_handle!(AggregatingState<IN, ACC, OUT>);

macro_rules! copy_handle {
    ($name:ident < $($t:ident),* >) => {
        impl<$($t),*> Clone for $name<$($t),*> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<$($t),*> Copy for $name<$($t),*> {}
    };
}
copy_handle!(ValueState<V>);
copy_handle!(ListState<V>);
copy_handle!(MapState<UK, UV>);

impl<V> Clone for ReducingState<V> {
    fn clone(&self) -> Self {
        ReducingState {
            index: self.index,
            reduce: Arc::clone(&self.reduce),
        }
    }
}

impl<IN, ACC, OUT> Clone for AggregatingState<IN, ACC, OUT> {
    fn clone(&self) -> Self {
        AggregatingState {
            index: self.index,
            function: Arc::clone(&self.function),
        }
    }
}

/// The TTL a read of entries stamped `stamps` must apply at `now` (write
/// access): `None` when it changes nothing (no TTL, or none expired and
/// reads do not refresh).
fn ttl_to_apply(
    ttl: Option<&StateTtlConfig>,
    now: u64,
    mut stamps: impl Iterator<Item = u64>,
) -> Option<StateTtlConfig> {
    let ttl = ttl?;
    (ttl.refreshes_on_read() || stamps.any(|ts| ttl.is_expired(ts, now))).then(|| ttl.clone())
}

/// A read of one entry of a collection under `ttl` at `now`: whether it
/// stays and whether the reader sees it (refreshed if the TTL says so).
fn read_entry<T>(ttl: &StateTtlConfig, now: u64, e: &mut Ttl<T>) -> (bool, bool) {
    if ttl.is_expired(e.ts, now) {
        (false, ttl.returns_expired())
    } else {
        if ttl.refreshes_on_read() {
            e.ts = now;
        }
        (true, true)
    }
}

/// The registration of each state kind: the descriptor's name, kind,
/// type and TTL go to `register` with the stored form `$stored`, and the
/// handle takes the index and the fields given.
macro_rules! state_registration {
    ($(
        $(#[$attr:meta])*
        fn $name:ident<$($g:ident: $bound:tt),+>($desc:ty) -> $state:ident<$($sg:ident),+>;
        stored $stored:ty, $kind:ident, $type_name:expr;
        |$d:ident| { $($field:ident: $value:expr),* $(,)? }
    )*) => {
        impl<K: StateKey> KeyedStateBackend<K> {
            $(
                $(#[$attr])*
                pub fn $name<$($g: $bound),+>(
                    &mut self,
                    descriptor: &$desc,
                ) -> Result<$state<$($sg),+>> {
                    let index = self.register::<$stored>(
                        &descriptor.name,
                        StateKind::$kind,
                        $type_name,
                        descriptor.ttl.as_ref(),
                    )?;
                    let $d = descriptor;
                    Ok($state { index, $($field: $value),* })
                }
            )*
        }
    };
}

state_registration! {
    /// Registers the value state of `descriptor`, or returns the state
    /// already registered under its name (an error if that one has another
    /// kind, type or TTL).
    fn value_state<V: StateData>(ValueStateDescriptor<V>) -> ValueState<V>;
    stored Ttl<V>, Value, std::any::type_name::<V>().to_string();
    |_d| { _types: PhantomData }

    fn list_state<V: StateData>(ListStateDescriptor<V>) -> ListState<V>;
    stored Vec<Ttl<V>>, List, std::any::type_name::<V>().to_string();
    |_d| { _types: PhantomData }

    fn map_state<UK: StateKey, UV: StateData>(MapStateDescriptor<UK, UV>) -> MapState<UK, UV>;
    stored FxHashMap<UK, Ttl<UV>>, Map, format!(
        "{} -> {}",
        std::any::type_name::<UK>(),
        std::any::type_name::<UV>()
    );
    |_d| { _types: PhantomData }

    /// Registers a reducing state. Registering the name again returns the
    /// same stored state with the new descriptor's function.
    fn reducing_state<V: StateData>(ReducingStateDescriptor<V>) -> ReducingState<V>;
    stored Ttl<V>, Reducing, std::any::type_name::<V>().to_string();
    |d| { reduce: Arc::clone(&d.reduce) }

    fn aggregating_state<IN: 'static, ACC: StateData, OUT: 'static>(
        AggregatingStateDescriptor<IN, ACC, OUT>
    ) -> AggregatingState<IN, ACC, OUT>;
    stored Ttl<ACC>, Aggregating, std::any::type_name::<ACC>().to_string();
    |d| { function: Arc::clone(&d.function) }
}

impl<K: StateKey> KeyedStateBackend<K> {
    // ----- single values (value, reducing, aggregating) -----

    /// The current key's value, honouring TTL.
    fn single_get<T: StateData>(&mut self, index: usize) -> Result<Option<T>> {
        let r = self.read::<Ttl<T>>(index)?;
        let Some(e) = r.map.get(r.key) else {
            return Ok(None);
        };
        let Some(ttl) = r.ttl else {
            return Ok(Some(e.value.clone()));
        };
        if ttl.is_expired(e.ts, r.now) {
            let value = ttl.returns_expired().then(|| e.value.clone());
            let w = self.write::<Ttl<T>>(index)?;
            w.map.remove(w.key);
            return Ok(value);
        }
        if ttl.refreshes_on_read() && e.ts != r.now {
            let w = self.write::<Ttl<T>>(index)?;
            if let Some(e) = w.map.get_mut(w.key) {
                e.ts = w.now;
                return Ok(Some(e.value.clone()));
            }
            return Ok(None);
        }
        Ok(Some(e.value.clone()))
    }

    fn single_set<T: StateData>(&mut self, index: usize, value: T) -> Result<()> {
        let w = self.write::<Ttl<T>>(index)?;
        let entry = Ttl { value, ts: w.now };
        match w.map.get_mut(w.key) {
            Some(e) => *e = entry,
            None => {
                w.map.insert(w.key.clone(), entry);
            }
        }
        Ok(())
    }

    /// Folds into the current key's value: `fold(previous)` where the
    /// previous value is `None` if absent or expired-and-hidden. One hash
    /// lookup when the key exists.
    fn single_fold<T: StateData>(
        &mut self,
        index: usize,
        fold: impl FnOnce(Option<T>) -> T,
    ) -> Result<()> {
        let w = self.write::<Ttl<T>>(index)?;
        match w.map.get_mut(w.key) {
            Some(e) => {
                let visible = match w.ttl {
                    Some(ttl) if ttl.is_expired(e.ts, w.now) => ttl.returns_expired(),
                    _ => true,
                };
                // The fold takes the value by value; cloning it is free for
                // the numbers built-in aggregations keep.
                e.value = fold(visible.then(|| e.value.clone()));
                e.ts = w.now;
            }
            None => {
                let value = fold(None);
                w.map.insert(w.key.clone(), Ttl { value, ts: w.now });
            }
        }
        Ok(())
    }

    /// Removes the current key's entry of a state stored as `S`.
    fn clear_key<S: Stored>(&mut self, index: usize) -> Result<()> {
        // Reading first spares a key-group copy when there is nothing to
        // remove.
        let r = self.read::<S>(index)?;
        if r.map.contains_key(r.key) {
            let w = self.write::<S>(index)?;
            w.map.remove(w.key);
        }
        Ok(())
    }

    // ----- lists and map iteration -----

    fn list_get<V: StateData>(&mut self, index: usize) -> Result<Vec<V>> {
        let r = self.read::<Vec<Ttl<V>>>(index)?;
        let Some(list) = r.map.get(r.key) else {
            return Ok(Vec::new());
        };
        let now = r.now;
        let Some(ttl) = ttl_to_apply(r.ttl, now, list.iter().map(|e| e.ts)) else {
            return Ok(list.iter().map(|e| e.value.clone()).collect());
        };
        let w = self.write::<Vec<Ttl<V>>>(index)?;
        let Some(list) = w.map.get_mut(w.key) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(list.len());
        list.retain_mut(|e| {
            let (keep, seen) = read_entry(&ttl, now, e);
            if seen {
                out.push(e.value.clone());
            }
            keep
        });
        if list.is_empty() {
            w.map.remove(w.key);
        }
        Ok(out)
    }

    fn map_entries<UK: StateKey, UV: StateData>(&mut self, index: usize) -> Result<Vec<(UK, UV)>> {
        let r = self.read::<FxHashMap<UK, Ttl<UV>>>(index)?;
        let Some(map) = r.map.get(r.key) else {
            return Ok(Vec::new());
        };
        let now = r.now;
        let Some(ttl) = ttl_to_apply(r.ttl, now, map.values().map(|e| e.ts)) else {
            return Ok(map
                .iter()
                .map(|(k, e)| (k.clone(), e.value.clone()))
                .collect());
        };
        let w = self.write::<FxHashMap<UK, Ttl<UV>>>(index)?;
        let Some(map) = w.map.get_mut(w.key) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(map.len());
        map.retain(|k, e| {
            let (keep, seen) = read_entry(&ttl, now, e);
            if seen {
                out.push((k.clone(), e.value.clone()));
            }
            keep
        });
        if map.is_empty() {
            w.map.remove(w.key);
        }
        Ok(out)
    }

    fn map_get<UK: StateKey, UV: StateData>(
        &mut self,
        index: usize,
        user_key: &UK,
    ) -> Result<Option<UV>> {
        let r = self.read::<FxHashMap<UK, Ttl<UV>>>(index)?;
        let Some(e) = r.map.get(r.key).and_then(|m| m.get(user_key)) else {
            return Ok(None);
        };
        let Some(ttl) = r.ttl else {
            return Ok(Some(e.value.clone()));
        };
        let expired = ttl.is_expired(e.ts, r.now);
        let refresh = ttl.refreshes_on_read() && e.ts != r.now;
        if !(expired || refresh) {
            return Ok(Some(e.value.clone()));
        }
        let returns_expired = ttl.returns_expired();
        let w = self.write::<FxHashMap<UK, Ttl<UV>>>(index)?;
        let Some(map) = w.map.get_mut(w.key) else {
            return Ok(None);
        };
        let value = if expired {
            let removed = map.remove(user_key);
            if map.is_empty() {
                w.map.remove(w.key);
            }
            removed.filter(|_| returns_expired).map(|e| e.value)
        } else {
            map.get_mut(user_key).map(|e| {
                e.ts = w.now;
                e.value.clone()
            })
        };
        Ok(value)
    }
}

impl<V: StateData> ValueState<V> {
    /// The current key's value.
    pub fn value<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>) -> Result<Option<V>> {
        backend.single_get::<V>(self.index)
    }

    pub fn update<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>, value: V) -> Result<()> {
        backend.single_set(self.index, value)
    }

    pub fn clear<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>) -> Result<()> {
        backend.clear_key::<Ttl<V>>(self.index)
    }
}

impl<V: StateData> ListState<V> {
    /// The current key's elements, in insertion order (empty if none).
    pub fn get<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>) -> Result<Vec<V>> {
        backend.list_get(self.index)
    }

    pub fn add<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>, value: V) -> Result<()> {
        let w = backend.write::<Vec<Ttl<V>>>(self.index)?;
        let e = Ttl { value, ts: w.now };
        match w.map.get_mut(w.key) {
            Some(list) => list.push(e),
            None => {
                w.map.insert(w.key.clone(), vec![e]);
            }
        }
        Ok(())
    }

    /// Replaces the current key's elements (an empty list clears them).
    pub fn update<K: StateKey>(
        &self,
        backend: &mut KeyedStateBackend<K>,
        values: Vec<V>,
    ) -> Result<()> {
        if values.is_empty() {
            return self.clear(backend);
        }
        let w = backend.write::<Vec<Ttl<V>>>(self.index)?;
        let now = w.now;
        w.map.insert(
            w.key.clone(),
            values
                .into_iter()
                .map(|value| Ttl { value, ts: now })
                .collect(),
        );
        Ok(())
    }

    pub fn clear<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>) -> Result<()> {
        backend.clear_key::<Vec<Ttl<V>>>(self.index)
    }
}

impl<UK: StateKey, UV: StateData> MapState<UK, UV> {
    pub fn get<K: StateKey>(
        &self,
        backend: &mut KeyedStateBackend<K>,
        user_key: &UK,
    ) -> Result<Option<UV>> {
        backend.map_get(self.index, user_key)
    }

    pub fn put<K: StateKey>(
        &self,
        backend: &mut KeyedStateBackend<K>,
        user_key: UK,
        value: UV,
    ) -> Result<()> {
        let w = backend.write::<FxHashMap<UK, Ttl<UV>>>(self.index)?;
        let e = Ttl { value, ts: w.now };
        match w.map.get_mut(w.key) {
            Some(map) => {
                map.insert(user_key, e);
            }
            None => {
                let mut map = FxHashMap::default();
                map.insert(user_key, e);
                w.map.insert(w.key.clone(), map);
            }
        }
        Ok(())
    }

    pub fn remove<K: StateKey>(
        &self,
        backend: &mut KeyedStateBackend<K>,
        user_key: &UK,
    ) -> Result<()> {
        let r = backend.read::<FxHashMap<UK, Ttl<UV>>>(self.index)?;
        if !r.map.get(r.key).is_some_and(|m| m.contains_key(user_key)) {
            return Ok(());
        }
        let w = backend.write::<FxHashMap<UK, Ttl<UV>>>(self.index)?;
        if let Some(map) = w.map.get_mut(w.key) {
            map.remove(user_key);
            if map.is_empty() {
                w.map.remove(w.key);
            }
        }
        Ok(())
    }

    pub fn contains<K: StateKey>(
        &self,
        backend: &mut KeyedStateBackend<K>,
        user_key: &UK,
    ) -> Result<bool> {
        Ok(self.get(backend, user_key)?.is_some())
    }

    /// The current key's entries, in no particular order.
    pub fn iter<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>) -> Result<Vec<(UK, UV)>> {
        backend.map_entries(self.index)
    }

    pub fn clear<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>) -> Result<()> {
        backend.clear_key::<FxHashMap<UK, Ttl<UV>>>(self.index)
    }
}

impl<V: StateData> ReducingState<V> {
    /// Folds `value` into the current key's value with the reduce function.
    #[inline]
    pub fn add<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>, value: V) -> Result<()> {
        let reduce = &self.reduce;
        backend.single_fold::<V>(self.index, |previous| match previous {
            Some(p) => reduce(p, value),
            None => value,
        })
    }

    pub fn get<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>) -> Result<Option<V>> {
        backend.single_get::<V>(self.index)
    }

    pub fn clear<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>) -> Result<()> {
        backend.clear_key::<Ttl<V>>(self.index)
    }
}

impl<IN, ACC: StateData, OUT> AggregatingState<IN, ACC, OUT> {
    /// Folds `value` into the current key's accumulator.
    #[inline]
    pub fn add<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>, value: IN) -> Result<()> {
        let f = &self.function;
        backend.single_fold::<ACC>(self.index, |previous| {
            f.add(value, previous.unwrap_or_else(|| f.create_accumulator()))
        })
    }

    /// The result of the current key's accumulator, `None` if nothing was
    /// added.
    pub fn get<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>) -> Result<Option<OUT>> {
        Ok(backend
            .single_get::<ACC>(self.index)?
            .map(|acc| self.function.get_result(&acc)))
    }

    pub fn clear<K: StateKey>(&self, backend: &mut KeyedStateBackend<K>) -> Result<()> {
        backend.clear_key::<Ttl<ACC>>(self.index)
    }
}
