//! The built-in operators behind the DataStream methods: stateless
//! transformations, keyed reduce and keyed process with per-key state,
//! and co-operators for connected streams (sinks are in [`crate::sinks`]).
//!
//! Keys reach the subtask that owns their key group (the network routes by
//! key group), so each key's state exists in exactly one subtask whatever
//! the parallelism. In a streaming job the per-key values of the keyed
//! operators live in `fluvia-state`'s keyed state backend and are part of
//! every checkpoint; a batch job (which takes none) keeps them in a plain
//! map.

use fluvia_core::keygroup::{KeyHash, key_group_for_hash};
use fluvia_runtime::state::{KeyedState, StateInitializationContext, StateSnapshotContext};
use fluvia_runtime::{
    Collector, Data, OneInputOperator, OperatorContext, TwoInputOperator, UserError,
};
use fluvia_state::KeyedStateBackend;
use fluvia_state::keyed::{StateData, StateKey, ValueState, ValueStateDescriptor};
use std::sync::Arc;

pub use crate::sinks::{
    CollectHandle, CollectSink, DiscardSink, FileSinkOptions, FnSink, PrintSink, TextFileSink,
    TwoPhaseCommitSink, TwoPhaseCommitSinkOp,
};

/// The stateless operators wrapping one user function `F`: each
/// `$record` goes to the function `$f` and its results to `$out` as
/// `$body` says.
macro_rules! fn_operators {
    ($(
        $(#[$attr:meta])*
        $name:ident<$($g:ident),+>: OneInputOperator<$t:ident, $o:ident>,
        F: ($($bound:tt)+),
        |$f:ident, $record:ident, $out:ident| $body:block
    )*) => {$(
        $(#[$attr])*
        pub struct $name<F>(pub Arc<F>);

        impl<$($g,)+ F> OneInputOperator<$t, $o> for $name<F>
        where
            $($g: 'static,)+
            F: $($bound)+ + Send + Sync + 'static,
        {
            #[inline]
            fn process_element(
                &mut self,
                $record: $t,
                $out: &mut Collector<'_, $o>,
            ) -> Result<(), UserError> {
                let $f = &*self.0;
                $body
            }
        }
    )*};
}

fn_operators! {
    MapOp<T, O>: OneInputOperator<T, O>,
    F: (Fn(T) -> O),
    |f, record, out| {
        out.collect(f(record));
        Ok(())
    }

    TryMapOp<T, O>: OneInputOperator<T, O>,
    F: (Fn(T) -> Result<O, UserError>),
    |f, record, out| {
        out.collect(f(record)?);
        Ok(())
    }

    FilterOp<T>: OneInputOperator<T, T>,
    F: (Fn(&T) -> bool),
    |f, record, out| {
        if f(&record) {
            out.collect(record);
        }
        Ok(())
    }

    FlatMapOp<T, O>: OneInputOperator<T, O>,
    F: (Fn(T, &mut Collector<'_, O>)),
    |f, record, out| {
        f(record, out);
        Ok(())
    }

    /// Flink's `ProcessFunction`: each record with a collector that reaches
    /// the main output and the side outputs; an error fails the task.
    ProcessOp<T, O>: OneInputOperator<T, O>,
    F: (Fn(T, &mut Collector<'_, O>) -> Result<(), UserError>),
    |f, record, out| { f(record, out) }
}

/// The value of each key of a built-in keyed operator (reduce, sum,
/// process): a plain map in batch mode, the checkpointed keyed state
/// backend (one value state named after the operator) in streaming mode.
pub enum KeyedValues<K, V> {
    Batch(KeyedState<K, Option<V>>),
    Streaming {
        backend: KeyedStateBackend<K>,
        state: ValueState<V>,
    },
}

impl<K: StateKey + KeyHash, V: StateData> KeyedValues<K, V> {
    pub fn new(ctx: &OperatorContext, state_name: &str) -> Result<Self, UserError> {
        if ctx.batch {
            return Ok(KeyedValues::Batch(KeyedState::new(ctx.max_parallelism)));
        }
        let mut backend = KeyedStateBackend::new(ctx.key_group_range(), ctx.max_parallelism)?;
        let state = backend.value_state(&ValueStateDescriptor::<V>::new(state_name))?;
        Ok(KeyedValues::Streaming { backend, state })
    }

    /// Runs `f` on `key`'s value (`None` when it has none); what `f` leaves
    /// there becomes the key's value.
    #[inline]
    pub fn with_value<R>(
        &mut self,
        key: &K,
        f: impl FnOnce(&mut Option<V>) -> R,
    ) -> Result<R, UserError> {
        match self {
            KeyedValues::Batch(map) => Ok(f(map.entry(key.clone()).or_insert(None))),
            KeyedValues::Streaming { backend, state } => {
                backend.set_current_key(key.clone(), key.key_hash())?;
                let mut slot = state.value(backend)?;
                let had = slot.is_some();
                let r = f(&mut slot);
                match slot {
                    Some(v) => state.update(backend, v)?,
                    None if had => state.clear(backend)?,
                    None => {}
                }
                Ok(r)
            }
        }
    }

    /// The values a snapshot restores (streaming).
    pub fn restore(&mut self, ctx: &StateInitializationContext) -> Result<(), UserError> {
        if let KeyedValues::Streaming { backend, .. } = self {
            backend.restore(ctx.keyed_state())?;
        }
        Ok(())
    }

    /// Freezes the values for a checkpoint (encoded off the task thread).
    pub fn snapshot(&mut self, ctx: &mut StateSnapshotContext) {
        if let KeyedValues::Streaming { backend, .. } = self {
            ctx.keyed_state(backend.snapshot());
        }
    }

    /// Every value, emptied (batch mode's end of input).
    pub fn drain(&mut self) -> Vec<V> {
        match self {
            KeyedValues::Batch(map) => map.drain().filter_map(|(_, v)| v).collect(),
            KeyedValues::Streaming { .. } => Vec::new(),
        }
    }
}

/// The state hooks of a keyed operator whose per-key values are its
/// `values` ([`KeyedValues`]): restored and snapshotted with them.
macro_rules! keyed_values_state {
    () => {
        fn initialize_state(
            &mut self,
            ctx: &mut StateInitializationContext,
        ) -> Result<(), UserError> {
            self.values.restore(ctx)
        }

        fn snapshot_state(&mut self, ctx: &mut StateSnapshotContext) -> Result<(), UserError> {
            self.values.snapshot(ctx);
            Ok(())
        }
    };
}

/// Keyed reduce. Streaming: emits the new aggregate after every record.
/// Batch: emits each key's final aggregate once, at the end of input (what
/// Flink's BATCH mode produces).
pub struct ReduceOp<T, K, KF: ?Sized, F> {
    pub key: Arc<KF>,
    pub reduce: Arc<F>,
    pub values: KeyedValues<K, T>,
    pub batch: bool,
}

impl<T, K, KF, F> OneInputOperator<T, T> for ReduceOp<T, K, KF, F>
where
    T: Data + Sync,
    K: StateKey + KeyHash,
    KF: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
    F: Fn(T, T) -> T + Send + Sync + 'static,
{
    keyed_values_state!();

    fn open(&mut self, ctx: &OperatorContext) -> Result<(), UserError> {
        self.batch = ctx.batch;
        Ok(())
    }

    #[inline]
    fn process_element(&mut self, record: T, out: &mut Collector<'_, T>) -> Result<(), UserError> {
        let key = (self.key)(&record);
        let reduce = &self.reduce;
        let batch = self.batch;
        self.values.with_value(&key, |slot| {
            let value = match slot.take() {
                Some(acc) => reduce(acc, record),
                None => record,
            };
            if !batch {
                out.collect(value.clone());
            }
            *slot = Some(value);
        })
    }

    fn end_input(&mut self, out: &mut Collector<'_, T>) -> Result<(), UserError> {
        if self.batch {
            for v in self.values.drain() {
                out.collect(v);
            }
        }
        Ok(())
    }
}

/// What a keyed process function sees besides the record.
pub struct KeyedContext<'a, K, S> {
    pub key: &'a K,
    /// This key's state; set it to `None` to clear it.
    pub state: &'a mut Option<S>,
    pub subtask_index: usize,
    /// Inclusive range of key groups this subtask owns.
    pub key_group_range: (usize, usize),
    max_parallelism: usize,
}

impl<K: KeyHash, S> KeyedContext<'_, K, S> {
    /// The key's key group (computed on demand: most functions never ask).
    pub fn key_group(&self) -> usize {
        key_group_for_hash(self.key.key_hash(), self.max_parallelism)
    }
}

pub struct KeyedProcessOp<K, S, KF: ?Sized, F> {
    pub key: Arc<KF>,
    pub f: Arc<F>,
    pub values: KeyedValues<K, S>,
    pub max_parallelism: usize,
    pub subtask_index: usize,
    pub key_group_range: (usize, usize),
}

impl<T, O, K, S, KF, F> OneInputOperator<T, O> for KeyedProcessOp<K, S, KF, F>
where
    T: 'static,
    O: 'static,
    K: StateKey + KeyHash,
    S: StateData,
    KF: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
    F: Fn(&mut KeyedContext<'_, K, S>, T, &mut Collector<'_, O>) -> Result<(), UserError>
        + Send
        + Sync
        + 'static,
{
    keyed_values_state!();

    fn open(&mut self, ctx: &OperatorContext) -> Result<(), UserError> {
        self.max_parallelism = ctx.max_parallelism;
        self.subtask_index = ctx.subtask_index;
        self.key_group_range = ctx.key_group_range();
        Ok(())
    }

    #[inline]
    fn process_element(&mut self, record: T, out: &mut Collector<'_, O>) -> Result<(), UserError> {
        let key = (self.key)(&record);
        let (f, subtask_index, key_group_range, max_parallelism) = (
            &self.f,
            self.subtask_index,
            self.key_group_range,
            self.max_parallelism,
        );
        self.values.with_value(&key, |slot| {
            let mut ctx = KeyedContext {
                key: &key,
                state: slot,
                subtask_index,
                key_group_range,
                max_parallelism,
            };
            f(&mut ctx, record, out)
        })?
    }
}

/// Flink's `KeyedProcessFunction` with keyed state by descriptor: `open`
/// registers the states on the subtask's keyed state backend
/// (`state.value_state(&ValueStateDescriptor::new("count"))`, as Flink's
/// `getRuntimeContext().getState(...)`), and each record is processed with
/// the backend scoped to its key (`self.count.value(state)?`,
/// `state.current_key()`). The states are part of every checkpoint and are
/// restored by key group at any parallelism; their TTL is measured in
/// processing time.
pub trait KeyedProcessFunction<K, IN, OUT>: Send + 'static {
    fn open(&mut self, _state: &mut KeyedStateBackend<K>) -> Result<(), UserError> {
        Ok(())
    }
    fn process_element(
        &mut self,
        value: IN,
        state: &mut KeyedStateBackend<K>,
        out: &mut Collector<'_, OUT>,
    ) -> Result<(), UserError>;
}

/// Runs a [`KeyedProcessFunction`] on the subtask's keyed state backend.
pub struct KeyedProcessFunctionOp<K, KF: ?Sized, F> {
    pub key: Arc<KF>,
    pub function: F,
    pub backend: KeyedStateBackend<K>,
}

impl<T, O, K, KF, F> OneInputOperator<T, O> for KeyedProcessFunctionOp<K, KF, F>
where
    T: 'static,
    O: 'static,
    K: StateKey + KeyHash,
    KF: Fn(&T) -> K + Send + Sync + ?Sized + 'static,
    F: KeyedProcessFunction<K, T, O>,
{
    fn initialize_state(&mut self, ctx: &mut StateInitializationContext) -> Result<(), UserError> {
        Ok(self.backend.restore(ctx.keyed_state())?)
    }

    fn snapshot_state(&mut self, ctx: &mut StateSnapshotContext) -> Result<(), UserError> {
        ctx.keyed_state(self.backend.snapshot());
        Ok(())
    }

    fn open(&mut self, _ctx: &OperatorContext) -> Result<(), UserError> {
        self.function.open(&mut self.backend)
    }

    #[inline]
    fn process_element(&mut self, record: T, out: &mut Collector<'_, O>) -> Result<(), UserError> {
        let key = (self.key)(&record);
        let hash = key.key_hash();
        self.backend.set_current_key(key, hash)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.backend.set_current_time(now);
        self.function
            .process_element(record, &mut self.backend, out)
    }
}

/// The co-operators of connected streams wrapping one user function per
/// input: a record of input 1 (`A`) goes to the first as `$f`, one of
/// input 2 (`B`) to the second, each as `$body` says.
macro_rules! co_fn_operators {
    ($(
        $name:ident,
        F1: ($($bound1:tt)+),
        F2: ($($bound2:tt)+),
        |$f:ident, $record:ident, $out:ident| $body:block
    )*) => {$(
        pub struct $name<F1, F2>(pub Arc<F1>, pub Arc<F2>);

        impl<A, B, O, F1, F2> TwoInputOperator<A, B, O> for $name<F1, F2>
        where
            A: 'static,
            B: 'static,
            O: 'static,
            F1: $($bound1)+ + Send + Sync + 'static,
            F2: $($bound2)+ + Send + Sync + 'static,
        {
            co_fn_operators!(@input process_element1, A, 0, |$f, $record, $out| $body);
            co_fn_operators!(@input process_element2, B, 1, |$f, $record, $out| $body);
        }
    )*};
    (@input $method:ident, $in:ident, $index:tt, |$f:ident, $record:ident, $out:ident| $body:block) => {
        fn $method(&mut self, $record: $in, $out: &mut Collector<'_, O>) -> Result<(), UserError> {
            let $f = &*self.$index;
            $body
        }
    };
}

co_fn_operators! {
    CoMapOp,
    F1: (Fn(A) -> O),
    F2: (Fn(B) -> O),
    |f, record, out| {
        out.collect(f(record));
        Ok(())
    }

    CoFlatMapOp,
    F1: (Fn(A, &mut Collector<'_, O>)),
    F2: (Fn(B, &mut Collector<'_, O>)),
    |f, record, out| {
        f(record, out);
        Ok(())
    }
}
