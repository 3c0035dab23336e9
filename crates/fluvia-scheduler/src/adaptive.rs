//! The adaptive batch scheduler's decider: Flink's
//! `DefaultVertexParallelismAndInputInfosDecider` in its 1.17–1.19 form
//! (FLIP-187, FLIP-283). From the bytes in each subpartition of the blocking
//! results a vertex consumes, it decides the vertex's parallelism and which
//! partitions and subpartitions each of its subtasks reads.
//!
//! Plain data in and out. It does not touch the [`ExecutionGraph`] and does
//! not schedule; the Scheduler asks it once a vertex's producers have
//! finished and applies the answer.
//!
//! [`ExecutionGraph`]: crate::ExecutionGraph

use crate::execution_graph::SubpartitionRange;
use fluvia_core::{Configuration, FluviaError, Result};

/// Flink's `IndexRange`: an inclusive range of partition or subpartition
/// indices. The same type as [`SubpartitionRange`], so a decided range goes
/// straight into a `ConsumedPartition`.
pub type IndexRange = SubpartitionRange;

/// Flink's `MAX_NUM_SUBPARTITIONS_PER_TASK_CONSUME`: the most subpartitions of
/// one result a subtask may read, because each one is an input channel and
/// too many channels make a task slow.
pub const MAX_NUM_SUBPARTITIONS_PER_TASK_CONSUME: usize = 32768;

/// The `execution.batch.adaptive.auto-parallelism.*` options (Flink's
/// `BatchExecutionOptions`), defined with the other keys in
/// `fluvia_core::config::options`.
pub mod options {
    pub use fluvia_core::config::options::{
        AUTO_PARALLELISM_AVG_DATA_VOLUME as AVG_DATA_VOLUME_PER_TASK,
        AUTO_PARALLELISM_DEFAULT_SOURCE as DEFAULT_SOURCE_PARALLELISM,
        AUTO_PARALLELISM_ENABLED as ENABLED, AUTO_PARALLELISM_MAX as MAX_PARALLELISM,
        AUTO_PARALLELISM_MIN as MIN_PARALLELISM,
    };
}

/// The decider's settings (the global bounds; each vertex's max parallelism
/// narrows them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeciderConfig {
    pub min_parallelism: usize,
    pub max_parallelism: usize,
    pub avg_data_volume_per_task: u64,
    pub default_source_parallelism: usize,
}

impl Default for DeciderConfig {
    fn default() -> Self {
        DeciderConfig {
            min_parallelism: options::MIN_PARALLELISM.default,
            max_parallelism: options::MAX_PARALLELISM.default,
            avg_data_volume_per_task: options::AVG_DATA_VOLUME_PER_TASK.default,
            default_source_parallelism: options::DEFAULT_SOURCE_PARALLELISM.default,
        }
    }
}

impl DeciderConfig {
    pub fn from_configuration(conf: &Configuration) -> Result<Self> {
        let config = DeciderConfig {
            min_parallelism: conf.get(&options::MIN_PARALLELISM)?,
            max_parallelism: conf.get(&options::MAX_PARALLELISM)?,
            avg_data_volume_per_task: conf.get(&options::AVG_DATA_VOLUME_PER_TASK)?,
            default_source_parallelism: conf.get(&options::DEFAULT_SOURCE_PARALLELISM)?,
        };
        config.validate()?;
        Ok(config)
    }

