//! How the process's allocator hands memory back to the kernel.
//!
//! glibc's malloc returns the free top of a heap to the kernel once it is
//! larger than a trim threshold, and serves blocks above an mmap threshold
//! from pages of their own that go back on `free`. Both start low (128 KiB)
//! and only the second adapts. A job's tasks free whole hash tables,
//! collected build sides and decoded batches when they end, and the next
//! task (or the next job in the same TaskManager) allocates as much again: the
//! pages go back and are faulted in anew, zeroed by the kernel. Measured on
//! small TPC-DS statements, the page faults were a sixth of the process's
//! CPU. Raising both thresholds keeps that memory in the process's heaps for
//! the next task. Blocks of 32 MiB and more still get pages of their own, and
//! a heap keeps at most 128 MiB free at its top.
//!
//! This module knows the C library only; the binaries call [`tune`] first
//! thing. A `GLIBC_TUNABLES` in the environment (not empty) is the operator's
//! choice and wins: then nothing is changed.

/// Largest free top of a heap kept for the next allocation.
pub const TRIM_THRESHOLD: usize = 128 << 20;
/// Smallest block served from pages of its own (glibc's own ceiling for its
/// adaptive threshold on 64-bit).
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Whether the thresholds were set (false: not glibc, or `GLIBC_TUNABLES`
/// is set, or the C library refused them).
pub fn tune() -> bool {
    if std::env::var_os("GLIBC_TUNABLES").is_some_and(|t| !t.is_empty()) {
        return false;
    }
    set_thresholds()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> bool {
    let (Ok(trim), Ok(mmap)) = (
        libc::c_int::try_from(TRIM_THRESHOLD),
        libc::c_int::try_from(MMAP_THRESHOLD),
    ) else {
        return false;
    };
    // SAFETY: `mallopt` only sets two of malloc's parameters; it takes
    // malloc's own lock and is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1
            && libc::mallopt(libc::M_MMAP_THRESHOLD, mmap) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> bool {
    false
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Minor page faults of the calling thread so far.
    fn faults() -> i64 {
        // SAFETY: `getrusage` writes one `rusage` it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        assert_eq!(rc, 0, "getrusage");
        usage.ru_minflt
    }

    #[test]
    fn memory_a_task_freed_is_reused_without_faulting_its_pages_in_again() {
        if std::env::var_os("GLIBC_TUNABLES").is_some_and(|t| !t.is_empty()) {
            return;
        }
        assert!(tune(), "glibc accepts both thresholds");
        // A thread of its own, as a task has: its own heap, nothing else on it.
        let refaulted = std::thread::spawn(|| {
            const BYTES: usize = 16 << 20;
            let first = vec![1u8; BYTES];
            std::hint::black_box(&first);
            drop(first);
            let before = faults();
            let second = vec![2u8; BYTES];
            std::hint::black_box(&second);
            faults() - before
        })
        .join()
        .expect("thread");
        // 16 MiB is 4096 pages: without the thresholds the block is
        // unmapped on `free` and every page faults in again.
        assert!(refaulted < 256, "{refaulted} pages faulted in again");
    }
}
