//! gRPC calls with their messages as bytes ([`call`]), and protobuf bytes
//! made by hand ([`field`], [`empty_values`]): for tests that send or
//! receive messages too large (or too costly) to build or decode, such as
//! floods of a daemon's bounds.
use bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::Status;

/// A message as its bytes, both ways.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

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
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The v1 function service's method.
pub const V1_RUN_FUNCTION: &str = "/apiextensions.fn.proto.v1.FunctionRunnerService/RunFunction";

/// One unary call of `path` on `channel` with `request`'s bytes; a
/// response up to `max_response` bytes is read (as bytes, never decoded).
pub async fn call(
    channel: Channel,
    path: &'static str,
    request: Bytes,
    max_response: usize,
) -> Result<Bytes, Status> {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(max_response)
        .max_encoding_message_size(usize::MAX);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(request), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

/// A length-delimited protobuf field `number` holding `content`.
pub fn field(number: u32, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 12);
    varint(&mut out, u64::from(number << 3 | 2));
    varint(&mut out, content.len() as u64);
    out.extend_from_slice(content);
    out
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A `google.protobuf.Struct` `{key: [null, null, …]}` of about `bytes`
/// bytes: `count` empty `Value`s, two bytes each on the wire and some 32
/// bytes each once decoded, the most a decoder holds per byte received.
pub fn empty_values(key: &str, bytes: usize) -> Vec<u8> {
    let list: Vec<u8> = [0x0a, 0x00].repeat(bytes.saturating_sub(64) / 2); // ListValue.values
    let value = field(6, &list); // Value.list_value
    let entry = [field(1, key.as_bytes()), field(2, &value)].concat(); // Struct.fields entry
    field(1, &entry) // Struct.fields
}
