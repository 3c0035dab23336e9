//! Rows ordered by the hash of their key, and an estimate of how many
//! distinct keys a sample holds.

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::physical_expr::PhysicalExpr;
use std::sync::Arc;

/// Below this many build rows the table stays in the core's cache.
pub(super) const MIN_ROWS: usize = 32 * 1024;

/// Rows whose keys are counted to estimate the rows per key.
pub(super) const SAMPLE: usize = 64 * 1024;

/// Sampled rows per distinct key from which the build side is sorted.
pub(super) const MIN_ROWS_PER_KEY: usize = 2;

/// Most buckets of the counting pass in [`order_by_hash`] (4 MiB of counts).
pub(super) const MAX_BUCKET_BITS: u32 = 20;

/// Row numbers in the order of their `hashes`, as a comparison sort gives
/// them (rows of equal hashes in any order), in linear time: one counting
/// pass on the hashes' top bits, about as many buckets as rows, then each
/// bucket (the rows of one key, or of a few) sorted on its own. A
/// comparison sort of a million hashes was 40 % of clustering q14's build
/// sides.
pub(super) fn order_by_hash(hashes: &[u64]) -> DfResult<Vec<u32>> {
    let n = hashes.len();
    if u32::try_from(n).is_err() {
        return Err(DataFusionError::Execution(format!(
            "a build side of {n} rows is more than a join can index"
        )));
    }
    let bits = (usize::BITS - n.leading_zeros()).clamp(1, MAX_BUCKET_BITS);
    let shift = u64::BITS - bits;
    let bucket = |h: u64| (h >> shift) as usize;
    // starts[b]..starts[b + 1]: where bucket b's rows go.
    let mut starts = vec![0u32; (1usize << bits) + 1];
    for &h in hashes {
        starts[bucket(h) + 1] += 1;
    }
    for b in 1..starts.len() {
        starts[b] += starts[b - 1];
    }
    let mut next = starts.clone();
    let mut order = vec![0u32; n];
    for (row, &h) in hashes.iter().enumerate() {
        let slot = &mut next[bucket(h)];
        order[*slot as usize] = row as u32;
        *slot += 1;
    }
    for w in starts.windows(2) {
        let rows = &mut order[w[0] as usize..w[1] as usize];
        if rows.len() > 1 {
            rows.sort_unstable_by_key(|&r| hashes[r as usize]);
        }
    }
    Ok(order)
}

/// The hash of `keys` for every row of `batch`.
pub(super) fn hash_keys(batch: &RecordBatch, keys: &[Arc<dyn PhysicalExpr>]) -> DfResult<Vec<u64>> {
    hash_rows(&key_columns(batch, keys)?)
}

/// `keys` evaluated on `batch`.
pub(super) fn key_columns(
    batch: &RecordBatch,
    keys: &[Arc<dyn PhysicalExpr>],
) -> DfResult<Vec<ArrayRef>> {
    keys.iter()
        .map(|k| k.evaluate(batch)?.into_array(batch.num_rows()))
        .collect()
}

/// One hash per row over `columns`.
pub(super) fn hash_rows(columns: &[ArrayRef]) -> DfResult<Vec<u64>> {
    let mut hashes = vec![0u64; columns.first().map_or(0, |c| c.len())];
    create_hashes(columns, &RandomState::with_seed(0), &mut hashes)?;
    Ok(hashes)
}

/// Whether every `step`-th row (about [`SAMPLE`] of the `rows`) has at
/// least [`MIN_ROWS_PER_KEY`] rows per distinct key hash. Only the sample
/// is hashed: a build side that stays as it is costs little.
pub(super) fn keys_repeat(
    batches: &[RecordBatch],
    keys: &[Arc<dyn PhysicalExpr>],
    rows: usize,
) -> DfResult<bool> {
    let step = rows.div_ceil(SAMPLE).max(1);
    let mut distinct = DistinctCount::default();
    let mut sampled = 0;
    // Row number (over all batches) of the next sampled row.
    let mut next = 0;
    let mut start = 0;
    for b in batches {
        let end = start + b.num_rows();
        let picks: Vec<u32> = (next..end)
            .step_by(step)
            .map(|r| (r - start) as u32)
            .collect();
        if let Some(&last) = picks.last() {
            next = start + last as usize + step;
            let picks = UInt32Array::from(picks);
            let columns = key_columns(b, keys)?
                .iter()
                .map(|c| take(c, &picks, None))
                .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
            let hashes = hash_rows(&columns)?;
            sampled += hashes.len();
            hashes.iter().for_each(|&h| distinct.add(h));
        }
        start = end;
    }
    Ok(sampled as f64 >= MIN_ROWS_PER_KEY as f64 * distinct.estimate())
}

/// Bits of [`DistinctCount`]'s bitmap: 64 KiB, which a core's cache
/// holds, eight bits per sampled row.
pub(super) const DISTINCT_BITS: u32 = 19;

/// Distinct key hashes counted the linear way (Whang et al.): each hash
/// sets one bit, and the share of bits still clear gives the count. A
/// hash set of the sample did the same exactly, at several times the cost
/// (an insert per row into half a megabyte of fresh memory), and for every
/// build side of 32K rows or more, most of which are then not sorted: the
/// decision needs the ratio of rows to keys, not the last key. With at
/// most [`SAMPLE`] hashes in 2^19 bits the count is within about 1 %.
pub(super) struct DistinctCount {
    bits: Vec<u64>,
}

impl Default for DistinctCount {
    fn default() -> Self {
        DistinctCount {
            bits: vec![0; (1 << DISTINCT_BITS) / 64],
        }
    }
}

impl DistinctCount {
    pub(super) fn add(&mut self, hash: u64) {
        // Mixed once more (MurmurHash3's finaliser): the count assumes
        // hashes that collide as random ones do, and the key hash of
        // consecutive integers collides less (65,536 of them counted as
        // 70,009 unmixed).
        let mut h = hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        let bit = (h >> (u64::BITS - DISTINCT_BITS)) as usize;
        self.bits[bit / 64] |= 1 << (bit % 64);
    }

    pub(super) fn estimate(&self) -> f64 {
        let size = f64::from(1u32 << DISTINCT_BITS);
        let clear: u32 = self.bits.iter().map(|w| w.count_zeros()).sum();
        // All bits set: more keys than the bitmap can tell apart.
        if clear == 0 {
            return f64::INFINITY;
        }
        size * (size / f64::from(clear)).ln()
    }
}
