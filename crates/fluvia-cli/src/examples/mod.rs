//! Built-in example jobs, runnable by name.

pub mod pipeline;
pub mod wordcount;

/// (name, one-line description) of every example, for `fluvia examples`.
pub const EXAMPLES: &[(&str, &str)] = &[
    (
        "wordcount",
        "Counts words in text files: source -> flat map -> keyed sum -> sorted output",
    ),
    (
        "pipeline",
        "Throughput job over generated rows (a, b, c, d): --job filter (chained filter+map) \
         or --job count (keyed running count across an exchange)",
    ),
];
