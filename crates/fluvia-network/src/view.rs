//! Subpartition views: one consumer's read of a range `[first, last]` of the
//! subpartitions of one result partition (Flink's `ResultSubpartitionView`).
//!
//! Every consumer gets its own view, so a blocking partition can be read by
//! several consumers at once (a re-run consumer, a speculative attempt, the
//! consumers of a broadcast). Each buffer a view hands out carries the
//! subpartition it belongs to: records never cross from one subpartition's
//! buffers into another's, and the consumer reassembles them per
//! subpartition. The view ends with one `EndOfPartition` for the whole range.
//!
//! The server serves a remote consumer from a view under its credit; a
//! [`LocalInputChannel`] serves a consumer on the same TaskManager.

use crate::buffer::lock_state;
use crate::gate::{InputChannel, Polled};
use crate::partition::{AvailabilityListener, BufferOrEvent, CreditPoll, NextKind, Subpartition};
use crate::{Event, ResultPartition};
use fluvia_core::{FluviaError, Result};
use std::sync::{Arc, Mutex, OnceLock};

/// The outcome of [`SubpartitionView::poll`].
#[derive(Debug)]
pub enum ViewPoll {
    /// Nothing readable now; the view's listener is told when there is.
    Nothing,
    /// The next element is data and there is no credit for it.
    NeedsCredit,
    Item {
        item: BufferOrEvent,
        /// The subpartition the buffer belongs to (absolute index).
        subpartition: u32,
        /// What follows (`Data` may be a guess: polling again is harmless).
        next: NextKind,
    },
}

/// One consumer's read of a subpartition range.
pub trait SubpartitionView: Send + Sync + std::fmt::Debug {
    /// Takes the next buffer or the final event. `credit` is how many data
    /// buffers the consumer can take now: 0 lets only the event through; a
    /// view that reads from disk reads ahead that many.
    fn poll(&self, credit: u32) -> Result<ViewPoll>;
    /// Data buffers still to come (Flink's backlog).
    fn backlog(&self) -> usize;
    /// The consumer reads no more (Flink's `releaseAllResources`): a
    /// pipelined producer stops holding data for it. A blocking partition
    /// keeps its data.
    fn release(&self) {}
    /// The consumer polls for data for the first time: a pipelined producer
    /// waiting for demand starts.
    fn demand(&self) {}
}

/// A range over pipelined or hash-blocking subpartitions: one cursor that
/// visits the range's subpartitions round robin.
#[derive(Debug)]
pub struct SubpartitionRangeView {
    first: u32,
    subpartitions: Vec<Arc<Subpartition>>,
    /// This view's generation at each subpartition.
    generations: Vec<u64>,
    state: Mutex<RangeState>,
}

#[derive(Debug)]
struct RangeState {
    finished: Vec<bool>,
    next: usize,
}

impl SubpartitionRangeView {
    /// Attaches to `subpartitions` (whose first index is `first`); data
    /// arriving is told to `listener` as `channel`.
    pub fn attach(
        first: u32,
        subpartitions: Vec<Arc<Subpartition>>,
        listener: Arc<dyn AvailabilityListener>,
        channel: usize,
    ) -> Arc<Self> {
        let n = subpartitions.len();
        let generations = subpartitions
            .iter()
            .map(|sp| sp.set_listener(Arc::clone(&listener), channel))
            .collect();
        let view = Arc::new(SubpartitionRangeView {
            first,
            subpartitions,
            generations,
            state: Mutex::new(RangeState {
                finished: vec![false; n],
                next: 0,
            }),
        });
        // A notification that came before the view existed found nothing
        // to poll: tell the listener again.
        listener.notify_available(channel);
        view
    }
}

