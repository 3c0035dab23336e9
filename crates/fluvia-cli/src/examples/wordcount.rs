//! Word count, as in Flink's examples: lines are split on non-word
//! characters and lower-cased, words are counted per key, and the final count
//! of each word is written as `word,count`, sorted by word.
//!
//! The sort is part of the job: counts go to one `Sorted Word Counts`
//! operator (parallelism 1) that keeps the latest count per word and emits
//! them in order at the end of input. In streaming mode it receives every
//! running count, in batch mode only the final ones; the output is the same.

use fluvia_datastream::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Splits a line into lower-case words (Flink's `\W+` tokenizer).
pub fn tokenize(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// Keeps the latest count per word; emits `word,count` lines sorted by word.
struct SortedWordCounts {
    counts: BTreeMap<String, i64>,
}

impl OneInputOperator<(String, i64), String> for SortedWordCounts {
    fn process_element(
        &mut self,
        (word, count): (String, i64),
        _out: &mut Collector<'_, String>,
    ) -> Result<(), UserError> {
        self.counts.insert(word, count);
        Ok(())
    }

    fn end_input(&mut self, out: &mut Collector<'_, String>) -> Result<(), UserError> {
        for (word, count) in std::mem::take(&mut self.counts) {
            out.collect(format!("{word},{count}"));
        }
        Ok(())
    }
}

/// Adds the word count job to `env`: reads `inputs`, writes to `output` (a
/// file) or, without one, prints to standard output. Unless `sorted`, the
/// counting subtasks write their counts themselves, in parallel.
pub fn build(
    env: &StreamExecutionEnvironment,
    inputs: Vec<PathBuf>,
    output: Option<PathBuf>,
    sorted: bool,
    rate: Option<f64>,
) {
    let counts = env
        .read_text_files_with_rate(inputs, rate)
        .name("lines")
        .flat_map(|line: String, out| tokenize(&line).for_each(|w| out.collect((w, 1i64))))
        .name("Tokenizer")
        .key_by(|(word, _): &(String, i64)| word.clone())
        .sum(|(_, n)| n);
    let (lines, parallelism) = if sorted {
        let lines = counts
            .global()
            .transform("Sorted Word Counts", |_| SortedWordCounts {
                counts: BTreeMap::new(),
            })
            .set_parallelism(1);
        (lines, Some(1))
    } else {
        let lines = counts.map(|(word, n): (String, i64)| format!("{word},{n}"));
        (lines.name("Format"), None)
    };
    let sink = match output {
        Some(path) => lines.write_as_text(path),
        None => lines
            .add_sink(|line: String| {
                use std::io::Write;
                writeln!(std::io::stdout().lock(), "{line}")
                    .map_err(|e| format!("writing to standard output: {e}").into())
            })
            .name("Print to Std. Out"),
    };
    if let Some(p) = parallelism {
        sink.set_parallelism(p);
    }
}
