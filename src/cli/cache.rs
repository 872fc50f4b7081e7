//! `xfn cache` (owned by the image work).
use clap::Subcommand;

/// `xfn cache` subcommands.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// List cached images with digest and size.
    Ls,
}
