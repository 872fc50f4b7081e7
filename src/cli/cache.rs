//! `xfn cache` (owned by the image work).
use clap::Subcommand;

/// `xfn cache` subcommands.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// List cached images with digest and size.
    Ls,
}

/// Runs `xfn cache`.
pub async fn execute(
    command: CacheCommand,
    global: &super::Global,
) -> anyhow::Result<std::process::ExitCode> {
    let _ = (command, global);
    anyhow::bail!("xfn cache is not built yet")
}
