//! [`DataStream`], [`KeyedStream`], [`ConnectedStreams`] and
//! [`DataStreamSink`]: each method adds a StreamGraph node (registering its
//! factory) and edges from the stream's upstream nodes.
//!
//! As in Flink, partitioning (`rebalance`, `broadcast`, `key_by`, ...) and
//! `union` add no node: they only change how the *next* operator's input
//! edges are drawn.

use crate::env::StreamExecutionEnvironment;
use crate::operators::*;
use fluvia_core::keygroup::KeyHash;
use fluvia_core::{ChainingStrategy, ExchangeMode, FluviaError, PartitionerKind};
use fluvia_graph::{StreamGraphBuilder, StreamNodeId};
use fluvia_runtime::operator::{OneInputFactory, OperatorFactory, TwoInputFactory};
use fluvia_runtime::output::KeyHasher;
use fluvia_runtime::{
    Collector, Data, OneInputOperator, OperatorContext, OutputTag, TwoInputOperator, UserError,
};
use std::hash::Hash;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug)]
struct Upstream {
    node: StreamNodeId,
    partitioner: Option<PartitionerKind>,
    /// The producer's side output this stream is (`get_side_output`).
    output_tag: Option<Arc<str>>,
}

impl Upstream {
    /// Adds the edge from this upstream to input `type_number` of `target`.
    fn connect(
        &self,
        builder: &mut StreamGraphBuilder,
        target: StreamNodeId,
        partitioner: Option<PartitionerKind>,
        type_number: u8,
    ) -> usize {
        let edge = builder.add_edge(
            self.node,
            target,
            partitioner,
            ExchangeMode::Undefined,
            type_number,
        );
        if let Some(tag) = &self.output_tag {
            builder.set_output_tag(edge, tag);
        }
        edge
    }
}

/// Settings of the operator a stream (or sink) comes from: Flink's
/// `SingleOutputStreamOperator` / `DataStreamSink` methods.
pub trait OperatorSettings: Sized {
    #[doc(hidden)]
    fn env(&self) -> &StreamExecutionEnvironment;
    #[doc(hidden)]
    fn operator_node(&self, what: &str) -> Option<StreamNodeId>;

    #[doc(hidden)]
    fn with_node(
        self,
        what: &str,
        f: impl FnOnce(&mut fluvia_graph::StreamGraphBuilder, StreamNodeId),
    ) -> Self {
        if let Some(node) = self.operator_node(what) {
            f(&mut self.env().inner.borrow_mut().builder, node);
        }
        self
    }

    /// The operator's display name (`Source: ` is kept for sources).
    fn name(self, name: &str) -> Self {
        self.with_node("name", |b, n| {
            let old = b.node_name(n).to_string();
            let new = match old.strip_prefix("Source: ") {
                Some(_) => format!("Source: {name}"),
                None if old.starts_with("Sink: ") => format!("Sink: {name}"),
                None => name.to_string(),
            };
            b.set_name(n, new)
        })
    }
    /// A stable id (keeps operator ids the same when the job changes).
    fn uid(self, uid: &str) -> Self {
        self.with_node("uid", |b, n| b.set_uid(n, uid))
    }
    fn set_parallelism(self, parallelism: usize) -> Self {
        self.with_node("set_parallelism", |b, n| b.set_parallelism(n, parallelism))
    }
    fn set_max_parallelism(self, max_parallelism: usize) -> Self {
        self.with_node("set_max_parallelism", |b, n| {
            b.set_max_parallelism(n, max_parallelism)
        })
    }
    fn slot_sharing_group(self, group: &str) -> Self {
        self.with_node("slot_sharing_group", |b, n| {
            b.set_slot_sharing_group(n, group)
        })
    }
    /// Neither chained to its predecessor nor to its successors.
    fn disable_chaining(self) -> Self {
        self.with_node("disable_chaining", |b, n| {
            b.set_chaining_strategy(n, ChainingStrategy::Never)
        })
    }
    /// Starts a new chain here; successors may still chain to it.
    fn start_new_chain(self) -> Self {
        self.with_node("start_new_chain", |b, n| {
            b.set_chaining_strategy(n, ChainingStrategy::Head)
        })
    }
}

