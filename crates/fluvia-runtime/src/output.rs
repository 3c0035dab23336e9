//! Where an operator's records go.
//!
//! [`Output`] is the chain's internal edge: a direct, typed call. Its
//! implementations mirror Flink's:
//! - a chained operator's driver (`ChainingOutput`: the record is moved;
//!   with `pipeline.object-reuse` off the driver copies it first, which is
//!   Flink's `CopyingChainingOutput` without an extra call);
//! - [`BroadcastingOutput`] for several outputs (clones for all but the last);
//! - [`RecordWriterOutput`] for a non-chained edge: encode, pick the
//!   subpartition, write into network buffers;
//! - [`DiscardingOutput`] for operators without outputs.
//!
//! User functions see a [`Collector`], which keeps the first downstream error
//! instead of making user code handle it (the driver reports it after the user
//! function returns).

use crate::checkpoint::ChainSnapshot;
use crate::record::{Data, encode_into};
use fluvia_core::{FluviaError, Result};
use fluvia_network::{ChannelSelector, CheckpointBarrier, ConsumersReleased, PartitionWriter};
use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

/// The receiving side of a chained edge.
pub trait Output<T> {
    fn collect(&mut self, record: T) -> Result<()>;
    /// The upstream operator has finished: nothing more will arrive.
    fn close(&mut self) -> Result<()>;
    /// Tells whether nothing collected here can reach anyone any more: every
    /// consumer of every pipelined partition behind it stopped reading (a
    /// join whose build side was empty, a satisfied LIMIT); a driver may then
    /// end its task early. `None` where a record can have any other effect
    /// (a sink, a chained operator, a blocking partition).
    fn consumers_released(&self) -> Option<ConsumersReleased> {
        None
    }
    /// The event time of the stream advanced to `watermark` (ms): a chained
    /// operator sees it after every record before it, a network edge sends
    /// it to every consumer. Outputs that lead nowhere drop it.
    fn emit_watermark(&mut self, _watermark: i64) -> Result<()> {
        Ok(())
    }
    /// A checkpoint passes this edge: every operator behind it emits what
    /// must precede the barrier, a network edge sends the barrier to every
    /// consumer, and each operator's state goes into `snapshot`. Outputs
    /// that lead nowhere do nothing.
    fn checkpoint(
        &mut self,
        _barrier: &CheckpointBarrier,
        _snapshot: &mut ChainSnapshot,
    ) -> Result<()> {
        Ok(())
    }
    /// Checkpoint `id` completed (`true`) or was aborted: every operator
    /// behind this edge is told.
    fn notify_checkpoint(&mut self, _id: u64, _complete: bool) -> Result<()> {
        Ok(())
    }
}

