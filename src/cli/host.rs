//! `xfn host`: serve every Function a catalog names on one port (see
//! `crate::host`). Static mode: `--functions FILE` (Crossplane Function
//! objects) and `--ca DIR` (the CA as `crossplane-root-ca` holds it).
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::grpc::daemon::Daemon;
use crate::grpc::raw;
use crate::grpc::serve::{Incoming, ServiceSet};
use crate::host::controller::Hosting;
use crate::host::servers::ServerLimits;
use crate::host::service::{HostService, WithAuthority};
use crate::host::status::ReadyWhen;
use crate::host::tls::Ca;
use crate::host::{Host, HostOptions};
use crate::image::PullPolicy;
use crate::runner::{Namespace, Runner};

use super::run::parse_duration;
use super::{StoreArgs, UsernsArgs};

/// Flags of `xfn host`.
#[derive(Debug, Clone, Args)]
#[group(id = "trust", required = true, multiple = false, args = ["ca", "insecure"])]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct HostArgs {
    /// What to ask a running `xfn host` (none: run one).
    #[command(subcommand)]
    pub(crate) command: Option<HostCommand>,
    /// Crossplane `pkg.crossplane.io` Function objects to host (multi-doc
    /// YAML; the file `crossplane render` takes). Without it, xfn hosts
    /// what the cluster's FunctionRevisions say is active (in a pod, with
    /// Crossplane installed with `Function=External`: docs/host.md).
    #[arg(long)]
    pub(crate) functions: Option<PathBuf>,
    /// Directory with the CA (`tls.crt`, `tls.key`, as the
    /// `crossplane-root-ca` secret holds it): server certificates are
    /// issued from it and client certificates must be signed by it.
    /// One of `--ca` and `--insecure` is required.
    #[arg(long, env = "XFN_HOST_CA_DIR")]
    pub(crate) ca: Option<PathBuf>,
    /// Serve plaintext gRPC, routed by the `:authority` host (local use
    /// only; instead of `--ca`).
    #[arg(long)]
    pub(crate) insecure: bool,
    /// TCP address to serve on.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub(crate) address: SocketAddr,
    /// The namespace in the names each function is served under (`NAME`,
    /// `NAME.NAMESPACE`, `NAME.NAMESPACE.svc`).
    #[arg(long, default_value = "crossplane-system")]
    pub(crate) namespace: String,
    /// Most servers of one function at once.
    #[arg(long, default_value_t = 1)]
    pub(crate) max_servers_per_function: usize,
    /// Most function servers of all functions at once.
    #[arg(long, default_value_t = 32)]
    pub(crate) max_servers: usize,
    /// Most calls one function server takes at once; later calls wait
    /// (FIFO) within their deadline.
    #[arg(long, default_value_t = 16)]
    pub(crate) calls_per_server: usize,
    /// A function server with no call this long is stopped.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) server_idle: Duration,
    /// Create each function's next server's container ahead of its start
    /// (rootfs, spec, cgroup, `crun create`; in a free --max-servers slot),
    /// so that a call finding no server only starts it. See docs/host.md.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) prepare_servers: bool,
    /// A container created ahead is removed once its function has had no
    /// call this long (scaled to zero, xfn's memory is its own again); it
    /// is made again after the function's next call. See docs/host.md.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub(crate) prepared_idle: Duration,
    /// The longest a function server may take to start listening.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) server_start_timeout: Duration,
    /// Kill a stdin/stdout function's run after this long (a caller's
    /// shorter deadline wins).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// Largest request accepted, a quantity like 4Mi.
    #[arg(long, default_value = "4Mi", value_parser = super::parse_byte_count)]
    pub(crate) max_recv_message_size: usize,
    /// Most bytes of function servers' responses xfn holds at once, all
    /// calls together (a quantity); a response waits for room within its
    /// caller's deadline. See docs/host.md.
    #[arg(long, default_value = DEFAULT_RESPONSE_BUDGET, value_parser = super::parse_nonzero_size)]
    pub(crate) response_budget: u64,
    /// When packages are pulled.
    #[arg(long, value_enum, default_value = "IfNotPresent")]
    pub(crate) image_pull_policy: PullPolicy,
    /// When `/readyz` (on --metrics-address) answers 200: once every
    /// hosted function's package is pulled and its kind decided (`all`),
    /// or once any is (`any`). See docs/host.md, Watching it.
    #[arg(long, value_enum, default_value = "all")]
    pub(crate) ready_when: ReadyWhen,
    /// CPU limit of each container of a function whose
    /// DeploymentRuntimeConfig sets none, a Kubernetes quantity (`500m`,
    /// `2`). See docs/host.md, Limits.
    #[arg(long, default_value = DEFAULT_CPU, value_parser = super::run::parse_cpu)]
    pub(crate) cpu: u64,
    /// Memory limit of each container of a function whose
    /// DeploymentRuntimeConfig sets none, a quantity (`512Mi`). See
    /// docs/host.md, Limits.
    #[arg(long, default_value = DEFAULT_MEMORY, value_parser = super::parse_nonzero_size)]
    pub(crate) memory: u64,
    /// Image cache and per-run state.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// User namespace mapping.
    #[command(flatten)]
    pub(crate) userns: UsernsArgs,
    /// Admission, drain and metrics (as `xfn start`).
    #[command(flatten)]
    pub(crate) daemon: super::daemon_flags::DaemonArgs,
    /// Disk the image cache may take (a quantity), as `xfn start`'s: past
    /// it, the least recently used packages not in use are removed.
    #[arg(long, default_value = super::start::DEFAULT_CACHE_MAX_SIZE, value_parser = super::parse_size)]
    pub(crate) cache_max_size: u64,
    /// Run engine flags.
    #[command(flatten)]
    pub(crate) runner: super::RunnerArgs,
    /// Warm containers for stdin/stdout functions (as `xfn start`).
    #[command(flatten)]
    pub(crate) warm_pool: super::WarmPoolArgs,
}

