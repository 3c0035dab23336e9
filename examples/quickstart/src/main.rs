//! A first Fluvia job: the ten most frequent words of a text file.
//!
//! ```text
//! cargo run --release -p fluvia-quickstart -- README.md
//! ```
//!
//! It shows the parts of a job: an environment, a source, chained
//! transformations, a keyed aggregation across an exchange, and a sink whose
//! results the program reads after `execute`.

use fluvia_datastream::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: fluvia-quickstart FILE")?;

    let env = StreamExecutionEnvironment::new();
    env.set_parallelism(2);

    let (_, frequencies) = env
        .read_text_file(&path)
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

    let result = env.execute("quickstart")?;

    let mut frequencies = frequencies.take();
    frequencies.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    for (word, n) in frequencies.iter().take(10) {
        println!("{n:>6}  {word}");
    }
    eprintln!("{}", result.summary());
    Ok(())
}
