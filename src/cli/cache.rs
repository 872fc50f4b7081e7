//! `xfn cache`: inspect the image cache, remove images, collect garbage.
use std::process::ExitCode;

use crate::image::{CacheListing, GcReport};
use clap::{Args, Subcommand};

use super::pull::human_bytes;
use super::{parse_size, print_json, ListFormat, StoreArgs};

/// `xfn cache` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum CacheCommand {
    /// List cached images: digest, disk held (all, and not shared with
    /// another image), compressed download size.
    Ls(LsArgs),
    /// Remove images (their references); their layers and blobs go when no
    /// other cached image uses them.
    Rm(RmArgs),
    /// Remove what no cached image uses and, with --max-size, the least
    /// recently used images until the cache fits. Images in use by a run or
    /// a pull are never removed.
    Gc(GcArgs),
}

/// Flags of `xfn cache ls`.
#[derive(Debug, Args)]
pub(crate) struct LsArgs {
    /// Cache flags.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ListFormat::Text)]
    pub(crate) format: ListFormat,
}

/// Flags of `xfn cache rm`.
#[derive(Debug, Args)]
pub(crate) struct RmArgs {
    /// Cache flags.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// The images to remove, as they were pulled (tag or digest).
    #[arg(required = true)]
    pub(crate) images: Vec<String>,
}

/// Flags of `xfn cache gc`.
#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// Cache flags.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Evict least recently used images until the cache takes at most this
    /// much disk (a quantity: `5Gi`, `500M`); without it only what no image
    /// uses is removed.
    #[arg(long, value_parser = parse_size)]
    pub(crate) max_size: Option<u64>,
}

impl CacheCommand {
    /// The cache flags of any subcommand.
    pub(crate) fn store(&self) -> &StoreArgs {
        match self {
            CacheCommand::Ls(args) => &args.store,
            CacheCommand::Rm(args) => &args.store,
            CacheCommand::Gc(args) => &args.store,
        }
    }
}

/// Runs `xfn cache`.
pub(crate) async fn execute(
    command: CacheCommand,
    global: &super::Global,
) -> anyhow::Result<ExitCode> {
    let store = command.store().open_store(&global.registry)?;
    match command {
        CacheCommand::Ls(args) => {
            list(&store.list()?, args.format)?;
            Ok(ExitCode::SUCCESS)
        }
        CacheCommand::Rm(args) => {
            let report = store.remove_images(&args.images).await?;
            for reference in &report.removed {
                println!("removed {reference}");
            }
            println!("{}", summary(&report));
            for reference in &report.missing {
                eprintln!("xfn: {reference} is not in the cache");
            }
            Ok(if report.missing.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        CacheCommand::Gc(args) => {
            let report = store.collect(args.max_size).await?;
            for reference in &report.evicted {
                println!("evicted {reference} (least recently used)");
            }
            println!("{}", summary(&report));
            if let Some(max) = args.max_size.filter(|max| report.bytes_after > *max) {
                println!(
                    "still above {}: {} image(s) in use by runs or pulls are kept",
                    human_bytes(max),
                    report.kept_in_use
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Prints `xfn cache ls`: per image the disk it holds (`DISK`), what of
/// it no other reference shares (`UNIQUE`: what `rm` of it alone frees)
/// and what a pull downloads (`DOWNLOAD`, compressed); then the total, as
/// `gc` counts what the cache takes.
fn list(listing: &CacheListing, format: ListFormat) -> anyhow::Result<()> {
    let images = &listing.images;
    if format == ListFormat::Json {
        let rows: Vec<_> = images
            .iter()
            .map(|image| {
                serde_json::json!({
                    "reference": image.reference,
                    "digest": image.digest,
                    "disk_bytes": image.disk,
                    "unique_disk_bytes": image.unique_disk,
                    "compressed_bytes": image.compressed_size,
                    "complete": image.complete,
                })
            })
            .collect();
        return print_json(&rows);
    }
    let width = images
        .iter()
        .map(|i| i.reference.len())
        .max()
        .unwrap_or(0)
        .max("REFERENCE".len());
    println!(
        "{:width$}  {:71}  {:>9}  {:>9}  {:>9}",
        "REFERENCE", "DIGEST", "DISK", "UNIQUE", "DOWNLOAD"
    );
    for image in images {
        let note = if image.complete { "" } else { "  (incomplete)" };
        println!(
            "{:width$}  {:71}  {:>9}  {:>9}  {:>9}{note}",
            image.reference,
            image.digest,
            human_bytes(image.disk),
            human_bytes(image.unique_disk),
            human_bytes(image.compressed_size),
        );
    }
    println!(
        "{} image(s) take {} of disk (what they share counted once)",
        images.len(),
        human_bytes(listing.disk)
    );
    Ok(())
}

/// `freed 12.3 MB (2 layers); the cache takes 40.1 MB`.
fn summary(report: &GcReport) -> String {
    let layers = report.layers_removed;
    format!(
        "freed {} ({layers} layer{}); the cache takes {}",
        human_bytes(report.freed()),
        if layers == 1 { "" } else { "s" },
        human_bytes(report.bytes_after)
    )
}
