//! The backend of a container per call: the engine ([`Runner`]: a warm
//! container of its pool, or one made for the call) runs the function's
//! image with the request on stdin; its stdout is the answer.
use tonic::Status;

use super::{Function, FunctionRunner, Request, Response};
use crate::grpc::status_of;
use crate::runner::Runner;

#[async_trait::async_trait]
impl FunctionRunner for Runner {
    async fn run_function(
        &self,
        function: &Function,
        request: Request,
    ) -> Result<Response, Status> {
        let output = Runner::run(self, &function.image, &request.input, &function.config)
            .await
            .map_err(|err| {
                let status = status_of(&err);
                // A named function's errors say which (an image says itself).
                match &function.name {
                    Some(name) => Status::new(
                        status.code(),
                        format!("function {name}: {}", status.message()),
                    ),
                    None => status,
                }
            })?;
        Ok(Response {
            output: output.stdout.into(),
            stderr_tail: output.stderr_tail,
            usage: output.usage,
            outcome: "ok",
        })
    }
}
