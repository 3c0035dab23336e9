//! `COPY ... TO` through attempt-private files: an [`ObjectStore`] in front
//! of the local file system that writes every object a fragment creates
//! under the staged name the runtime gives it
//! ([`fluvia_runtime::operator::staged_name`]) and records it in the task's
//! staged files, so DataFusion's file sinks (CSV, Parquet, JSON, Arrow; one
//! file or a directory of them) are committed like the other sinks: renamed
//! into place only for the winning attempt, once the job finished.
//!
//! It knows nothing of scheduling; it only maps names. Reads of an object
//! this attempt wrote see the staged file; everything else passes through.

use datafusion::common::Result as DfResult;
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::object_store::local::LocalFileSystem;
use datafusion::object_store::path::Path;
use datafusion::object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use fluvia_runtime::operator::{StagedFile, StagedFiles, staged_name};
use futures::stream::BoxStream;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use url::Url;

/// The local file system, with writes staged for one attempt.
#[derive(Debug)]
pub struct StagingStore {
    inner: LocalFileSystem,
    attempt: u32,
    staged: StagedFiles,
    /// Object written → its staged object.
    written: Mutex<HashMap<Path, Path>>,
}

impl StagingStore {
    pub fn new(attempt: u32, staged: StagedFiles) -> Self {
        StagingStore {
            inner: LocalFileSystem::new(),
            attempt,
            staged,
            written: Mutex::new(HashMap::new()),
        }
    }

    /// The staged object for a new object at `location`, recorded.
    fn stage(&self, location: &Path) -> Result<Path> {
        let name = location
            .filename()
            .ok_or_else(|| generic(location, "has no file name"))?;
        let staged_file = staged_name(name, self.attempt);
        let parent: Vec<_> = location.parts().collect();
        let staged = Path::from_iter(
            parent[..parent.len().saturating_sub(1)]
                .iter()
                .cloned()
                .chain(std::iter::once(staged_file.as_str().into())),
        );
        let utf8 = |p: &Path| -> Result<String> {
            let fs = self.inner.path_to_filesystem(p)?;
            fs.to_str()
                .map(str::to_string)
                .ok_or_else(|| generic(p, "is not UTF-8"))
        };
        let file = StagedFile {
            pending: utf8(&staged)?,
            target: utf8(location)?,
        };
        self.staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(file);
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(location.clone(), staged.clone());
        Ok(staged)
    }

    /// Where `location` is read from: its staged object if this attempt
    /// wrote it.
    fn resolve(&self, location: &Path) -> Path {
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(location)
            .cloned()
            .unwrap_or_else(|| location.clone())
    }
}

fn generic(location: &Path, what: &str) -> datafusion::object_store::Error {
    datafusion::object_store::Error::Generic {
        store: "fluvia staging",
        source: format!("output path '{location}' {what}").into(),
    }
}

impl std::fmt::Display for StagingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StagingStore(attempt {}, {})", self.attempt, self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for StagingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let staged = self.stage(location)?;
        self.inner.put_opts(&staged, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let staged = self.stage(location)?;
        self.inner.put_multipart_opts(&staged, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(&self.resolve(location), options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let from = self.resolve(from);
        let to = self.stage(to)?;
        self.inner.copy_opts(&from, &to, options).await
    }
}

/// Hands out the staging store for `file://` URLs and the session's stores
/// for the others (which are written in place).
#[derive(Debug)]
pub struct StagingRegistry {
    inner: Arc<dyn ObjectStoreRegistry>,
    local: Arc<StagingStore>,
}

impl StagingRegistry {
    pub fn new(inner: Arc<dyn ObjectStoreRegistry>, local: StagingStore) -> Self {
        StagingRegistry {
            inner,
            local: Arc::new(local),
        }
    }
}

impl ObjectStoreRegistry for StagingRegistry {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        if url.scheme() == "file" {
            return Ok(Arc::clone(&self.local) as Arc<dyn ObjectStore>);
        }
        self.inner.get_store(url)
    }
}

/// Whether `plan` writes files (a `COPY ... TO` or an insert into a file
/// table): then its task runs with a [`StagingRegistry`].
pub fn writes_files(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> bool {
    plan.downcast_ref::<datafusion::datasource::sink::DataSinkExec>()
        .is_some()
        || plan.children().into_iter().any(writes_files)
}
