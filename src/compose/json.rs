//! The protobuf JSON mapping of v1 function messages, for functions that
//! read a `RunFunctionRequest` on stdin and write a `RunFunctionResponse` on
//! stdout (the Exec runtime). Done reflectively over xfn's own descriptor set,
//! so the mapping is the standard one (camelCase names, enum names, Struct as
//! plain JSON, bytes as base64).
use std::sync::LazyLock;

use prost::Message;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor};

use super::ComposeError;
use crate::proto::v1 as pb;

static POOL: LazyLock<Result<DescriptorPool, String>> = LazyLock::new(|| {
    DescriptorPool::decode(crate::proto::FILE_DESCRIPTOR_SET).map_err(|e| e.to_string())
});

fn descriptor(name: &str) -> Result<MessageDescriptor, ComposeError> {
    let pool = POOL
        .as_ref()
        .map_err(|e| ComposeError::Protocol(format!("descriptor set: {e}")))?;
    pool.get_message_by_name(name)
        .ok_or_else(|| ComposeError::Protocol(format!("no message {name} in the descriptor set")))
}

/// A `RunFunctionRequest` as protobuf JSON.
pub fn request_to_json(request: &pb::RunFunctionRequest) -> Result<Vec<u8>, ComposeError> {
    let dynamic = dynamic("RunFunctionRequest", request)?;
    serde_json::to_vec(&dynamic).map_err(|e| ComposeError::Protocol(e.to_string()))
}

/// The v1 message `name` (`ResourceSelector`, …) as a protobuf JSON value.
pub fn to_json(name: &str, message: &impl Message) -> Result<serde_json::Value, ComposeError> {
    serde_json::to_value(dynamic(name, message)?).map_err(|e| ComposeError::Protocol(e.to_string()))
}

fn dynamic(name: &str, message: &impl Message) -> Result<DynamicMessage, ComposeError> {
    let desc = descriptor(&format!("apiextensions.fn.proto.v1.{name}"))?;
    DynamicMessage::decode(desc, message.encode_to_vec().as_slice())
        .map_err(|e| ComposeError::Protocol(e.to_string()))
}

/// A `RunFunctionResponse` from protobuf JSON. Unknown fields are ignored so
/// functions built against newer protocol versions still work. Its nesting
/// is bounded first ([`crate::nesting`]), as every input's.
pub fn response_from_json(json: &[u8]) -> Result<pb::RunFunctionResponse, ComposeError> {
    crate::nesting::check_depth(json, crate::nesting::MAX_DEPTH).map_err(|e| {
        ComposeError::Protocol(format!("the output is not a RunFunctionResponse: {e}"))
    })?;
    let desc = descriptor("apiextensions.fn.proto.v1.RunFunctionResponse")?;
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let dynamic = DynamicMessage::deserialize_with_options(
        desc,
        &mut deserializer,
        &DeserializeOptions::new().deny_unknown_fields(false),
    )
    .map_err(|e| ComposeError::Protocol(format!("the output is not a RunFunctionResponse: {e}")))?;
    deserializer
        .end()
        .map_err(|e| ComposeError::Protocol(format!("trailing output: {e}")))?;
    dynamic
        .transcode_to::<pb::RunFunctionResponse>()
        .map_err(|e| ComposeError::Protocol(e.to_string()))
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
            input: crate::compose::value::to_struct(&json!({"a": 1})),
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
        assert!(err.to_string().contains("nested more than 64"), "{err}");
    }
}
