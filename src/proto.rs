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

/// The function service (v1 and v1beta1, which share their messages' wire
/// format) with each message kept as its encoded bytes: a caller's request
/// is passed to a function server and its answer back without being
/// decoded, so what xfn holds of a call is its size on the wire, never the
/// tens of times more a decoded `Struct` of tiny values takes.
pub(crate) mod raw {
    #![allow(unreachable_pub)]
    use bytes::{Buf, BufMut, Bytes};
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::Status;

    /// `apiextensions.fn.proto.v1.FunctionRunnerService`, raw.
    pub(crate) mod v1 {
        include!(concat!(
            env!("OUT_DIR"),
            "/raw/apiextensions.fn.proto.v1.FunctionRunnerService.rs"
        ));
    }

    /// `apiextensions.fn.proto.v1beta1.FunctionRunnerService`, raw.
    pub(crate) mod v1beta1 {
        include!(concat!(
            env!("OUT_DIR"),
            "/raw/apiextensions.fn.proto.v1beta1.FunctionRunnerService.rs"
        ));
    }

    /// A message as its bytes, both ways (tonic bounds their size).
    #[derive(Debug, Clone, Copy, Default)]
    pub(crate) struct RawCodec;

    impl Codec for RawCodec {
        type Encode = Bytes;
        type Decode = Bytes;
        type Encoder = RawCodec;
        type Decoder = RawCodec;

        fn encoder(&mut self) -> RawCodec {
            RawCodec
        }

        fn decoder(&mut self) -> RawCodec {
            RawCodec
        }
    }

    impl Encoder for RawCodec {
        type Item = Bytes;
        type Error = Status;

        fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put_slice(&item);
            Ok(())
        }
    }

    impl Decoder for RawCodec {
        type Item = Bytes;
        type Error = Status;

        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
            // The message's bytes out of tonic's buffer, without a copy.
            Ok(Some(src.copy_to_bytes(src.remaining())))
        }
    }
}

/// Conversions between Kubernetes objects as JSON and the protobuf `Struct`
/// the function protocol carries them in (for programs that serve or call
/// functions with these types).
pub use crate::value::{from_struct, to_struct};
