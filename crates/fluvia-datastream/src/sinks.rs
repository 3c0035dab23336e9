//! The sinks behind the DataStream methods that end a stream: print,
//! collect, text files, discard and user functions.

use fluvia_runtime::state::{StateInitializationContext, StateSnapshotContext};
use fluvia_runtime::{Collector, Data, OneInputOperator, OperatorContext, UserError};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A sink's `process_element`: each record goes to the body given, and
/// nothing is emitted.
macro_rules! sink_invoke {
    (|$this:ident, $record:ident: $t:ty| $body:block) => {
        #[inline]
        fn process_element(
            &mut $this,
            $record: $t,
            _out: &mut Collector<'_, ()>,
        ) -> Result<(), UserError> $body
    };
}

/// Prints records with `Debug`, prefixed by `subtask> ` when parallel (as
/// Flink's print sink does).
pub struct PrintSink {
    pub prefix: String,
}

impl<T: std::fmt::Debug + 'static> OneInputOperator<T, ()> for PrintSink {
    fn open(&mut self, ctx: &OperatorContext) -> Result<(), UserError> {
        if ctx.parallelism > 1 {
            self.prefix = format!("{}> ", ctx.subtask_index + 1);
        }
        Ok(())
    }

    sink_invoke!(|self, record: T| {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}{:?}", self.prefix, record)?;
        Ok(())
    });
}

/// Gathers a subtask's records and hands them to the client in the
/// attempt's final report (an accumulator named after the sink), so
/// `collect()` works on any cluster and only the winning attempt counts.
pub struct CollectSink<T> {
    pub name: String,
    pub local: Vec<T>,
    pub accumulators: Option<fluvia_runtime::operator::Accumulators>,
}

impl<T: Data> OneInputOperator<T, ()> for CollectSink<T> {
    fn open(&mut self, ctx: &OperatorContext) -> Result<(), UserError> {
        self.accumulators = Some(ctx.accumulators());
        Ok(())
    }

    sink_invoke!(|self, record: T| {
        self.local.push(record);
        Ok(())
    });

    fn end_input(&mut self, _out: &mut Collector<'_, ()>) -> Result<(), UserError> {
        let bytes = bincode::serialize(&self.local)
            .map_err(|e| format!("encoding the collected records: {e}"))?;
        self.local.clear();
        if let Some(acc) = &self.accumulators {
            acc.borrow_mut().push((self.name.clone(), bytes));
        }
        Ok(())
    }
}

/// The records a collect sink gathered, readable after the job ran.
#[derive(Clone)]
pub struct CollectHandle<T> {
    pub(crate) data: Arc<Mutex<Vec<T>>>,
}

impl<T> CollectHandle<T> {
    /// Takes everything collected so far.
    pub fn take(&self) -> Vec<T> {
        self.data
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// How the text file sink names and rolls its part files in STREAMING
/// mode with checkpointing (Flink's `FileSink` row format:
/// `OutputFileConfig` and `DefaultRollingPolicy`). A part file is also
/// rolled at every checkpoint, whatever these say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSinkOptions {
    /// Finished parts are named `<prefix>-<subtask>-<counter><suffix>`
    /// (`OutputFileConfig.partPrefix`, default `part`).
    pub part_prefix: String,
    /// `OutputFileConfig.partSuffix` (default none).
    pub part_suffix: String,
    /// Roll when the part reaches this many bytes (`rolling-policy.file-size`,
    /// Flink's default 128 MiB).
    pub part_size: u64,
    /// Roll when the part has been open this long
    /// (`rolling-policy.rollover-interval`, Flink's default 60 s); checked
    /// when a record is written.
    pub rollover_interval: std::time::Duration,
}

impl Default for FileSinkOptions {
    fn default() -> Self {
        FileSinkOptions {
            part_prefix: "part".into(),
            part_suffix: String::new(),
            part_size: 128 * 1024 * 1024,
            rollover_interval: std::time::Duration::from_secs(60),
        }
    }
}

impl FileSinkOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_part_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.part_prefix = prefix.into();
        self
    }
    pub fn with_part_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.part_suffix = suffix.into();
        self
    }
    pub fn with_part_size(mut self, bytes: u64) -> Self {
        self.part_size = bytes.max(1);
        self
    }
    pub fn with_rollover_interval(mut self, interval: std::time::Duration) -> Self {
        self.rollover_interval = interval;
        self
    }
}

