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
//! [`LocalInputChannel`](crate::local_channel::LocalInputChannel) serves a
//! consumer on the same TaskManager.

use crate::availability::AvailabilityListener;
use crate::buffer::lock_state;
use crate::event::{BufferOrEvent, Event, NextKind};
use crate::subpartition::{CreditPoll, Subpartition};
use fluvia_core::{FluviaError, Result};
use std::sync::{Arc, Mutex};

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
    /// An event a subpartition reached, held until every unfinished
    /// subpartition of the range reached it (Flink's
    /// `UnionResultSubpartitionView`): the consumer sees one barrier or
    /// watermark per channel, after the data that precedes it in every
    /// subpartition of the range.
    events: Vec<Option<Event>>,
    next: usize,
}

impl RangeState {
    /// The event every unfinished subpartition waits at, taken once, if
    /// they all do; an error if they wait at different events (a producer
    /// writes events to all its subpartitions in the same order).
    fn aligned_event(&mut self, first: u32) -> Result<Option<ViewPoll>> {
        let mut waiting = self
            .finished
            .iter()
            .zip(&self.events)
            .enumerate()
            .filter(|(_, (f, _))| !**f);
        let Some((at, (_, Some(event)))) = waiting.next() else {
            return Ok(None);
        };
        for (i, (_, other)) in waiting {
            match other {
                None => return Ok(None),
                Some(o) if o != event => {
                    return Err(FluviaError::Execution(format!(
                        "subpartitions {} and {} of one channel reached different events ({event:?}, {o:?})",
                        first as usize + at,
                        first as usize + i
                    )));
                }
                Some(_) => {}
            }
        }
        let event = event.clone();
        for e in &mut self.events {
            *e = None;
        }
        Ok(Some(ViewPoll::Item {
            item: BufferOrEvent::Event(event),
            subpartition: first + at as u32,
            // The subpartitions were not read past the event: look again.
            next: NextKind::Data,
        }))
    }
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
                events: vec![None; n],
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
            // A finished subpartition, or one that waits at an event for the
            // rest of the range, is not read.
            if st.finished[i] || st.events[i].is_some() {
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
                    // The others may all wait at an event that can go now.
                    if let Some(item) = st.aligned_event(self.first)? {
                        return Ok(item);
                    }
                }
                CreditPoll::Item {
                    item: BufferOrEvent::Event(event),
                    ..
                } => {
                    st.events[i] = Some(event);
                    if let Some(item) = st.aligned_event(self.first)? {
                        return Ok(item);
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