    /// Flink's constructor checks, plus a non-zero data volume (Flink would
    /// divide by zero and end at the max parallelism).
    pub fn validate(&self) -> Result<()> {
        let fail = |msg: String| Err(FluviaError::Config(msg));
        if self.min_parallelism == 0 {
            return fail(format!(
                "'{}' must be at least 1",
                options::MIN_PARALLELISM.key
            ));
        }
        if self.max_parallelism < self.min_parallelism {
            return fail(format!(
                "'{}' ({}) is smaller than '{}' ({})",
                options::MAX_PARALLELISM.key,
                self.max_parallelism,
                options::MIN_PARALLELISM.key,
                self.min_parallelism
            ));
        }
        if self.avg_data_volume_per_task == 0 {
            return fail(format!(
                "'{}' must be at least 1 byte",
                options::AVG_DATA_VOLUME_PER_TASK.key
            ));
        }
        if self.default_source_parallelism == 0 {
            return fail(format!(
                "'{}' must be at least 1",
                options::DEFAULT_SOURCE_PARALLELISM.key
            ));
        }
        Ok(())
    }
}

/// One blocking result the vertex consumes, once all its producers finished
/// (Flink's `AllToAllBlockingResultInfo` / `PointwiseBlockingResultInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockingResultInfo {
    /// Every consumer reads all of it (one subpartition per partition on a
    /// dynamic graph). Only with all-to-all.
    pub is_broadcast: bool,
    /// Pointwise (forward, rescale) rather than all-to-all.
    pub is_pointwise: bool,
    /// Per producer partition (subtask), the bytes of each subpartition.
    pub subpartition_bytes: Vec<Vec<u64>>,
}

impl BlockingResultInfo {
    pub fn all_to_all(subpartition_bytes: Vec<Vec<u64>>) -> Self {
        BlockingResultInfo {
            is_broadcast: false,
            is_pointwise: false,
            subpartition_bytes,
        }
    }

    pub fn broadcast(subpartition_bytes: Vec<Vec<u64>>) -> Self {
        BlockingResultInfo {
            is_broadcast: true,
            is_pointwise: false,
            subpartition_bytes,
        }
    }

    pub fn pointwise(subpartition_bytes: Vec<Vec<u64>>) -> Self {
        BlockingResultInfo {
            is_broadcast: false,
            is_pointwise: true,
            subpartition_bytes,
        }
    }

    pub fn num_partitions(&self) -> usize {
        self.subpartition_bytes.len()
    }

    /// Subpartitions of one partition (0 if there is no such partition).
    pub fn num_subpartitions(&self, partition: usize) -> usize {
        self.subpartition_bytes.get(partition).map_or(0, Vec::len)
    }

    /// Every byte the producers wrote (a broadcast result counts each
    /// subpartition it wrote).
    pub fn total_bytes(&self) -> u64 {
        self.subpartition_bytes
            .iter()
            .flatten()
            .fold(0, |acc, &b| acc.saturating_add(b))
    }

    /// Bytes of subpartition `s` summed over all partitions: what the
    /// consumer of `s` reads from an all-to-all result. Errors if the
    /// partitions do not all have the same number of subpartitions.
    pub fn aggregated_subpartition_bytes(&self) -> Result<Vec<u64>> {
        let n = self.uniform_num_subpartitions()?;
        let mut agg = vec![0u64; n];
        for partition in &self.subpartition_bytes {
            for (sum, &b) in agg.iter_mut().zip(partition) {
                *sum = sum.saturating_add(b);
            }
        }
        Ok(agg)
    }

    /// Bytes a subtask reads when it is given these ranges (Flink's
    /// `getNumBytesProduced(partitionRange, subpartitionRange)`).
    pub fn num_bytes_in(&self, partitions: IndexRange, subpartitions: IndexRange) -> Result<u64> {
        let mut sum = 0u64;
        for p in partitions.iter() {
            let Some(row) = self.subpartition_bytes.get(p) else {
                return internal(format!(
                    "partition {p} out of range: the result has {} partitions",
                    self.num_partitions()
                ));
            };
            for s in subpartitions.iter() {
                let Some(&b) = row.get(s) else {
                    return internal(format!(
                        "subpartition {s} out of range: partition {p} has {}",
                        row.len()
                    ));
                };
                sum = sum.saturating_add(b);
            }
        }
        Ok(sum)
    }