impl SubpartitionView for SubpartitionRangeView {
    fn poll(&self, credit: u32) -> Result<ViewPoll> {
        let n = self.subpartitions.len();
        if n == 1 {
            // One subpartition (the common case): its own state says all;
            // after its end it returns nothing more to this generation.
            return Ok(
                match self.subpartitions[0].poll_as(credit > 0, Some(self.generations[0]))? {
                    CreditPoll::Item { item, next } => ViewPoll::Item {
                        item,
                        subpartition: self.first,
                        next,
                    },
                    CreditPoll::NeedsCredit => ViewPoll::NeedsCredit,
                    CreditPoll::Nothing => ViewPoll::Nothing,
                },
            );
        }
        let mut st = lock_state(&self.state);
        let mut needs_credit = false;
        let mut k = 0;
        while k < n {
            let i = (st.next + k) % n;
            k += 1;
            if st.finished[i] {
                continue;
            }
            match self.subpartitions[i].poll_as(credit > 0, Some(self.generations[i]))? {
                CreditPoll::Item {
                    item: BufferOrEvent::Event(Event::EndOfPartition),
                    ..
                } => {
                    st.finished[i] = true;
                    if st.finished.iter().all(|f| *f) {
                        return Ok(ViewPoll::Item {
                            item: BufferOrEvent::Event(Event::EndOfPartition),
                            subpartition: self.first + i as u32,
                            next: NextKind::Nothing,
                        });
                    }
                }
                CreditPoll::Item { item, next } => {
                    st.next = (i + 1) % n;
                    // Another subpartition of the range may have data.
                    let next = match next {
                        NextKind::Nothing if n > 1 => NextKind::Data,
                        other => other,
                    };
                    return Ok(ViewPoll::Item {
                        item,
                        subpartition: self.first + i as u32,
                        next,
                    });
                }
                CreditPoll::NeedsCredit => needs_credit = true,
                CreditPoll::Nothing => {}
            }
        }
        Ok(if needs_credit {
            ViewPoll::NeedsCredit
        } else {
            ViewPoll::Nothing
        })
    }

    fn backlog(&self) -> usize {
        let st = lock_state(&self.state);
        self.subpartitions
            .iter()
            .zip(&st.finished)
            .filter(|(_, f)| !**f)
            .map(|(s, _)| s.backlog())
            .sum()
    }

    fn release(&self) {
        for (sp, generation) in self.subpartitions.iter().zip(&self.generations) {
            sp.release_consumer(*generation);
        }
    }

    fn demand(&self) {
        for sp in &self.subpartitions {
            sp.demand();
        }
    }
}

/// How many buffers a local consumer's view reads ahead from disk.
const LOCAL_READ_AHEAD: u32 = 32;

/// An input channel reading a partition of the same TaskManager in place:
/// buffers are the producer's (pipelined) or the read scheduler's (blocking),
/// never copied.
pub struct LocalInputChannel {
    partition: Arc<ResultPartition>,
    first: u32,
    last: u32,
    view: OnceLock<std::result::Result<Arc<dyn SubpartitionView>, String>>,
    failure: Mutex<Option<String>>,
}

impl std::fmt::Debug for LocalInputChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalInputChannel")
            .field("partition", &self.partition.name())
            .field("first", &self.first)
            .field("last", &self.last)
            .finish()
    }
}

impl LocalInputChannel {
    /// A channel over subpartitions `first..=last` of `partition`; the range
    /// is checked here so a bad descriptor fails the deployment, not a read.
    pub fn new(partition: Arc<ResultPartition>, first: u32, last: u32) -> Result<Arc<Self>> {
        partition.check_range(first, last)?;
        Ok(Arc::new(LocalInputChannel {
            partition,
            first,
            last,
            view: OnceLock::new(),
            failure: Mutex::new(None),
        }))
    }
}

impl InputChannel for LocalInputChannel {
    fn set_listener(&self, target: Arc<dyn AvailabilityListener>, channel: usize) {
        let created = self
            .partition
            .create_view(self.first, self.last, Arc::clone(&target), channel)
            .map_err(|e| e.to_string());
        let failed = created.is_err();
        let _ = self.view.set(created);
        if failed {
            target.notify_available(channel);
        }
    }

    fn poll(&self) -> Result<Option<Polled>> {
        let view = match self.view.get() {
            None => return Ok(None),
            Some(Err(e)) => {
                lock_state(&self.failure).get_or_insert_with(|| e.clone());
                return Err(FluviaError::Execution(e.clone()));
            }
            Some(Ok(v)) => v,
        };
        let polled = view.poll(LOCAL_READ_AHEAD).inspect_err(|e| {
            lock_state(&self.failure).get_or_insert_with(|| e.to_string());
        })?;
        Ok(match polled {
            ViewPoll::Item {
                item,
                subpartition,
                next,
            } => Some(Polled {
                item,
                subpartition: subpartition - self.first,
                more: next != NextKind::Nothing,
            }),
            ViewPoll::Nothing | ViewPoll::NeedsCredit => None,
        })
    }

    fn failure(&self) -> Option<String> {
        lock_state(&self.failure).clone()
    }

    fn release(&self) {
        if let Some(Ok(view)) = self.view.get() {
            view.release();
        }
    }

    fn demand(&self) {
        // Also before the view exists: a consumer may want the data before
        // its reader is created.
        for i in self.first..=self.last {
            if let Some(sp) = self.partition.get_subpartition(i as usize) {
                sp.demand();
            }
        }
    }
}