/// A closed part file waiting for its checkpoint to complete (Flink's
/// pending file, the committable of the file sink): the hidden name it was
/// written under and its final name, both in the sink's directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PendingPartFile {
    /// The checkpoint that recorded it (none: not yet snapshotted).
    pub checkpoint_id: Option<u64>,
    pub pending: String,
    pub target: String,
    /// The directory it was written in, absolute: a job restored from a
    /// savepoint into another directory still commits the savepoint's files
    /// where they are (empty: the sink's directory).
    #[serde(default)]
    pub dir: String,
}

/// The list state the text sink keeps its pending part files in (union
/// state: after a rescale every subtask sees them all, commits them
/// idempotently and knows which hidden files are still needed).
pub const PENDING_PART_FILES_STATE: &str = "pending-part-files";

/// The part being written.
struct InProgressPart {
    writer: std::io::BufWriter<std::fs::File>,
    pending: String,
    target: String,
    bytes: u64,
    opened: std::time::Instant,
}

/// The part-file lifecycle of a subtask in STREAMING mode with
/// checkpointing: in-progress → pending (closed at the barrier, recorded in
/// the checkpoint) → finished (renamed when the checkpoint completes).
struct PartFiles {
    dir: PathBuf,
    options: FileSinkOptions,
    subtask: usize,
    parallelism: usize,
    /// Unique to this attempt: in-progress names never collide.
    uid: String,
    next_part: u64,
    current: Option<InProgressPart>,
    pending: Vec<PendingPartFile>,
    staged: fluvia_runtime::operator::StagedFiles,
}

/// Renames a pending part file to its final name. A pending file that is
/// gone while its final file exists was committed before (a restore
/// commits again what the restored checkpoint recorded): nothing to do.
pub fn commit_part_file(dir: &std::path::Path, file: &PendingPartFile) -> Result<(), UserError> {
    let dir = if file.dir.is_empty() {
        dir
    } else {
        std::path::Path::new(&file.dir)
    };
    let (from, to) = (dir.join(&file.pending), dir.join(&file.target));
    match std::fs::rename(&from, &to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => Ok(()),
        Err(e) => Err(format!(
            "committing the part file '{}' as '{}': {e}",
            from.display(),
            to.display()
        )
        .into()),
    }
}

/// `dir` made absolute (against the working directory), as text.
fn absolute_dir(dir: &std::path::Path) -> String {
    std::path::absolute(dir)
        .unwrap_or_else(|_| dir.to_path_buf())
        .display()
        .to_string()
}

/// The subtask and counter of a part file named by `options`, finished
/// (`part-1-7`) or hidden (`.part-1-7.inprogress.<uid>`).
fn parse_part_name(name: &str, options: &FileSinkOptions) -> Option<(usize, u64, bool)> {
    let (visible, hidden) = match name.strip_prefix('.') {
        Some(rest) => (rest.split_once(".inprogress.")?.0, true),
        None => (name, false),
    };
    let rest = visible
        .strip_prefix(options.part_prefix.as_str())?
        .strip_prefix('-')?
        .strip_suffix(options.part_suffix.as_str())?;
    let (subtask, counter) = rest.split_once('-')?;
    Some((subtask.parse().ok()?, counter.parse().ok()?, hidden))
}

fn unique_suffix(attempt: u32) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{attempt}-{:x}{:x}{:x}",
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

