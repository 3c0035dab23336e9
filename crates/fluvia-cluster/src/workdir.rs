//! A process's working directory under `io.tmp.dirs`:
//! `<base>/fluvia-<role>-<id>/`, held with a file lock for the life of the
//! process and removed when it ends. At start, the directories of processes
//! of the same role that died without cleaning up (their lock is free) are
//! removed: what a crashed TaskManager spilled is garbage once the
//! JobManager re-ran it elsewhere.

use fluvia_core::config::options;
use fluvia_core::{Configuration, FluviaError, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// `io.tmp.dirs`, or the system temp directory.
pub fn tmp_base(config: &Configuration) -> Result<PathBuf> {
    let base = config.get(&options::TMP_DIRS)?;
    Ok(if base.is_empty() {
        std::env::temp_dir()
    } else {
        PathBuf::from(base)
    })
}

/// Opens (creating) `dir/LOCK` and takes its exclusive lock; `None` when
/// another live process holds it.
pub fn try_lock_dir(dir: &Path) -> Result<Option<File>> {
    let file = open_lock_file(&dir.join("LOCK"))?;
    Ok(file.try_lock().is_ok().then_some(file))
}

fn open_lock_file(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| FluviaError::io(format!("opening {}", path.display()), e))
}

#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
    _lock: File,
}

impl WorkDir {
    /// Creates and locks `<base>/fluvia-<role>-<id>`, first removing the
    /// unlocked directories other `role` processes left in `base`.
    pub fn claim(base: &Path, role: &str, id: &str) -> Result<Self> {
        std::fs::create_dir_all(base)
            .map_err(|e| FluviaError::io(format!("creating {}", base.display()), e))?;
        // One claim at a time: a directory created but not locked yet must
        // not look abandoned to a process starting beside it.
        let scan_path = base.join(format!("fluvia-{role}.lock"));
        let scan = open_lock_file(&scan_path)?;
        scan.lock()
            .map_err(|e| FluviaError::io(format!("locking {}", scan_path.display()), e))?;
        let prefix = format!("fluvia-{role}-");
        if let Ok(entries) = std::fs::read_dir(base) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let path = e.path();
                if !name.starts_with(&prefix) || !path.is_dir() {
                    continue;
                }
                // Holding the lock proves its owner is gone.
                if let Ok(Some(_held)) = try_lock_dir(&path) {
                    tracing::info!("removing {} left by a stopped {role}", path.display());
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
        }
        let path = base.join(format!("{prefix}{id}"));
        std::fs::create_dir_all(&path)
            .map_err(|e| FluviaError::io(format!("creating {}", path.display()), e))?;
        let lock = try_lock_dir(&path)?.ok_or_else(|| {
            FluviaError::Config(format!("{} is in use by another process", path.display()))
        })?;
        Ok(WorkDir { path, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_owners_directory_is_removed_and_a_live_ones_kept() {
        let base = tempfile::tempdir().expect("temp dir");
        // A directory whose owner died: no lock held.
        let stale = base.path().join("fluvia-tm-old");
        std::fs::create_dir_all(&stale).expect("dir");
        std::fs::write(stale.join("x.shuffle.data"), b"garbage").expect("file");
        let live = WorkDir::claim(base.path(), "tm", "a").expect("claim a");
        assert!(!stale.exists(), "stale directory removed");
        std::fs::write(live.path().join("y.shuffle.data"), b"data").expect("file");
        let other = WorkDir::claim(base.path(), "tm", "b").expect("claim b");
        assert!(
            live.path().join("y.shuffle.data").exists(),
            "a live one is kept"
        );
        let (a, b) = (live.path().to_path_buf(), other.path().to_path_buf());
        drop(live);
        drop(other);
        assert!(!a.exists() && !b.exists(), "removed when the process ends");
    }
}
