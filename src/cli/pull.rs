//! `xfn pull` (owned by the image work).
use clap::Args;

/// Flags of `xfn pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// The image to pull.
    pub image: String,
}

/// Runs `xfn pull`.
pub async fn execute(
    args: PullArgs,
    global: &super::Global,
) -> anyhow::Result<std::process::ExitCode> {
    let _ = (args, global);
    anyhow::bail!("xfn pull is not built yet")
}
