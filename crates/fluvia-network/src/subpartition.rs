//! One subpartition of a result partition, shared between the producer and
//! its consumer: a queue of buffers and events in memory (pipelined), or a
//! spill file read back once the producer finished (hash-blocking).
//!
//! Priority events (unaligned checkpoint barriers) are queued ahead of the
//! data already waiting, behind earlier priority events, and announced
//! to the reader with [`AvailabilityListener::notify_priority`].

use crate::availability::AvailabilityListener;
use crate::buffer::{Buffer, lock_state};
use crate::event::{BufferOrEvent, Event, NextKind, push_in_priority_order};
use crate::release::ReleaseState;
use fluvia_core::{FluviaError, Result};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The outcome of [`Subpartition::poll_with_credit`].
#[derive(Debug)]
pub enum CreditPoll {
    /// Nothing readable now.
    Nothing,
    /// The next element is data and there is no credit for it.
    NeedsCredit,
    Item {
        item: BufferOrEvent,
        next: NextKind,
    },
}

struct Listener {
    target: Arc<dyn AvailabilityListener>,
    channel: usize,
}

enum Storage {
    Pipelined {
        queue: VecDeque<BufferOrEvent>,
    },
    Blocking {
        path: PathBuf,
        writer: Option<BufWriter<File>>,
        reader: Option<BufReader<File>>,
        /// Set once the producer finished: only then may the consumer read.
        finished: bool,
        end_delivered: bool,
        bytes_written: u64,
        buffers_written: usize,
    },
}

struct SubpartitionState {
    storage: Storage,
    listener: Option<Listener>,
    /// Incremented when a consumer attaches. A blocking subpartition is
    /// re-readable (a restarted consumer reads it again from the start);
    /// polls from an earlier consumer are ignored.
    generation: u64,
    /// Data (not counting a trailing event) written and not yet read.
    buffers_backlog: usize,
    /// A pipelined subpartition whose consumer stopped reading (its join
    /// found an empty build side, its LIMIT was satisfied): what is written
    /// is dropped at once, so the producer never waits for this consumer.
    released: bool,
}

/// One subpartition, shared between the producer and its consumer.
pub struct Subpartition {
    index: usize,
    segment_size: usize,
    state: Mutex<SubpartitionState>,
    /// Mirror of the backlog, readable without the lock (the load-aware
    /// partitioner reads it per record).
    backlog_hint: std::sync::atomic::AtomicUsize,
    /// The partition's record of released and demanded subpartitions
    /// (pipelined only).
    release_state: Option<Arc<ReleaseState>>,
}

debug_fields!(Subpartition, |this| { index: this.index });

impl Subpartition {
    pub(crate) fn pipelined(
        index: usize,
        segment_size: usize,
        release_state: Arc<ReleaseState>,
    ) -> Self {
        Subpartition {
            index,
            segment_size,
            state: Mutex::new(SubpartitionState {
                storage: Storage::Pipelined {
                    queue: VecDeque::new(),
                },
                listener: None,
                generation: 0,
                buffers_backlog: 0,
                released: false,
            }),
            backlog_hint: Default::default(),
            release_state: Some(release_state),
        }
    }

    pub(crate) fn blocking(index: usize, segment_size: usize, path: PathBuf) -> Result<Self> {
        let file = File::create(&path)
            .map_err(|e| FluviaError::io(format!("creating spill file {}", path.display()), e))?;
        Ok(Subpartition {
            index,
            segment_size,
            state: Mutex::new(SubpartitionState {
                storage: Storage::Blocking {
                    path,
                    writer: Some(BufWriter::with_capacity(64 * 1024, file)),
                    reader: None,
                    finished: false,
                    end_delivered: false,
                    bytes_written: 0,
                    buffers_written: 0,
                },
                listener: None,
                generation: 0,
                buffers_backlog: 0,
                released: false,
            }),
            backlog_hint: Default::default(),
            release_state: None,
        })
    }

    pub fn index(&self) -> usize {
        self.index
    }

    /// Registers the consumer and returns its generation. If data is
    /// already readable it is told at once. A new consumer of a blocking
    /// subpartition reads it from the start.
    pub fn set_listener(&self, target: Arc<dyn AvailabilityListener>, channel: usize) -> u64 {
        let mut st = lock_state(&self.state);
        st.generation += 1;
        let generation = st.generation;
        let mut reset_backlog = None;
        let readable = match &mut st.storage {
            Storage::Pipelined { queue } => !queue.is_empty(),
            Storage::Blocking {
                finished,
                reader,
                end_delivered,
                buffers_written,
                ..
            } => {
                *reader = None;
                *end_delivered = false;
                reset_backlog = Some(*buffers_written);
                *finished
            }
        };
        if let Some(b) = reset_backlog {
            st.buffers_backlog = b;
        }
        st.listener = Some(Listener {
            target: Arc::clone(&target),
            channel,
        });
        drop(st);
        if readable {
            target.notify_available(channel);
        }
        generation
    }

