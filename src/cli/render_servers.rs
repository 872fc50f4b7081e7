//! `xfn render-servers ls|stop`: the function servers renders keep running
//! (`render.crossplane.io/runtime-docker-cleanup: Orphan`); `keep` (hidden)
//! is the keeper process a render starts for each (see
//! `crate::compose::kept`).
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::compose::kept::{self, KeptDir, KeptInfo};
use crate::image::PullPolicy;
use crate::runner::{Limits, Namespace, NetworkPolicy, RunConfig, Runner};

use super::run::parse_duration;
use super::{RunnerArgs, StoreArgs, UsernsArgs};

/// `xfn render-servers`.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process; boxing buys nothing
pub(crate) enum RenderServersCommand {
    /// List kept function servers: name, Function, image, keeper pid, age.
    Ls(LsArgs),
    /// Stop kept function servers (and remove everything of them).
    Stop(StopArgs),
    /// Run one kept server (started by `xfn render`).
    #[command(hide = true)]
    Keep(Box<KeepArgs>),
}

/// The cache whose kept servers are meant.
#[derive(Debug, Args)]
pub(crate) struct CacheArg {
    /// Directory of the image cache (and per-run state).
    #[arg(short = 'c', long, env = "XFN_CACHE_DIR", default_value_os_t = super::default_cache_dir())]
    pub(crate) cache_dir: PathBuf,
}

/// `xfn render-servers ls`.
#[derive(Debug, Args)]
pub(crate) struct LsArgs {
    /// The cache.
    #[command(flatten)]
    pub(crate) cache: CacheArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = super::ListFormat::Text)]
    pub(crate) format: super::ListFormat,
}

/// `xfn render-servers stop`.
#[derive(Debug, Args)]
pub(crate) struct StopArgs {
    /// The cache.
    #[command(flatten)]
    pub(crate) cache: CacheArg,
    /// Stop every kept server.
    #[arg(long, conflicts_with = "names")]
    pub(crate) all: bool,
    /// The servers (their `runtime-docker-name`).
    #[arg(required_unless_present = "all")]
    pub(crate) names: Vec<String>,
}

/// `xfn render-servers keep`.
#[derive(Debug, Args)]
pub(crate) struct KeepArgs {
    /// Store flags.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// User namespace flags.
    #[command(flatten)]
    pub(crate) userns: UsernsArgs,
    /// Run engine flags.
    #[command(flatten)]
    pub(crate) runner: RunnerArgs,
    /// The server's name.
    #[arg(long)]
    pub(crate) name: String,
    /// The Function it serves.
    #[arg(long)]
    pub(crate) function: String,
    /// The image.
    #[arg(long)]
    pub(crate) image: String,
    /// When to pull the image.
    #[arg(long, value_enum, default_value = "IfNotPresent")]
    pub(crate) image_pull_policy: PullPolicy,
    /// `KEY=VALUE` added to its environment.
    #[arg(long)]
    pub(crate) env: Vec<String>,
    /// Share the host's network (egress).
    #[arg(long)]
    pub(crate) host_network: bool,
    /// Bounds the server's start (half of it, at most 30s, as a render's).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
}

/// Runs `xfn render-servers …`.
pub(crate) async fn execute(
    command: RenderServersCommand,
    namespace: Option<&Namespace>,
    global: &super::Global,
) -> anyhow::Result<ExitCode> {
    match command {
        RenderServersCommand::Ls(args) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let servers = kept::list(&args.cache.cache_dir);
            if args.format == super::ListFormat::Json {
                let rows: Vec<_> = servers
                    .iter()
                    .map(|server| {
                        serde_json::json!({
                            "name": server.name,
                            "function": server.function,
                            "image": server.image,
                            "pid": server.pid,
                            "ageSeconds": now.saturating_sub(server.started),
                        })
                    })
                    .collect();
                super::print_json(&rows)?;
                return Ok(ExitCode::SUCCESS);
            }
            println!("NAME\tFUNCTION\tIMAGE\tPID\tAGE");
            for KeptInfo {
                name,
                function,
                image,
                pid,
                started,
            } in servers
            {
                println!(
                    "{name}\t{function}\t{image}\t{pid}\t{}s",
                    now.saturating_sub(started)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        RenderServersCommand::Stop(args) => {
            let names: Vec<String> = if args.all {
                kept::list(&args.cache.cache_dir)
                    .into_iter()
                    .map(|i| i.name)
                    .collect()
            } else {
                args.names
            };
            let mut missing = Vec::new();
            for name in &names {
                let dir = args.cache.cache_dir.clone();
                let name_owned = name.clone();
                let stopped =
                    tokio::task::spawn_blocking(move || kept::stop(&dir, &name_owned)).await?;
                if stopped {
                    println!("stopped {name}");
                } else {
                    missing.push(name.as_str());
                }
            }
            if !missing.is_empty() {
                bail!("no kept server named {}", missing.join(", "));
            }
            Ok(ExitCode::SUCCESS)
        }
        RenderServersCommand::Keep(args) => {
            let store = args.store.open_store(&global.registry)?;
            let namespace = namespace.context("xfn did not enter its user namespace")?;
            let runner = Runner::new(namespace, store, args.runner.options())?;
            let config = RunConfig {
                pull_policy: args.image_pull_policy,
                auth: super::pull::docker_config_auth(&args.image, &global.registry)
                    .unwrap_or_default(),
                timeout: args.timeout,
                network: NetworkPolicy::Isolated,
                limits: Limits::default(),
            };
            let dir = KeptDir::new(&args.store.cache_dir, &args.name);
            let info = KeptInfo {
                name: args.name.clone(),
                function: args.function.clone(),
                image: args.image.clone(),
                pid: std::process::id(),
                started: 0,
            };
            kept::keep(&runner, &dir, info, &config, &args.env, args.host_network).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
