//! Built-in bounded sources: a collection, a generator (and number
//! sequence), and text files read as lines.
//!
//! The collection and the generator split their work deterministically by
//! subtask index; text files are read as FLIP-27 splits handed out by the
//! source's coordinator on the JobManager as readers ask for them.

use crate::env::StreamExecutionEnvironment;
use crate::stream::{DataStream, OperatorSettings};
use fluvia_core::{FluviaError, Result};
use fluvia_graph::CoordinatorSpec;
use fluvia_runtime::operator::{OperatorFactory, SourceFactory};
use fluvia_runtime::source::SourceEvent;
use fluvia_runtime::source::file::{FILE_SOURCE_COORDINATOR, FileSourceConfig, FileSplitReader};
use fluvia_runtime::{Collector, Data, OperatorContext, SourceOperator, SourceStatus, UserError};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

/// The sources of a job: each call adds a source node to the environment's
/// graph and returns its stream.
impl StreamExecutionEnvironment {
    /// Adds a source operator. `make` builds one instance per subtask.
    pub fn add_source<T: Data>(
        &self,
        name: &str,
        bounded: bool,
        factory: Arc<dyn OperatorFactory>,
    ) -> DataStream<T> {
        self.add_coordinated_source(name, bounded, factory, None)
    }

    /// A source with a coordinator on the JobManager (a FLIP-27 source's
    /// split enumerator).
    fn add_coordinated_source<T: Data>(
        &self,
        name: &str,
        bounded: bool,
        factory: Arc<dyn OperatorFactory>,
        coordinator: Option<fluvia_graph::CoordinatorSpec>,
    ) -> DataStream<T> {
        let node = {
            let mut inner = self.inner.borrow_mut();
            let node = inner.builder.add_source(format!("Source: {name}"), bounded);
            if let Some(spec) = coordinator {
                inner.builder.set_coordinator(node, spec);
            }
            inner.registry.register(node, factory);
            node
        };
        DataStream::from_node(self.clone(), node)
    }

    /// A source from a per-subtask constructor.
    pub fn from_source<T: Data, S: SourceOperator<T>>(
        &self,
        name: &str,
        bounded: bool,
        make: impl Fn(&fluvia_runtime::OperatorContext) -> S + Send + Sync + 'static,
    ) -> DataStream<T> {
        let factory = SourceFactory::<T>::new(move |ctx| Ok(Box::new(make(ctx))));
        self.add_source(name, bounded, Arc::new(factory))
    }

    /// The elements of `items`, in order (parallelism 1 by default, as Flink's
    /// `fromCollection`; with more subtasks each takes every p-th element).
    pub fn from_collection<T: Data + Sync>(&self, items: Vec<T>) -> DataStream<T> {
        let items = Arc::new(items);
        let stream = self.from_source("Collection Source", true, move |ctx| {
            CollectionSource::new(Arc::clone(&items), ctx.subtask_index, ctx.parallelism)
        });
        stream.set_parallelism(1)
    }

    /// The numbers `from..=to`, split evenly across subtasks.
    pub fn from_sequence(&self, from: i64, to: i64) -> DataStream<i64> {
        let count = if to >= from {
            (to - from) as u64 + 1
        } else {
            0
        };
        self.generator_source("Sequence Source", count, None, move |i| from + i as i64)
    }

    /// `count` records `f(0) .. f(count-1)`, split evenly across subtasks.
    pub fn from_generator<T: Data>(
        &self,
        count: u64,
        f: impl Fn(u64) -> T + Send + Sync + 'static,
    ) -> DataStream<T> {
        self.generator_source("Generator Source", count, None, f)
    }

    /// As [`from_generator`](Self::from_generator), emitting at most
    /// `per_second` records a second per subtask (Flink's
    /// `DataGeneratorSource` with `RateLimiterStrategy.perSecond`).
    pub fn from_generator_with_rate<T: Data>(
        &self,
        count: u64,
        per_second: f64,
        f: impl Fn(u64) -> T + Send + Sync + 'static,
    ) -> DataStream<T> {
        self.generator_source("Generator Source", count, Some(per_second), f)
    }

    fn generator_source<T: Data>(
        &self,
        name: &str,
        count: u64,
        rate: Option<f64>,
        f: impl Fn(u64) -> T + Send + Sync + 'static,
    ) -> DataStream<T> {
        let f: Arc<dyn Fn(u64) -> T + Send + Sync> = Arc::new(f);
        self.from_source(name, true, move |ctx| {
            let mut g =
                GeneratorSource::new(Arc::clone(&f), count, ctx.subtask_index, ctx.parallelism);
            g.rate = rate.map(RateLimiter::per_second);
            g
        })
    }

