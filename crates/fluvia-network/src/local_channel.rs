//! An input channel reading a partition of the same TaskManager in place,
//! through a [`SubpartitionView`] of its range: no copy, no credit.

use crate::availability::AvailabilityListener;
use crate::buffer::lock_state;
use crate::event::NextKind;
use crate::gate::{InputChannel, Polled};
use crate::partition::ResultPartition;
use crate::view::{SubpartitionView, ViewPoll};
use fluvia_core::{FluviaError, Result};
use std::sync::{Arc, Mutex, OnceLock};

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

debug_fields!(LocalInputChannel, |this| {
    partition: this.partition.name(),
    first: this.first,
    last: this.last,
});

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
