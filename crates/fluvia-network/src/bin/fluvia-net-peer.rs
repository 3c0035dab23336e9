//! `fluvia-net-peer`: one side of a network exchange between two processes,
//! used by the multi-process tests.
//!
//! ```text
//! fluvia-net-peer produce --producers P --consumers C --records N --size BYTES [--lz4]
//!     prints "ADDR <data address>", serves P partitions of C subpartitions,
//!     each subpartition receiving N records; exits when stdin closes
//! fluvia-net-peer consume --peer ADDR --producers P --consumers C --records N --size BYTES
//!     checks every record arrives exactly once and in order per channel,
//!     prints "OK records=.. bytes=.. seconds=.."
//! ```

fn main() -> std::process::ExitCode {
    let result = fluvia_network::net::peer::parse(std::env::args().skip(1))
        .and_then(|a| fluvia_network::net::peer::run(&a));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
