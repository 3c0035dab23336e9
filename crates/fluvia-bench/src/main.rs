//! `fluvia-bench`: Fluvia's benchmarks, each side by side with its baseline
//! in one run. Results go to BENCHMARKS.md.
//!
//! ```text
//! cargo run --release -p fluvia-bench -- datastream   # jobs vs Flink, chaining on/off, hand-written loop
//! cargo run --release -p fluvia-bench -- network      # channels vs raw TCP and memcpy, keyed exchange
//! cargo run --release -p fluvia-bench -- startup      # submission to finish, embedded and on a cluster
//! cargo run --release -p fluvia-bench -- sql --data DIR  # TPC-DS: Fluvia vs DataFusion, multiple-input on/off
//! cargo run --release -p fluvia-bench -- shuffle      # blocking partitions: sort-merge vs file per subpartition vs a plain file
//! cargo run --release -p fluvia-bench -- skew         # a skewed join: skew splitting off vs on
//! cargo run --release -p fluvia-bench -- speculative  # a slowed TaskManager: speculation off vs on
//! ```

mod checkpoints;
mod datastream;
mod network;
mod shuffle;
mod skew;
mod speculative;
mod sql;
mod startup;

use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Subcommand)]
enum Suite {
    /// DataStream job throughput (the jobs measured on Flink 2.3).
    Datastream(datastream::Args),
    /// Data plane throughput: remote channel vs raw TCP, local channel vs memcpy, keyed exchange.
    Network(network::Args),
    /// Time from submission to the end of a trivial job, embedded and on a cluster.
    Startup(startup::Args),
    /// TPC-DS queries: DataFusion in one process vs Fluvia, multiple-input on and off.
    Sql(sql::Args),
    /// Blocking partitions: sort-merge vs one file per subpartition vs a plain file, LZ4 on/off.
    Shuffle(shuffle::Args),
    /// A join with one hot key: slowest over median join subtask, skew splitting off vs on.
    Skew(skew::Args),
    /// Word count on processes, one TaskManager slowed: speculation off vs on (needs target/release/fluvia).
    Speculative(speculative::Args),
    /// Checkpoints: keyed count with checkpoints off vs every second; duration and size vs state size.
    Checkpoints(checkpoints::Args),
}

fn main() -> anyhow::Result<()> {
    // The same allocator settings as the `fluvia` binary, for every variant
    // (DataFusion alone included) of every suite.
    fluvia_cluster::allocator::tune();
    match Cli::parse().suite {
        Suite::Datastream(a) => datastream::run(a),
        Suite::Network(a) => network::run(a),
        Suite::Startup(a) => startup::run(a),
        Suite::Sql(a) => sql::run_suite(a),
        Suite::Shuffle(a) => shuffle::run(a),
        Suite::Skew(a) => skew::run_bench(a),
        Suite::Speculative(a) => speculative::run(a),
        Suite::Checkpoints(a) => checkpoints::run(a),
    }
}
