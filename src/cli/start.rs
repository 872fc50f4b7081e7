//! `xfn start` (owned by the server work).
use clap::Args;

/// Flags of `xfn start`.
#[derive(Debug, Default, Args)]
pub struct StartArgs {}

/// Runs `xfn start`.
pub async fn execute(
    args: StartArgs,
    global: &super::Global,
) -> anyhow::Result<std::process::ExitCode> {
    let _ = (args, global);
    anyhow::bail!("xfn start is not built yet")
}
