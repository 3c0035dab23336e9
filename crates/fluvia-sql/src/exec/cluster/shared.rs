//! The slots through which the subtasks of one stage in one process share
//! a broadcast build side: the first to finish clusters it for the others,
//! or reads it once for all.

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result as DfResult;
use std::collections::HashMap;
use std::sync::Arc;

/// The build sides one job's subtasks in this process cluster once, by
/// (stage, the clustering's plan as displayed, attempt). An entry
/// lives while a subtask's plan holds it.
#[derive(Debug, Default)]
pub struct SharedClusters {
    pub(super) entries: std::sync::Mutex<HashMap<SlotKey, (usize, Arc<Slot>)>>,
}

pub(super) type SlotKey = (usize, String, u32);

impl SharedClusters {
    pub(super) fn join(this: &Arc<Self>, key: SlotKey) -> Member {
        let mut entries = this.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (members, slot) = entries.entry(key.clone()).or_insert_with(|| {
            let (tx, _) = tokio::sync::watch::channel(SlotState::Open);
            (0, Arc::new(Slot(tx)))
        });
        *members += 1;
        Member {
            registry: Arc::clone(this),
            key,
            slot: Arc::clone(slot),
        }
    }

    /// Entries held now (for tests).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug)]
pub(super) struct Slot(pub(super) tokio::sync::watch::Sender<SlotState>);

#[derive(Debug, Clone)]
pub(super) enum SlotState {
    /// No subtask has its whole input yet.
    Open,
    /// One clusters `rows` rows.
    Claimed { rows: usize },
    /// Sorted: one batch, which the joins build from without a copy.
    Done {
        rows: usize,
        batches: Vec<RecordBatch>,
    },
    /// Sorting would not pay: each keeps its own rows as they are (holding
    /// them here would keep a second copy beside each join's).
    AsIs { rows: usize },
    /// The one that claimed it failed or was stopped.
    Abandoned,
    /// One subtask reads the input for all ([`ClusterByKeyExec::read_once`]).
    Reading,
    /// What it read: its rows as the joins take them.
    Read { batches: Vec<RecordBatch> },
}

/// A subtask's place at one shared build side.
#[derive(Debug)]
pub(super) struct Member {
    registry: Arc<SharedClusters>,
    key: SlotKey,
    slot: Arc<Slot>,
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut entries = self
            .registry
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((members, _)) = entries.get_mut(&self.key) {
            *members -= 1;
            if *members == 0 {
                entries.remove(&self.key);
            }
        }
    }
}

/// What a subtask whose input ended with `rows` rows does.
pub(super) enum Turn {
    /// Clusters them and hands the result on.
    Claim(Claim),
    /// Waits for the one that claimed the same number of rows.
    Wait(tokio::sync::watch::Receiver<SlotState>),
    /// The claim's outcome for as many rows as this subtask has.
    Take(Taken),
    /// Clusters its own (another number of rows was shared).
    Own,
}

/// What a subtask takes from another's clustering.
pub(super) enum Taken {
    Sorted(Vec<RecordBatch>),
    AsIs,
}

impl Taken {
    pub(super) fn of(state: &SlotState, rows: usize) -> Option<Taken> {
        match state {
            SlotState::Done { rows: r, batches } if *r == rows => {
                Some(Taken::Sorted(batches.clone()))
            }
            SlotState::AsIs { rows: r } if *r == rows => Some(Taken::AsIs),
            _ => None,
        }
    }
}

/// The claim on a slot; dropped unfinished, it lets the others cluster
/// their own.
pub(super) struct Claim {
    slot: Arc<Slot>,
    rows: usize,
    done: bool,
}

impl Claim {
    pub(super) fn finish(mut self, out: &DfResult<(Vec<RecordBatch>, bool)>) {
        let rows = self.rows;
        let state = match out {
            Ok((batches, true)) => SlotState::Done {
                rows,
                batches: batches.clone(),
            },
            Ok((_, false)) => SlotState::AsIs { rows },
            Err(_) => SlotState::Abandoned,
        };
        self.slot.0.send_replace(state);
        self.done = true;
    }
}

impl Claim {
    /// Hands the rows read for all to the others.
    pub(super) fn publish(mut self, batches: Vec<RecordBatch>) {
        self.slot.0.send_replace(SlotState::Read { batches });
        self.done = true;
    }
}

/// What a subtask whose input is read once does when its join asks.
pub(super) enum ReadTurn {
    /// Reads it for all.
    Lead(Claim),
    /// Waits for the one that does.
    Wait(tokio::sync::watch::Receiver<SlotState>),
    /// Takes what it read.
    Take(Vec<RecordBatch>),
    /// Reads its own (the one that read for all was cut short).
    Own,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.done {
            self.slot.0.send_replace(SlotState::Abandoned);
        }
    }
}

impl Member {
    pub(super) fn read_turn(&self) -> ReadTurn {
        let mut turn = ReadTurn::Own;
        self.slot.0.send_if_modified(|state| match state {
            SlotState::Open => {
                *state = SlotState::Reading;
                turn = ReadTurn::Lead(Claim {
                    slot: Arc::clone(&self.slot),
                    rows: 0,
                    done: false,
                });
                true
            }
            SlotState::Reading => {
                turn = ReadTurn::Wait(self.slot.0.subscribe());
                false
            }
            SlotState::Read { batches } => {
                turn = ReadTurn::Take(batches.clone());
                false
            }
            _ => false,
        });
        turn
    }

    pub(super) fn turn(&self, rows: usize) -> Turn {
        let mut turn = Turn::Own;
        self.slot.0.send_if_modified(|state| match state {
            SlotState::Open => {
                *state = SlotState::Claimed { rows };
                turn = Turn::Claim(Claim {
                    slot: Arc::clone(&self.slot),
                    rows,
                    done: false,
                });
                true
            }
            SlotState::Claimed { rows: r } if *r == rows => {
                turn = Turn::Wait(self.slot.0.subscribe());
                false
            }
            done => {
                if let Some(t) = Taken::of(done, rows) {
                    turn = Turn::Take(t);
                }
                false
            }
        });
        turn
    }
}
