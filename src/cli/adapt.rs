//! `xfn adapt`: serve one container image as a modern Crossplane Function
//! (v1 and v1beta1 `FunctionRunnerService` on TCP, mTLS or `--insecure`).
//! Each call runs the container with the JSON `RunFunctionRequest` on stdin
//! and answers with the JSON `RunFunctionResponse` it writes to stdout.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::adaptor::transport::{mutual_tls, services, Security};
use crate::adaptor::{Adaptor, AdaptorOptions};
use crate::grpc::daemon::Daemon;
use crate::grpc::serve::Incoming;
use crate::image::store::ImportSource;
use crate::image::{PullPolicy, RegistryAuth};
use crate::runner::{Namespace, RunConfig};

use super::daemon_flags::daemon_runner;
use super::run::parse_duration;
use super::{StoreArgs, UsernsArgs};

/// Flags of `xfn adapt`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["image_tarball", "image_layout", "image"])))]
pub(crate) struct AdaptArgs {
    /// The function image as `docker save` wrote it (gzipped or not), or an
    /// OCI layout in a tar.
    #[arg(long)]
    pub(crate) image_tarball: Option<PathBuf>,
    /// The function image as an OCI image layout directory.
    #[arg(long)]
    pub(crate) image_layout: Option<PathBuf>,
    /// The function image in a registry (pulled once at start).
    #[arg(long)]
    pub(crate) image: Option<String>,
    /// Image cache and per-run state.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// User namespace mapping.
    #[command(flatten)]
    pub(crate) userns: UsernsArgs,
    /// TCP address to serve on.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub(crate) address: SocketAddr,
    /// Directory with `tls.crt`, `tls.key` and `ca.crt` (mTLS; client
    /// certificates required).
    #[arg(long, env = "TLS_SERVER_CERTS_DIR")]
    pub(crate) tls_certs_dir: Option<PathBuf>,
    /// Serve plaintext gRPC (no TLS).
    #[arg(long, conflicts_with = "tls_certs_dir")]
    pub(crate) insecure: bool,
    /// Largest request accepted, a quantity like 4Mi.
    #[arg(long, default_value = "4Mi", value_parser = super::parse_byte_count)]
    pub(crate) max_recv_message_size: usize,
    /// Kill a run after this long (e.g. `20s`, `500ms`); a caller's
    /// shorter deadline (grpc-timeout) wins.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// Admission, drain and metrics (as `xfn start`).
    #[command(flatten)]
    pub(crate) daemon: super::daemon_flags::DaemonArgs,
    /// Do not answer identical requests from responses that set `meta.ttl`.
    #[arg(long)]
    pub(crate) no_response_cache: bool,
    /// Most responses the cache holds.
    #[arg(long, default_value_t = 1024)]
    pub(crate) response_cache_size: usize,
    /// Run engine flags.
    #[command(flatten)]
    pub(crate) runner: super::RunnerArgs,
    /// Warm containers (as `xfn start`).
    #[command(flatten)]
    pub(crate) warm_pool: super::WarmPoolArgs,
}

/// The repository imported images get in the store (tagged by digest).
const IMPORTED_REPOSITORY: &str = "adapt.xfn.invalid/function";

/// Reads the TLS files while xfn still has its own uid (before the user
/// namespace, where a key readable only by that uid is out of reach), and
/// refuses to go on with neither TLS nor `--insecure`.
pub(crate) fn prepare(args: &AdaptArgs) -> anyhow::Result<Security> {
    Ok(match (&args.tls_certs_dir, args.insecure) {
        (Some(dir), _) => mutual_tls(dir).context("cannot load the TLS certificates")?,
        (None, true) => {
            tracing::warn!("serving plaintext gRPC (--insecure)");
            Security::Insecure
        }
        (None, false) => anyhow::bail!(
            "no TLS certificates: pass --tls-certs-dir (or set TLS_SERVER_CERTS_DIR), or --insecure for plaintext"
        ),
    })
}

/// Runs `xfn adapt`.
pub(crate) async fn execute(
    args: AdaptArgs,
    security: Security,
    namespace: &Namespace,
    state_in_memory: bool,
    global: &super::Global,
) -> anyhow::Result<ExitCode> {
    let store = args.store.open_store(&global.registry)?;

    // Everything that can happen once happens here: the image is whole in
    // the store before the first call, so calls never pull.
    let started = std::time::Instant::now();
    let name = match (&args.image_tarball, &args.image_layout, &args.image) {
        (Some(path), _, _) | (_, Some(path), _) => path.display().to_string(),
        (_, _, image) => image.clone().unwrap_or_default(),
    };
    let image = match (&args.image_tarball, &args.image_layout, &args.image) {
        (Some(tarball), _, _) => store
            .import(ImportSource::Tarball(tarball.clone()), IMPORTED_REPOSITORY)
            .await
            .with_context(|| format!("cannot load {}", tarball.display()))?,
        (_, Some(layout), _) => store
            .import(ImportSource::Layout(layout.clone()), IMPORTED_REPOSITORY)
            .await
            .with_context(|| format!("cannot load {}", layout.display()))?,
        (_, _, Some(image)) => {
            store
                .ensure(image, PullPolicy::IfNotPresent, &RegistryAuth::default())
                .await
                .with_context(|| format!("cannot pull {image}"))?;
            image.clone()
        }
        (None, None, None) => anyhow::bail!("one of --image-tarball, --image-layout, --image"),
    };
    // Held for the adaptor's life: a collection of this cache (`xfn cache
    // gc` from a shell, a daemon's budget) never takes its one image, which
    // its calls, pull policy Never, could not fetch again.
    let _in_use = store
        .ensure(&image, PullPolicy::Never, &RegistryAuth::default())
        .await
        .with_context(|| format!("cannot find {image} in the cache"))?;
    tracing::info!(%image, took = ?started.elapsed(), "function image ready");

    let runner = daemon_runner(
        namespace,
        store,
        &args.runner,
        &args.warm_pool,
        state_in_memory,
    )?;
    // No cache budget: the adaptor's one image is pinned for its life.
    let daemon = Daemon::new(runner, args.daemon.daemon_options(None, None));
    let adaptor = Arc::new(Adaptor::new(
        Arc::clone(daemon.runner()),
        image,
        AdaptorOptions {
            name,
            run: RunConfig {
                // Imported or pulled above: a call never goes to a registry.
                pull_policy: PullPolicy::Never,
                timeout: args.timeout,
                ..RunConfig::default()
            },
            response_cache_size: (!args.no_response_cache).then_some(args.response_cache_size),
        },
        daemon.calls(),
    ));

    let listener = std::net::TcpListener::bind(args.address)
        .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
        .with_context(|| format!("cannot listen on {}", args.address))?;
    tracing::info!(
        address = %listener.local_addr()?,
        tls = !matches!(security, Security::Insecure),
        "serving the function API (v1, v1beta1)"
    );
    let services = services(adaptor, args.max_recv_message_size, security);
    daemon.serve(Incoming::Tcp(listener), services).await?;
    Ok(ExitCode::SUCCESS)
}
