//! The adaptor's translation, a layer over a container per call: a
//! `RunFunctionRequest` on the wire goes to the function as protobuf JSON
//! on its stdin, and its stdout, a JSON `RunFunctionResponse`, comes back
//! as the response on the wire, its `meta.tag` the request's unless it set
//! its own. The JSON is made before the call waits for a run slot, so a
//! queued call holds only what admission counts (the JSON), never the
//! decoded request: 4 MiB of empty values decode to ~76 MiB of tree.
use bytes::Bytes;
use prost::Message;
use tonic::Status;

use crate::call::{Function, FunctionRunner, Request, Response};
use crate::chain::Chain;
use crate::proto::v1 as pb;
use crate::proto_json::{request_json_from_wire, response_from_json};

/// `inner` (a function reading JSON on stdin), called with the protobuf
/// messages of the function API.
#[derive(Debug)]
pub(crate) struct Json<R>(pub(crate) R);

#[async_trait::async_trait]
impl<R: FunctionRunner> FunctionRunner for Json<R> {
    async fn run_function(
        &self,
        function: &Function,
        request: Request,
    ) -> Result<Response, Status> {
        let Request { input, deadline } = request;
        let (json, tag) =
            request_json_from_wire(&input).map_err(|e| Status::internal(Chain(&e).to_string()))?;
        // The wire bytes go before the call waits: it holds only its JSON.
        drop(input);
        let request = Request {
            input: Bytes::from(json),
            deadline,
        };
        let response = self.0.run_function(function, request).await?;
        let answer = decode(function, &tag, &response)?;
        Ok(Response {
            output: Bytes::from(answer.encode_to_vec()),
            ..response
        })
    }
}

/// The response a run wrote, its `meta.tag` `tag` unless it set its own.
fn decode(
    function: &Function,
    tag: &str,
    response: &Response,
) -> Result<pb::RunFunctionResponse, Status> {
    let mut answer = response_from_json(&response.output).map_err(|e| {
        Status::internal(format!(
            "function {}: {} (on its stdout); its stderr: {}",
            function.name.as_deref().unwrap_or(&function.image),
            Chain(&e),
            crate::runner::stderr_tail_text(&response.stderr_tail)
        ))
    })?;
    let meta = answer.meta.get_or_insert_with(Default::default);
    if meta.tag.is_empty() {
        meta.tag = tag.to_string();
    }
    Ok(answer)
}
