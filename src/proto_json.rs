//! The protobuf JSON mapping of v1 function messages, for functions that
//! read a `RunFunctionRequest` on stdin and write a `RunFunctionResponse` on
//! stdout (render's Exec runtime and the adaptor). Done reflectively over
//! xfn's own descriptor set, so the mapping is the standard one (camelCase
//! names, enum names, Struct as plain JSON, bytes as base64). It sits
//! beside [`crate::proto`], below both its users, so neither front end
//! imports the other.
use std::sync::{Arc, LazyLock};

use prost::Message;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor};

use crate::proto::v1 as pb;

/// Why a message to or from a function could not be converted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProtocolError {
    /// xfn's own descriptor set does not decode (a build defect).
    #[error("xfn's protobuf descriptor set does not decode")]
    Descriptors(#[source] Arc<prost_reflect::DescriptorError>),
    /// xfn's descriptor set lacks a message (a build defect).
    #[error("no message {0} in xfn's descriptor set")]
    NoMessage(String),
    /// A message does not encode as protobuf JSON.
    #[error("cannot write a {what} as protobuf JSON")]
    ToJson {
        /// The message.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// A message does not decode (or re-encode as another version).
    #[error("cannot decode a {what}")]
    Decode {
        /// The message.
        what: &'static str,
        /// Why.
        source: prost::DecodeError,
    },
    /// A function's output nests too deep, or its aliases expand too far,
    /// to read.
    #[error("the output is not a {what}")]
    OutOfBounds {
        /// What it should be.
        what: &'static str,
        /// Which bound.
        source: crate::nesting::NestingError,
    },
    /// A function's output is not the JSON message it should be.
    #[error("the output is not a {what}")]
    NotJson {
        /// What it should be.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// A function's output is not the YAML document it should be.
    #[error("the output is not a {what}")]
    NotYaml {
        /// What it should be.
        what: &'static str,
        /// Why.
        source: yaml_serde::Error,
    },
    /// A function's input does not encode as YAML.
    #[error("cannot write a {what} as YAML")]
    ToYaml {
        /// The message.
        what: &'static str,
        /// Why.
        source: yaml_serde::Error,
    },
}

/// Decoded once; the error shared (an `Arc`) as the source of each call's.
static POOL: LazyLock<Result<DescriptorPool, Arc<prost_reflect::DescriptorError>>> =
    LazyLock::new(|| DescriptorPool::decode(crate::proto::FILE_DESCRIPTOR_SET).map_err(Arc::new));

fn descriptor(name: &str) -> Result<MessageDescriptor, ProtocolError> {
    let pool = POOL
        .as_ref()
        .map_err(|e| ProtocolError::Descriptors(Arc::clone(e)))?;
    pool.get_message_by_name(name)
        .ok_or_else(|| ProtocolError::NoMessage(name.to_string()))
}

/// A `RunFunctionRequest` as protobuf JSON.
pub(crate) fn request_to_json(request: &pb::RunFunctionRequest) -> Result<Vec<u8>, ProtocolError> {
    request_json_from_wire(&request.encode_to_vec()).map(|(json, _)| json)
}

/// A `RunFunctionRequest` as it came on the wire (v1 or v1beta1: the same
/// bytes), as protobuf JSON, and its `meta.tag`. The decoded message lives
/// only while it is written: a caller that keeps the JSON keeps no tree.
pub(crate) fn request_json_from_wire(wire: &[u8]) -> Result<(Vec<u8>, String), ProtocolError> {
    let what = "RunFunctionRequest";
    let desc = descriptor(&format!("apiextensions.fn.proto.v1.{what}"))?;
    let dynamic = DynamicMessage::decode(desc, wire)
        .map_err(|source| ProtocolError::Decode { what, source })?;
    let tag = dynamic
        .get_field_by_name("meta")
        .and_then(|meta| {
            meta.as_message()
                .and_then(|m| m.get_field_by_name("tag"))
                .and_then(|tag| tag.as_str().map(str::to_owned))
        })
        .unwrap_or_default();
    let json =
        serde_json::to_vec(&dynamic).map_err(|source| ProtocolError::ToJson { what, source })?;
    Ok((json, tag))
}

/// The v1 message `name` (`ResourceSelector`, …) as a protobuf JSON value.
pub(crate) fn to_json(
    name: &'static str,
    message: &impl Message,
) -> Result<serde_json::Value, ProtocolError> {
    serde_json::to_value(dynamic(name, message)?)
        .map_err(|source| ProtocolError::ToJson { what: name, source })
}

fn dynamic(name: &'static str, message: &impl Message) -> Result<DynamicMessage, ProtocolError> {
    let desc = descriptor(&format!("apiextensions.fn.proto.v1.{name}"))?;
    DynamicMessage::decode(desc, message.encode_to_vec().as_slice())
        .map_err(|source| ProtocolError::Decode { what: name, source })
}

/// A `RunFunctionResponse` from protobuf JSON. Unknown fields are ignored so
/// functions built against newer protocol versions still work. Its nesting
/// is bounded first ([`crate::nesting`]), as every input's.
pub(crate) fn response_from_json(json: &[u8]) -> Result<pb::RunFunctionResponse, ProtocolError> {
    let what = "RunFunctionResponse";
    crate::nesting::check(json).map_err(|source| ProtocolError::OutOfBounds { what, source })?;
    let desc = descriptor("apiextensions.fn.proto.v1.RunFunctionResponse")?;
    let not_json = |source| ProtocolError::NotJson { what, source };
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let dynamic = DynamicMessage::deserialize_with_options(
        desc,
        &mut deserializer,
        &DeserializeOptions::new().deny_unknown_fields(false),
    )
    .map_err(not_json)?;
    // What follows the message (trailing output) is refused too.
    deserializer.end().map_err(not_json)?;
    dynamic
        .transcode_to::<pb::RunFunctionResponse>()
        .map_err(|source| ProtocolError::Decode { what, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_use_the_standard_mapping() {
        let request = pb::RunFunctionRequest {
            meta: Some(pb::RequestMeta {
                tag: "t".into(),
                capabilities: vec![pb::Capability::Conditions as i32],
            }),
            input: crate::value::to_struct(&json!({"a": 1})),
            ..Default::default()
        };
        let json: serde_json::Value =
            serde_json::from_slice(&request_to_json(&request).unwrap()).unwrap();
        assert_eq!(
            json,
            json!({"meta": {"tag": "t", "capabilities": ["CAPABILITY_CONDITIONS"]}, "input": {"a": 1.0}})
        );
    }

    #[test]
    fn responses_parse_and_ignore_unknown_fields() {
        let response = response_from_json(
            br#"{"desired": {"resources": {"a": {"resource": {"kind": "X"}, "ready": "READY_TRUE"}}},
                 "results": [{"severity": "SEVERITY_WARNING", "message": "m"}], "future": 1}"#,
        )
        .unwrap();
        let a = &response.desired.unwrap().resources["a"];
        assert_eq!(a.ready, pb::Ready::True as i32);
        assert_eq!(response.results[0].severity, pb::Severity::Warning as i32);
        assert!(response_from_json(b"not json").is_err());
    }

    #[test]
    fn deep_output_is_refused_before_parsing() {
        let deep = format!("{{\"output\": {}", "[".repeat(1 << 20));
        let err = response_from_json(deep.as_bytes()).unwrap_err();
        let text = crate::chain::one_line(&err);
        assert!(text.contains("nested more than 64"), "{text}");
    }
}
