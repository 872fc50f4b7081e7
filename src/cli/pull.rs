//! `xfn pull`: pull an image into the cache, with a progress bar on a
//! terminal and a one-line summary.
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::image::{
    ImageReference, ImageStore, PullPolicy, PullProgress, RegistryAuth, StoreOptions,
};

use super::StoreArgs;

/// Flags of `xfn pull`.
#[derive(Debug, Args)]
pub(crate) struct PullArgs {
    /// Cache and registry flags.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// When to contact the registry.
    #[arg(long, value_enum, default_value_t = PullPolicy::IfNotPresent)]
    pub(crate) image_pull_policy: PullPolicy,
    /// The image to pull.
    pub(crate) image: String,
}

impl StoreArgs {
    /// Store options from the flags and the global default registry.
    pub(crate) fn store_options(&self, default_registry: &str) -> StoreOptions {
        StoreOptions {
            default_registry: default_registry.to_string(),
            insecure_registries: self.insecure_registries.clone(),
            ca_bundle: self.ca_bundle_path.clone(),
            max_image_size: self.bounds.max_image_size,
            max_layer_entries: self.bounds.max_layer_entries,
            pull_timeout: self.bounds.pull_timeout,
        }
    }

    /// Opens the image store these flags name.
    pub(crate) fn open_store(&self, default_registry: &str) -> anyhow::Result<ImageStore> {
        ImageStore::open(&self.cache_dir, self.store_options(default_registry))
            .with_context(|| format!("opening the image cache {}", self.cache_dir.display()))
    }
}

/// Credentials for `image` from the docker config (anonymous when none).
pub(crate) fn docker_config_auth(
    image: &str,
    default_registry: &str,
) -> anyhow::Result<RegistryAuth> {
    let reference = ImageReference::parse(image, default_registry)?;
    Ok(RegistryAuth::from_docker_config(&reference.registry)?)
}

/// A progress bar over the layer bytes.
struct Bar(ProgressBar);

impl PullProgress for Bar {
    fn started(&self, layers: usize, total_bytes: u64) {
        self.0.set_length(total_bytes);
        self.0.set_message(format!("{layers} layers"));
    }
    fn advanced(&self, bytes: u64) {
        self.0.inc(bytes);
    }
}

/// Runs `xfn pull`.
pub(crate) async fn execute(args: PullArgs, global: &super::Global) -> anyhow::Result<ExitCode> {
    let store = args.store.open_store(&global.registry)?;
    let auth = docker_config_auth(&args.image, &global.registry)?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Bar(bar)
    });
    let started = Instant::now();
    let result = store
        .ensure_with(
            &args.image,
            args.image_pull_policy,
            &auth,
            bar.as_ref().map(|b| b as &dyn PullProgress),
        )
        .await;
    if let Some(bar) = &bar {
        bar.0.finish_and_clear();
    }
    let (image, report) = result.with_context(|| format!("pulling {}", args.image))?;
    let verb = if report.resolved_remotely {
        "pulled"
    } else {
        "cached"
    };
    println!(
        "{verb} {} {} {} layers {} in {:.2}s ({} layers, {} downloaded)",
        args.image,
        image.digest,
        report.layers,
        human_bytes(report.total_bytes),
        started.elapsed().as_secs_f64(),
        report.layers_downloaded,
        human_bytes(report.bytes_downloaded),
    );
    Ok(ExitCode::SUCCESS)
}

/// `52.1 MB`: decimal units, one decimal.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: &[&str] = &["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_is_decimal() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(52_100_000), "52.1 MB");
        assert_eq!(human_bytes(1_500), "1.5 kB");
    }
}
