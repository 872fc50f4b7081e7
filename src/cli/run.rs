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

/// Runs `xfn run`.
pub async fn execute(
    args: RunArgs,
    global: &super::Global,
) -> anyhow::Result<std::process::ExitCode> {
    let _ = (args, global);
    anyhow::bail!("xfn run is not built yet")
}
