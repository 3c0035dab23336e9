//! The task mailbox (Flink's `MailboxProcessor`): other threads ask a task
//! to do something (inject a checkpoint barrier at a source, fire timers,
//! notify a completed checkpoint) by putting a [`Mail`] into its
//! [`Mailbox`]; the task thread runs the mail between records or input
//! buffers, never concurrently with its operators, so operator state needs
//! no lock.
//!
//! The task thread checks [`Mailbox::has_mail`] (one atomic load) between
//! units of work. A task waiting for input is woken by new mail (the
//! mailbox calls the waker its input registered); a source that has nothing
//! to emit waits in [`Mailbox::wait`] and is woken by mail or by
//! [`MailboxSender::wake`].
//!
//! This module knows nothing of operators or the network: a mail acts on
//! whatever the task hands it, [`TaskControl`].

use crate::checkpoint::SubtaskCheckpointCoordinator;
use fluvia_core::{FluviaError, Result};
use fluvia_network::metrics::IoCounters;
use fluvia_network::{CheckpointBarrier, Event, PartitionWriter};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// What a mail can act on: the task's side, lent to it on the task thread.
pub struct TaskControl<'a> {
    writers: &'a [Rc<RefCell<PartitionWriter>>],
    counters: Option<&'a IoCounters>,
    checkpoints: Option<&'a mut SubtaskCheckpointCoordinator>,
}

impl<'a> TaskControl<'a> {
    pub fn new(writers: &'a [Rc<RefCell<PartitionWriter>>]) -> Self {
        TaskControl {
            writers,
            counters: None,
            checkpoints: None,
        }
    }

    /// The task takes part in checkpoints through `checkpoints`.
    pub fn with_checkpoints(
        mut self,
        checkpoints: Option<&'a mut SubtaskCheckpointCoordinator>,
    ) -> Self {
        self.checkpoints = checkpoints;
        self
    }

    /// The task's checkpointing; `None` when the job takes no checkpoints.
    pub fn checkpoints(&mut self) -> Option<&mut SubtaskCheckpointCoordinator> {
        self.checkpoints.as_deref_mut()
    }

    /// Time spent waiting for something to do counts as the task's idle
    /// time in `counters`.
    pub fn with_counters(mut self, counters: &'a IoCounters) -> Self {
        self.counters = Some(counters);
        self
    }

    /// Nothing to do (a source without data): hands over what is buffered
    /// and waits on `mailbox` for mail or a wake-up, at most `timeout`,
    /// counted as idle time.
    pub fn wait_idle(&mut self, mailbox: &Mailbox, timeout: Duration) -> Result<()> {
        self.flush()?;
        let since = std::time::Instant::now();
        mailbox.wait(timeout);
        if let Some(c) = self.counters {
            IoCounters::add(&c.idle_nanos, since.elapsed().as_nanos() as u64);
        }
        Ok(())
    }

    /// Hands every partly filled output buffer to its consumers.
    pub fn flush(&mut self) -> Result<()> {
        for w in self.writers {
            w.borrow_mut().flush_all()?;
        }
        Ok(())
    }

    /// Writes `event` to every output of the task, after the records
    /// written before it (a priority event overtakes them): how a source
    /// injects a checkpoint barrier.
    pub fn broadcast_event(&mut self, event: &Event) -> Result<()> {
        for w in self.writers {
            w.borrow_mut().broadcast_event(event)?;
        }
        Ok(())
    }
}

