//! Compiles `inventory/v1/*.proto` with protox (pure Rust), so no system `protoc` is needed.

use std::path::PathBuf;

use prost::Message;

const PROTOS: &[&str] =
    &["inventory/v1/common.proto", "inventory/v1/center.proto", "inventory/v1/admin.proto", "inventory/v1/agent.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let fds = protox::compile(PROTOS, ["."])?;
    // The encoded descriptor set feeds gRPC server reflection.
    std::fs::write(out_dir.join("inventory_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Malformed requests are the caller's fault: INVALID_ARGUMENT (see src/codec.rs).
        .codec_path("crate::codec::StrictCodec")
        .compile_fds(fds)?;
    Ok(())
}