thread_local! {
    /// Index (in its chain) of the operator whose user code runs on this
    /// thread, so a panic can be attributed to the right operator.
    static CURRENT_OPERATOR: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks `index` as the operator now running user code on this thread.
#[inline]
pub fn set_current_operator(index: usize) {
    CURRENT_OPERATOR.with(|c| c.set(index));
}

/// The operator that last ran user code on this thread.
pub fn current_operator() -> usize {
    CURRENT_OPERATOR.with(|c| c.get())
}

/// Names a side output of an operator and the type of its records
/// (Flink's `OutputTag<T>`): the operator emits with
/// [`Collector::output`], a consumer reads it with the API's
/// `get_side_output`. Two tags are the same output when their ids are.
pub struct OutputTag<T> {
    id: Arc<str>,
    _t: PhantomData<fn() -> T>,
}

impl<T> OutputTag<T> {
    pub fn new(id: &str) -> Self {
        OutputTag {
            id: Arc::from(id),
            _t: PhantomData,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }
}

impl<T> Clone for OutputTag<T> {
    fn clone(&self) -> Self {
        OutputTag {
            id: Arc::clone(&self.id),
            _t: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for OutputTag<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OutputTag({})", self.id)
    }
}

/// One side output with its record type erased: what the chain needs to
/// end it and to pass watermarks on, plus the typed output behind
/// [`SideOutput::as_any_mut`] for [`Collector::output`].
pub trait SideOutput {
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn close(&mut self) -> Result<()>;
    fn emit_watermark(&mut self, watermark: i64) -> Result<()>;
    fn checkpoint(
        &mut self,
        barrier: &CheckpointBarrier,
        snapshot: &mut ChainSnapshot,
    ) -> Result<()>;
    fn notify_checkpoint(&mut self, id: u64, complete: bool) -> Result<()>;
}

/// The typed form behind a [`SideOutput`].
pub struct TypedSideOutput<T>(pub Box<dyn Output<T>>);

impl<T: 'static> SideOutput for TypedSideOutput<T> {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn close(&mut self) -> Result<()> {
        self.0.close()
    }
    fn emit_watermark(&mut self, watermark: i64) -> Result<()> {
        self.0.emit_watermark(watermark)
    }
    fn checkpoint(
        &mut self,
        barrier: &CheckpointBarrier,
        snapshot: &mut ChainSnapshot,
    ) -> Result<()> {
        self.0.checkpoint(barrier, snapshot)
    }
    fn notify_checkpoint(&mut self, id: u64, complete: bool) -> Result<()> {
        self.0.notify_checkpoint(id, complete)
    }
}

/// The side outputs of one operator that have consumers, by tag id. A tag
/// without consumers is absent: its records are dropped, as in Flink.
#[derive(Default)]
pub struct SideOutputs {
    outputs: Vec<(String, Box<dyn SideOutput>)>,
}

impl SideOutputs {
    pub fn insert(&mut self, tag: String, output: Box<dyn SideOutput>) {
        self.outputs.push((tag, output));
    }

    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    fn get(&mut self, tag: &str) -> Option<&mut (dyn SideOutput + 'static)> {
        self.outputs
            .iter_mut()
            .find(|(t, _)| t == tag)
            .map(|(_, o)| &mut **o)
    }

    /// Ends every side output (the operator has closed).
    pub fn close(&mut self) -> Result<()> {
        self.outputs.iter_mut().try_for_each(|(_, o)| o.close())
    }

    fn emit_watermark(&mut self, watermark: i64) -> Result<()> {
        self.outputs
            .iter_mut()
            .try_for_each(|(_, o)| o.emit_watermark(watermark))
    }

    /// A checkpoint passes every side output (see [`Output::checkpoint`]).
    pub fn checkpoint(
        &mut self,
        barrier: &CheckpointBarrier,
        snapshot: &mut ChainSnapshot,
    ) -> Result<()> {
        self.outputs
            .iter_mut()
            .try_for_each(|(_, o)| o.checkpoint(barrier, snapshot))
    }

    pub fn notify_checkpoint(&mut self, id: u64, complete: bool) -> Result<()> {
        self.outputs
            .iter_mut()
            .try_for_each(|(_, o)| o.notify_checkpoint(id, complete))
    }
}

/// What user functions emit into.
pub struct Collector<'a, T> {
    out: &'a mut dyn Output<T>,
    side: Option<&'a mut SideOutputs>,
    error: Option<FluviaError>,
    operator_index: usize,
    emitted: u64,
}

impl<'a, T> Collector<'a, T> {
    pub fn new(out: &'a mut dyn Output<T>, operator_index: usize) -> Self {
        Collector {
            out,
            side: None,
            error: None,
            operator_index,
            emitted: 0,
        }
    }

    /// A collector that can also emit to the operator's side outputs.
    pub fn with_side_outputs(
        out: &'a mut dyn Output<T>,
        side: &'a mut SideOutputs,
        operator_index: usize,
    ) -> Self {
        Collector {
            side: Some(side),
            ..Collector::new(out, operator_index)
        }
    }

    /// Emits `record` to the side output `tag` (Flink's
    /// `Context.output`). Without a consumer of that tag the record is
    /// dropped; a consumer that expects another type is an error.
    pub fn output<X: 'static>(&mut self, tag: &OutputTag<X>, record: X) {
        if self.error.is_some() {
            return;
        }
        let Some(out) = self.side.as_deref_mut().and_then(|s| s.get(tag.id())) else {
            return;
        };
        let result = match out.as_any_mut().downcast_mut::<TypedSideOutput<X>>() {
            Some(typed) => typed.0.collect(record),
            None => Err(FluviaError::Internal(format!(
                "side output '{}' is read as another type than {}",
                tag.id(),
                std::any::type_name::<X>()
            ))),
        };
        if let Err(e) = result {
            self.error = Some(e);
        }
        set_current_operator(self.operator_index);
    }

    /// Emits a record downstream. After a downstream failure further records
    /// are dropped; the failure is reported when the user function returns.
    #[inline]
    pub fn collect(&mut self, record: T) {
        if self.error.is_none() {
            if let Err(e) = self.out.collect(record) {
                self.error = Some(e);
            }
            set_current_operator(self.operator_index);
            self.emitted += 1;
        }
    }

    /// Emits a watermark downstream (a source's or a watermark generator's
    /// event time; operators forward the watermarks they receive by
    /// default). A downstream failure is kept like a record's.
    pub fn emit_watermark(&mut self, watermark: i64) {
        if self.error.is_none() {
            let side = match self.side.as_deref_mut() {
                Some(side) => side.emit_watermark(watermark),
                None => Ok(()),
            };
            if let Err(e) = side.and_then(|()| self.out.emit_watermark(watermark)) {
                self.error = Some(e);
            }
            set_current_operator(self.operator_index);
        }
    }

    /// Whether a downstream operator failed (sources stop producing then).
    pub fn is_failed(&self) -> bool {
        self.error.is_some()
    }

    /// Records emitted through this collector.
    pub fn emitted(&self) -> u64 {
        self.emitted
    }

    pub(crate) fn take_error(&mut self) -> Option<FluviaError> {
        self.error.take()
    }
}

