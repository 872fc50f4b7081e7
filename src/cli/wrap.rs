//! `xfn wrap`: build an adaptor image (a Crossplane Function package) from a
//! function image tarball and a base image holding xfn and crun, without
//! Docker; push it or write it as an OCI layout tarball. Everything is
//! checked before anything is pushed (see `crate::adaptor::wrap`).
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::adaptor::wrap::{wrap, WrapOutput, WrapSpec};
use crate::image::pull::ConnectOptions;
use crate::image::{ImageReference, RegistryAuth};

/// Flags of `xfn wrap`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("destination").required(true).args(["push", "output"])))]
pub(crate) struct WrapArgs {
    /// The function image as `docker save` wrote it.
    #[arg(long)]
    pub(crate) function: PathBuf,
    /// The base image: one holding xfn and crun.
    #[arg(long)]
    pub(crate) base: String,
    /// The reference of the result.
    #[arg(long)]
    pub(crate) tag: String,
    /// Push the result to the registry `--tag` names.
    #[arg(long)]
    pub(crate) push: bool,
    /// Write the result to FILE as an OCI image layout in a tar.
    #[arg(long)]
    pub(crate) output: Option<PathBuf>,
    /// The package's `metadata.name` (default: the metadata file's, else
    /// the last path segment of `--tag`'s repository).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// A package annotation `KEY=VALUE` (repeatable).
    #[arg(long = "annotation", value_parser = parse_annotation)]
    pub(crate) annotations: Vec<(String, String)>,
    /// What the Function serves, Crossplane's package capabilities
    /// (repeatable; default: the metadata file's, else both).
    #[arg(long = "capability", value_parser = ["composition", "operation"])]
    pub(crate) capabilities: Vec<String>,
    /// Package metadata to start from: a `crossplane.yaml` holding a
    /// `meta.pkg.crossplane.io` Function (dependencies, Crossplane version,
    /// annotations); --name, --annotation and --capability are set over it.
    #[arg(long, value_name = "FILE")]
    pub(crate) package_metadata: Option<PathBuf>,
    /// Registries reached over plain HTTP (loopback registries always are).
    #[arg(long = "insecure-registry")]
    pub(crate) insecure_registries: Vec<String>,
    /// A PEM bundle of CAs trusted besides the system roots.
    #[arg(long, env = "CA_BUNDLE_PATH")]
    pub(crate) ca_bundle_path: Option<PathBuf>,
}

fn parse_annotation(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

/// Runs `xfn wrap`.
pub(crate) async fn execute(args: WrapArgs, global: &super::Global) -> anyhow::Result<ExitCode> {
    let target = ImageReference::parse(&args.tag, &global.registry)?;
    let mut connect = ConnectOptions {
        insecure_registries: args.insecure_registries.clone(),
        ..Default::default()
    };
    if let Some(ca) = &args.ca_bundle_path {
        connect.load_ca_bundle(ca)?;
    }
    let spec = WrapSpec {
        function: args.function.clone(),
        base: args.base.clone(),
        tag: args.tag.clone(),
        name: args.name.clone(),
        annotations: args.annotations.clone(),
        capabilities: args.capabilities.clone(),
        package_metadata: args.package_metadata.clone(),
        // The docker config's entry for the target registry (anonymous
        // without one); the base is usually in the same registry.
        auth: RegistryAuth::from_docker_config(&target.registry)?,
        connect,
        default_registry: global.registry.clone(),
    };
    let output = match &args.output {
        Some(path) => WrapOutput::LayoutTarball(path.clone()),
        None => WrapOutput::Push,
    };
    let digest = wrap(&spec, &output)
        .await
        .with_context(|| format!("cannot build {}", args.tag))?;
    match &args.output {
        Some(path) => println!("{} {digest} written to {}", args.tag, path.display()),
        None => println!("{}@{digest}", args.tag),
    }
    Ok(ExitCode::SUCCESS)
}
