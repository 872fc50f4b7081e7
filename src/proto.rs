//! Generated protocol code: the alpha runner service and the v1/v1beta1
//! function service (see `proto/`).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// The encoded descriptor set of every xfn protocol, for gRPC reflection and
/// protobuf-JSON conversion.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/xfn_descriptor.bin"));

/// `apiextensions.fn.proto.v1alpha1`: the sidecar runner service.
pub mod v1alpha1 {
    // `fn` is a Rust keyword, so prost names the file with a raw identifier.
    include!(concat!(
        env!("OUT_DIR"),
        "/apiextensions.r#fn.proto.v1alpha1.rs"
    ));
}

/// `apiextensions.fn.proto.v1`: the function service.
pub mod v1 {
    // `fn` is a Rust keyword, so prost names the file with a raw identifier.
    include!(concat!(env!("OUT_DIR"), "/apiextensions.r#fn.proto.v1.rs"));
}

/// `apiextensions.fn.proto.v1beta1`: the function service, beta package.
pub mod v1beta1 {
    // `fn` is a Rust keyword, so prost names the file with a raw identifier.
    include!(concat!(
        env!("OUT_DIR"),
        "/apiextensions.r#fn.proto.v1beta1.rs"
    ));
}

/// Conversions between Kubernetes objects as JSON and the protobuf `Struct`
/// the function protocol carries them in (for programs that serve or call
/// functions with these types).
pub use crate::value::{from_struct, to_struct};
