//! A first Fluvia job: the ten most frequent words of a text file.
//!
//! ```text
//! cargo run --release -p fluvia-quickstart -- README.md
//! ```
//!
//! It shows the parts of a job: an environment, a source, chained
//! transformations, a keyed aggregation across an exchange, and a sink whose
//! results the program reads after the job ran.
//!
//! The same binary runs the job on a running cluster (application mode): it
//! is the client, and started as `taskmanager` it serves its own jobs:
//!
//! ```text
//! fluvia-quickstart taskmanager --jobmanager HOST:PORT &
//! fluvia-quickstart --jobmanager HOST:PORT README.md
//! ```

use fluvia_datastream::prelude::*;
use std::process::ExitCode;

/// Builds the job from the program's arguments. Every process of the job
/// (client and TaskManagers) calls it with the same arguments.
fn build(
    env: &StreamExecutionEnvironment,
    args: &[String],
) -> Result<CollectHandle<(String, u64)>, UserError> {
    let path = args
        .first()
        .ok_or("usage: fluvia-quickstart [--jobmanager HOST:PORT] FILE")?;
    env.set_parallelism(2);
    let (_, frequencies) = env
        .read_text_file(path)
        .flat_map(|line: String, out| {
            for word in line.split_whitespace() {
                let word: String = word
                    .chars()
                    .filter(|c| c.is_alphabetic())
                    .flat_map(char::to_lowercase)
                    .collect();
                if word.len() > 3 {
                    out.collect((word, 1u64));
                }
            }
        })
        .key_by(|(word, _): &(String, u64)| word.clone())
        .reduce(|(word, a), (_, b)| (word, a + b))
        .collect();
    Ok(frequencies)
}

fn main() -> ExitCode {
    fluvia_datastream::app::main(
        fluvia_datastream::program!(),
        build,
        |result, frequencies| {
            let mut frequencies = frequencies.take();
            frequencies.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            for (word, n) in frequencies.iter().take(10) {
                println!("{n:>6}  {word}");
            }
            eprintln!("{}", result.summary());
            Ok(())
        },
    )
}
