//! Compiles the control API's protobuf with protox (pure Rust), so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/stateplane/control/v1/control.proto",
        "proto/stateplane/sync/v1/collector.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    // A read's values and bounds come as `Bytes`, taken from the received buffer whole.
    tonic_prost_build::configure()
        .bytes(".stateplane.sync.v1.ReadReply")
        .compile_fds(descriptors)?;
    Ok(())
}
