//! `xfn cache`: inspect the image cache.
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::pull::human_bytes;
use super::StoreArgs;

/// `xfn cache` subcommands.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// List cached images with digest and size.
    Ls(LsArgs),
}

/// Flags of `xfn cache ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Cache flags.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Runs `xfn cache`.
pub async fn execute(command: CacheCommand, global: &super::Global) -> anyhow::Result<ExitCode> {
    match command {
        CacheCommand::Ls(args) => {
            let store = args.store.open_store(&global.registry)?;
            let images = store.list()?;
            let width = images
                .iter()
                .map(|i| i.reference.len())
                .max()
                .unwrap_or(0)
                .max("REFERENCE".len());
            println!("{:width$}  {:71}  SIZE", "REFERENCE", "DIGEST");
            for image in images {
                let note = if image.complete { "" } else { "  (incomplete)" };
                println!(
                    "{:width$}  {:71}  {}{note}",
                    image.reference,
                    image.digest,
                    human_bytes(image.size)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