    /// The consumer of `generation` will read no more. A pipelined
    /// subpartition drops what it holds and everything written from now on;
    /// a blocking one keeps its data for other readers (a restarted or
    /// speculative consumer reads it from the start).
    pub fn release_consumer(&self, generation: u64) {
        let mut st = lock_state(&self.state);
        if st.generation != generation || st.released {
            return;
        }
        let dropped = match &mut st.storage {
            Storage::Pipelined { queue } => std::mem::take(queue),
            Storage::Blocking { .. } => return,
        };
        st.released = true;
        st.listener = None;
        st.buffers_backlog = 0;
        self.backlog_hint.store(0, Ordering::Relaxed);
        drop(st);
        if let Some(c) = &self.release_state {
            c.one_released();
        }
        // The buffers go back to the producer's pool here, outside the lock.
        drop(dropped);
    }

    /// A consumer is about to read (its first poll): a producer that waits
    /// for demand before it starts may go. Blocking subpartitions ignore it
    /// (their consumers start only once the producer finished).
    pub fn demand(&self) {
        if let Some(c) = &self.release_state {
            c.demanded();
        }
    }

    /// Adds a filled buffer (producer side).
    pub fn add_buffer(&self, buffer: Buffer) -> Result<()> {
        let mut st = lock_state(&self.state);
        if st.released {
            return Ok(());
        }
        let notify = match &mut st.storage {
            Storage::Pipelined { queue } => {
                queue.push_back(BufferOrEvent::Buffer(buffer));
                queue.len() == 1
            }
            Storage::Blocking {
                path,
                writer,
                bytes_written,
                buffers_written,
                ..
            } => {
                let Some(w) = writer.as_mut() else {
                    return Err(FluviaError::Internal(format!(
                        "write to finished blocking subpartition {}",
                        path.display()
                    )));
                };
                let len = buffer.len() as u32;
                w.write_all(&len.to_le_bytes())
                    .and_then(|_| w.write_all(buffer.as_slice()))
                    .map_err(|e| {
                        FluviaError::io(format!("writing spill file {}", path.display()), e)
                    })?;
                *bytes_written += 4 + len as u64;
                *buffers_written += 1;
                // The buffer is recycled here, when it goes out of scope.
                false
            }
        };
        st.buffers_backlog += 1;
        self.backlog_hint
            .store(st.buffers_backlog, std::sync::atomic::Ordering::Relaxed);
        Self::maybe_notify(st, notify);
        Ok(())
    }

    /// Marks the end of data (producer side).
    pub fn finish(&self) -> Result<()> {
        let mut st = lock_state(&self.state);
        if st.released {
            return Ok(());
        }
        let notify = match &mut st.storage {
            Storage::Pipelined { queue } => {
                queue.push_back(BufferOrEvent::Event(Event::EndOfPartition));
                queue.len() == 1
            }
            Storage::Blocking {
                path,
                writer,
                finished,
                ..
            } => {
                if let Some(mut w) = writer.take() {
                    w.flush().map_err(|e| {
                        FluviaError::io(format!("flushing spill file {}", path.display()), e)
                    })?;
                }
                *finished = true;
                true
            }
        };
        Self::maybe_notify(st, notify);
        Ok(())
    }

    /// Adds an event (producer side). An ordinary event follows the data
    /// written before it; a priority event ([`Event::is_priority`]) goes
    /// ahead of the queued data, behind earlier priority events, and its
    /// reader is told with priority. Events take no buffer and count in no
    /// backlog. Blocking subpartitions carry no events (batch exchanges end
    /// with [`finish`](Self::finish) only).
    pub fn add_event(&self, event: Event) -> Result<()> {
        if event == Event::EndOfPartition {
            return self.finish();
        }
        let mut st = lock_state(&self.state);
        if st.released {
            return Ok(());
        }
        let priority = event.is_priority();
        let notify = match &mut st.storage {
            Storage::Pipelined { queue } => {
                let event = BufferOrEvent::Event(event);
                push_in_priority_order(queue, event, priority, BufferOrEvent::is_priority);
                priority || queue.len() == 1
            }
            Storage::Blocking { path, .. } => {
                return Err(FluviaError::Internal(format!(
                    "event {event:?} written to blocking subpartition {}: blocking exchanges carry no events",
                    path.display()
                )));
            }
        };
        if priority {
            if let Some(l) = &st.listener {
                let (target, channel) = (Arc::clone(&l.target), l.channel);
                drop(st);
                target.notify_priority(channel);
            }
            return Ok(());
        }
        Self::maybe_notify(st, notify);
        Ok(())
    }