    /// Lines of a text file; see [`read_text_files`](Self::read_text_files).
    pub fn read_text_file(&self, path: impl Into<PathBuf>) -> DataStream<String> {
        self.read_text_files(vec![path.into()])
    }

    /// Lines of text files, split into byte ranges shared out among the
    /// parallel readers. A missing file fails the job before it runs.
    pub fn read_text_files(&self, paths: Vec<PathBuf>) -> DataStream<String> {
        self.read_text_files_with_rate(paths, None)
    }

    /// As [`read_text_files`](Self::read_text_files), each reader emitting at
    /// most `per_second` lines a second when a rate is given.
    pub fn read_text_files_with_rate(
        &self,
        paths: Vec<PathBuf>,
        per_second: Option<f64>,
    ) -> DataStream<String> {
        let name = paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let coordinator = TextFileSource::coordinator(&paths);
        let factory = SourceFactory::<String>::new(move |_| {
            let mut source = TextFileSource::new();
            source.rate = per_second.map(RateLimiter::per_second);
            Ok(Box::new(source))
        })
        .with_validation(move || TextFileSource::validate(&paths));
        self.add_coordinated_source(&name, true, Arc::new(factory), Some(coordinator))
    }
}

/// Records emitted per poll: large enough to amortise the poll, small enough
/// to notice cancellation quickly.
const BATCH: usize = 1024;

/// At most `per_second` records a second, averaged from the first poll
/// (Flink's `RateLimiterStrategy.perSecond`): a source that may emit
/// nothing now says so and the task thread runs its mailbox meanwhile, so
/// a slow source still takes checkpoints promptly.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    per_second: f64,
    started: Option<std::time::Instant>,
    granted: u64,
}

impl RateLimiter {
    pub fn per_second(per_second: f64) -> Self {
        RateLimiter {
            per_second: per_second.max(0.0),
            started: None,
            granted: 0,
        }
    }

    /// How many records may go out now, at most `max`.
    pub fn acquire(&mut self, max: usize) -> usize {
        let start = *self.started.get_or_insert_with(std::time::Instant::now);
        // The first record goes out at once.
        let due = (start.elapsed().as_secs_f64() * self.per_second) as u64 + 1;
        let n = due.saturating_sub(self.granted).min(max as u64);
        self.granted += n;
        n as usize
    }

    /// `n` of the records acquired were not emitted after all.
    pub fn give_back(&mut self, n: usize) {
        self.granted = self.granted.saturating_sub(n as u64);
    }

    /// Records allowed in a poll of a source limited by `rate`, if any.
    fn allowance(rate: &mut Option<RateLimiter>) -> usize {
        rate.as_mut().map_or(BATCH, |r| r.acquire(BATCH))
    }
}

pub struct CollectionSource<T> {
    items: Arc<Vec<T>>,
    /// (next index, step) of each stride this subtask emits: one on a
    /// fresh start, any number after a restore at another parallelism.
    cursors: VecDeque<(u64, u64)>,
}

impl<T> CollectionSource<T> {
    pub fn new(items: Arc<Vec<T>>, subtask: usize, parallelism: usize) -> Self {
        CollectionSource {
            items,
            cursors: VecDeque::from([(subtask as u64, parallelism.max(1) as u64)]),
        }
    }
}

impl<T: Data> SourceOperator<T> for CollectionSource<T> {
    fn initialize_state(
        &mut self,
        ctx: &mut fluvia_runtime::state::StateInitializationContext,
    ) -> Result<(), UserError> {
        if let Some(cursors) = restored_pairs(ctx)? {
            self.cursors = cursors;
        }
        Ok(())
    }

    fn snapshot_state(
        &mut self,
        ctx: &mut fluvia_runtime::state::StateSnapshotContext,
    ) -> Result<(), UserError> {
        let len = self.items.len() as u64;
        let cursors = self
            .cursors
            .iter()
            .filter(|(next, _)| *next < len)
            .map(|(next, step)| [next.to_le_bytes(), step.to_le_bytes()].concat())
            .collect();
        ctx.list_state(POSITION, cursors);
        Ok(())
    }

    fn poll_next(&mut self, out: &mut Collector<'_, T>) -> Result<SourceStatus, UserError> {
        for _ in 0..BATCH {
            let Some((next, step)) = self.cursors.front_mut() else {
                return Ok(SourceStatus::End);
            };
            match self.items.get(*next as usize) {
                Some(item) => {
                    out.collect(item.clone());
                    *next += (*step).max(1);
                }
                None => {
                    self.cursors.pop_front();
                }
            }
        }
        Ok(SourceStatus::MoreAvailable)
    }
}

