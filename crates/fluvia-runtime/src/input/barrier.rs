//! Checkpoint barrier alignment (Flink's `CheckpointBarrierHandler`), as a
//! state machine without I/O: it is told of barriers, cancel markers and
//! ended channels, and answers with what to do (block channels, resume
//! them, trigger or abort a checkpoint); the input processor does it.
//!
//! - *Aligned* (and forced-aligned) barriers block each channel they arrive
//!   on until every channel that has not ended delivered its barrier; then
//!   the checkpoint is triggered and every channel resumes.
//! - *Unaligned* barriers trigger the checkpoint at the first barrier (it
//!   overtook the data before it); nothing is blocked, and the checkpoint's
//!   alignment ends when the last barrier arrives.
//! - *At-least-once* barriers block nothing and trigger at the last one.
//!
//! A barrier of a newer checkpoint aborts the one being aligned; barriers
//! of a checkpoint already completed or aborted are ignored.

use fluvia_network::{AlignmentType, CheckpointBarrier};

/// What the handler asks of the input processor.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BarrierAction {
    /// Channels to stop reading.
    pub block: Vec<usize>,
    /// Read every channel again.
    pub resume_all: bool,
    /// The checkpoint to take now.
    pub trigger: Option<CheckpointBarrier>,
    /// The checkpoint given up.
    pub aborted: Option<u64>,
}

#[derive(Debug)]
struct Pending {
    barrier: CheckpointBarrier,
    received: Vec<bool>,
    triggered: bool,
}

/// The alignment state of one task's input channels.
#[derive(Debug)]
pub struct CheckpointBarrierHandler {
    finished: Vec<bool>,
    pending: Option<Pending>,
    /// The newest checkpoint completed or aborted here.
    latest: Option<u64>,
}

impl CheckpointBarrierHandler {
    pub fn new(num_channels: usize) -> Self {
        CheckpointBarrierHandler {
            finished: vec![false; num_channels],
            pending: None,
            latest: None,
        }
    }

    /// The checkpoint being aligned, if any.
    pub fn pending(&self) -> Option<u64> {
        self.pending.as_ref().map(|p| p.barrier.id)
    }

    /// A barrier arrived on `channel`.
    pub fn barrier(&mut self, channel: usize, barrier: CheckpointBarrier) -> BarrierAction {
        let mut action = BarrierAction::default();
        if self.latest.is_some_and(|l| barrier.id <= l) {
            return action;
        }
        match &self.pending {
            Some(p) if p.barrier.id > barrier.id => return action,
            Some(p) if p.barrier.id < barrier.id => {
                action.aborted = Some(p.barrier.id);
                action.resume_all = true;
                self.pending = None;
            }
            _ => {}
        }
        let n = self.finished.len();
        let p = self.pending.get_or_insert_with(|| Pending {
            barrier,
            received: vec![false; n],
            triggered: false,
        });
        p.received[channel] = true;
        if barrier.options.alignment == AlignmentType::Unaligned && !p.triggered {
            p.triggered = true;
            action.trigger = Some(barrier);
        }
        if self.aligned() {
            self.complete(&mut action);
        } else if matches!(
            barrier.options.alignment,
            AlignmentType::Aligned | AlignmentType::ForcedAligned
        ) {
            action.block.push(channel);
        }
        action
    }

    /// Checkpoint `id` was cancelled upstream.
    pub fn cancel(&mut self, id: u64) -> BarrierAction {
        let mut action = BarrierAction::default();
        if self.latest.is_some_and(|l| id <= l) {
            return action;
        }
        match &self.pending {
            Some(p) if p.barrier.id > id => return action,
            Some(_) => {
                self.pending = None;
                action.resume_all = true;
            }
            None => {}
        }
        self.latest = Some(id);
        action.aborted = Some(id);
        action
    }

    /// `channel` ended: it holds back no alignment any more.
    pub fn channel_finished(&mut self, channel: usize) -> BarrierAction {
        self.finished[channel] = true;
        let mut action = BarrierAction::default();
        if self.pending.is_some() && self.aligned() {
            self.complete(&mut action);
        }
        action
    }

    fn aligned(&self) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|p| p.received.iter().zip(&self.finished).all(|(r, f)| *r || *f))
    }

    fn complete(&mut self, action: &mut BarrierAction) {
        if let Some(p) = self.pending.take() {
            if !p.triggered {
                action.trigger = Some(p.barrier);
            }
            action.resume_all = true;
            action.block.clear();
            self.latest = Some(p.barrier.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fluvia_network::CheckpointOptions;

    fn barrier(id: u64, options: CheckpointOptions) -> CheckpointBarrier {
        CheckpointBarrier {
            id,
            timestamp: 0,
            options,
        }
    }

    #[test]
    fn aligned_barriers_block_until_all_arrive_then_trigger() {
        let mut h = CheckpointBarrierHandler::new(3);
        let b = barrier(1, CheckpointOptions::aligned());
        assert_eq!(h.barrier(0, b).block, vec![0]);
        assert_eq!(h.barrier(2, b).block, vec![2]);
        let done = h.barrier(1, b);
        assert_eq!(done.trigger, Some(b));
        assert!(done.resume_all && done.block.is_empty());
        // A late duplicate is ignored.
        assert_eq!(h.barrier(1, b), BarrierAction::default());
    }

    #[test]
    fn unaligned_barriers_trigger_at_once_and_block_nothing() {
        let mut h = CheckpointBarrierHandler::new(2);
        let b = barrier(4, CheckpointOptions::unaligned());
        let first = h.barrier(1, b);
        assert_eq!(first.trigger, Some(b));
        assert!(first.block.is_empty());
        let last = h.barrier(0, b);
        assert_eq!(last.trigger, None);
        assert_eq!(h.pending(), None);
    }

    #[test]
    fn a_newer_barrier_or_a_cancel_marker_aborts_and_an_ended_channel_completes() {
        let mut h = CheckpointBarrierHandler::new(2);
        h.barrier(0, barrier(1, CheckpointOptions::aligned()));
        let newer = h.barrier(0, barrier(2, CheckpointOptions::aligned()));
        assert_eq!(newer.aborted, Some(1));
        assert!(newer.resume_all);
        assert_eq!(newer.block, vec![0]);
        let cancelled = h.cancel(2);
        assert_eq!(cancelled.aborted, Some(2));
        assert!(cancelled.resume_all);
        assert_eq!(
            h.barrier(1, barrier(2, CheckpointOptions::aligned()))
                .trigger,
            None
        );
        h.barrier(0, barrier(3, CheckpointOptions::aligned()));
        let ended = h.channel_finished(1);
        assert_eq!(ended.trigger.map(|b| b.id), Some(3));
    }
}
