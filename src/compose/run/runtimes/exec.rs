//! The `Exec` runtime: one container run per call, the adaptor convention
//! (the JSON RunFunctionRequest on stdin, the JSON RunFunctionResponse on
//! stdout), through the engine's own backend of the seam
//! (`call::container`); each Function's container is made (and started)
//! before the pipeline's first step, in the runner's warm pool.
use std::sync::Arc;

use tonic::Status;

use super::runtime::{Runtime, Wire};
use crate::call::{self, FunctionRunner};
use crate::compose::{CallError, ComposeError};
use crate::runner::Runner;

/// One container run per call (`Exec` runtime).
#[derive(Debug)]
pub(crate) struct Exec {
    /// The in-process runner.
    pub(super) runner: Arc<Runner>,
    /// The Function: its image and how to run it.
    pub(super) function: call::Function,
}

#[async_trait::async_trait]
impl Runtime for Exec {
    fn function(&self) -> &call::Function {
        &self.function
    }

    fn wire(&self) -> Wire {
        Wire::Json
    }

    /// Pulls the image and has a container ready for the Function's step,
    /// while the other Functions' are made too.
    async fn start(&self) -> Result<(), ComposeError> {
        self.runner
            .prewarm(&self.function.image, &self.function.config)
            .await
            .map_err(|e| ComposeError::Call {
                target: self.function.image.clone(),
                source: Box::new(CallError::Run(e)),
            })
    }
}

#[async_trait::async_trait]
impl FunctionRunner for Exec {
    async fn run_function(
        &self,
        function: &call::Function,
        request: call::Request,
    ) -> Result<call::Response, Status> {
        self.runner.run_function(function, request).await
    }
}