type Action = Box<dyn FnOnce(&mut TaskControl<'_>) -> Result<()> + Send>;

enum MailKind {
    Action(Action),
    Task(TaskMail),
}

/// Mail the task's driver acts on itself, with its operators at hand.
#[derive(Debug)]
pub enum TaskMail {
    /// An event from an operator's coordinator, for the operator at this
    /// index of the chain.
    OperatorEvent { operator: usize, event: Vec<u8> },
    /// Start checkpoint `barrier.id` here: a source injects the barrier
    /// (Flink's `triggerCheckpointAsync`).
    TriggerCheckpoint(CheckpointBarrier),
    /// A savepoint after which the job stops (stop-with-savepoint): the
    /// source emits nothing after its barrier and ends once the savepoint
    /// completes (it resumes if the savepoint is aborted).
    TriggerSynchronousSavepoint(CheckpointBarrier),
    /// Checkpoint `id` completed everywhere (`true`) or was aborted.
    NotifyCheckpoint { id: u64, complete: bool },
}

/// One action for the task thread.
pub struct Mail {
    description: String,
    kind: MailKind,
}

debug_fields!(Mail, |s| {
    description: s.description,
});

impl Mail {
    pub fn new(
        description: impl Into<String>,
        action: impl FnOnce(&mut TaskControl<'_>) -> Result<()> + Send + 'static,
    ) -> Self {
        Mail {
            description: description.into(),
            kind: MailKind::Action(Box::new(action)),
        }
    }

    /// Mail for the task's driver.
    pub fn task(mail: TaskMail) -> Self {
        let description = match &mail {
            TaskMail::OperatorEvent { operator, .. } => {
                format!("operator event for operator {operator}")
            }
            TaskMail::TriggerCheckpoint(b) => format!("trigger checkpoint {}", b.id),
            TaskMail::TriggerSynchronousSavepoint(b) => {
                format!("trigger stop-with-savepoint {}", b.id)
            }
            TaskMail::NotifyCheckpoint { id, complete: true } => {
                format!("checkpoint {id} complete")
            }
            TaskMail::NotifyCheckpoint { id, .. } => format!("checkpoint {id} aborted"),
        };
        Mail {
            description,
            kind: MailKind::Task(mail),
        }
    }

    pub fn description(&self) -> &str {
        &self.description
    }
}

#[derive(Default)]
struct Inner {
    queue: Mutex<VecDeque<Mail>>,
    /// Mails queued, readable without the lock.
    pending: AtomicUsize,
    /// A wake-up without mail (a source has something again).
    woken: AtomicBool,
    signal: Condvar,
    /// Called on every new mail: the task's input gate waker.
    waker: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
    closed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A task's mailbox; the task thread owns it, others hold a
/// [`MailboxSender`].
#[derive(Clone, Default)]
pub struct Mailbox {
    inner: Arc<Inner>,
}

debug_fields!(Mailbox, |s| {
    pending: s.inner.pending.load(Ordering::Relaxed),
});

/// Puts mail into a task's mailbox from any thread.
#[derive(Clone)]
pub struct MailboxSender {
    inner: Arc<Inner>,
}

debug_fields!(MailboxSender);

impl MailboxSender {
    /// Queues `mail` for the task thread. Fails once the task ended (its
    /// mailbox is closed): the mail would never run.
    pub fn send(&self, mail: Mail) -> Result<()> {
        {
            let mut q = lock(&self.inner.queue);
            if self.inner.closed.load(Ordering::Acquire) {
                return Err(FluviaError::Execution(format!(
                    "mail '{}' sent to a task that has ended",
                    mail.description
                )));
            }
            q.push_back(mail);
            self.inner.pending.fetch_add(1, Ordering::Release);
        }
        self.notify();
        Ok(())
    }

    /// Hands `event` from its coordinator to the chain's operator `operator`.
    pub fn send_operator_event(&self, operator: usize, event: Vec<u8>) -> Result<()> {
        self.send(Mail::task(TaskMail::OperatorEvent { operator, event }))
    }

    /// Wakes a source waiting in [`Mailbox::wait`] (it has data again).
    pub fn wake(&self) {
        {
            let _q = lock(&self.inner.queue);
            self.inner.woken.store(true, Ordering::Release);
        }
        self.notify();
    }

    fn notify(&self) {
        self.inner.signal.notify_all();
        let waker = lock(&self.inner.waker).clone();
        if let Some(w) = waker {
            w();
        }
    }
}

impl Mailbox {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn sender(&self) -> MailboxSender {
        MailboxSender {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Whether mail waits (cheap: checked between records).
    #[inline]
    pub fn has_mail(&self) -> bool {
        self.inner.pending.load(Ordering::Acquire) > 0
    }

    /// Called whenever mail arrives, so a thread blocked elsewhere (on its
    /// input gate) looks at the mailbox.
    pub fn set_waker(&self, waker: Arc<dyn Fn() + Send + Sync>) {
        *lock(&self.inner.waker) = Some(waker);
    }

    /// Runs every queued mail, in order, on this (the task) thread; mail
    /// for the driver goes to `on_mail`.
    pub fn run_pending(
        &self,
        control: &mut TaskControl<'_>,
        on_mail: &mut dyn FnMut(&mut TaskControl<'_>, TaskMail) -> Result<()>,
    ) -> Result<usize> {
        let mut ran = 0;
        while self.has_mail() {
            let mail = {
                let mut q = lock(&self.inner.queue);
                let m = q.pop_front();
                if m.is_some() {
                    self.inner.pending.fetch_sub(1, Ordering::Release);
                }
                m
            };
            let Some(mail) = mail else { break };
            tracing::trace!("running mail '{}'", mail.description);
            match mail.kind {
                MailKind::Action(action) => action(control)?,
                MailKind::Task(mail) => on_mail(control, mail)?,
            }
            ran += 1;
        }
        Ok(ran)
    }

    /// Blocks until mail arrives, the mailbox is woken, or `timeout`
    /// passes (a source with nothing to emit).
    pub fn wait(&self, timeout: Duration) {
        let q = lock(&self.inner.queue);
        if !q.is_empty() || self.inner.woken.swap(false, Ordering::AcqRel) {
            return;
        }
        let (_q, _) = self
            .inner
            .signal
            .wait_timeout(q, timeout)
            .unwrap_or_else(|e| e.into_inner());
        self.inner.woken.store(false, Ordering::Release);
    }

    /// No more mail is taken: the task ended. What is queued is dropped.
    pub fn close(&self) -> Vec<Mail> {
        let mut q = lock(&self.inner.queue);
        self.inner.closed.store(true, Ordering::Release);
        self.inner.pending.store(0, Ordering::Release);
        q.drain(..).collect()
    }
}

/// Sends a task's operator events to their coordinators: (index of the
/// operator in its chain, event). The TaskManager provides it.
#[derive(Clone)]
pub struct CoordinatorGateway(pub Arc<dyn Fn(usize, Vec<u8>) -> Result<()> + Send + Sync>);

impl std::fmt::Debug for CoordinatorGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CoordinatorGateway")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Mail sent from another thread runs on the task thread, between the
    /// units of work of a busy loop, in the order sent.
    #[test]
    fn mail_from_another_thread_runs_on_the_task_thread_between_records() {
        let mailbox = Mailbox::new();
        let sender = mailbox.sender();
        let task_thread = std::thread::current().id();
        let ran = Arc::new(Mutex::new(Vec::new()));
        let r = Arc::clone(&ran);
        let other = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            for i in 0..3 {
                let r = Arc::clone(&r);
                sender
                    .send(Mail::new(format!("mail {i}"), move |_| {
                        r.lock().unwrap().push((i, std::thread::current().id()));
                        Ok(())
                    }))
                    .unwrap();
            }
        });
        let mut records = 0u64;
        let mut ran_after = None;
        while records < 50_000_000 {
            records += 1;
            if mailbox.has_mail() {
                mailbox
                    .run_pending(&mut TaskControl::new(&[]), &mut |_, _| Ok(()))
                    .unwrap();
                if ran.lock().unwrap().len() == 3 {
                    ran_after = Some(records);
                    break;
                }
            }
        }
        other.join().unwrap();
        let ran = ran.lock().unwrap();
        assert_eq!(
            ran.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert!(ran.iter().all(|(_, t)| *t == task_thread));
        assert!(ran_after.is_some_and(|n| n > 1), "ran between records");
        // Once closed, mail is refused, not lost silently.
        mailbox.close();
        let err = mailbox
            .sender()
            .send(Mail::new("late", |_| Ok(())))
            .unwrap_err();
        assert!(err.to_string().contains("late"), "{err}");
    }

    #[test]
    fn a_waiting_source_is_woken_by_mail_or_wake() {
        let mailbox = Mailbox::new();
        let sender = mailbox.sender();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            sender.wake();
        });
        let started = std::time::Instant::now();
        mailbox.wait(Duration::from_secs(10));
        assert!(started.elapsed() < Duration::from_secs(5));
        t.join().unwrap();
    }
}
