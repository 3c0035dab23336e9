//! Physical execution: the fourth of Fluvia's graphs.
//!
//! A [`task`] runs one subtask of a JobVertex: it builds the vertex's
//! OperatorChain from the [`OperatorRegistry`] (user code looked up by stream
//! node id), reads its InputGate, and writes its ResultPartitions. Inside a
//! chain operators call each other directly through typed [`Output`]s; only
//! non-chained edges serialise records (with [`record`]'s codec) into network
//! buffers.
//!
//! The [`input`] processor reads a task's gate for every kind of task
//! (DataStream and SQL) and handles the data plane's events in one place.
//!
//! Tasks run inside TaskManagers (`fluvia-cluster`), embedded or remote;
//! [`result`] sums what their attempts report into a job's outcome. A task
//! reads which attempt it is, its parallelism and its key groups from the
//! scheduler's `TaskDeploymentDescriptor` and reports `AttemptMetrics`,
//! both from the contract crate `fluvia-deployment`: the task side does not
//! link the scheduler.
//!
//! Record types are known only to [`operator`] factories and [`output`]s;
//! everything below (network, scheduler, graph) sees bytes and ids.

/// `Debug` for a type whose fields are not all `Debug`: its name and the
/// fields listed, each shown as the value given (of `self`, bound to `$s`).
macro_rules! debug_fields {
    ($ty:ident) => {
        debug_fields!($ty, |_s| {});
    };
    ($ty:ident, |$s:ident| { $($field:ident: $value:expr),* $(,)? }) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let $s = self;
                f.debug_struct(stringify!($ty))
                    $(.field(stringify!($field), &$value))*
                    .finish()
            }
        }
    };
}

pub mod checkpoint;
pub mod coordinator;
pub mod input;
pub mod mailbox;
pub mod metrics;
pub mod operator;
pub mod output;
pub mod record;
pub mod registry;
pub mod result;
pub mod source;
pub mod state;
pub mod task;

pub use input::{DataOutput, InputStatus, StreamInputProcessor};
pub use mailbox::{CoordinatorGateway, Mail, Mailbox, MailboxSender, TaskControl, TaskMail};
pub use metrics::{MetricRegistry, TaskMetricsSnapshot};
pub use operator::{
    InputStats, OneInputOperator, OperatorContext, OperatorFactory, OperatorInstance, RecordType,
    SourceOperator, SourceStatus, TaskDriver, TwoInputOperator, UserError,
};
pub use output::{Collector, Output, OutputTag, SideOutputs};
pub use record::Data;
pub use registry::OperatorRegistry;
pub use result::{JobExecutionResult, VertexMetrics, validate_job};
