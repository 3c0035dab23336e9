//! Compiles `proto/cluster.proto` with a pure-Rust protobuf compiler
//! (protox), so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/cluster.proto");
    let fds = protox::compile(["proto/cluster.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
