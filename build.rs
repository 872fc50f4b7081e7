//! Generates the gRPC code for the three protocol packages.
//!
//! `protox` parses the `.proto` files in pure Rust, so building xfn needs no
//! system `protoc`. The descriptor set is also written to `OUT_DIR` so the
//! servers can offer gRPC reflection and JSON (protobuf JSON mapping) codecs.
use std::path::PathBuf;

use prost::Message;

const PROTOS: &[&str] = &[
    "proto/v1alpha1.proto",
    "proto/v1.proto",
    "proto/v1beta1.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("xfn_descriptor.bin");
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    std::fs::write(&descriptor_path, descriptors.encode_to_vec())?;

    tonic_prost_build::configure().compile_fds(descriptors)?;

    Ok(())
}