    fn uniform_num_subpartitions(&self) -> Result<usize> {
        let n = self.num_subpartitions(0);
        match self.subpartition_bytes.iter().position(|p| p.len() != n) {
            None => Ok(n),
            Some(p) => internal(format!(
                "partition 0 has {n} subpartitions but partition {p} has {}",
                self.subpartition_bytes[p].len()
            )),
        }
    }
}

/// What one subtask reads of one input: the same subpartition range of every
/// partition in the partition range (Flink 1.x's `ExecutionVertexInputInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutionVertexInputInfo {
    pub partition_range: IndexRange,
    pub subpartition_range: IndexRange,
}

/// What every subtask reads of one input (Flink's `JobVertexInputInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobVertexInputInfo {
    /// Indexed by subtask.
    pub subtasks: Vec<ExecutionVertexInputInfo>,
}

/// The decision: the parallelism and, per consumed result in the order given
/// to [`decide`], what each subtask reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelismAndInputInfos {
    pub parallelism: usize,
    pub inputs: Vec<JobVertexInputInfo>,
}

/// Decides the parallelism of a vertex and what each of its subtasks reads.
///
/// `initial_parallelism` is a parallelism already fixed (set by the user or
/// by a forward group); it is kept and the subpartitions split evenly. Else
/// a source gets the default source parallelism, and a vertex whose inputs
/// are all all-to-all gets ranges balanced by bytes (FLIP-283); any other
/// vertex gets a parallelism from its bytes and an even split.
pub fn decide(
    vertex_max_parallelism: usize,
    initial_parallelism: Option<usize>,
    inputs: &[BlockingResultInfo],
    config: &DeciderConfig,
) -> Result<ParallelismAndInputInfos> {
    config.validate()?;
    if vertex_max_parallelism == 0 {
        return plan("vertex max parallelism must be at least 1");
    }
    match initial_parallelism {
        Some(0) => return plan("a vertex's parallelism must be at least 1"),
        Some(p) if p > vertex_max_parallelism => {
            return plan(format!(
                "parallelism {p} is larger than the vertex max parallelism {vertex_max_parallelism}"
            ));
        }
        _ => {}
    }
    for (i, input) in inputs.iter().enumerate() {
        validate_input(input).map_err(|e| prefix(i, e))?;
    }

    if inputs.is_empty() {
        let parallelism = initial_parallelism.unwrap_or(
            config
                .default_source_parallelism
                .min(vertex_max_parallelism),
        );
        return Ok(ParallelismAndInputInfos {
            parallelism,
            inputs: Vec::new(),
        });
    }

    // With the parallelism still open, the vertex's max parallelism narrows
    // both global bounds: it is also the number of subpartitions producers
    // wrote for it, so a larger parallelism would leave subtasks empty.
    let min = config.min_parallelism.min(vertex_max_parallelism);
    let max = config.max_parallelism.min(vertex_max_parallelism);

    if let Some(parallelism) = initial_parallelism {
        return evenly_distribute_subpartitions(parallelism, inputs);
    }
    let all_to_all = inputs.iter().all(|i| !i.is_pointwise);
    let all_broadcast = inputs.iter().all(|i| i.is_broadcast);
    // Without a legal count of balanced ranges, fall back to the even split.
    if all_to_all
        && !all_broadcast
        && let Some(ranges) = balanced_subpartition_ranges(inputs, min, max, config)?
    {
        return Ok(all_to_all_input_infos(inputs, &ranges));
    }
    let parallelism = decide_parallelism(inputs, min, max, config.avg_data_volume_per_task);
    evenly_distribute_subpartitions(parallelism, inputs)
}

