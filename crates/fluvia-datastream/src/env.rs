//! The [`StreamExecutionEnvironment`]: job-wide settings, sources, and the
//! path from API calls to a running job (StreamGraph → JobGraph → a cluster:
//! the embedded mini-cluster, or a running one in application mode).

use fluvia_cluster::program::{ProgramCatalog, ProgramSpec};
use fluvia_core::config::options;
use fluvia_core::{Configuration, FluviaError, Result, RuntimeMode};
use fluvia_graph::{JobGraph, JobGraphGenerator, StreamGraph, StreamGraphBuilder, StreamNodeId};
use fluvia_runtime::operator::OperatorFactory;
use fluvia_runtime::{JobExecutionResult, OperatorRegistry, validate_job};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct EnvInner {
    pub builder: StreamGraphBuilder,
    pub registry: OperatorRegistry,
    pub config: Configuration,
    /// Misuses found while the job was written (reported at build time).
    pub deferred_errors: Vec<String>,
    /// Collect sinks so far (they are named by position).
    pub collects: usize,
    /// What to do with a finished job's result (fill collect handles).
    pub result_readers: Vec<ResultReader>,
    /// Set by [`crate::app`]: how this program runs on a cluster.
    pub application: Option<Application>,
}

/// Reads what a finished job handed back.
pub type ResultReader = Box<dyn Fn(&JobExecutionResult) -> Result<()>>;

/// A program in application mode: the spec every process rebuilds the job
/// from, the fingerprint of the binary, and where to submit it.
#[derive(Debug, Clone)]
pub struct Application {
    pub spec: ProgramSpec,
    pub fingerprint: String,
    /// A running JobManager (`host:port`); none: the embedded mini-cluster.
    pub jobmanager: Option<String>,
}

/// This process's own job, for the embedded mini-cluster's TaskManagers
/// (they share the registry, closures and all).
struct InProcessCatalog {
    graph: JobGraph,
    registry: OperatorRegistry,
    fingerprint: String,
}

impl ProgramCatalog for InProcessCatalog {
    fn build(&self, _spec: &ProgramSpec) -> Result<(JobGraph, OperatorRegistry)> {
        Ok((self.graph.clone(), self.registry.clone()))
    }

    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }
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
                collects: 0,
                result_readers: Vec::new(),
                application: None,
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
        // Chosen by the user: kept as it is (the adaptive batch scheduler
        // decides only parallelisms nobody set).
        inner.builder.default_parallelism_configured = true;
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

    // ------------------------------------------------------------ building

    pub(crate) fn register(&self, node: StreamNodeId, factory: Arc<dyn OperatorFactory>) {
        self.inner.borrow_mut().registry.register(node, factory);
    }

    pub(crate) fn next_collect_name(&self) -> String {
        let mut inner = self.inner.borrow_mut();
        inner.collects += 1;
        format!("collect-{}", inner.collects)
    }

    pub(crate) fn on_result(&self, reader: ResultReader) {
        self.inner.borrow_mut().result_readers.push(reader);
    }

    /// Runs this program's jobs in application mode (see [`crate::app`]).
    pub fn set_application(&self, application: Application) -> &Self {
        self.inner.borrow_mut().application = Some(application);
        self
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

    /// Builds the job and runs it until it finishes: on the embedded
    /// mini-cluster (a JobManager and TaskManagers in this process, over
    /// loopback, exactly as a real cluster), or, in application mode with a
    /// JobManager address, on that cluster. Collect handles are filled from
    /// the finished job's report.
    pub fn execute(&self, job_name: &str) -> Result<JobExecutionResult> {
        let job = self.job_graph(job_name)?;
        let registry = self.registry();
        validate_job(&job, &registry)?;
        let config = self.config();
        let application = self.inner.borrow().application.clone();
        let started = std::time::Instant::now();
        let graph = job.clone();
        let status = run_on_runtime(async move {
            match application {
                Some(Application {
                    spec,
                    fingerprint,
                    jobmanager: Some(address),
                }) => {
                    let secret = fluvia_cluster::config::cluster_secret(&config)?;
                    let mut client =
                        fluvia_cluster::client::ClusterClient::connect(&address, secret).await?;
                    let id = client.submit(&spec, &graph, &fingerprint).await?;
                    client.wait(&id).await
                }
                app => {
                    let spec = app.map(|a| a.spec).unwrap_or(ProgramSpec {
                        name: graph.name.clone(),
                        args: Vec::new(),
                    });
                    let catalog = Arc::new(InProcessCatalog {
                        fingerprint: format!("in-process-{}", graph.fingerprint),
                        graph: graph.clone(),
                        registry,
                    });
                    fluvia_cluster::minicluster::run_job(&config, catalog, &spec, &graph).await
                }
            }
        })?;
        let result = fluvia_cluster::client::job_result(&job, &status, started.elapsed())?;
        let inner = self.inner.borrow();
        for read in &inner.result_readers {
            read(&result)?;
        }
        Ok(result)
    }
}

/// Runs `future` on its own thread (so `execute` works from inside another
/// async runtime too) with [`fluvia_cluster::block_on`].
fn run_on_runtime<T: Send + 'static>(
    future: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    std::thread::Builder::new()
        .name("fluvia-client".into())
        .spawn(move || fluvia_cluster::block_on(future)?)
        .map_err(|e| FluviaError::io("starting the client thread", e))?
        .join()
        .map_err(|_| FluviaError::Internal("the client thread panicked".into()))?
}