/// A stream of `T`.
pub struct DataStream<T> {
    env: StreamExecutionEnvironment,
    inputs: Vec<Upstream>,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for DataStream<T> {
    fn clone(&self) -> Self {
        DataStream {
            env: self.env.clone(),
            inputs: self.inputs.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> OperatorSettings for DataStream<T> {
    fn env(&self) -> &StreamExecutionEnvironment {
        &self.env
    }
    fn operator_node(&self, what: &str) -> Option<StreamNodeId> {
        match self.inputs.as_slice() {
            [
                Upstream {
                    node,
                    partitioner: None,
                    output_tag: None,
                },
            ] => Some(*node),
            _ => {
                self.env.defer_error(format!(
                    "{what}() applies to an operator; it cannot be called on a union or \
                     a partitioned stream"
                ));
                None
            }
        }
    }
}

/// The methods that send a stream's records on by one partitioner each.
macro_rules! partitioners {
    ($($method:ident => $kind:ident),* $(,)?) => {$(
        pub fn $method(&self) -> DataStream<T> {
            self.clone().with_partitioner(PartitionerKind::$kind)
        }
    )*};
}

impl<T: Data> DataStream<T> {
    pub(crate) fn from_node(env: StreamExecutionEnvironment, node: StreamNodeId) -> Self {
        DataStream {
            env,
            inputs: vec![Upstream {
                node,
                partitioner: None,
                output_tag: None,
            }],
            _t: PhantomData,
        }
    }

    fn with_partitioner(self, p: PartitionerKind) -> Self {
        DataStream {
            inputs: self
                .inputs
                .into_iter()
                .map(|u| Upstream {
                    partitioner: Some(p),
                    ..u
                })
                .collect(),
            ..self
        }
    }

    /// Adds a one-input node fed by this stream; keyed edges get `key`.
    fn one_input<O: Data>(
        &self,
        name: &str,
        factory: Arc<dyn OperatorFactory>,
        key: Option<KeyHasher<T>>,
    ) -> DataStream<O> {
        let node = {
            let mut inner = self.env.inner.borrow_mut();
            let node = inner.builder.add_operator(name, 1);
            for up in &self.inputs {
                let partitioner = if key.is_some() {
                    Some(PartitionerKind::Hash)
                } else {
                    up.partitioner
                };
                let edge = up.connect(&mut inner.builder, node, partitioner, 0);
                if let Some(k) = &key {
                    inner.registry.register_key_hasher::<T>(edge, Arc::clone(k));
                }
            }
            node
        };
        self.env.register(node, factory);
        DataStream::from_node(self.env.clone(), node)
    }

    /// Adds a custom one-input operator; `make` builds one per subtask.
    pub fn transform<O: Data, Op: OneInputOperator<T, O>>(
        &self,
        name: &str,
        make: impl Fn(&OperatorContext) -> Op + Send + Sync + 'static,
    ) -> DataStream<O> {
        let factory = OneInputFactory::<T, O>::new(move |ctx| Ok(Box::new(make(ctx))));
        self.one_input(name, Arc::new(factory), None)
    }

    /// [`transform`](Self::transform) with the operator `op` makes of the
    /// user function `f`, which every subtask shares.
    fn transform_fn<O: Data, F: Send + Sync + 'static, Op: OneInputOperator<T, O>>(
        &self,
        name: &str,
        f: F,
        op: fn(Arc<F>) -> Op,
    ) -> DataStream<O> {
        let f = Arc::new(f);
        self.transform(name, move |_| op(Arc::clone(&f)))
    }

    pub fn map<O: Data>(&self, f: impl Fn(T) -> O + Send + Sync + 'static) -> DataStream<O> {
        self.transform_fn("Map", f, MapOp)
    }

    /// Like `map`, but the function may fail; an error fails the job and
    /// names this operator and subtask.
    pub fn try_map<O: Data>(
        &self,
        f: impl Fn(T) -> Result<O, UserError> + Send + Sync + 'static,
    ) -> DataStream<O> {
        self.transform_fn("Map", f, TryMapOp)
    }

    pub fn filter(&self, f: impl Fn(&T) -> bool + Send + Sync + 'static) -> DataStream<T> {
        self.transform_fn("Filter", f, FilterOp)
    }

    pub fn flat_map<O: Data>(
        &self,
        f: impl Fn(T, &mut Collector<'_, O>) + Send + Sync + 'static,
    ) -> DataStream<O> {
        self.transform_fn("Flat Map", f, FlatMapOp)
    }

    /// Processes each record (Flink's `ProcessFunction`): emit any number
    /// of records to the main output, and to side outputs with
    /// [`Collector::output`]; an error fails the task, naming the operator.
    pub fn process<O: Data>(
        &self,
        f: impl Fn(T, &mut Collector<'_, O>) -> Result<(), UserError> + Send + Sync + 'static,
    ) -> DataStream<O> {
        self.transform_fn("Process", f, ProcessOp)
    }

    /// Partitions by key: records with equal keys go to the same subtask
    /// (by key group, as Flink).
    pub fn key_by<K>(&self, key: impl Fn(&T) -> K + Send + Sync + 'static) -> KeyedStream<T, K>
    where
        K: KeyHash + Hash + Eq + Clone + Send + 'static,
    {
        KeyedStream {
            stream: self.clone(),
            key: Arc::new(key),
        }
    }

    /// Merges streams of the same type (no operator; the next one reads all).
    pub fn union(&self, others: &[&DataStream<T>]) -> DataStream<T> {
        let mut inputs = self.inputs.clone();
        for o in others {
            inputs.extend(o.inputs.iter().cloned());
        }
        DataStream {
            env: self.env.clone(),
            inputs,
            _t: PhantomData,
        }
    }

    /// The records this stream's operator emitted to side output `tag`
    /// with [`Collector::output`] (Flink's `getSideOutput`). Like a main
    /// output it may be chained to its consumers or go over the network.
    pub fn get_side_output<X: Data>(&self, tag: &OutputTag<X>) -> DataStream<X> {
        let inputs = match self.operator_node("get_side_output") {
            Some(node) => {
                self.env.inner.borrow_mut().registry.register_side_output(
                    node,
                    tag.id(),
                    fluvia_runtime::operator::record_type::<X>(),
                );
                vec![Upstream {
                    node,
                    partitioner: None,
                    output_tag: Some(Arc::from(tag.id())),
                }]
            }
            None => Vec::new(),
        };
        DataStream {
            env: self.env.clone(),
            inputs,
            _t: PhantomData,
        }
    }

    /// Pairs with another stream for a two-input operator.
    pub fn connect<U: Data>(&self, other: &DataStream<U>) -> ConnectedStreams<T, U> {
        ConnectedStreams {
            first: self.clone(),
            second: other.clone(),
            keys: None,
        }
    }

    partitioners! {
        forward => Forward,
        rebalance => Rebalance,
        rescale => Rescale,
        shuffle => Shuffle,
        broadcast => Broadcast,
        global => Global,
    }

    /// `concurrent`: the sink's effects are attempt-private (Flink's
    /// `SupportsConcurrentExecutionAttempts`), so speculation may run two
    /// attempts of it; otherwise never.
    fn sink(
        &self,
        name: &str,
        factory: Arc<dyn OperatorFactory>,
        concurrent: bool,
    ) -> DataStreamSink {
        let stream: DataStream<()> = self.one_input(&format!("Sink: {name}"), factory, None);
        self.env
            .inner
            .borrow_mut()
            .builder
            .set_supports_concurrent_attempts(stream.inputs[0].node, concurrent);
        DataStreamSink {
            env: self.env.clone(),
            node: stream.inputs[0].node,
        }
    }

    fn sink_with<Op: OneInputOperator<T, ()>>(
        &self,
        name: &str,
        concurrent: bool,
        make: impl Fn() -> Op + Send + Sync + 'static,
    ) -> DataStreamSink {
        self.sink(
            name,
            Arc::new(OneInputFactory::<T, ()>::new(move |_| Ok(Box::new(make())))),
            concurrent,
        )
    }

    /// Prints every record (Debug) to standard output.
    pub fn print(&self) -> DataStreamSink
    where
        T: std::fmt::Debug,
    {
        // Printed lines cannot be taken back.
        self.sink_with("Print to Std. Out", false, || PrintSink {
            prefix: String::new(),
        })
    }

    /// Gathers the records; read them with [`CollectHandle::take`] after
    /// `execute`.
    pub fn collect(&self) -> (DataStreamSink, CollectHandle<T>) {
        let data: Arc<Mutex<Vec<T>>> = Arc::new(Mutex::new(Vec::new()));
        // Named by position, so every process of the job names it alike.
        let name = self.env.next_collect_name();
        let sink_name = name.clone();
        // Only the winning attempt's records reach the client.
        let sink = self.sink_with("Collect", true, move || CollectSink {
            name: sink_name.clone(),
            local: Vec::new(),
            accumulators: None,
        });
        let target = Arc::clone(&data);
        self.env.on_result(Box::new(move |result| {
            let mut all = Vec::new();
            for bytes in result.accumulator(&name) {
                let part: Vec<T> = bincode::deserialize(bytes).map_err(|e| {
                    FluviaError::Serialization(format!("decoding the collected records: {e}"))
                })?;
                all.extend(part);
            }
            if let Ok(mut t) = target.lock() {
                t.extend(all);
            }
            Ok(())
        }));
        (sink, CollectHandle { data })
    }

    /// Writes one line per record (Display) to `path`. In BATCH mode (and
    /// in STREAMING mode without checkpointing): a file at parallelism 1,
    /// else a directory of `part-<i>` files. In STREAMING mode with
    /// checkpointing: a directory of part files committed exactly once at
    /// checkpoints (see [`TextFileSink`]).
    pub fn write_as_text(&self, path: impl Into<PathBuf>) -> DataStreamSink
    where
        T: std::fmt::Display,
    {
        self.write_as_text_with(path, FileSinkOptions::default())
    }

    /// [`write_as_text`](Self::write_as_text) with the part-file naming and
    /// rolling policy of a checkpointed streaming job.
    pub fn write_as_text_with(
        &self,
        path: impl Into<PathBuf>,
        options: FileSinkOptions,
    ) -> DataStreamSink
    where
        T: std::fmt::Display,
    {
        let path = path.into();
        self.sink_with("Text File", true, move || {
            TextFileSink::new(path.clone(), options.clone())
        })
    }

    /// Drops every record.
    pub fn discard(&self) -> DataStreamSink {
        self.sink_with("Discard", true, || DiscardSink)
    }

    /// Writes through a [`TwoPhaseCommitSink`] made by `make` for every
    /// subtask: transactions pre-committed at checkpoint barriers are
    /// committed when their checkpoint completes, and again after a
    /// restore (exactly once, Flink's `TwoPhaseCommitSinkFunction`).
    pub fn add_two_phase_commit_sink<S>(
        &self,
        make: impl Fn(&OperatorContext) -> S + Send + Sync + 'static,
    ) -> DataStreamSink
    where
        S: TwoPhaseCommitSink<T>,
    {
        self.sink(
            "Two-Phase Commit",
            Arc::new(OneInputFactory::<T, ()>::new(move |ctx| {
                Ok(Box::new(TwoPhaseCommitSinkOp::new(make(ctx))))
            })),
            false,
        )
    }

    /// Calls `f` for every record.
    pub fn add_sink(
        &self,
        f: impl Fn(T) -> Result<(), UserError> + Send + Sync + 'static,
    ) -> DataStreamSink {
        let f = Arc::new(f);
        // What a user function does is not known to be attempt-private.
        self.sink_with("Unnamed", false, move || FnSink(Arc::clone(&f)))
    }
}

/// A stream partitioned by key, for stateful operators.
pub struct KeyedStream<T, K> {
    stream: DataStream<T>,
    key: Arc<dyn Fn(&T) -> K + Send + Sync>,
}

impl<T: Data + Sync, K> KeyedStream<T, K>
where
    K: KeyHash + fluvia_state::keyed::StateKey,
{
    fn key_hasher(&self) -> KeyHasher<T> {
        let key = Arc::clone(&self.key);
        Arc::new(move |t: &T| key(t).key_hash())
    }

    fn keyed<O: Data>(&self, name: &str, factory: Arc<dyn OperatorFactory>) -> DataStream<O> {
        self.stream
            .one_input(name, factory, Some(self.key_hasher()))
    }

    /// A keyed operator that `make` builds for each subtask, given the
    /// stream's key function.
    fn keyed_op<O: Data, Op: OneInputOperator<T, O>>(
        &self,
        name: &str,
        make: impl Fn(&OperatorContext, Arc<dyn Fn(&T) -> K + Send + Sync>) -> Result<Op, UserError>
        + Send
        + Sync
        + 'static,
    ) -> DataStream<O> {
        let key = Arc::clone(&self.key);
        let factory =
            OneInputFactory::<T, O>::new(move |ctx| Ok(Box::new(make(ctx, Arc::clone(&key))?)));
        self.keyed(name, Arc::new(factory))
    }

    /// Combines the records of each key. Streaming: emits each new
    /// aggregate; batch: each key's final aggregate at the end.
    pub fn reduce(&self, f: impl Fn(T, T) -> T + Send + Sync + 'static) -> DataStream<T> {
        self.reduce_named("Keyed Reduce", f)
    }

    fn reduce_named(
        &self,
        name: &str,
        f: impl Fn(T, T) -> T + Send + Sync + 'static,
    ) -> DataStream<T> {
        let f = Arc::new(f);
        self.keyed_op("Keyed Reduce", move |ctx, key| {
            Ok(ReduceOp {
                key,
                reduce: Arc::clone(&f),
                values: KeyedValues::new(ctx, "reduce")?,
                batch: false,
            })
        })
        .name(name)
    }

    /// Running sum of one field per key (Flink's `sum(pos)`): `field` points
    /// at the field inside a record; the other fields are the first record's.
    pub fn sum<V>(&self, field: impl Fn(&mut T) -> &mut V + Send + Sync + 'static) -> DataStream<T>
    where
        V: std::ops::AddAssign + Copy,
    {
        self.reduce_named("Keyed Aggregation", move |mut acc, mut next| {
            let add = *field(&mut next);
            *field(&mut acc) += add;
            acc
        })
    }

    /// Processes each record with a [`KeyedProcessFunction`] and keyed state
    /// by descriptor (Flink's `process(KeyedProcessFunction)`); each subtask
    /// runs a clone of `function`.
    pub fn process_function<O: Data, F>(&self, function: F) -> DataStream<O>
    where
        F: KeyedProcessFunction<K, T, O> + Clone + Sync,
    {
        let key = Arc::clone(&self.key);
        let factory = OneInputFactory::<T, O>::new(move |ctx| {
            Ok(Box::new(KeyedProcessFunctionOp {
                key: Arc::clone(&key),
                function: function.clone(),
                backend: fluvia_state::KeyedStateBackend::new(
                    ctx.key_group_range(),
                    ctx.max_parallelism,
                )?,
            }))
        });
        self.keyed("KeyedProcess", Arc::new(factory))
    }

    /// Processes each record with its key's state (`Option<S>`, created
    /// empty on the first record of a key).
    pub fn process<O: Data, S: fluvia_state::keyed::StateData>(
        &self,
        f: impl Fn(&mut KeyedContext<'_, K, S>, T, &mut Collector<'_, O>) -> Result<(), UserError>
        + Send
        + Sync
        + 'static,
    ) -> DataStream<O> {
        let f = Arc::new(f);
        self.keyed_op("KeyedProcess", move |ctx, key| {
            Ok(KeyedProcessOp {
                key,
                f: Arc::clone(&f),
                values: KeyedValues::<K, S>::new(ctx, "process")?,
                max_parallelism: 1,
                subtask_index: 0,
                key_group_range: (0, 0),
            })
        })
    }
}

/// Two streams feeding one two-input operator.
pub struct ConnectedStreams<A, B> {
    first: DataStream<A>,
    second: DataStream<B>,
    keys: Option<(KeyHasher<A>, KeyHasher<B>)>,
}

impl<A: Data, B: Data> ConnectedStreams<A, B> {
    /// Partitions both inputs by key, so equal keys meet in one subtask.
    pub fn key_by<K: KeyHash + 'static>(
        self,
        key1: impl Fn(&A) -> K + Send + Sync + 'static,
        key2: impl Fn(&B) -> K + Send + Sync + 'static,
    ) -> Self {
        let h1: KeyHasher<A> = Arc::new(move |a: &A| key1(a).key_hash());
        let h2: KeyHasher<B> = Arc::new(move |b: &B| key2(b).key_hash());
        ConnectedStreams {
            keys: Some((h1, h2)),
            ..self
        }
    }

    /// Adds a custom two-input operator; `make` builds one per subtask.
    pub fn transform<O: Data, Op: TwoInputOperator<A, B, O>>(
        &self,
        name: &str,
        make: impl Fn(&OperatorContext) -> Op + Send + Sync + 'static,
    ) -> DataStream<O> {
        let env = self.first.env.clone();
        let node = {
            let mut inner = env.inner.borrow_mut();
            let node = inner.builder.add_operator(name, 2);
            let keyed = self.keys.is_some();
            let pick = |up: &Upstream| {
                if keyed {
                    Some(PartitionerKind::Hash)
                } else {
                    up.partitioner
                }
            };
            for up in &self.first.inputs {
                let e = up.connect(&mut inner.builder, node, pick(up), 1);
                if let Some((h1, _)) = &self.keys {
                    inner.registry.register_key_hasher::<A>(e, Arc::clone(h1));
                }
            }
            for up in &self.second.inputs {
                let e = up.connect(&mut inner.builder, node, pick(up), 2);
                if let Some((_, h2)) = &self.keys {
                    inner.registry.register_key_hasher::<B>(e, Arc::clone(h2));
                }
            }
            node
        };
        let factory = TwoInputFactory::<A, B, O>::new(move |ctx| Ok(Box::new(make(ctx))));
        env.register(node, Arc::new(factory));
        DataStream::from_node(env, node)
    }

    pub fn map<O: Data>(
        &self,
        f1: impl Fn(A) -> O + Send + Sync + 'static,
        f2: impl Fn(B) -> O + Send + Sync + 'static,
    ) -> DataStream<O> {
        let (f1, f2) = (Arc::new(f1), Arc::new(f2));
        self.transform("Co-Map", move |_| CoMapOp(Arc::clone(&f1), Arc::clone(&f2)))
    }

    pub fn flat_map<O: Data>(
        &self,
        f1: impl Fn(A, &mut Collector<'_, O>) + Send + Sync + 'static,
        f2: impl Fn(B, &mut Collector<'_, O>) + Send + Sync + 'static,
    ) -> DataStream<O> {
        let (f1, f2) = (Arc::new(f1), Arc::new(f2));
        self.transform("Co-Flat Map", move |_| {
            CoFlatMapOp(Arc::clone(&f1), Arc::clone(&f2))
        })
    }
}

/// The end of a stream; carries the sink operator's settings.
pub struct DataStreamSink {
    env: StreamExecutionEnvironment,
    node: StreamNodeId,
}

impl DataStreamSink {
    /// Declares that two attempts of this sink may run at once: what it
    /// writes is private to its attempt until one wins (Flink's
    /// `SupportsConcurrentExecutionAttempts`; write files through
    /// `OperatorContext::stage_file`). Speculative execution never runs a
    /// sink twice otherwise.
    pub fn set_supports_concurrent_attempts(self, supports: bool) -> Self {
        self.env
            .inner
            .borrow_mut()
            .builder
            .set_supports_concurrent_attempts(self.node, supports);
        self
    }
}

impl OperatorSettings for DataStreamSink {
    fn env(&self) -> &StreamExecutionEnvironment {
        &self.env
    }
    fn operator_node(&self, _what: &str) -> Option<StreamNodeId> {
        Some(self.node)
    }
}