impl PartFiles {
    fn dir_entries(&self) -> Result<Vec<String>, UserError> {
        let listing = std::fs::read_dir(&self.dir)
            .map_err(|e| format!("listing the output directory '{}': {e}", self.dir.display()))?;
        let mut names = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| {
                format!("listing the output directory '{}': {e}", self.dir.display())
            })?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    /// After a restore: commits what the restored checkpoint recorded,
    /// removes this subtask's hidden files it did not record (written after
    /// it, by attempts that failed), and continues the counter after every
    /// part of this subtask in the directory.
    fn recover(&mut self, restored: Option<&[PendingPartFile]>) -> Result<(), UserError> {
        if let Some(restored) = restored {
            for file in restored {
                commit_part_file(&self.dir, file)?;
            }
            let here = absolute_dir(&self.dir);
            let keep: std::collections::HashSet<&str> = restored
                .iter()
                .filter(|f| f.dir.is_empty() || f.dir == here)
                .map(|f| f.pending.as_str())
                .collect();
            for name in self.dir_entries()? {
                let Some((subtask, _, true)) = parse_part_name(&name, &self.options) else {
                    continue;
                };
                // Subtasks a smaller parallelism no longer runs are cleaned
                // by the one their index folds onto.
                if subtask % self.parallelism != self.subtask || keep.contains(name.as_str()) {
                    continue;
                }
                let path = self.dir.join(&name);
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(format!(
                            "removing the uncommitted part file '{}': {e}",
                            path.display()
                        )
                        .into());
                    }
                }
            }
        }
        self.next_part = self
            .dir_entries()?
            .iter()
            .filter_map(|n| parse_part_name(n, &self.options))
            .filter(|(s, _, _)| *s == self.subtask)
            .map(|(_, n, _)| n + 1)
            .max()
            .unwrap_or(0);
        Ok(())
    }

    fn write<T: std::fmt::Display>(&mut self, record: &T) -> Result<(), UserError> {
        if let Some(part) = &self.current
            && (part.bytes >= self.options.part_size
                || part.opened.elapsed() >= self.options.rollover_interval)
        {
            self.roll()?;
        }
        if self.current.is_none() {
            let part = self.open_part()?;
            self.current = Some(part);
        }
        let Some(part) = &mut self.current else {
            return Ok(());
        };
        let line = format!("{record}\n");
        part.writer
            .write_all(line.as_bytes())
            .map_err(|e| format!("writing '{}': {e}", self.dir.join(&part.pending).display()))?;
        part.bytes += line.len() as u64;
        Ok(())
    }

    fn open_part(&mut self) -> Result<InProgressPart, UserError> {
        let o = &self.options;
        let target = format!(
            "{}-{}-{}{}",
            o.part_prefix, self.subtask, self.next_part, o.part_suffix
        );
        let pending = format!(".{target}.inprogress.{}", self.uid);
        let path = self.dir.join(&pending);
        let file = std::fs::File::create(&path)
            .map_err(|e| format!("cannot create part file '{}': {e}", path.display()))?;
        self.next_part += 1;
        Ok(InProgressPart {
            writer: std::io::BufWriter::new(file),
            pending,
            target,
            bytes: 0,
            opened: std::time::Instant::now(),
        })
    }

    /// Closes the part being written (if any) into a pending file.
    fn roll(&mut self) -> Result<(), UserError> {
        let Some(mut part) = self.current.take() else {
            return Ok(());
        };
        let path = self.dir.join(&part.pending);
        part.writer
            .flush()
            .and_then(|()| part.writer.get_ref().sync_data())
            .map_err(|e| format!("closing the part file '{}': {e}", path.display()))?;
        self.pending.push(PendingPartFile {
            checkpoint_id: None,
            pending: part.pending,
            target: part.target,
            dir: absolute_dir(&self.dir),
        });
        Ok(())
    }

    fn snapshot(&mut self, ctx: &mut StateSnapshotContext) -> Result<(), UserError> {
        self.roll()?;
        let mut elements = Vec::with_capacity(self.pending.len());
        for file in &mut self.pending {
            file.checkpoint_id.get_or_insert(ctx.checkpoint_id);
            elements
                .push(bincode::serialize(&*file).map_err(|e| {
                    format!("encoding the pending part file {}: {e}", file.pending)
                })?);
        }
        ctx.union_list_state(PENDING_PART_FILES_STATE, elements);
        Ok(())
    }

    fn commit_up_to(&mut self, checkpoint_id: u64) -> Result<(), UserError> {
        let (ready, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|f| f.checkpoint_id.is_some_and(|c| c <= checkpoint_id));
        self.pending = later;
        for file in &ready {
            commit_part_file(&self.dir, file)?;
        }
        Ok(())
    }

    /// The end of a bounded streaming job's input: what is left (the last
    /// part and the pending files whose checkpoint was not confirmed) is
    /// committed when the job finishes, staged like a batch job's output,
    /// and removed if this attempt fails or the job does not finish.
    /// Flink waits for a final checkpoint instead; no checkpoint is taken
    /// here once a task finished, so the job's own end is the first point
    /// where these records can no longer be replayed.
    fn end(&mut self) -> Result<(), UserError> {
        self.roll()?;
        let utf8 = |p: PathBuf| -> Result<String, UserError> {
            p.to_str()
                .map(str::to_string)
                .ok_or_else(|| format!("output path '{}' is not UTF-8", p.display()).into())
        };
        let mut staged = Vec::with_capacity(self.pending.len());
        for file in std::mem::take(&mut self.pending) {
            staged.push(fluvia_runtime::operator::StagedFile {
                pending: utf8(self.dir.join(&file.pending))?,
                target: utf8(self.dir.join(&file.target))?,
            });
        }
        self.staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(staged);
        Ok(())
    }
}

