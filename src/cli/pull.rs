//! `xfn pull` (owned by the image work).
use clap::Args;

/// Flags of `xfn pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// The image to pull.
    pub image: String,
}