/// Fans out to several outputs: a clone to all but the last, which gets the
/// record itself.
pub struct BroadcastingOutput<T> {
    pub outputs: Vec<Box<dyn Output<T>>>,
}

impl<T: Clone> Output<T> for BroadcastingOutput<T> {
    #[inline]
    fn collect(&mut self, record: T) -> Result<()> {
        if let Some((last, rest)) = self.outputs.split_last_mut() {
            for o in rest {
                o.collect(record.clone())?;
            }
            last.collect(record)?;
        }
        Ok(())
    }
    fn close(&mut self) -> Result<()> {
        for o in &mut self.outputs {
            o.close()?;
        }
        Ok(())
    }
    fn emit_watermark(&mut self, watermark: i64) -> Result<()> {
        for o in &mut self.outputs {
            o.emit_watermark(watermark)?;
        }
        Ok(())
    }
    fn checkpoint(
        &mut self,
        barrier: &CheckpointBarrier,
        snapshot: &mut ChainSnapshot,
    ) -> Result<()> {
        for o in &mut self.outputs {
            o.checkpoint(barrier, snapshot)?;
        }
        Ok(())
    }
    fn notify_checkpoint(&mut self, id: u64, complete: bool) -> Result<()> {
        for o in &mut self.outputs {
            o.notify_checkpoint(id, complete)?;
        }
        Ok(())
    }
    fn consumers_released(&self) -> Option<ConsumersReleased> {
        let mut all = self.outputs.iter().map(|o| o.consumers_released());
        let first = all.next()??;
        all.try_fold(first, |acc, r| Some(acc.and(r?)))
    }
}

/// For operators without outputs (sinks).
pub struct DiscardingOutput;

impl<T> Output<T> for DiscardingOutput {
    #[inline]
    fn collect(&mut self, _record: T) -> Result<()> {
        Ok(())
    }
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Computes the Java-compatible key hash of a record for a keyed edge.
pub type KeyHasher<T> = Arc<dyn Fn(&T) -> i32 + Send + Sync>;

/// A non-chained edge: encodes each record once and writes it to the chosen
/// subpartition(s). Closing it ends the partition.
pub struct RecordWriterOutput<T> {
    writer: Rc<RefCell<PartitionWriter>>,
    selector: ChannelSelector,
    key_hasher: Option<KeyHasher<T>>,
    scratch: Vec<u8>,
}

impl<T: Data> RecordWriterOutput<T> {
    pub fn new(
        writer: Rc<RefCell<PartitionWriter>>,
        selector: ChannelSelector,
        key_hasher: Option<KeyHasher<T>>,
    ) -> Result<Self> {
        if selector.needs_key() && key_hasher.is_none() {
            return Err(FluviaError::Internal(
                "a HASH edge without a key selector".to_string(),
            ));
        }
        Ok(RecordWriterOutput {
            writer,
            selector,
            key_hasher,
            scratch: Vec::with_capacity(256),
        })
    }
}

impl<T: Data> Output<T> for RecordWriterOutput<T> {
    #[inline]
    fn collect(&mut self, record: T) -> Result<()> {
        self.scratch.clear();
        encode_into(&record, &mut self.scratch)?;
        let key_hash = match &self.key_hasher {
            Some(h) => h(&record),
            None => 0,
        };
        let target = self.selector.select(key_hash);
        self.writer.borrow_mut().emit(target, &self.scratch)
    }

    fn close(&mut self) -> Result<()> {
        self.writer.borrow_mut().finish()
    }

    fn emit_watermark(&mut self, watermark: i64) -> Result<()> {
        self.writer
            .borrow_mut()
            .broadcast_event(&fluvia_network::Event::Watermark(watermark))
    }

    fn checkpoint(
        &mut self,
        barrier: &CheckpointBarrier,
        _snapshot: &mut ChainSnapshot,
    ) -> Result<()> {
        self.writer
            .borrow_mut()
            .broadcast_event(&fluvia_network::Event::CheckpointBarrier(*barrier))
    }

    fn consumers_released(&self) -> Option<ConsumersReleased> {
        self.writer.borrow().consumers_released()
    }
}
