//! The threads a TaskManager runs its tasks on, kept between tasks.
//!
//! Flink starts a thread per task. On a machine with few cores a SQL job of
//! ten small tasks then pays, per task, the thread's creation, the first
//! touches of a fresh stack (glibc gives an exited thread's stack pages back
//! to the kernel), a malloc arena and a thread cache that start cold, and,
//! when the thread exits, the unmapping that interrupts the other cores to
//! flush their TLBs. A task here runs on an idle thread a previous task
//! left, and only starts a new thread when none is idle, so a task never
//! waits for another to end. Idle threads end after [`KEEP_ALIVE`], and at
//! most [`MAX_IDLE`] stay.
//!
//! The thread carries the task's name where the operating system shows it
//! (`top -H`, `perf`, `/proc/<pid>/task/*/comm`), as a thread of its own
//! would. This module knows threads only, not tasks.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long an idle thread waits for the next task before it ends.
pub const KEEP_ALIVE: Duration = Duration::from_secs(60);
/// Idle threads kept at most; a thread finding this many idle ends.
pub const MAX_IDLE: usize = 64;

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct State {
    /// Jobs handed to idle threads, not yet taken.
    queue: VecDeque<(String, Job)>,
    /// Threads waiting for a job; those beyond the queued jobs are free.
    waiting: usize,
}

/// A pool of task threads; cloning shares it.
#[derive(Clone)]
pub struct TaskThreads {
    shared: Arc<(Mutex<State>, Condvar)>,
    keep_alive: Duration,
}

impl Default for TaskThreads {
    fn default() -> Self {
        Self::with_keep_alive(KEEP_ALIVE)
    }
}

/// The process's pool: every TaskManager in it (a mini-cluster may run
/// several) hands its tasks to the same threads.
pub fn shared() -> &'static TaskThreads {
    static POOL: std::sync::LazyLock<TaskThreads> = std::sync::LazyLock::new(TaskThreads::default);
    &POOL
}

impl TaskThreads {
    pub fn with_keep_alive(keep_alive: Duration) -> Self {
        TaskThreads {
            shared: Arc::new((Mutex::new(State::default()), Condvar::new())),
            keep_alive,
        }
    }

    /// Runs `job` on an idle thread, or on a new one when none is idle.
    /// `name` is the thread's name while the job runs.
    pub fn spawn(&self, name: String, job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let job: Job = Box::new(job);
        {
            let (lock, wake) = &*self.shared;
            let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
            if state.waiting > state.queue.len() {
                state.queue.push_back((name, job));
                drop(state);
                wake.notify_one();
                return Ok(());
            }
        }
        let pool = self.clone();
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || pool.work(name, job))
            .map(|_| ())
    }

    /// Threads now waiting for a job.
    pub fn idle(&self) -> usize {
        let (lock, _) = &*self.shared;
        lock.lock().unwrap_or_else(|e| e.into_inner()).waiting
    }

    fn work(&self, first_name: String, first: Job) {
        let (lock, wake) = &*self.shared;
        let mut job = first;
        let mut name = first_name;
        let mut named = true;
        loop {
            if !named {
                set_os_thread_name(&name);
            }
            job();
            let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
            if state.waiting >= MAX_IDLE {
                return;
            }
            state.waiting += 1;
            let deadline = std::time::Instant::now() + self.keep_alive;
            let next = loop {
                if let Some(next) = state.queue.pop_front() {
                    break Some(next);
                }
                let now = std::time::Instant::now();
                if now >= deadline {
                    break None;
                }
                state = wake
                    .wait_timeout(state, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            };
            state.waiting -= 1;
            match next {
                Some((n, j)) => {
                    (name, job) = (n, j);
                    named = false;
                }
                // Timed out with nothing queued: no spawn counted on it.
                None => return,
            }
        }
    }
}

/// The name the operating system shows for the calling thread (Linux keeps
/// 15 bytes). `std::thread::current().name()` keeps the thread's first name.
#[cfg(target_os = "linux")]
fn set_os_thread_name(name: &str) {
    let mut bytes: Vec<u8> = name.bytes().filter(|&b| b != 0).take(15).collect();
    // Cut on a character boundary so the shown name stays valid UTF-8.
    while std::str::from_utf8(&bytes).is_err() {
        bytes.pop();
    }
    bytes.push(0);
    // SAFETY: `bytes` is NUL-terminated and outlives the call; PR_SET_NAME
    // copies at most 16 bytes from it.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, bytes.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(not(target_os = "linux"))]
fn set_os_thread_name(_name: &str) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn thread_id_of(pool: &TaskThreads, name: &str) -> std::thread::ThreadId {
        let (tx, rx) = mpsc::channel();
        pool.spawn(name.into(), move || {
            let _ = tx.send(std::thread::current().id());
        })
        .expect("spawn");
        rx.recv_timeout(Duration::from_secs(10)).expect("job ran")
    }

    fn wait_idle(pool: &TaskThreads, n: usize) {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while pool.idle() != n {
            assert!(std::time::Instant::now() < until, "idle {}", pool.idle());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_task_after_another_runs_on_the_thread_it_left() {
        let pool = TaskThreads::default();
        let first = thread_id_of(&pool, "first");
        wait_idle(&pool, 1);
        let second = thread_id_of(&pool, "second");
        assert_eq!(first, second);
        wait_idle(&pool, 1);
    }

    #[test]
    fn tasks_that_run_together_each_get_a_thread() {
        let pool = TaskThreads::default();
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let (tx, rx) = mpsc::channel();
        for i in 0..4 {
            let (barrier, tx) = (Arc::clone(&barrier), tx.clone());
            // Each waits for all four: with fewer threads than tasks this
            // would never return.
            pool.spawn(format!("t{i}"), move || {
                barrier.wait();
                let _ = tx.send(std::thread::current().id());
            })
            .expect("spawn");
        }
        let ids: std::collections::HashSet<_> = (0..4)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).expect("all ran"))
            .collect();
        assert_eq!(ids.len(), 4);
        wait_idle(&pool, 4);
    }

    #[test]
    fn an_idle_thread_ends_after_its_keep_alive() {
        let pool = TaskThreads::with_keep_alive(Duration::from_millis(20));
        let first = thread_id_of(&pool, "first");
        wait_idle(&pool, 1);
        wait_idle(&pool, 0);
        let second = thread_id_of(&pool, "second");
        assert_ne!(first, second);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_reused_thread_shows_the_name_of_its_task() {
        let pool = TaskThreads::default();
        let comm = |name: &str| {
            let (tx, rx) = mpsc::channel();
            pool.spawn(name.into(), move || {
                let tid = unsafe { libc::gettid() };
                let _ = tx.send(std::fs::read_to_string(format!(
                    "/proc/self/task/{tid}/comm"
                )));
            })
            .expect("spawn");
            rx.recv_timeout(Duration::from_secs(10))
                .expect("job ran")
                .expect("comm")
        };
        assert_eq!(comm("Source: item (1/2)").trim_end(), "Source: item (1");
        wait_idle(&pool, 1);
        assert_eq!(comm("Sink: collect").trim_end(), "Sink: collect");
    }
}