/// Writes one line per record (`Display`).
///
/// In BATCH mode, and in STREAMING mode without checkpointing: to `path`
/// itself at parallelism 1, else to `path/part-<subtask>`. In batch, each
/// attempt writes a file of its own and the winner's gets the final name
/// when the job finishes, so it supports concurrent attempts.
///
/// In STREAMING mode with checkpointing (Flink's `FileSink`, exactly once):
/// `path` is a directory; subtask `i` writes hidden in-progress files
/// `.part-<i>-<n>.inprogress.<uid>`, closes the one open at each barrier
/// (or when the rolling policy says) into a pending file recorded in the
/// checkpoint, and renames the pending files of checkpoints up to `id` to
/// `part-<i>-<n>` when checkpoint `id` completes. A restore commits the
/// pending files of the restored checkpoint again (idempotent) and removes
/// the subtask's hidden files written after it.
pub struct TextFileSink {
    pub path: PathBuf,
    pub options: FileSinkOptions,
    writer: Option<std::io::BufWriter<std::fs::File>>,
    file: PathBuf,
    parts: Option<PartFiles>,
    /// What `initialize_state` restored, committed in `open` (which knows
    /// the subtask).
    restored: Option<Vec<PendingPartFile>>,
}

impl TextFileSink {
    pub fn new(path: impl Into<PathBuf>, options: FileSinkOptions) -> Self {
        TextFileSink {
            path: path.into(),
            options,
            writer: None,
            file: PathBuf::new(),
            parts: None,
            restored: None,
        }
    }

    /// The pending part files not committed yet (for tests and metrics).
    pub fn pending_part_files(&self) -> &[PendingPartFile] {
        self.parts.as_ref().map_or(&[], |p| p.pending.as_slice())
    }

