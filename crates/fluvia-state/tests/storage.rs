//! Checkpoint storage on a temporary directory: layout, put/get/delete,
//! errors, atomic replacement, and use without any async runtime.
#![allow(clippy::unwrap_used)]

use fluvia_state::storage::{checkpoint_dir, metadata_file, savepoint_dir, state_file};
use fluvia_state::{CheckpointStorage, StateError};

const JOB: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90";

#[test]
fn layout_follows_flink() {
    assert_eq!(checkpoint_dir(JOB, 7), format!("{JOB}/chk-7"));
    assert_eq!(metadata_file(JOB, 7), format!("{JOB}/chk-7/_metadata"));
    assert_eq!(
        state_file(JOB, 7, "op9", 2, 1),
        format!("{JOB}/chk-7/op9-2-1")
    );
    let a = savepoint_dir(JOB);
    let b = savepoint_dir(JOB);
    assert_ne!(a, b);
    let rest = a.strip_prefix("savepoint-a1b2c3-").unwrap();
    assert_eq!(rest.len(), 12);
    assert!(rest.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
}

#[test]
fn put_get_list_delete() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    let storage = CheckpointStorage::for_directory(dir.to_str().unwrap()).unwrap();
    let root = storage.root().to_str().unwrap().to_string();

    let f1 = storage
        .put(&state_file(JOB, 1, "op", 0, 0), b"state of 0".to_vec())
        .unwrap();
    assert_eq!(f1, format!("{root}/{JOB}/chk-1/op-0-0"));
    let meta = storage
        .put(&metadata_file(JOB, 1), b"meta".to_vec())
        .unwrap();
    storage
        .put(&state_file(JOB, 2, "op", 0, 0), b"newer".to_vec())
        .unwrap();

    // Relative, absolute and file:// locations name the same file.
    assert_eq!(
        storage.get(&state_file(JOB, 1, "op", 0, 0)).unwrap(),
        b"state of 0"
    );
    assert_eq!(storage.get(&f1).unwrap(), b"state of 0");
    assert_eq!(storage.get(&format!("file://{meta}")).unwrap(), b"meta");

    assert!(storage.exists(&checkpoint_dir(JOB, 1)).unwrap());
    assert!(storage.exists(&meta).unwrap());
    assert!(!storage.exists(&checkpoint_dir(JOB, 3)).unwrap());
    assert_eq!(
        storage.list(&checkpoint_dir(JOB, 1)).unwrap(),
        vec![format!("{root}/{JOB}/chk-1/_metadata"), f1.clone()]
    );

    // Discarding a subsumed checkpoint removes its directory, nothing else.
    storage.delete_dir(&checkpoint_dir(JOB, 1)).unwrap();
    assert!(!std::path::Path::new(&format!("{root}/{JOB}/chk-1")).exists());
    assert!(!storage.exists(&checkpoint_dir(JOB, 1)).unwrap());
    assert_eq!(
        storage.get(&state_file(JOB, 2, "op", 0, 0)).unwrap(),
        b"newer"
    );
    storage.delete_dir(&checkpoint_dir(JOB, 1)).unwrap();
    assert!(storage.delete_dir("").is_err());
}

#[test]
fn a_missing_file_is_an_error_naming_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::for_directory(tmp.path().to_str().unwrap()).unwrap();
    let e = storage.get(&metadata_file(JOB, 9)).unwrap_err();
    assert!(matches!(e, StateError::NotFound { .. }), "{e}");
    assert!(
        e.to_string().contains(&format!("{JOB}/chk-9/_metadata")),
        "{e}"
    );
    assert!(
        e.to_string().contains(storage.root().to_str().unwrap()),
        "{e}"
    );
}

#[test]
fn unsupported_schemes_and_foreign_paths_are_errors() {
    for dir in ["s3://bucket/ck", "hdfs://nn/ck", "gs://b/x"] {
        let e = CheckpointStorage::for_directory(dir).unwrap_err();
        assert!(matches!(e, StateError::UnsupportedScheme { .. }), "{e}");
        assert!(e.to_string().contains(dir), "{e}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}", tmp.path().join("ck").display());
    let storage = CheckpointStorage::for_directory(&url).unwrap();
    assert!(storage.root().ends_with("ck"));
    let e = storage.get("/etc/passwd").unwrap_err();
    assert!(matches!(e, StateError::InvalidLocation { .. }), "{e}");
    let e = storage.put("a/../../b", vec![]).unwrap_err();
    assert!(matches!(e, StateError::InvalidLocation { .. }), "{e}");
    assert!(storage.put("s3://x/y", vec![]).is_err());
}

#[test]
fn put_replaces_a_file_atomically() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = std::sync::Arc::new(
        CheckpointStorage::for_directory(tmp.path().to_str().unwrap()).unwrap(),
    );
    const LEN: usize = 1 << 18;
    let path = storage.put("job/chk-1/_metadata", vec![b'a'; LEN]).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Read with plain std I/O: what any other process would see.
                let bytes = std::fs::read(&path).unwrap();
                assert_eq!(bytes.len(), LEN, "a partial file was visible");
                assert!(
                    bytes.iter().all(|b| *b == bytes[0]),
                    "a mixed file was visible"
                );
                reads += 1;
            }
            reads
        })
    };
    for i in 0..60 {
        let byte = if i % 2 == 0 { b'b' } else { b'a' };
        storage.put(&path, vec![byte; LEN]).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    // No staging files are left behind.
    let names: Vec<String> = std::fs::read_dir(tmp.path().join("job/chk-1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["_metadata".to_string()]);
}

#[test]
fn works_on_a_thread_without_an_async_runtime() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap().to_string();
    // A fresh thread has no tokio runtime context, so object_store runs its
    // file I/O inline inside block_on.
    std::thread::spawn(move || {
        let storage = CheckpointStorage::for_directory(&dir).unwrap();
        let p = storage.put("x/chk-1/f", b"hello".to_vec()).unwrap();
        assert_eq!(storage.get(&p).unwrap(), b"hello");
        assert!(storage.exists("x").unwrap());
        storage.delete_dir("x").unwrap();
        assert!(!storage.exists("x").unwrap());
    })
    .join()
    .unwrap();
}
