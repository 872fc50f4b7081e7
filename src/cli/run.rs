//! `xfn run` (owned by the sandbox work).
use clap::Args;

/// Flags of `xfn run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The function image.
    pub image: String,
    /// The input document (a FunctionIO, or a RunFunctionRequest as JSON); `-` for stdin.
    pub input: String,
}
