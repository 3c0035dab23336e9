//! Checkpoint storage on a file system, in Flink's `FsCheckpointStorage`
//! layout, through `object_store`'s local file system:
//!
//! ```text
//! <dir>/<job-id>/chk-<n>/_metadata                       the checkpoint's metadata
//! <dir>/<job-id>/chk-<n>/<operator-id>-<subtask>-<attempt>  one subtask's state file
//! <dir>/savepoint-<first 6 of job id>-<12 random hex>/   a savepoint
//! ```
//!
//! Every call blocks (`futures::executor::block_on`), so task threads and
//! the coordinator need no async runtime. `LocalFileSystem` runs its file
//! I/O inline when no tokio runtime is current; inside one it hands the
//! I/O to tokio's blocking pool, which still completes under `block_on`,
//! but blocks that worker thread while it waits.
//!
//! Writes are atomic: `LocalFileSystem::put` writes a staging file next to
//! the target (`<name>#<n>`) and renames it into place, so a reader sees
//! the old file or the whole new one, never a part.
//!
//! This module knows paths and bytes, not what the bytes mean.

use crate::error::{Result, StateError};
use futures::executor::block_on;
use futures::{StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The directory of checkpoint `n` of a job, relative to the storage root.
pub fn checkpoint_dir(job_id: &str, checkpoint: u64) -> String {
    format!("{job_id}/chk-{checkpoint}")
}

/// The metadata file of checkpoint `n`, relative to the storage root.
pub fn metadata_file(job_id: &str, checkpoint: u64) -> String {
    format!("{}/_metadata", checkpoint_dir(job_id, checkpoint))
}

/// The state file of one subtask attempt in checkpoint `n`, relative to
/// the storage root.
pub fn state_file(
    job_id: &str,
    checkpoint: u64,
    operator_id: &str,
    subtask: usize,
    attempt: u32,
) -> String {
    format!(
        "{}/{operator_id}-{subtask}-{attempt}",
        checkpoint_dir(job_id, checkpoint)
    )
}

/// A new savepoint directory name, relative to the savepoint root:
/// `savepoint-<first 6 of job id>-<12 random hex>` (Flink's naming).
pub fn savepoint_dir(job_id: &str) -> String {
    let prefix: String = job_id.chars().take(6).collect();
    format!("savepoint-{prefix}-{:012x}", random_48_bits())
}

/// 48 bits unlikely to repeat: the process's randomly keyed hasher over the
/// time, a counter and the process id (no random-number crate needed).
fn random_48_bits() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    h.write_u128(nanos);
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish() & 0xffff_ffff_ffff
}

/// Checkpoint and savepoint files under one directory.
#[derive(Debug)]
pub struct CheckpointStorage {
    /// The directory as given (made absolute), and canonical: absolute
    /// locations may name either.
    given_root: PathBuf,
    root: PathBuf,
    store: LocalFileSystem,
}

impl CheckpointStorage {
    /// Storage under `dir`, a local path or a `file://` URL; the directory
    /// is created if missing. Other schemes are an error.
    pub fn for_directory(dir: &str) -> Result<Self> {
        let path = local_path(dir)?;
        let given_root = if path.is_absolute() {
            path
        } else {
            std::env::current_dir()
                .map_err(|e| storage_error(dir, e))?
                .join(path)
        };
        std::fs::create_dir_all(&given_root).map_err(|e| storage_error(dir, e))?;
        let root = std::fs::canonicalize(&given_root).map_err(|e| storage_error(dir, e))?;
        let store = LocalFileSystem::new_with_prefix(&root)
            .map_err(|e| storage_error(dir, e))?
            // Deleting a directory's last file removes the emptied
            // directories up to (not including) the root.
            .with_automatic_cleanup(true);
        Ok(CheckpointStorage {
            given_root,
            root,
            store,
        })
    }

    /// The storage's directory (canonical).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The absolute path of a location (relative to the root, absolute
    /// under it, or a `file://` URL under it).
    pub fn resolve(&self, location: &str) -> Result<String> {
        let rel = self.relative(location)?;
        Ok(self.absolute(&rel))
    }

    /// Writes `bytes` to `location` atomically, replacing any file there,
    /// and returns its absolute path (what `_metadata` should record).
    pub fn put(&self, location: &str, bytes: Vec<u8>) -> Result<String> {
        let rel = self.relative(location)?;
        let abs = self.absolute(&rel);
        block_on(self.store.put(&rel, PutPayload::from(bytes)))
            .map_err(|e| object_error(&abs, e))?;
        tracing::debug!(path = %abs, "wrote state file");
        Ok(abs)
    }