/// Default of `--cpu`: one core. A function's server is one process
/// (Python's SDK runs its calls on one interpreter): a core lets it go as
/// fast as it can alone and keeps one busy function from taking a shared
/// node's other cores from the rest.
pub(crate) const DEFAULT_CPU: &str = "1";

/// Default of `--memory`: a Python SDK function server idles at 46 MiB
/// resident (measured here) and a Go or Rust one at about 10 MiB; a call
/// adds its request and response (4 MiB in, up to 64 MiB out) times the
/// calls a server takes at once. 512Mi holds that several times over and
/// still bounds a runaway function far below a node's memory; a Function
/// that needs more says so in its DeploymentRuntimeConfig, as it would for
/// its own pod.
pub(crate) const DEFAULT_MEMORY: &str = "512Mi";

/// Default of `--response-budget`: eight responses of the 64 MiB a call
/// may answer, while a real Function answers kilobytes to a few MiB; a
/// sixteenth of the 8Gi `deploy/host/` gives xfn's pod. Without it the
/// bound was calls in flight (up to 512) × 64 MiB = 32 GiB.
pub(crate) const DEFAULT_RESPONSE_BUDGET: &str = "512Mi";

/// What is read before the namespace: the catalog and the CA (a key
/// readable only by the real uid is out of reach in it).
#[derive(Debug)]
pub(crate) struct Prepared {
    functions: Vec<crate::host::catalog::HostedFunction>,
    ca: Option<Ca>,
}

/// Reads the functions file and the CA.
pub(crate) fn prepare(args: &HostArgs) -> anyhow::Result<Prepared> {
    let functions = match &args.functions {
        Some(path) => crate::host::functions_file::read(path, args.max_servers.max(1))
            .map_err(|e| anyhow::anyhow!("{}", crate::chain::Chain(&e)))?,
        None => Vec::new(),
    };
    let ca = match (&args.ca, args.insecure) {
        (Some(dir), _) => Some(
            Ca::load(dir)
                .map_err(|e| anyhow::anyhow!("{}", crate::chain::Chain(&e)))
                .context("cannot load the CA")?,
        ),
        (None, true) => None,
        (None, false) => anyhow::bail!("no CA: pass --ca DIR, or --insecure for plaintext"),
    };
    Ok(Prepared { functions, ca })
}