    fn open_single_file(&mut self, ctx: &OperatorContext) -> Result<(), UserError> {
        self.file = if ctx.parallelism == 1 {
            self.path.clone()
        } else {
            std::fs::create_dir_all(&self.path).map_err(|e| {
                format!(
                    "cannot create output directory '{}': {e}",
                    self.path.display()
                )
            })?;
            self.path.join(format!("part-{}", ctx.subtask_index))
        };
        if let Some(parent) = self.file.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create directory '{}': {e}", parent.display()))?;
        }
        // In batch, written under an attempt-private name and renamed when
        // the job finishes if this attempt won. A streaming job without
        // checkpoints may never finish and has none to commit on: it writes
        // in place, as Flink's `writeAsText`.
        let pending = if ctx.batch {
            ctx.stage_file(&self.file)?
        } else {
            self.file.clone()
        };
        let f = std::fs::File::create(&pending)
            .map_err(|e| format!("cannot create output file '{}': {e}", pending.display()))?;
        self.writer = Some(std::io::BufWriter::new(f));
        Ok(())
    }
}

impl<T: std::fmt::Display + 'static> OneInputOperator<T, ()> for TextFileSink {
    fn initialize_state(&mut self, ctx: &mut StateInitializationContext) -> Result<(), UserError> {
        if !ctx.is_restored() {
            return Ok(());
        }
        let mut restored = Vec::new();
        for bytes in ctx.operator_state(PENDING_PART_FILES_STATE) {
            let file: PendingPartFile = bincode::deserialize(bytes)
                .map_err(|e| format!("decoding a restored pending part file: {e}"))?;
            restored.push(file);
        }
        self.restored = Some(restored);
        Ok(())
    }

    fn open(&mut self, ctx: &OperatorContext) -> Result<(), UserError> {
        let restored = self.restored.take();
        if ctx.batch || ctx.checkpoint_interval.is_none() {
            // Pending files of a checkpoint taken with checkpointing on are
            // still committed.
            if let Some(restored) = &restored {
                for file in restored {
                    commit_part_file(&self.path, file)?;
                }
            }
            return self.open_single_file(ctx);
        }
        std::fs::create_dir_all(&self.path).map_err(|e| {
            format!(
                "cannot create output directory '{}': {e}",
                self.path.display()
            )
        })?;
        let mut parts = PartFiles {
            dir: self.path.clone(),
            options: self.options.clone(),
            subtask: ctx.subtask_index,
            parallelism: ctx.parallelism.max(1),
            uid: unique_suffix(ctx.attempt_number),
            next_part: 0,
            current: None,
            pending: Vec::new(),
            staged: ctx.staged_files(),
        };
        parts.recover(restored.as_deref())?;
        self.parts = Some(parts);
        Ok(())
    }

    sink_invoke!(|self, record: T| {
        if let Some(parts) = &mut self.parts {
            return parts.write(&record);
        }
        if let Some(w) = &mut self.writer {
            writeln!(w, "{record}")
                .map_err(|e| format!("writing '{}': {e}", self.file.display()))?;
        }
        Ok(())
    });

    fn snapshot_state(&mut self, ctx: &mut StateSnapshotContext) -> Result<(), UserError> {
        match &mut self.parts {
            Some(parts) => parts.snapshot(ctx),
            None => Ok(()),
        }
    }

    fn notify_checkpoint_complete(&mut self, id: u64) -> Result<(), UserError> {
        match &mut self.parts {
            Some(parts) => parts.commit_up_to(id),
            None => Ok(()),
        }
    }

    // An aborted checkpoint's pending files stay pending: the next
    // checkpoint that completes commits them (its id is larger).

    fn end_input(&mut self, _out: &mut Collector<'_, ()>) -> Result<(), UserError> {
        if let Some(parts) = &mut self.parts {
            return parts.end();
        }
        if let Some(mut w) = self.writer.take() {
            w.flush()
                .map_err(|e| format!("writing '{}': {e}", self.file.display()))?;
        }
        Ok(())
    }
}

