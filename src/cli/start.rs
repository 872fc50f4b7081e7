//! `xfn start` (owned by the server work).
use clap::Args;

/// Flags of `xfn start`.
#[derive(Debug, Default, Args)]
pub struct StartArgs {}