/// Runs `xfn host`.
pub(crate) async fn execute(
    args: HostArgs,
    prepared: Prepared,
    namespace: &Namespace,
    state_in_memory: bool,
    global: &super::Global,
) -> anyhow::Result<ExitCode> {
    let store = args.store.open_store(&global.registry)?;
    let options = crate::runner::RunnerOptions {
        warm_pool: Some(args.warm_pool.options()),
        state_in_memory,
        ..args.runner.options()
    };
    let runner = Runner::new(namespace, store, options).context("cannot set up the runner")?;
    let crun = runner.check_runtime()?;
    tracing::info!(%crun, "OCI runtime");
    super::daemon_flags::report_limits(&runner, args.runner.require_limits);
    let daemon = Daemon::new(
        runner,
        args.daemon.daemon_options(Some(args.cache_max_size), None),
    );
    let tls = prepared.ca.is_some();
    let prepare_servers = args.prepare_servers && daemon.runner().makes_cheap_containers();
    if args.prepare_servers && !prepare_servers {
        tracing::info!("no server containers created ahead in copy mode (each would hold a copy of its image in memory)");
    }
    let host = Host::new(
        Arc::clone(daemon.runner()),
        Arc::clone(daemon.calls()),
        HostOptions {
            namespace: args.namespace.clone(),
            servers: ServerLimits {
                max_servers: args.max_servers_per_function.max(1),
                calls_per_server: args.calls_per_server.max(1),
                idle: args.server_idle,
                start_timeout: args.server_start_timeout,
                min_servers: 0,
                host_network: false,
                prepared_idle: prepare_servers.then_some(args.prepared_idle),
            },
            max_servers: args.max_servers.max(1),
            response_budget: usize::try_from(args.response_budget).unwrap_or(usize::MAX),
            run_timeout: args.timeout,
            pull_policy: args.image_pull_policy,
            limits: crate::runner::Limits {
                cpu_millis: Some(args.cpu),
                memory_bytes: Some(args.memory),
                pids: None,
            },
            ready_when: args.ready_when,
        },
        prepared.ca,
    );
    daemon.metrics().set_front_end(Box::new(host.stats()));
    daemon
        .metrics()
        .set_front_end_status(Arc::clone(&host) as Arc<dyn crate::grpc::metrics::FrontEndStatus>);
    for function in prepared.functions {
        host.host(function);
    }
    host.keep_tidy();

    let listener = std::net::TcpListener::bind(args.address)
        .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
        .with_context(|| format!("cannot listen on {}", args.address))?;
    tracing::info!(
        address = %listener.local_addr()?,
        tls,
        "serving the function API (v1, v1beta1) for every hosted function"
    );
    let size = args.max_recv_message_size;
    let service = Arc::new(HostService(Arc::clone(&host)));
    let mut services = ServiceSet::new()
        .with_service(WithAuthority(raw::Server::<raw::V1, _>::new(
            Arc::clone(&service),
            size,
        )))
        .with_service(WithAuthority(raw::Server::<raw::V1beta1, _>::new(
            service, size,
        )));
    if tls {
        services =
            services.with_sni_tls(Arc::clone(&host) as Arc<dyn crate::grpc::sni::SniConfigs>);
    }
    // Without a functions file, the controller is the catalog: it watches
    // Crossplane's Functions and hosts each active revision.
    let controller = async {
        if args.functions.is_some() {
            return std::future::pending().await;
        }
        let client = kube::Client::try_default()
            .await
            .context("no Kubernetes API to watch (give --functions FILE outside a cluster)")?;
        let options = crate::host::controller::ControllerOptions {
            namespace: args.namespace.clone(),
            max_servers: args.max_servers.max(1),
            ..Default::default()
        };
        let hosting: Arc<dyn Hosting> = Arc::new(Arc::clone(&host));
        crate::host::controller::run(client, hosting, options)
            .await
            .map_err(|e| anyhow::anyhow!("{}", crate::chain::Chain(&e)))
            .context("the controller stopped")
    };
    let served = tokio::select! {
        served = daemon.serve(Incoming::Tcp(listener), services) => served,
        failed = controller => {
            host.shutdown().await;
            return failed.map(|()| ExitCode::FAILURE);
        }
    };
    // Drained (or cancelled) by now: no function server outlives xfn.
    host.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

/// What `xfn host` asks a running one.
#[derive(Debug, Clone, clap::Subcommand)]
pub(crate) enum HostCommand {
    /// List the hosted functions of a running `xfn host`: package and
    /// digest, kind, state (pulling, ready, failing and its error),
    /// servers, calls, last cold start (its `/status`).
    Ls(LsArgs),
}

/// `xfn host ls`.
#[derive(Debug, Clone, Args)]
pub(crate) struct LsArgs {
    /// The `--metrics-address` of the `xfn host` to ask.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(crate) address: String,
    /// Output format (`json`: its `/status` as it answered).
    #[arg(long, value_enum, default_value_t = super::ListFormat::Text)]
    pub(crate) format: super::ListFormat,
}

/// The most bytes of `/status` read: one entry per hosted function, each
/// well under 2 KiB (its error cut), for thousands of functions.
const MAX_STATUS_BYTES: usize = 8 << 20;

/// Runs `xfn host ls`.
pub(crate) async fn list(args: LsArgs) -> anyhow::Result<ExitCode> {
    let url = format!("http://{}/status", args.address);
    let mut response = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?
        .get(&url)
        .send()
        .await
        .with_context(|| format!("cannot reach xfn host at {url}"))?;
    if !response.status().is_success() {
        anyhow::bail!(
            "{url} answered {}: is it xfn host's --metrics-address?",
            response.status()
        );
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .with_context(|| format!("reading {url}"))?
    {
        anyhow::ensure!(
            body.len() + chunk.len() <= MAX_STATUS_BYTES,
            "{url} answered more than {MAX_STATUS_BYTES} bytes"
        );
        body.extend_from_slice(&chunk);
    }
    let status: serde_json::Value =
        serde_json::from_slice(&body).with_context(|| format!("{url} answered no JSON"))?;
    if args.format == super::ListFormat::Json {
        let mut stdout = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut stdout, &status)?;
        std::io::Write::write_all(&mut stdout, b"\n")?;
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", table(&status));
    Ok(ExitCode::SUCCESS)
}

/// `/status` as aligned columns, a failing function's error under it.
fn table(status: &serde_json::Value) -> String {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let mut rows = vec![[
        "NAME",
        "STATE",
        "KIND",
        "SERVERS",
        "CALLS",
        "ERRORS",
        "LAST-COLD-START",
        "PACKAGE",
        "DIGEST",
    ]
    .map(str::to_owned)];
    let mut errors = Vec::new();
    let functions = status["functions"].as_array().cloned().unwrap_or_default();
    for f in &functions {
        let cold = match &f["lastColdStart"] {
            serde_json::Value::Null => "-".to_owned(),
            cold => format!(
                "{:.2}s at {}",
                cold["seconds"].as_f64().unwrap_or(0.0),
                text(&cold["at"])
            ),
        };
        let servers = format!(
            "{} (+{} starting)",
            text(&f["serversRunning"]),
            text(&f["serversStarting"])
        );
        rows.push([
            text(&f["name"]),
            text(&f["state"]),
            text(&f["kind"]),
            servers,
            text(&f["calls"]),
            text(&f["callErrors"]),
            cold,
            text(&f["package"]),
            text(&f["digest"]),
        ]);
        errors.push(f["error"].as_str().map(str::to_owned));
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if let Some(Some(error)) = i.checked_sub(1).and_then(|f| errors.get(f)) {
            out.push_str(&format!("  error: {error}\n"));
        }
    }
    out
}
