//! The `Exec` runtime: one container run per call, the adaptor convention;
//! each Function's container is made (and started) before the pipeline's
//! first step, in the runner's warm pool.
use std::sync::Arc;

use crate::compose::run::v1::FunctionCaller;
use crate::compose::{CallError, ComposeError};
use crate::proto::v1;
use crate::proto_json::{request_to_json, response_from_json};
use crate::runner::{RunConfig, Runner};

/// One container run per call (`Exec` runtime): the JSON RunFunctionRequest
/// on stdin, the JSON RunFunctionResponse on stdout.
#[derive(Debug)]
pub(crate) struct Exec {
    /// The in-process runner.
    pub(super) runner: Arc<Runner>,
    /// The Function's image.
    pub(super) image: String,
    /// How to run it.
    pub(super) config: RunConfig,
}

#[async_trait::async_trait(?Send)]
impl FunctionCaller for Exec {
    /// Pulls the image and has a container ready for the Function's step,
    /// while the other Functions' are made too.
    async fn start(&self) -> Result<(), ComposeError> {
        self.runner
            .prewarm(&self.image, &self.config)
            .await
            .map_err(|e| self.failed(e.into()))
    }

    async fn run_function(
        &self,
        request: v1::RunFunctionRequest,
    ) -> Result<v1::RunFunctionResponse, ComposeError> {
        let input = request_to_json(&request)?;
        let output = self
            .runner
            .run(&self.image, &input, &self.config)
            .await
            .map_err(|e| self.failed(e.into()))?;
        response_from_json(&output.stdout).map_err(|e| self.failed(e.into()))
    }
}

impl Exec {
    fn failed(&self, source: CallError) -> ComposeError {
        ComposeError::Call {
            target: self.image.clone(),
            source: Box::new(source),
        }
    }
}