/// The parallelism from the bytes of the non-broadcast inputs (broadcast
/// results are usually small, and every subtask reads them whole anyway):
/// `ceil(bytes / avg)`, at least enough subtasks that none reads more than
/// [`MAX_NUM_SUBPARTITIONS_PER_TASK_CONSUME`] subpartitions of a result, within
/// `[min, max]`. Only broadcast inputs: `min`.
pub fn decide_parallelism(
    inputs: &[BlockingResultInfo],
    min_parallelism: usize,
    max_parallelism: usize,
    avg_data_volume_per_task: u64,
) -> usize {
    let non_broadcast = || inputs.iter().filter(|i| !i.is_broadcast);
    if non_broadcast().next().is_none() {
        return min_parallelism;
    }
    let total = non_broadcast().fold(0u64, |acc, i| acc.saturating_add(i.total_bytes()));
    let by_bytes = total.div_ceil(avg_data_volume_per_task.max(1));
    let by_bytes = usize::try_from(by_bytes).unwrap_or(usize::MAX);
    // Flink counts the subpartitions of all partitions of a result here.
    let max_subpartitions = non_broadcast()
        .map(|i| i.subpartition_bytes.iter().map(Vec::len).sum::<usize>())
        .max()
        .unwrap_or(0);
    let by_channels = max_subpartitions.div_ceil(MAX_NUM_SUBPARTITIONS_PER_TASK_CONSUME);
    by_bytes
        .max(by_channels)
        .clamp(min_parallelism, max_parallelism.max(min_parallelism))
}

fn validate_input(input: &BlockingResultInfo) -> Result<()> {
    if input.is_broadcast && input.is_pointwise {
        return internal("a broadcast result must be all-to-all");
    }
    if input.subpartition_bytes.is_empty() {
        return internal("it has no partitions");
    }
    if let Some(p) = input.subpartition_bytes.iter().position(Vec::is_empty) {
        return internal(format!("partition {p} has no subpartitions"));
    }
    if !input.is_pointwise {
        input.uniform_num_subpartitions()?;
    }
    Ok(())
}

/// FLIP-283: cut the subpartitions (summed over all non-broadcast inputs)
/// into ranges of about `avg` bytes each; their count is the parallelism. If
/// that count is outside `[min, max]`, search the byte limit for the closest
/// legal count. `None` when no limit gives a legal count.
fn balanced_subpartition_ranges(
    inputs: &[BlockingResultInfo],
    min: usize,
    max: usize,
    config: &DeciderConfig,
) -> Result<Option<Vec<IndexRange>>> {
    let mut bytes: Vec<u64> = Vec::new();
    let mut max_num_partitions = 0;
    for (i, input) in inputs.iter().enumerate().filter(|(_, i)| !i.is_broadcast) {
        let agg = input
            .aggregated_subpartition_bytes()
            .map_err(|e| prefix(i, e))?;
        if bytes.is_empty() {
            bytes = agg;
        } else if bytes.len() != agg.len() {
            // Subtask k reads the same subpartition range of every input.
            return internal(format!(
                "adaptive batch scheduler: the all-to-all inputs differ in their numbers of \
                 subpartitions ({} before consumed result {i}, {} in it)",
                bytes.len(),
                agg.len()
            ));
        } else {
            for (sum, b) in bytes.iter_mut().zip(agg) {
                *sum = sum.saturating_add(b);
            }
        }
        max_num_partitions = max_num_partitions.max(input.num_partitions());
    }
    // A subtask reads its range of every partition: one channel per
    // (partition, subpartition) pair.
    let max_range_size = MAX_NUM_SUBPARTITIONS_PER_TASK_CONSUME / max_num_partitions.max(1);
    let count = |limit: u64| greedy_ranges(&bytes, limit, max_range_size).len();

    let avg = config.avg_data_volume_per_task;
    let min_limit = bytes.iter().copied().min().unwrap_or(0);
    let max_limit = bytes.iter().fold(0u64, |acc, &b| acc.saturating_add(b));
    let initial = count(avg);
    let limit = if initial < min {
        // Too few ranges: the largest limit that still gives at least `min`
        // is the closest legal count; of the limits giving that count the
        // smallest cuts most evenly.
        if avg < min_limit || count(min_limit) < min {
            return Ok(None);
        }
        let widest = largest_satisfying(min_limit, avg, |l| count(l) >= min);
        let target = count(widest);
        smallest_satisfying(min_limit, widest, |l| count(l) == target)
    } else if initial > max {
        // Too many: the smallest limit giving at most `max`.
        if avg > max_limit || count(max_limit) > max {
            return Ok(None);
        }
        smallest_satisfying(avg, max_limit, |l| count(l) <= max)
    } else {
        avg
    };
    let ranges = greedy_ranges(&bytes, limit, max_range_size);
    Ok((min..=max).contains(&ranges.len()).then_some(ranges))
}