/// Drops every record (Flink's `DiscardingSink`), for benchmarks.
pub struct DiscardSink;

impl<T: 'static> OneInputOperator<T, ()> for DiscardSink {
    sink_invoke!(|self, record: T| {
        std::hint::black_box(record);
        Ok(())
    });
}

/// Calls a function per record.
pub struct FnSink<F>(pub Arc<F>);

impl<T, F> OneInputOperator<T, ()> for FnSink<F>
where
    T: 'static,
    F: Fn(T) -> Result<(), UserError> + Send + Sync + 'static,
{
    sink_invoke!(|self, record: T| { (self.0)(record) });
}

// ------------------------------------------------------ two-phase commit

/// A user sink that writes in transactions committed exactly once with
/// checkpoints (Flink's `TwoPhaseCommitSinkFunction`; Sink V2's
/// `CommittingSinkWriter` + `Committer`).
///
/// A transaction is begun when the subtask opens and after every
/// checkpoint; records are written into the current one. At a checkpoint
/// barrier the current transaction is pre-committed (flushed, made ready)
/// and recorded in the checkpoint with its id; once that checkpoint
/// completes it is committed. After a failure the restored pending
/// transactions are committed again ([`recover_and_commit`], which must be
/// idempotent: they may have been committed before the failure) and the
/// transaction that was open at the checkpoint is aborted
/// ([`recover_and_abort`]).
///
/// [`recover_and_commit`]: Self::recover_and_commit
/// [`recover_and_abort`]: Self::recover_and_abort
pub trait TwoPhaseCommitSink<T>: Send + 'static {
    /// What identifies a transaction; it is stored in checkpoints.
    type Txn: Data;
    /// Starts a transaction.
    fn begin(&mut self) -> Result<Self::Txn, UserError>;
    /// Writes a record within `txn`.
    fn write(&mut self, txn: &mut Self::Txn, value: T) -> Result<(), UserError>;
    /// Makes `txn` ready to commit (flush): after this, a commit must not
    /// fail for lack of data.
    fn pre_commit(&mut self, txn: &mut Self::Txn) -> Result<(), UserError>;
    /// Commits a pre-committed transaction. Must be idempotent.
    fn commit(&mut self, txn: Self::Txn) -> Result<(), UserError>;
    /// Gives up a transaction.
    fn abort(&mut self, txn: Self::Txn) -> Result<(), UserError>;
    /// Commits a pre-committed transaction restored from a checkpoint (it
    /// may have been committed before).
    fn recover_and_commit(&mut self, txn: Self::Txn) -> Result<(), UserError> {
        self.commit(txn)
    }
    /// Aborts the transaction that was open when the restored checkpoint
    /// was taken.
    fn recover_and_abort(&mut self, txn: Self::Txn) -> Result<(), UserError> {
        self.abort(txn)
    }
}

/// The list state a two-phase-commit sink keeps its transactions in.
pub const TRANSACTIONS_STATE: &str = "two-phase-commit-transactions";

/// One element of [`TRANSACTIONS_STATE`].
#[derive(serde::Serialize, serde::Deserialize)]
enum TxnState<X> {
    /// Pre-committed at checkpoint `.0`, waiting for it to complete.
    Pending(u64, X),
    /// Open when the checkpoint was taken.
    Open(X),
}

/// The operator that drives a [`TwoPhaseCommitSink`].
pub struct TwoPhaseCommitSinkOp<T, S: TwoPhaseCommitSink<T>> {
    pub sink: S,
    current: Option<S::Txn>,
    /// Pre-committed transactions and the checkpoint that recorded them.
    pending: Vec<(u64, S::Txn)>,
    _t: std::marker::PhantomData<fn(T)>,
}

impl<T, S: TwoPhaseCommitSink<T>> TwoPhaseCommitSinkOp<T, S> {
    pub fn new(sink: S) -> Self {
        TwoPhaseCommitSinkOp {
            sink,
            current: None,
            pending: Vec::new(),
            _t: std::marker::PhantomData,
        }
    }