    fn maybe_notify(st: std::sync::MutexGuard<'_, SubpartitionState>, notify: bool) {
        if notify && let Some(l) = &st.listener {
            let (target, channel) = (Arc::clone(&l.target), l.channel);
            drop(st);
            target.notify_available(channel);
        }
    }

    /// Takes the next buffer or event (consumer side). The flag says whether
    /// more is readable right now.
    pub fn poll(&self) -> Result<Option<(BufferOrEvent, bool)>> {
        Ok(match self.poll_with_credit(true)? {
            CreditPoll::Item { item, next } => Some((item, next != NextKind::Nothing)),
            CreditPoll::Nothing | CreditPoll::NeedsCredit => None,
        })
    }

    /// Like [`poll`](Self::poll) for a sender serving a remote consumer:
    /// without credit only an event may be taken. Reports what comes next,
    /// so the sender knows whether to keep this reader in its queue.
    pub fn poll_with_credit(&self, has_credit: bool) -> Result<CreditPoll> {
        self.poll_as(has_credit, None)
    }

    /// [`poll_with_credit`](Self::poll_with_credit) for the consumer of
    /// `generation`; an earlier consumer gets nothing.
    pub fn poll_as(&self, has_credit: bool, generation: Option<u64>) -> Result<CreditPoll> {
        let mut st = lock_state(&self.state);
        if generation.is_some_and(|g| g != st.generation) {
            return Ok(CreditPoll::Nothing);
        }
        let segment_size = self.segment_size;
        let st = &mut *st;
        match &mut st.storage {
            Storage::Pipelined { queue } => {
                let kind = NextKind::of;
                match kind(queue.front()) {
                    NextKind::Nothing => return Ok(CreditPoll::Nothing),
                    NextKind::Data if !has_credit => return Ok(CreditPoll::NeedsCredit),
                    _ => {}
                }
                let Some(item) = queue.pop_front() else {
                    return Ok(CreditPoll::Nothing);
                };
                if matches!(item, BufferOrEvent::Buffer(_)) {
                    st.buffers_backlog -= 1;
                    self.backlog_hint
                        .store(st.buffers_backlog, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(CreditPoll::Item {
                    item,
                    next: kind(queue.front()),
                })
            }
            Storage::Blocking {
                path,
                reader,
                finished,
                end_delivered,
                ..
            } => {
                if !*finished || *end_delivered {
                    return Ok(CreditPoll::Nothing);
                }
                if !has_credit && st.buffers_backlog > 0 {
                    return Ok(CreditPoll::NeedsCredit);
                }
                if reader.is_none() {
                    let f = File::open(&*path).map_err(|e| {
                        FluviaError::io(format!("opening spill file {}", path.display()), e)
                    })?;
                    *reader = Some(BufReader::with_capacity(segment_size.max(64 * 1024), f));
                }
                let Some(r) = reader.as_mut() else {
                    return Ok(CreditPoll::Nothing);
                };
                match read_spilled_buffer(r, path, segment_size)? {
                    Some(buf) => {
                        st.buffers_backlog = st.buffers_backlog.saturating_sub(1);
                        let next = if st.buffers_backlog > 0 {
                            NextKind::Data
                        } else {
                            NextKind::Event
                        };
                        Ok(CreditPoll::Item {
                            item: BufferOrEvent::Buffer(buf),
                            next,
                        })
                    }
                    None => {
                        *end_delivered = true;
                        *reader = None;
                        Ok(CreditPoll::Item {
                            item: BufferOrEvent::Event(Event::EndOfPartition),
                            next: NextKind::Nothing,
                        })
                    }
                }
            }
        }
    }

    /// The backlog as of the last change, without taking the lock.
    pub fn backlog_hint(&self) -> usize {
        self.backlog_hint.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Buffers written and not yet consumed (Flink's backlog).
    pub fn backlog(&self) -> usize {
        lock_state(&self.state).buffers_backlog
    }
}

fn read_spilled_buffer(
    r: &mut BufReader<File>,
    path: &Path,
    segment_size: usize,
) -> Result<Option<Buffer>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => {
            return Err(FluviaError::io(
                format!("reading spill file {}", path.display()),
                e,
            ));
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    // A buffer is at most a segment: a larger length is corruption, not
    // something to allocate.
    if len > segment_size {
        return Err(FluviaError::Execution(format!(
            "spill file {} is corrupt: a buffer of {len} bytes, more than a segment ({segment_size})",
            path.display()
        )));
    }
    let mut data = vec![0u8; len];
    r.read_exact(&mut data).map_err(|e| {
        FluviaError::io(
            format!("reading spill file {} (truncated buffer)", path.display()),
            e,
        )
    })?;
    Ok(Some(Buffer::from_vec(data)))
}
