//! Fluvia's data plane: it moves bytes, never records.
//!
//! - [`buffer`]: fixed-size network buffers, the global [`NetworkBufferPool`]
//!   that bounds a TaskManager's network memory, and bounded
//!   [`LocalBufferPool`]s per result partition. A producer that finds its pool
//!   empty waits: that wait *is* back-pressure.
//! - [`partition`]: a [`ResultPartition`] per producing subtask and data set,
//!   with one subpartition per consumer. Pipelined subpartitions hand buffers to
//!   the consumer in memory; blocking partitions are readable once the
//!   producer finished: [`sortmerge`] files (one data file and one index for
//!   all subpartitions), or one spill file per subpartition.
//! - [`view`]: one consumer's read of a range of subpartitions, tagged per
//!   subpartition; local channels read through one in place.
//! - [`gate`]: a consumer's [`InputGate`], one input channel per consumed
//!   subpartition; a local channel takes the producer's buffers as they are
//!   (no copy) and returns them to the producer's pool when dropped.
//! - [`serialization`]: length-prefixed record framing into buffers, with
//!   records spanning buffer boundaries, and the matching deserializer.
//! - [`partitioner`]: channel selection for each partitioner kind.
//!
//! This crate does not know record types, operators or the job graph; the
//! runtime encodes records to bytes and picks the target subpartition.

/// `impl Debug` for a type whose fields are not all `Debug`: the type's
/// name and the fields listed, each `name: value` with the value an
/// expression of `this` (the value shown).
macro_rules! debug_fields {
    ($ty:ident, |$this:ident| { $($field:ident: $value:expr),+ $(,)? }) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let $this = self;
                f.debug_struct(stringify!($ty))
                    $(.field(stringify!($field), &$value))+
                    .finish()
            }
        }
    };
}

pub mod availability;
pub mod buffer;
mod byte_reader;
pub mod cancel;
pub mod compression;
pub mod event;
pub mod gate;
pub mod local_channel;
pub mod metrics;
pub mod net;
pub mod partition;
pub mod partitioner;
pub mod release;
pub mod serialization;
pub mod sortmerge;
pub mod subpartition;
pub mod view;

pub use buffer::{Buffer, BufferBuilder, LocalBufferPool, NetworkBufferPool};
pub use cancel::CancelToken;
pub use event::{
    AlignmentType, BufferOrEvent, CheckpointBarrier, CheckpointOptions, Event, SnapshotType,
    StopMode, WatermarkStatus,
};
pub use gate::{GateEvent, InputChannel, InputChannelSpec, InputGate, Polled};
pub use local_channel::LocalInputChannel;
pub use partition::ResultPartition;
pub use partitioner::{ChannelSelector, Target};
pub use release::ConsumersReleased;
pub use serialization::{
    ChannelDeserializers, PartitionWriter, RECORD_HEADER, RecordBytes, RecordDeserializer,
};
pub use view::SubpartitionView;