    /// The checkpoints whose transactions wait for their completion.
    pub fn pending_checkpoints(&self) -> Vec<u64> {
        self.pending.iter().map(|(id, _)| *id).collect()
    }

    fn current(&mut self) -> Result<&mut S::Txn, UserError> {
        if self.current.is_none() {
            self.current = Some(self.sink.begin()?);
        }
        self.current
            .as_mut()
            .ok_or_else(|| "no transaction to write into".into())
    }
}

impl<T: 'static, S: TwoPhaseCommitSink<T>> OneInputOperator<T, ()> for TwoPhaseCommitSinkOp<T, S> {
    fn initialize_state(&mut self, ctx: &mut StateInitializationContext) -> Result<(), UserError> {
        let mut open = Vec::new();
        let mut pending = Vec::new();
        for bytes in ctx.operator_state(TRANSACTIONS_STATE) {
            match bincode::deserialize::<TxnState<S::Txn>>(bytes)
                .map_err(|e| format!("decoding a restored transaction: {e}"))?
            {
                TxnState::Pending(id, txn) => pending.push((id, txn)),
                TxnState::Open(txn) => open.push(txn),
            }
        }
        // The restored checkpoint completed: what it pre-committed is
        // committed (again); what was open then is rolled back, its
        // records are replayed.
        pending.sort_by_key(|(id, _)| *id);
        for (_, txn) in pending {
            self.sink.recover_and_commit(txn)?;
        }
        for txn in open {
            self.sink.recover_and_abort(txn)?;
        }
        Ok(())
    }

    fn open(&mut self, _ctx: &OperatorContext) -> Result<(), UserError> {
        self.current()?;
        Ok(())
    }

    sink_invoke!(|self, record: T| {
        self.current()?;
        match &mut self.current {
            Some(txn) => self.sink.write(txn, record),
            None => Err("no transaction to write into".into()),
        }
    });

    fn snapshot_state(&mut self, ctx: &mut StateSnapshotContext) -> Result<(), UserError> {
        if let Some(mut txn) = self.current.take() {
            self.sink.pre_commit(&mut txn)?;
            self.pending.push((ctx.checkpoint_id, txn));
        }
        let next = self.sink.begin()?;
        let encode = |s: &TxnState<&S::Txn>| {
            bincode::serialize(s).map_err(|e| format!("encoding a transaction: {e}"))
        };
        let mut elements = Vec::with_capacity(self.pending.len() + 1);
        for (id, txn) in &self.pending {
            elements.push(encode(&TxnState::Pending(*id, txn))?);
        }
        elements.push(encode(&TxnState::Open(&next))?);
        self.current = Some(next);
        ctx.list_state(TRANSACTIONS_STATE, elements);
        Ok(())
    }

    fn notify_checkpoint_complete(&mut self, id: u64) -> Result<(), UserError> {
        let (ready, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(c, _)| *c <= id);
        self.pending = later;
        for (_, txn) in ready {
            self.sink.commit(txn)?;
        }
        Ok(())
    }

    // An aborted checkpoint's transactions stay pre-committed: their
    // records will not be replayed unless the job fails over (then the
    // restore decides), so the next completed checkpoint commits them.

    fn end_input(&mut self, _out: &mut Collector<'_, ()>) -> Result<(), UserError> {
        // The task ends normally: everything written is committed now.
        if let Some(mut txn) = self.current.take() {
            self.sink.pre_commit(&mut txn)?;
            self.pending.push((u64::MAX, txn));
        }
        for (_, txn) in std::mem::take(&mut self.pending) {
            self.sink.commit(txn)?;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), UserError> {
        if let Some(txn) = self.current.take() {
            self.sink.abort(txn)?;
        }
        Ok(())
    }
}
