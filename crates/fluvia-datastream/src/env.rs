//! The [`StreamExecutionEnvironment`]: job-wide settings, sources, and the
//! path from API calls to a running job (StreamGraph → JobGraph → embedded
//! runtime).

use crate::sources::{CollectionSource, GeneratorSource, TextFileSource};
use crate::stream::{DataStream, OperatorSettings};
use fluvia_core::config::options;
use fluvia_core::{Configuration, FluviaError, Result, RuntimeMode};
use fluvia_graph::{JobGraph, JobGraphGenerator, StreamGraph, StreamGraphBuilder, StreamNodeId};
use fluvia_runtime::operator::{OperatorFactory, SourceFactory};
use fluvia_runtime::{Data, JobExecutionResult, LocalExecutor, OperatorRegistry, SourceOperator};
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct EnvInner {
    pub builder: StreamGraphBuilder,
    pub registry: OperatorRegistry,
    pub config: Configuration,
    /// Misuses found while the job was written (reported at build time).
    pub deferred_errors: Vec<String>,
}

/// Entry point of a DataStream job.
#[derive(Clone)]
pub struct StreamExecutionEnvironment {
    pub(crate) inner: Rc<RefCell<EnvInner>>,
}

impl Default for StreamExecutionEnvironment {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamExecutionEnvironment {
    pub fn new() -> Self {
        Self::with_config(Configuration::new()).unwrap_or_else(|_| Self::raw(Configuration::new()))
    }

    fn raw(config: Configuration) -> Self {
        StreamExecutionEnvironment {
            inner: Rc::new(RefCell::new(EnvInner {
                builder: StreamGraphBuilder::new("Fluvia Job"),
                registry: OperatorRegistry::new(),
                config,
                deferred_errors: Vec::new(),
            })),
        }
    }

    /// An environment configured from Flink-style keys
    /// (`parallelism.default`, `pipeline.object-reuse`, ...).
    pub fn with_config(config: Configuration) -> Result<Self> {
        let env = Self::raw(config.clone());
        {
            let mut inner = env.inner.borrow_mut();
            inner.builder.default_parallelism = config.get(&options::PARALLELISM)?;
            inner.builder.default_max_parallelism = config.get(&options::MAX_PARALLELISM)?;
            inner.builder.chaining_enabled = config.get(&options::CHAINING_ENABLED)?;
            inner.builder.runtime_mode = config.get(&options::RUNTIME_MODE)?;
            config.get(&options::OBJECT_REUSE)?;
        }
        Ok(env)
    }

    pub fn set_parallelism(&self, parallelism: usize) -> &Self {
        let mut inner = self.inner.borrow_mut();
        inner.builder.default_parallelism = parallelism;
        inner.config.set_option(&options::PARALLELISM, parallelism);
        self
    }

    pub fn parallelism(&self) -> usize {
        self.inner.borrow().builder.default_parallelism
    }

    /// Number of key groups (0: derived from each operator's parallelism).
    pub fn set_max_parallelism(&self, max_parallelism: usize) -> &Self {
        self.inner.borrow_mut().builder.default_max_parallelism = max_parallelism;
        self
    }

    pub fn set_runtime_mode(&self, mode: RuntimeMode) -> &Self {
        let mut inner = self.inner.borrow_mut();
        inner.builder.runtime_mode = mode;
        inner
            .config
            .set(options::RUNTIME_MODE.key, mode.to_string());
        self
    }

    pub fn enable_object_reuse(&self) -> &Self {
        self.inner
            .borrow_mut()
            .config
            .set_option(&options::OBJECT_REUSE, true);
        self
    }

    pub fn disable_object_reuse(&self) -> &Self {
        self.inner
            .borrow_mut()
            .config
            .set_option(&options::OBJECT_REUSE, false);
        self
    }

    pub fn disable_operator_chaining(&self) -> &Self {
        let mut inner = self.inner.borrow_mut();
        inner.builder.chaining_enabled = false;
        inner.config.set_option(&options::CHAINING_ENABLED, false);
        self
    }

    pub fn set_buffer_timeout(&self, timeout: Duration) -> &Self {
        self.inner.borrow_mut().config.set(
            options::BUFFER_TIMEOUT.key,
            format!("{} ms", timeout.as_millis()),
        );
        self
    }

    /// Sets any configuration key (e.g. `taskmanager.memory.segment-size`).
    pub fn set_config(&self, key: &str, value: &str) -> &Self {
        self.inner.borrow_mut().config.set(key, value);
        self
    }

    pub fn config(&self) -> Configuration {
        self.inner.borrow().config.clone()
    }

    // ------------------------------------------------------------ sources