/// Extends each range while it stays within `limit` bytes and
/// `max_range_size` subpartitions; a range always takes its first
/// subpartition, however big. Greedy cutting gives the fewest ranges for a
/// limit, so the count never grows as the limit grows, which the bisections
/// rely on.
pub(crate) fn greedy_ranges(bytes: &[u64], limit: u64, max_range_size: usize) -> Vec<IndexRange> {
    let mut ranges = Vec::new();
    let mut start = 0;
    let mut sum = 0u64;
    for (i, &b) in bytes.iter().enumerate() {
        let fits = sum.saturating_add(b) <= limit && i - start < max_range_size;
        if i == start || fits {
            sum = sum.saturating_add(b);
        } else {
            ranges.push(IndexRange { start, end: i - 1 });
            start = i;
            sum = b;
        }
    }
    if !bytes.is_empty() {
        ranges.push(IndexRange {
            start,
            end: bytes.len() - 1,
        });
    }
    ranges
}

/// The largest value in `[lo, hi]` for which `pred` holds, given it holds at
/// `lo` and holds on a prefix of the interval.
pub(crate) fn largest_satisfying(mut lo: u64, mut hi: u64, pred: impl Fn(u64) -> bool) -> u64 {
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if pred(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The smallest value in `[lo, hi]` for which `pred` holds, given it holds at
/// `hi` and holds on a suffix of the interval.
pub(crate) fn smallest_satisfying(mut lo: u64, mut hi: u64, pred: impl Fn(u64) -> bool) -> u64 {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Subtask `k` reads range `k` of every partition of each non-broadcast
/// input, and subpartition 0 of every partition of each broadcast one.
fn all_to_all_input_infos(
    inputs: &[BlockingResultInfo],
    ranges: &[IndexRange],
) -> ParallelismAndInputInfos {
    let inputs = inputs
        .iter()
        .map(|input| {
            let partition_range = IndexRange {
                start: 0,
                end: input.num_partitions() - 1,
            };
            let subtasks = ranges
                .iter()
                .map(|&range| ExecutionVertexInputInfo {
                    partition_range,
                    subpartition_range: if input.is_broadcast {
                        IndexRange::single(0)
                    } else {
                        range
                    },
                })
                .collect();
            JobVertexInputInfo { subtasks }
        })
        .collect();
    ParallelismAndInputInfos {
        parallelism: ranges.len(),
        inputs,
    }
}

/// Flink's `VertexInputInfoComputationUtils` on a dynamic graph: each
/// subtask gets about the same number of subpartitions.
fn evenly_distribute_subpartitions(
    parallelism: usize,
    inputs: &[BlockingResultInfo],
) -> Result<ParallelismAndInputInfos> {
    let inputs = inputs
        .iter()
        .enumerate()
        .map(|(i, input)| {
            if input.is_pointwise {
                pointwise_input_info(parallelism, input)
            } else {
                all_to_all_input_info(parallelism, input)
            }
            .map_err(|e| prefix(i, e))
        })
        .collect::<Result<_>>()?;
    Ok(ParallelismAndInputInfos {
        parallelism,
        inputs,
    })
}

fn all_to_all_input_info(
    parallelism: usize,
    input: &BlockingResultInfo,
) -> Result<JobVertexInputInfo> {
    let partition_range = IndexRange {
        start: 0,
        end: input.num_partitions() - 1,
    };
    let n = input.num_subpartitions(0);
    let subtasks = (0..parallelism)
        .map(|k| {
            let subpartition_range = if input.is_broadcast {
                Ok(IndexRange::single(0))
            } else {
                even_range(k, parallelism, n)
            };
            subpartition_range.map(|subpartition_range| ExecutionVertexInputInfo {
                partition_range,
                subpartition_range,
            })
        })
        .collect::<Result<_>>()?;
    Ok(JobVertexInputInfo { subtasks })
}

/// Pointwise: with at least as many partitions as subtasks, subtask `i`
/// reads partitions `[i*S/T, (i+1)*S/T)` whole; with fewer, the consumers
/// `[ceil(p*T/S), ceil((p+1)*T/S))` of partition `p` share its subpartitions.
fn pointwise_input_info(
    parallelism: usize,
    input: &BlockingResultInfo,
) -> Result<JobVertexInputInfo> {
    let sources = input.num_partitions();
    let mut subtasks = Vec::with_capacity(parallelism);
    if sources >= parallelism {
        for i in 0..parallelism {
            let start = i * sources / parallelism;
            let end = (i + 1) * sources / parallelism - 1;
            // One subpartition range serves the whole partition range.
            let n = input.num_subpartitions(start);
            if let Some(p) = (start..=end).find(|&p| input.num_subpartitions(p) != n) {
                return internal(format!(
                    "subtask {i} reads partitions {start}..={end}, but partition {start} has \
                     {n} subpartitions and partition {p} has {}",
                    input.num_subpartitions(p)
                ));
            }
            subtasks.push(ExecutionVertexInputInfo {
                partition_range: IndexRange { start, end },
                subpartition_range: IndexRange {
                    start: 0,
                    end: n - 1,
                },
            });
        }
    } else {
        for p in 0..sources {
            let first = (p * parallelism).div_ceil(sources);
            let next = ((p + 1) * parallelism).div_ceil(sources);
            let consumers = next - first;
            for i in first..next {
                // Flink indexes by `i % consumers`, which can hand a
                // partition's halves out in reverse; `i - first` keeps them in
                // subtask order, as the static graph does.
                subtasks.push(ExecutionVertexInputInfo {
                    partition_range: IndexRange::single(p),
                    subpartition_range: even_range(
                        i - first,
                        consumers,
                        input.num_subpartitions(p),
                    )
                    .map_err(|e| prefix_partition(p, e))?,
                });
            }
        }
    }
    Ok(JobVertexInputInfo { subtasks })
}

/// Consumer `k` of `consumers` gets `[k*n/consumers, (k+1)*n/consumers - 1]`.
fn even_range(k: usize, consumers: usize, n: usize) -> Result<IndexRange> {
    if consumers > n {
        return internal(format!(
            "{n} subpartitions cannot be shared among {consumers} subtasks"
        ));
    }
    Ok(IndexRange {
        start: k * n / consumers,
        end: (k + 1) * n / consumers - 1,
    })
}

fn plan<T>(msg: impl std::fmt::Display) -> Result<T> {
    Err(FluviaError::Plan(format!(
        "adaptive batch scheduler: {msg}"
    )))
}

fn internal<T>(msg: impl Into<String>) -> Result<T> {
    Err(FluviaError::Internal(msg.into()))
}

fn prefix(index: usize, e: FluviaError) -> FluviaError {
    match e {
        FluviaError::Internal(msg) => FluviaError::Internal(format!(
            "adaptive batch scheduler: consumed result {index}: {msg}"
        )),
        other => other,
    }
}

fn prefix_partition(partition: usize, e: FluviaError) -> FluviaError {
    match e {
        FluviaError::Internal(msg) => {
            FluviaError::Internal(format!("partition {partition}: {msg}"))
        }
        other => other,
    }
}
