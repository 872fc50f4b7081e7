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

    // The function service once more, its messages left as their bytes
    // (`crate::proto::raw`): `xfn host` serves calls and passes their
    // answers back without decoding them. Server side only: xfn calls a
    // function server over h2 itself (`host::upstream`).
    let raw_dir = out_dir.join("raw");
    std::fs::create_dir_all(&raw_dir)?;
    for package in [
        "apiextensions.fn.proto.v1",
        "apiextensions.fn.proto.v1beta1",
    ] {
        let method = tonic_build::manual::Method::builder()
            .name("run_function")
            .route_name("RunFunction")
            .input_type("bytes::Bytes")
            .output_type("bytes::Bytes")
            .codec_path("crate::proto::raw::RawCodec")
            .build();
        let service = tonic_build::manual::Service::builder()
            .name("FunctionRunnerService")
            .package(package)
            .method(method)
            .build();
        tonic_build::manual::Builder::new()
            .build_transport(false)
            .build_client(false)
            .out_dir(&raw_dir)
            .compile(&[service]);
    }
    Ok(())
}
