//! The throughput job the benchmarks compare with Flink: a generator of rows
//! `(a: i64, b: i64, c: i32 in 0..100, d: i32 in 0..1_000_000)`, pseudo-random
//! but reproducible, then either
//! - `filter`: `filter(c < 50)` → `map((a, c, b + d))` → discard, all chained;
//! - `count`: `key_by(d % 1000)` → running count per key → discard, across a
//!   HASH exchange.

use fluvia_datastream::prelude::*;

/// One generated row.
pub type Row = (i64, i64, i32, i32);

/// splitmix64: a fast, well-mixed hash of the row index.
#[inline]
pub fn mix(z: u64) -> u64 {
    fluvia_core::random::splitmix64(z)
}

/// Row `i` of the generator.
#[inline]
pub fn row(i: u64) -> Row {
    let x = mix(i);
    let y = mix(x);
    (
        x as i64,
        y as i64,
        ((x >> 32) % 100) as i32,
        ((y >> 32) % 1_000_000) as i32,
    )
}

/// Which variant of the pipeline to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipelineJob {
    Filter,
    Count,
}

impl std::str::FromStr for PipelineJob {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "filter" => Ok(PipelineJob::Filter),
            "count" => Ok(PipelineJob::Count),
            other => Err(format!(
                "unknown pipeline job '{other}' (expected filter or count)"
            )),
        }
    }
}

/// Adds the pipeline job over `rows` generated rows to `env`.
pub fn build(env: &StreamExecutionEnvironment, rows: u64, job: PipelineJob) {
    let source = env.from_generator(rows, row).name("rows");
    match job {
        PipelineJob::Filter => {
            source
                .filter(|r: &Row| r.2 < 50)
                .map(|(a, b, c, d): Row| (a, c, b.wrapping_add(d as i64)))
                .discard();
        }
        PipelineJob::Count => {
            source
                .key_by(|r: &Row| r.3 % 1000)
                .process(|ctx: &mut KeyedContext<'_, i32, u64>, _r: Row, out| {
                    let count = ctx.state.get_or_insert(0);
                    *count += 1;
                    out.collect((*ctx.key, *count));
                    Ok(())
                })
                .name("Running Count")
                .discard();
        }
    }
}

/// The same work as `filter` in a plain loop: the ceiling for the engine.
pub fn hand_written_filter(rows: u64) -> u64 {
    let mut kept = 0u64;
    for i in 0..rows {
        let (a, b, c, d) = row(i);
        if c < 50 {
            std::hint::black_box((a, c, b.wrapping_add(d as i64)));
            kept += 1;
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_in_range_and_spread() {
        let mut low_c = 0;
        for i in 0..10_000 {
            let (_, _, c, d) = row(i);
            assert!((0..100).contains(&c));
            assert!((0..1_000_000).contains(&d));
            low_c += (c < 50) as u32;
        }
        assert!((4_500..5_500).contains(&low_c), "{low_c}");
    }
}