    /// Adds a source operator. `make` builds one instance per subtask.
    pub fn add_source<T: Data>(
        &self,
        name: &str,
        bounded: bool,
        factory: Arc<dyn OperatorFactory>,
    ) -> DataStream<T> {
        let node = {
            let mut inner = self.inner.borrow_mut();
            let node = inner.builder.add_source(format!("Source: {name}"), bounded);
            inner.registry.register(node, factory);
            node
        };
        DataStream::from_node(self.clone(), node)
    }

    /// A source from a per-subtask constructor.
    pub fn from_source<T: Data, S: SourceOperator<T>>(
        &self,
        name: &str,
        bounded: bool,
        make: impl Fn(&fluvia_runtime::OperatorContext) -> S + Send + Sync + 'static,
    ) -> DataStream<T> {
        let factory = SourceFactory::<T>::new(move |ctx| Ok(Box::new(make(ctx))));
        self.add_source(name, bounded, Arc::new(factory))
    }

    /// The elements of `items`, in order (parallelism 1 by default, as Flink's
    /// `fromCollection`; with more subtasks each takes every p-th element).
    pub fn from_collection<T: Data + Sync>(&self, items: Vec<T>) -> DataStream<T> {
        let items = Arc::new(items);
        let stream = self.from_source("Collection Source", true, move |ctx| {
            CollectionSource::new(Arc::clone(&items), ctx.subtask_index, ctx.parallelism)
        });
        stream.set_parallelism(1)
    }

    /// The numbers `from..=to`, split evenly across subtasks.
    pub fn from_sequence(&self, from: i64, to: i64) -> DataStream<i64> {
        let count = if to >= from {
            (to - from) as u64 + 1
        } else {
            0
        };
        self.generator_source("Sequence Source", count, move |i| from + i as i64)
    }

    /// `count` records `f(0) .. f(count-1)`, split evenly across subtasks.
    pub fn from_generator<T: Data>(
        &self,
        count: u64,
        f: impl Fn(u64) -> T + Send + Sync + 'static,
    ) -> DataStream<T> {
        self.generator_source("Generator Source", count, f)
    }

    fn generator_source<T: Data>(
        &self,
        name: &str,
        count: u64,
        f: impl Fn(u64) -> T + Send + Sync + 'static,
    ) -> DataStream<T> {
        let f: Arc<dyn Fn(u64) -> T + Send + Sync> = Arc::new(f);
        self.from_source(name, true, move |ctx| {
            GeneratorSource::new(Arc::clone(&f), count, ctx.subtask_index, ctx.parallelism)
        })
    }

    /// Lines of a text file; see [`read_text_files`](Self::read_text_files).
    pub fn read_text_file(&self, path: impl Into<PathBuf>) -> DataStream<String> {
        self.read_text_files(vec![path.into()])
    }

    /// Lines of text files, split into byte ranges shared out among the
    /// parallel readers. A missing file fails the job before it runs.
    pub fn read_text_files(&self, paths: Vec<PathBuf>) -> DataStream<String> {
        let name = paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let paths = Arc::new(paths);
        let check = Arc::clone(&paths);
        let factory = SourceFactory::<String>::new(move |ctx| {
            Ok(Box::new(TextFileSource::new(
                Arc::clone(&paths),
                ctx.subtask_index,
                ctx.parallelism,
            )))
        })
        .with_validation(move || TextFileSource::validate(&check));
        self.add_source(&name, true, Arc::new(factory))
    }

    // ------------------------------------------------------------ building

    pub(crate) fn register(&self, node: StreamNodeId, factory: Arc<dyn OperatorFactory>) {
        self.inner.borrow_mut().registry.register(node, factory);
    }

    pub(crate) fn defer_error(&self, message: String) {
        self.inner.borrow_mut().deferred_errors.push(message);
    }

    /// The resolved StreamGraph of everything added so far.
    pub fn stream_graph(&self, job_name: &str) -> Result<StreamGraph> {
        let mut inner = self.inner.borrow_mut();
        if let Some(e) = inner.deferred_errors.first() {
            return Err(FluviaError::Plan(e.clone()));
        }
        inner.builder.set_job_name(job_name);
        inner.builder.build()
    }

    /// The JobGraph (after chaining) of everything added so far.
    pub fn job_graph(&self, job_name: &str) -> Result<JobGraph> {
        let graph = self.stream_graph(job_name)?;
        let config = self.config();
        let object_reuse = config.get(&options::OBJECT_REUSE)?;
        JobGraphGenerator::new(&graph).create_job_graph(config, object_reuse)
    }

    /// The operator registry that goes with [`job_graph`](Self::job_graph).
    pub fn registry(&self) -> OperatorRegistry {
        self.inner.borrow().registry.clone()
    }

    /// Builds the job and runs it on the embedded runtime until it finishes.
    pub fn execute(&self, job_name: &str) -> Result<JobExecutionResult> {
        let job = self.job_graph(job_name)?;
        let registry = Arc::new(self.registry());
        LocalExecutor::new(self.config()).execute(job, registry)
    }
}