pub struct GeneratorSource<T> {
    f: Arc<dyn Fn(u64) -> T + Send + Sync>,
    next: u64,
    end: u64,
    /// Further ranges to emit (a restore may hand a subtask several).
    queued: VecDeque<(u64, u64)>,
    pub rate: Option<RateLimiter>,
}

impl<T> GeneratorSource<T> {
    pub fn new(
        f: Arc<dyn Fn(u64) -> T + Send + Sync>,
        count: u64,
        subtask: usize,
        parallelism: usize,
    ) -> Self {
        let p = parallelism.max(1) as u128;
        let share = |i: u128| (i * count as u128 / p) as u64;
        GeneratorSource {
            f,
            next: share(subtask as u128),
            end: share(subtask as u128 + 1),
            queued: VecDeque::new(),
            rate: None,
        }
    }
}

/// The state name of a source's unread ranges or splits.
const POSITION: &str = "position";

/// Encodes `(next, end)` ranges as list-state elements.
fn encode_ranges(ranges: impl Iterator<Item = (u64, u64)>) -> Vec<Vec<u8>> {
    ranges
        .filter(|(next, end)| next < end)
        .map(|(next, end)| [next.to_le_bytes(), end.to_le_bytes()].concat())
        .collect()
}

/// The `(u64, u64)` pairs of a restored position state, if restored.
fn restored_pairs(
    ctx: &fluvia_runtime::state::StateInitializationContext,
) -> Result<Option<VecDeque<(u64, u64)>>, UserError> {
    if !ctx.is_restored() {
        return Ok(None);
    }
    let pairs = ctx
        .operator_state(POSITION)
        .iter()
        .map(|b| decode_range(b))
        .collect::<Result<_, _>>()?;
    Ok(Some(pairs))
}

fn decode_range(bytes: &[u8]) -> Result<(u64, u64), UserError> {
    let word = |i: usize| -> Result<u64, UserError> {
        let b: [u8; 8] = bytes
            .get(i..i + 8)
            .and_then(|b| b.try_into().ok())
            .ok_or("a source position in the restored state is malformed")?;
        Ok(u64::from_le_bytes(b))
    };
    Ok((word(0)?, word(8)?))
}

impl<T: Data> SourceOperator<T> for GeneratorSource<T> {
    /// A restored subtask emits the ranges it is given back (at another
    /// parallelism the ranges are split among the subtasks as list state).
    fn initialize_state(
        &mut self,
        ctx: &mut fluvia_runtime::state::StateInitializationContext,
    ) -> Result<(), UserError> {
        if let Some(ranges) = restored_pairs(ctx)? {
            self.queued = ranges;
            self.next = 0;
            self.end = 0;
        }
        Ok(())
    }

    fn snapshot_state(
        &mut self,
        ctx: &mut fluvia_runtime::state::StateSnapshotContext,
    ) -> Result<(), UserError> {
        let ranges = std::iter::once((self.next, self.end)).chain(self.queued.iter().copied());
        ctx.list_state(POSITION, encode_ranges(ranges));
        Ok(())
    }

    fn poll_next(&mut self, out: &mut Collector<'_, T>) -> Result<SourceStatus, UserError> {
        while self.next >= self.end {
            match self.queued.pop_front() {
                Some((next, end)) => (self.next, self.end) = (next, end),
                None => return Ok(SourceStatus::End),
            }
        }
        let allowed = RateLimiter::allowance(&mut self.rate);
        if allowed == 0 {
            return Ok(SourceStatus::NothingAvailable);
        }
        let stop = self.end.min(self.next + allowed as u64);
        while self.next < stop {
            out.collect((self.f)(self.next));
            self.next += 1;
        }
        Ok(if self.next >= self.end && self.queued.is_empty() {
            SourceStatus::End
        } else {
            SourceStatus::MoreAvailable
        })
    }
}

pub use fluvia_runtime::source::file::{FileSplit, create_splits};

/// Reads lines of text files as a FLIP-27 reader: it asks the source's
/// coordinator on the JobManager for a split whenever it has none left, so
/// a fast reader reads more of the input than a slow one.
pub struct TextFileSource {
    ctx: Option<OperatorContext>,
    splits: VecDeque<FileSplit>,
    current: Option<FileSplitReader>,
    /// A request is on its way to the coordinator.
    requested: bool,
    no_more_splits: bool,
    pub rate: Option<RateLimiter>,
}

impl Default for TextFileSource {
    fn default() -> Self {
        Self::new()
    }
}

impl TextFileSource {
    pub fn new() -> Self {
        TextFileSource {
            ctx: None,
            splits: VecDeque::new(),
            current: None,
            requested: false,
            no_more_splits: false,
            rate: None,
        }
    }