    /// The bytes of the file at `location`; a missing file is
    /// [`StateError::NotFound`] naming its path.
    pub fn get(&self, location: &str) -> Result<Vec<u8>> {
        let rel = self.relative(location)?;
        let abs = self.absolute(&rel);
        let bytes = block_on(async { self.store.get(&rel).await?.bytes().await })
            .map_err(|e| object_error(&abs, e))?;
        Ok(bytes.to_vec())
    }

    /// Whether a file, or a directory holding files, is at `location`.
    pub fn exists(&self, location: &str) -> Result<bool> {
        let rel = self.relative(location)?;
        let abs = self.absolute(&rel);
        match block_on(self.store.head(&rel)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => {
                let first = block_on(self.store.list(Some(&rel)).try_next())
                    .map_err(|e| object_error(&abs, e))?;
                Ok(first.is_some())
            }
            Err(e) => Err(object_error(&abs, e)),
        }
    }

    /// The absolute paths of the files under `location`, sorted.
    pub fn list(&self, location: &str) -> Result<Vec<String>> {
        let rel = self.relative(location)?;
        let abs = self.absolute(&rel);
        let metas: Vec<_> = block_on(self.store.list(Some(&rel)).try_collect())
            .map_err(|e| object_error(&abs, e))?;
        let mut paths: Vec<String> = metas.iter().map(|m| self.absolute(&m.location)).collect();
        paths.sort();
        Ok(paths)
    }

    /// Deletes the file at `location`.
    pub fn delete(&self, location: &str) -> Result<()> {
        let rel = self.relative(location)?;
        let abs = self.absolute(&rel);
        block_on(self.store.delete(&rel)).map_err(|e| object_error(&abs, e))
    }

    /// Deletes a directory and everything in it (discarding a subsumed
    /// checkpoint). A missing directory is not an error.
    pub fn delete_dir(&self, location: &str) -> Result<()> {
        let rel = self.relative(location)?;
        if rel.as_ref().is_empty() {
            return Err(StateError::InvalidLocation {
                location: location.to_string(),
                reason: "refusing to delete the storage root".into(),
            });
        }
        let abs = self.absolute(&rel);
        let files = self.store.list(Some(&rel)).map_ok(|m| m.location).boxed();
        block_on(
            self.store
                .delete_stream(files)
                .try_for_each(|_| futures::future::ready(Ok(()))),
        )
        .map_err(|e| object_error(&abs, e))?;
        // Listing skips staging files of interrupted writes, and empty
        // directories hold no objects; remove what is left.
        match std::fs::remove_dir_all(&abs) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(storage_error(&abs, e)),
        }
    }

    fn absolute(&self, rel: &StorePath) -> String {
        if rel.as_ref().is_empty() {
            return self.root.to_string_lossy().into_owned();
        }
        self.root.join(rel.as_ref()).to_string_lossy().into_owned()
    }

    /// The store path of a location.
    fn relative(&self, location: &str) -> Result<StorePath> {
        let invalid = |reason: String| StateError::InvalidLocation {
            location: location.to_string(),
            reason,
        };
        let path = local_path(location)?;
        let rel: PathBuf = if path.is_absolute() {
            match path
                .strip_prefix(&self.root)
                .or_else(|_| path.strip_prefix(&self.given_root))
            {
                Ok(rel) => rel.to_path_buf(),
                Err(_) => {
                    return Err(invalid(format!(
                        "outside the checkpoint directory {}",
                        self.root.display()
                    )));
                }
            }
        } else {
            path
        };
        let rel = rel
            .to_str()
            .ok_or_else(|| invalid("not UTF-8".into()))?
            .trim_end_matches('/');
        StorePath::parse(rel).map_err(|e| invalid(e.to_string()))
    }
}

/// The local path of a location: the location itself, or the path of a
/// `file://` URL. Any other scheme is an error.
fn local_path(location: &str) -> Result<PathBuf> {
    if let Some(rest) = location.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(StateError::InvalidLocation {
                location: location.to_string(),
                reason: "a file URL must be absolute (file:///path)".into(),
            });
        }
        return Ok(PathBuf::from(rest));
    }
    if location.contains("://") {
        return Err(StateError::UnsupportedScheme {
            location: location.to_string(),
        });
    }
    Ok(PathBuf::from(location))
}

fn storage_error(
    path: impl std::fmt::Display,
    e: impl std::error::Error + Send + Sync + 'static,
) -> StateError {
    StateError::Storage {
        path: path.to_string(),
        source: Box::new(e),
    }
}

fn object_error(path: &str, e: object_store::Error) -> StateError {
    match e {
        object_store::Error::NotFound { .. } => StateError::NotFound {
            path: path.to_string(),
        },
        e => storage_error(path, e),
    }
}
