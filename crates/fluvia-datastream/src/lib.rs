//! The typed DataStream API.
//!
//! A job is written against a [`StreamExecutionEnvironment`]: sources give
//! [`DataStream`]s, transformations (`map`, `filter`, `flat_map`, `key_by` →
//! `reduce`/`sum`/`process`, `union`, `connect`) give new ones, sinks end
//! them. Every call records a StreamGraph node and registers the node's user
//! code (closures stay in this process; the graph only holds ids). `execute`
//! builds the JobGraph with Flink's chaining rules and runs it on the embedded
//! mini-cluster (the same JobManager, scheduler and TaskManager code as a
//! real cluster, over loopback); [`app`] runs a program's jobs on a running
//! cluster, with the program's own binary as their TaskManager.
//!
//! ```
//! use fluvia_datastream::prelude::*;
//!
//! let env = StreamExecutionEnvironment::new();
//! env.set_parallelism(2);
//! let (_, counts) = env
//!     .from_collection(vec!["a b".to_string(), "b c".into(), "b".into()])
//!     .flat_map(|line: String, out| {
//!         line.split(' ').for_each(|w| out.collect((w.to_string(), 1i64)))
//!     })
//!     .key_by(|(w, _): &(String, i64)| w.clone())
//!     .sum(|(_, n)| n)
//!     .collect();
//! env.execute("word count").unwrap();
//! let mut counts = counts.take();
//! counts.sort();
//! assert_eq!(counts, vec![("a".into(), 1), ("b".into(), 3), ("c".into(), 1)]);
//! ```
//!
//! This crate must not know about buffers, partitions or threads: it speaks
//! StreamGraph and operator factories only.

pub mod app;
pub mod env;
pub mod operators;
pub mod sinks;
pub mod sources;
pub mod stream;

pub use env::StreamExecutionEnvironment;
pub use operators::{KeyedContext, KeyedProcessFunction};
pub use sinks::{CollectHandle, FileSinkOptions, TwoPhaseCommitSink};
pub use stream::{ConnectedStreams, DataStream, DataStreamSink, KeyedStream, OperatorSettings};

/// Everything a job needs in one import.
pub mod prelude {
    pub use crate::env::StreamExecutionEnvironment;
    pub use crate::operators::{KeyedContext, KeyedProcessFunction};
    pub use crate::sinks::{CollectHandle, FileSinkOptions, TwoPhaseCommitSink};
    pub use crate::stream::{
        ConnectedStreams, DataStream, DataStreamSink, KeyedStream, OperatorSettings,
    };
    pub use fluvia_core::{Configuration, FluviaError, RuntimeMode};
    pub use fluvia_runtime::{
        Collector, JobExecutionResult, OneInputOperator, OperatorContext, OutputTag,
        SourceOperator, SourceStatus, TwoInputOperator, UserError,
    };
    pub use fluvia_state::KeyedStateBackend;
    pub use fluvia_state::keyed::{
        AggregateFunction, AggregatingState, AggregatingStateDescriptor, ListState,
        ListStateDescriptor, MapState, MapStateDescriptor, ReducingState, ReducingStateDescriptor,
        StateTtlConfig, StateVisibility, UpdateType, ValueState, ValueStateDescriptor,
    };
}
