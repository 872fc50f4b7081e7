//! A render's runtime of one Function ([`Runtime`]): a backend of the one
//! call seam with a start and a stop, and the one place the pipeline's
//! typed messages meet the seam's bytes ([`answer`], as the runtime's
//! [`Wire`] says). Each runtime's file implements it; nothing here names
//! one.
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use crate::call::{self, FunctionRunner};
use crate::compose::{CallError, ComposeError};
use crate::function_server::Client;
use crate::proto::v1;
use crate::proto_json::{request_to_json, response_from_json, ProtocolError};

/// A render's runtime of one Function: a backend of the seam, called only
/// between its [`Runtime::start`] (a server started and listening, a
/// container made ahead) and its [`Runtime::stop`].
#[async_trait::async_trait]
pub(crate) trait Runtime: FunctionRunner {
    /// The Function as the seam names it (its name, image, run settings).
    fn function(&self) -> &call::Function;

    /// How its backend reads a request and writes its answer.
    fn wire(&self) -> Wire {
        Wire::Protobuf
    }

    /// Where a call goes, as its errors say: the image, or the address of
    /// the server.
    fn target(&self) -> &str {
        &self.function().image
    }

    /// Gets ready to be called, so that every Function of a render starts
    /// at once, before the first step.
    async fn start(&self) -> Result<(), ComposeError> {
        Ok(())
    }

    /// Releases what [`Runtime::start`] acquired (stops a server).
    async fn stop(&self) {}
}

/// The runtimes of a render's Functions, by name.
pub(crate) type RuntimeMap = HashMap<String, Arc<dyn Runtime>>;

/// How a runtime's backend reads a `RunFunctionRequest` and writes its
/// `RunFunctionResponse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    /// Protobuf, as a function server is called.
    Protobuf,
    /// Protobuf JSON, on a container's stdin and stdout (Exec).
    Json,
}

/// The answer of `runtime` to `request`: the one place a render's typed
/// messages meet the seam's bytes, written and read back as its [`Wire`]
/// says.
pub(crate) async fn answer(
    runtime: &dyn Runtime,
    request: &v1::RunFunctionRequest,
) -> Result<v1::RunFunctionResponse, ComposeError> {
    let failed = |source: CallError| ComposeError::Call {
        target: runtime.target().to_string(),
        source: Box::new(source),
    };
    let input = match runtime.wire() {
        Wire::Protobuf => Bytes::from(request.encode_to_vec()),
        Wire::Json => Bytes::from(request_to_json(request).map_err(|e| failed(e.into()))?),
    };
    let request = call::Request {
        input,
        deadline: None,
    };
    let output = runtime
        .run_function(runtime.function(), request)
        .await
        .map_err(|status| failed(CallError::Status(status)))?
        .output;
    match runtime.wire() {
        Wire::Protobuf => {
            v1::RunFunctionResponse::decode(output).map_err(|source| ProtocolError::Decode {
                what: "v1 RunFunctionResponse",
                source,
            })
        }
        Wire::Json => response_from_json(&output),
    }
    .map_err(|e| failed(e.into()))
}

/// A call on a function server's `client`: the request sent as it is, the
/// answer returned as it came.
pub(super) async fn served(
    client: &Client,
    request: call::Request,
) -> Result<call::Response, tonic::Status> {
    client
        .call(&request.input, request.deadline)
        .await
        .map(call::Response::ran)
}