    /// Fails (before the job runs) if an input is missing or not a file.
    pub fn validate(paths: &[PathBuf]) -> Result<()> {
        for p in paths {
            match std::fs::metadata(p) {
                Ok(m) if m.is_file() => {}
                Ok(_) => {
                    return Err(FluviaError::Plan(format!(
                        "input '{}' is not a regular file",
                        p.display()
                    )));
                }
                Err(e) => {
                    return Err(FluviaError::Plan(format!(
                        "input file '{}' cannot be read: {e}",
                        p.display()
                    )));
                }
            }
        }
        Ok(())
    }

    /// The coordinator spec of a text file source over `paths`.
    pub fn coordinator(paths: &[PathBuf]) -> CoordinatorSpec {
        CoordinatorSpec {
            kind: FILE_SOURCE_COORDINATOR.to_string(),
            config: FileSourceConfig {
                paths: paths.to_vec(),
            }
            .encode(),
        }
    }

    fn request_split(&mut self) -> Result<(), UserError> {
        if !self.requested && !self.no_more_splits {
            if let Some(ctx) = &self.ctx {
                ctx.send_operator_event(SourceEvent::RequestSplit.encode())?;
            }
            self.requested = true;
        }
        Ok(())
    }
}

impl SourceOperator<String> for TextFileSource {
    /// A restored reader first reads the splits it held at the checkpoint
    /// (the split it was in from the next unread line); its coordinator
    /// restores the splits not handed out then.
    fn initialize_state(
        &mut self,
        ctx: &mut fluvia_runtime::state::StateInitializationContext,
    ) -> Result<(), UserError> {
        for bytes in ctx.operator_state(POSITION) {
            self.splits.push_back(FileSplit::decode(bytes)?);
        }
        Ok(())
    }

    fn snapshot_state(
        &mut self,
        ctx: &mut fluvia_runtime::state::StateSnapshotContext,
    ) -> Result<(), UserError> {
        let held = self
            .current
            .as_ref()
            .and_then(FileSplitReader::remainder)
            .into_iter()
            .chain(self.splits.iter().cloned())
            .map(|s| s.encode())
            .collect();
        ctx.list_state(POSITION, held);
        Ok(())
    }

    fn open(&mut self, ctx: &OperatorContext) -> Result<(), UserError> {
        self.ctx = Some(ctx.clone());
        self.request_split()
    }

    fn handle_operator_event(&mut self, event: &[u8]) -> Result<(), UserError> {
        match SourceEvent::decode(event)? {
            SourceEvent::AddSplits(splits) => {
                for s in splits {
                    self.splits.push_back(FileSplit::decode(&s)?);
                }
                self.requested = false;
            }
            SourceEvent::NoMoreSplits => {
                self.no_more_splits = true;
                self.requested = false;
            }
            SourceEvent::RequestSplit => {
                return Err("the coordinator sent a split request to a reader".into());
            }
        }
        Ok(())
    }

    fn poll_next(&mut self, out: &mut Collector<'_, String>) -> Result<SourceStatus, UserError> {
        let mut emitted = 0;
        let allowed = RateLimiter::allowance(&mut self.rate);
        if allowed == 0 {
            return Ok(SourceStatus::NothingAvailable);
        }
        while emitted < allowed {
            let current = match &mut self.current {
                Some(c) => c,
                None => match self.splits.pop_front() {
                    Some(s) => {
                        // Ask for the next split while this one is read.
                        if self.splits.is_empty() {
                            self.request_split()?;
                        }
                        self.current.insert(FileSplitReader::open(s)?)
                    }
                    None if self.no_more_splits => return Ok(SourceStatus::End),
                    None => {
                        self.request_split()?;
                        if let Some(r) = &mut self.rate {
                            r.give_back(allowed - emitted);
                        }
                        return Ok(if emitted > 0 {
                            SourceStatus::MoreAvailable
                        } else {
                            SourceStatus::NothingAvailable
                        });
                    }
                },
            };
            match current.next_line()? {
                Some(line) => {
                    out.collect(line.to_string());
                    emitted += 1;
                }
                None => self.current = None,
            }
        }
        Ok(SourceStatus::MoreAvailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_limiter_grants_one_at_once_and_then_by_elapsed_time() {
        let mut r = RateLimiter::per_second(1000.0);
        assert_eq!(r.acquire(BATCH), 1, "the first record goes out at once");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let later = r.acquire(BATCH);
        // At least 50 ms passed: 50 more are due; never more than the cap.
        assert!(later >= 49, "{later}");
        assert!(later <= BATCH);
        r.give_back(later);
        assert!(
            r.acquire(BATCH) >= later,
            "what was given back is granted again"
        );
    }
}
