//! The command line: one module per subcommand. `anyhow` lives here only.
use std::ffi::OsString;
use std::path::PathBuf;

use std::process::ExitCode;

use crate::adaptor::transport::Security;
use crate::runner::Namespace;
use clap::{Args, Parser, Subcommand};

pub(crate) mod adapt;
pub(crate) mod cache;
pub(crate) mod daemon_flags;
pub(crate) mod host;
pub(crate) mod logging;
mod map_flag;
pub(crate) mod pull;
pub(crate) mod render;
pub(crate) mod render_servers;
pub(crate) mod run;
pub(crate) mod start;
pub(crate) mod test;
pub(crate) mod validate;
mod value_enums;
pub(crate) mod wrap;

/// A rootless OCI container function runner for Crossplane Composition Functions.
#[derive(Debug, Parser)]
#[command(name = "xfn", version, about, arg_required_else_help = true)]
pub(crate) struct Cli {
    /// Registry for image references that name none.
    #[arg(
        short = 'r',
        long,
        env = "REGISTRY",
        default_value = "index.docker.io",
        global = true
    )]
    pub(crate) registry: String,
    /// Log at debug level.
    #[arg(short = 'd', long, global = true)]
    pub(crate) debug: bool,
    /// Log format.
    #[arg(long, value_enum, default_value = "text", global = true)]
    pub(crate) log_format: LogFormat,
    /// The subcommand. `xfn` alone prints this help: a daemon started by
    /// typing a bare command surprises a newcomer; the image's CMD is
    /// `start`, so the sidecar is unchanged.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human readable.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process; boxing buys nothing
pub(crate) enum Command {
    /// Serve the runner API for Crossplane (the runner image's command).
    Start(start::StartArgs),
    /// Run one function once.
    Run(run::RunArgs),
    /// Pull an image into the cache.
    Pull(pull::PullArgs),
    /// Inspect the image cache.
    #[command(subcommand)]
    Cache(cache::CacheCommand),
    /// Render a Composition's or an Operation's pipeline locally, like
    /// `crossplane composition render` / `crossplane operation render`.
    // A flag given twice is taken, the last value winning, as kong (the
    // CLI's parser) takes it; a list flag still gathers every value.
    #[command(args_override_self = true)]
    Render(render::RenderArgs),
    /// List and stop the function servers renders keep running.
    #[command(subcommand)]
    RenderServers(render_servers::RenderServersCommand),
    /// Serve a container image as a Crossplane Function (v1 FunctionRunnerService).
    Adapt(adapt::AdaptArgs),
    /// Build an adaptor image (a Function package) from a function image tarball.
    Wrap(wrap::WrapArgs),
    /// Validate resources against CRDs and XRDs, like `crossplane beta
    /// validate`: `xfn validate EXTENSIONS RESOURCES`.
    Validate(validate::ValidateArgs),
    /// Run Composition test suites (xprin's format) in one process.
    // A flag given twice is taken, as kong (xprin's parser) takes it.
    #[command(args_override_self = true)]
    Test(test::TestArgs),
    /// Serve many Functions on one port, each started on demand (Crossplane v2).
    Host(host::HostArgs),
}

/// How a listing (`cache ls`, `render-servers ls`) is printed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ListFormat {
    /// Aligned columns for a person.
    #[default]
    Text,
    /// One JSON array of objects, for scripts.
    Json,
}

/// Prints `rows` as one JSON array (`--format json`).
pub(crate) fn print_json(rows: &[serde_json::Value]) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, rows)?;
    std::io::Write::write_all(&mut stdout, b"\n")?;
    Ok(())
}

/// Flags every command that touches the image store shares.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub(crate) struct StoreArgs {
    /// Directory of the image cache (and per-run state). Default: `/xfn`
    /// where it exists (the sidecar's mount), else `/var/cache/xfn` for
    /// root and `$XDG_CACHE_HOME/xfn` or `~/.cache/xfn` for other users;
    /// the value below is this user's.
    #[arg(short = 'c', long, env = "XFN_CACHE_DIR", default_value_os_t = default_cache_dir())]
    pub(crate) cache_dir: PathBuf,
    /// Registries reached over plain HTTP (loopback registries always are).
    #[arg(long = "insecure-registry")]
    pub(crate) insecure_registries: Vec<String>,
    /// A PEM bundle of CAs trusted besides the system roots.
    #[arg(long, env = "CA_BUNDLE_PATH")]
    pub(crate) ca_bundle_path: Option<PathBuf>,
    /// Bounds on pulls.
    #[command(flatten)]
    pub(crate) bounds: PullBoundsArgs,
}

impl StoreArgs {
    /// The flags that parse back to these (a child xfn's command line).
    pub(crate) fn to_args(&self) -> Vec<OsString> {
        let Self {
            cache_dir,
            insecure_registries,
            ca_bundle_path,
            bounds,
        } = self;
        let mut args = flag("--cache-dir", cache_dir);
        for registry in insecure_registries {
            args.extend(flag("--insecure-registry", registry));
        }
        if let Some(ca) = ca_bundle_path {
            args.extend(flag("--ca-bundle-path", ca));
        }
        args.extend(bounds.to_args());
        args
    }
}

/// `name value`, as a child's command line takes them.
fn flag(name: &str, value: impl Into<OsString>) -> Vec<OsString> {
    vec![name.into(), value.into()]
}

/// The name a flag of type `T` is given `value` by.
fn value_name<T: clap::ValueEnum>(value: &T) -> Option<String> {
    value.to_possible_value().map(|v| v.get_name().to_owned())
}

/// A duration as [`run::parse_duration`] reads it back, to the nanosecond.
fn duration_arg(duration: std::time::Duration) -> String {
    format!("{}ns", duration.as_nanos())
}

/// Bounds on what one pull may take from a registry: hostile or broken
/// images are refused while they stream, with an error naming the bound.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub(crate) struct PullBoundsArgs {
    /// Most bytes one image may unpack to (a quantity: 4Gi, 500Mi, 1G).
    #[arg(long, default_value = "4Gi", value_parser = parse_size)]
    pub(crate) max_image_size: u64,
    /// Most entries (files, dirs, links) one layer may hold.
    #[arg(long, default_value_t = crate::image::extract::bounds::DEFAULT_MAX_LAYER_ENTRIES)]
    pub(crate) max_layer_entries: u64,
    /// Give up on a pull (resolving and downloading) after this long.
    #[arg(long, default_value = "10m", value_parser = run::parse_duration)]
    pub(crate) pull_timeout: std::time::Duration,
}

impl PullBoundsArgs {
    /// The flags that parse back to these.
    pub(crate) fn to_args(&self) -> Vec<OsString> {
        let Self {
            max_image_size,
            max_layer_entries,
            pull_timeout,
        } = self;
        [
            flag("--max-image-size", max_image_size.to_string()),
            flag("--max-layer-entries", max_layer_entries.to_string()),
            flag("--pull-timeout", duration_arg(*pull_timeout)),
        ]
        .concat()
    }
}

/// A byte size given as a Kubernetes quantity (`2Gi`, `500M`, `1e9`).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    crate::quantity::Quantity::parse(text)
        .and_then(|q| q.bytes())
        .map_err(|e| e.to_string())
}

/// A byte count given as a quantity (`4Mi`, `100M`, or plain bytes), for
/// the caps held in memory as `usize`: every size flag takes the same form.
pub(crate) fn parse_byte_count(text: &str) -> Result<usize, String> {
    let bytes = parse_size(text)?;
    usize::try_from(bytes).map_err(|_| format!("{text:?}: too large for this machine"))
}

/// `/xfn` where it exists (Crossplane's sidecar mounts its cache there);
/// for root `/var/cache/xfn`, because root maps a 65536-id range whose root
/// cannot search `/root` (mode 0700); else the user's cache dir, so `xfn run`
/// works on a laptop without set-up.
pub(crate) fn default_cache_dir() -> PathBuf {
    let sidecar = PathBuf::from("/xfn");
    if sidecar.is_dir() {
        return sidecar;
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/cache/xfn");
    }
    if let Some(xdg) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(xdg).join("xfn");
    }
    if let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home).join(".cache").join("xfn");
    }
    std::env::temp_dir().join("xfn")
}

/// Flags of the run engine, shared by every command that runs functions.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub(crate) struct RunnerArgs {
    /// How per-run root filesystems are made.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) rootfs: crate::runner::RootfsMode,
    /// The OCI runtime binary.
    #[arg(long, default_value = "crun")]
    pub(crate) runtime: PathBuf,
    /// Fail runs (over gRPC: FailedPrecondition) instead of running them
    /// without enforced cpu/memory/pids limits.
    #[arg(long)]
    pub(crate) require_limits: bool,
    /// Kill a function that writes more than this to stdout or stderr, a
    /// quantity like 100Mi (over gRPC: ResourceExhausted).
    #[arg(long, default_value = "100Mi", value_parser = parse_byte_count)]
    pub(crate) max_output_bytes: usize,
    /// Most processes and threads a function may have at once (a stop for
    /// fork bombs): pids.max where cgroup limits are enforced,
    /// RLIMIT_NPROC where they are not.
    #[arg(long, default_value_t = crate::runner::DEFAULT_PIDS_LIMIT, value_parser = clap::value_parser!(i64).range(1..))]
    pub(crate) pids_limit: i64,
    /// Size of each function's /tmp (a tmpfs), a quantity like 128Mi:
    /// beyond it, writes fail with ENOSPC.
    #[arg(long, default_value = "128Mi", value_parser = parse_nonzero_size)]
    pub(crate) tmp_size: u64,
    /// The most a function may write to its root filesystem, a quantity like
    /// 256Mi: beyond it, writes fail with ENOSPC.
    #[arg(long, default_value = "256Mi", value_parser = parse_nonzero_size)]
    pub(crate) rootfs_size: u64,
}

impl RunnerArgs {
    /// The flags that parse back to these.
    pub(crate) fn to_args(&self) -> Vec<OsString> {
        let Self {
            rootfs,
            runtime,
            require_limits,
            max_output_bytes,
            pids_limit,
            tmp_size,
            rootfs_size,
        } = self;
        let mut args = [
            flag("--runtime", runtime),
            flag("--max-output-bytes", max_output_bytes.to_string()),
            flag("--pids-limit", pids_limit.to_string()),
            flag("--tmp-size", tmp_size.to_string()),
            flag("--rootfs-size", rootfs_size.to_string()),
        ]
        .concat();
        if let Some(mode) = value_name(rootfs) {
            args.extend(flag("--rootfs", mode));
        }
        if *require_limits {
            args.push("--require-limits".into());
        }
        args
    }
}

/// [`parse_size`] for the sizes of a function's tmpfs mounts: never zero
/// (a tmpfs of `size=0` is unbounded).
pub(crate) fn parse_nonzero_size(text: &str) -> Result<u64, String> {
    match parse_size(text)? {
        0 => Err(format!("{text:?}: a size must be more than zero")),
        bytes => Ok(bytes),
    }
}

impl RunnerArgs {
    /// The runner's options these flags give.
    pub(crate) fn options(&self) -> crate::runner::RunnerOptions {
        crate::runner::RunnerOptions {
            runtime: self.runtime.clone(),
            max_output_bytes: self.max_output_bytes,
            require_limits: self.require_limits,
            rootfs: self.rootfs,
            pids_limit: self.pids_limit,
            tmp_size_bytes: self.tmp_size,
            rootfs_size_bytes: self.rootfs_size,
            warm_pool: None,
            // On the disk unless the command's containers end with it.
            state_in_memory: false,
        }
    }
}

/// Flags of the warm containers a daemon keeps ahead of its calls (`xfn
/// start`, `xfn adapt`): one definition, one set of defaults.
#[derive(Debug, Clone, Args)]
pub(crate) struct WarmPoolArgs {
    /// Most warm containers kept ready ahead of calls, over all images and
    /// settings (default: 2 per CPU); 0 turns them off. Each is made for an
    /// image and settings in recent demand and serves one call.
    #[arg(long)]
    pub(crate) warm_pool: Option<usize>,
    /// Warm containers of an image not called for this long are removed.
    #[arg(long, default_value = "2m", value_parser = run::parse_duration)]
    pub(crate) warm_pool_idle: std::time::Duration,
    /// How far warm containers are taken before their call: `started` (the
    /// function runs, blocked reading its stdin, so a call pays only for
    /// its work on the input) or `created` (it starts when its call
    /// arrives: for functions that must not start before their input).
    #[arg(long, value_enum, default_value_t = crate::runner::WarmStart::Started)]
    pub(crate) warm_pool_start: crate::runner::WarmStart,
}

impl WarmPoolArgs {
    /// The pool these flags give.
    pub(crate) fn options(&self) -> crate::runner::PoolOptions {
        self.options_for_at_least(0)
    }

    /// The pool these flags give, whose default size holds at least
    /// `containers` (a render's per-call containers, all made ahead).
    pub(crate) fn options_for_at_least(&self, containers: usize) -> crate::runner::PoolOptions {
        crate::runner::PoolOptions {
            size: self
                .warm_pool
                .unwrap_or_else(|| crate::runner::default_pool_size().max(containers)),
            idle: self.warm_pool_idle,
            start: self.warm_pool_start,
        }
    }
}

/// Flags of the user namespace xfn enters before anything else.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub(crate) struct UsernsArgs {
    /// The first of the 65536 uids xfn maps when it may map a range
    /// (CAP_SETUID): xfn is that uid, functions the rest. Default: 100000
    /// where those are mapped (a host), else 0 where xfn is 0 and 0..65535
    /// are mapped (the root of a pod with `hostUsers: false`); a start whose
    /// uids are not all mapped is refused.
    #[arg(long)]
    pub(crate) map_root_uid: Option<u32>,
    /// The first of the 65536 gids, alike (CAP_SETGID).
    #[arg(long)]
    pub(crate) map_root_gid: Option<u32>,
    /// Without CAP_SETUID: `auto` runs functions under the subordinate ids
    /// of xfn's user (/etc/subuid and /etc/subgid, 65536 or more, mapped
    /// with newuidmap/newgidmap), not under xfn's own uid, where the
    /// deployment gives them; `off` keeps them on xfn's uid.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) subids: SubIds,
}

impl UsernsArgs {
    /// The flags that parse back to these. Unset ids stay unset: the child
    /// chooses as the parent would (`userns::choose_start`).
    pub(crate) fn to_args(&self) -> Vec<OsString> {
        let Self {
            map_root_uid,
            map_root_gid,
            subids,
        } = self;
        let mut args = Vec::new();
        if let Some(uid) = map_root_uid {
            args.extend(flag("--map-root-uid", uid.to_string()));
        }
        if let Some(gid) = map_root_gid {
            args.extend(flag("--map-root-gid", gid.to_string()));
        }
        if let Some(subids) = value_name(subids) {
            args.extend(flag("--subids", subids));
        }
        args
    }
}

/// `--subids`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SubIds {
    /// Use them where the deployment gives them.
    Auto,
    /// Never.
    Off,
}

impl Default for UsernsArgs {
    fn default() -> Self {
        Self {
            map_root_uid: None,
            map_root_gid: None,
            subids: SubIds::Auto,
        }
    }
}

/// Flags that hold for every subcommand, after parsing.
#[derive(Debug, Clone)]
#[allow(dead_code)] // `registry` is read by the image commands as they land.
pub(crate) struct Global {
    /// Registry for references that name none.
    pub(crate) registry: String,
    /// Debug logging.
    pub(crate) debug: bool,
    /// Log format.
    pub(crate) log_format: LogFormat,
}

/// Sets up tracing to stderr: `info` (and why xfn's HTTP/2 server reset a
/// caller's stream or connection) by default, `debug` with `-d` (xfn's own;
/// HTTP/2 and connection pools of the crates it uses only at
/// `RUST_LOG=…,h2=debug`: they drowned a call's ~10 lines in ~90), or
/// whatever `RUST_LOG` says. Text lines escape what their fields carry (see
/// [`logging`]); JSON escapes by itself.
pub(crate) fn init_logging(global: &Global) {
    use tracing_subscriber::EnvFilter;
    // The server says at debug level only why it reset a caller's stream or
    // connection (a malformed header, a bad preface): the caller sees
    // INTERNAL or a reset and nothing else, so its reasons always show.
    let default = if global.debug {
        "debug,h2=info,hyper=info,hyper_util=info,tower=info"
    } else {
        "info,xfn::grpc::http2=debug"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only for a person at a terminal: escapes in a CI log or a
    // file make it harder to read and to grep.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match global.log_format {
        LogFormat::Text => builder.fmt_fields(logging::EscapedFields).init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// A command with what had to be set up for it while the process was still
/// single-threaded, handed over as values: the namespace token its runner
/// needs, a bound listener, TLS material read with xfn's own uid.
#[allow(clippy::large_enum_variant)] // one per process, as `Command`
pub(crate) enum Prepared {
    /// `xfn start`: its listener (gatekeeper forked), namespace, and
    /// whether its containers end with it (its PID namespace).
    Start(start::StartArgs, start::Bound, Namespace, bool),
    /// `xfn run`: its input, read and checked, and namespace.
    Run(run::RunArgs, Vec<u8>, Namespace),
    /// `xfn pull`: in the namespace (layers are extracted under its mapping).
    Pull(pull::PullArgs),
    /// `xfn cache …`.
    Cache(cache::CacheCommand),
    /// `xfn render`: in a namespace when a Function runs a container here.
    Render(render::RenderArgs, Option<Namespace>),
    /// `xfn render-servers …`: `keep` in a namespace.
    RenderServers(render_servers::RenderServersCommand, Option<Namespace>),
    /// `xfn adapt`: its transport security, namespace, and whether its
    /// containers end with it.
    Adapt(adapt::AdaptArgs, Security, Namespace, bool),
    /// `xfn wrap`.
    Wrap(wrap::WrapArgs),
    /// `xfn validate`.
    Validate(validate::ValidateArgs),
    /// `xfn test`: its suites, read; in a namespace when a Function runs a
    /// container here.
    Test(test::TestArgs, test::Loaded, Option<Namespace>),
    /// `xfn host`: its catalog and CA, namespace, and whether its
    /// containers end with it.
    Host(host::HostArgs, host::Prepared, Namespace, bool),
    /// `xfn host ls`.
    HostLs(host::LsArgs),
    /// A command that ended while preparing, with this exit code (`xfn
    /// run`'s refused input, said on stderr).
    Exit(std::process::ExitCode),
}

/// Whatever must happen while the process is still single-threaded: entering
/// the user and mount namespace for the commands that run or unpack images,
/// and what must be done outside it first.
pub(crate) fn prepare_process(command: Command, global: &Global) -> anyhow::Result<Prepared> {
    Ok(match command {
        Command::Run(args) => run::prepare(args)?,
        Command::Render(args) => {
            // Keepers of kept servers start from outside any namespace.
            render::start_kept(&args, global)?;
            let namespace = if args.needs_containers() {
                Some(enter_namespace(&args.store_args(), &args.userns)?)
            } else {
                None
            };
            Prepared::Render(args, namespace)
        }
        Command::RenderServers(command) => {
            let namespace = match &command {
                render_servers::RenderServersCommand::Keep(args) => {
                    Some(enter_namespace(&args.store, &args.userns)?)
                }
                _ => None,
            };
            Prepared::RenderServers(command, namespace)
        }
        Command::Start(args) => {
            // Bind and fork the caller-checking gatekeeper first: it must
            // stay outside the namespace.
            let incoming = start::prepare(&args)?;
            let namespace = enter_namespace(&args.store, &args.userns)?;
            let containers_end_with_xfn = enter_pid_namespace()?;
            Prepared::Start(args, incoming, namespace, containers_end_with_xfn)
        }
        // Layers must be extracted inside the same mapping runs use, or the
        // cache would hold files owned by ids unmapped in the namespace.
        // (`pull` has no --map-root-* flags yet: the defaults apply.)
        Command::Pull(args) => {
            enter_namespace(&args.store, &UsernsArgs::default())?;
            Prepared::Pull(args)
        }
        // Removing layers takes the namespace's root: their files belong to
        // the image's (mapped) owners and their dirs may be read-only.
        Command::Cache(command @ (cache::CacheCommand::Rm(_) | cache::CacheCommand::Gc(_))) => {
            enter_namespace(command.store(), &UsernsArgs::default())?;
            Prepared::Cache(command)
        }
        Command::Adapt(args) => {
            // The TLS key may be readable only by the real uid, not by
            // xfn's mapped root: read it first.
            let security = adapt::prepare(&args)?;
            let namespace = enter_namespace(&args.store, &args.userns)?;
            let containers_end_with_xfn = enter_pid_namespace()?;
            Prepared::Adapt(args, security, namespace, containers_end_with_xfn)
        }
        Command::Cache(command) => Prepared::Cache(command),
        Command::Wrap(args) => Prepared::Wrap(args),
        Command::Validate(args) => Prepared::Validate(args),
        Command::Test(args) => test::prepare(args)?,
        Command::Host(host::HostArgs {
            command: Some(host::HostCommand::Ls(args)),
            ..
        }) => Prepared::HostLs(args),
        Command::Host(args) => {
            // The CA key may be readable only by the real uid: read it first.
            let prepared = host::prepare(&args)?;
            let namespace = enter_namespace(&args.store, &args.userns)?;
            let containers_end_with_xfn = enter_pid_namespace()?;
            Prepared::Host(args, prepared, namespace, containers_end_with_xfn)
        }
    })
}

impl Prepared {
    /// Runs the command (on the async runtime, started after preparing).
    pub(crate) async fn execute(self, global: &Global) -> anyhow::Result<std::process::ExitCode> {
        match self {
            Prepared::Start(args, incoming, namespace, in_memory) => {
                start::execute(args, incoming, &namespace, in_memory, global).await
            }
            Prepared::Run(args, input, namespace) => {
                run::execute(args, input, &namespace, global).await
            }
            Prepared::Pull(args) => pull::execute(args, global).await,
            Prepared::Cache(command) => cache::execute(command, global).await,
            Prepared::Render(args, namespace) => {
                render::execute(args, namespace.as_ref(), global).await
            }
            Prepared::RenderServers(command, namespace) => {
                render_servers::execute(command, namespace.as_ref(), global).await
            }
            Prepared::Adapt(args, security, namespace, in_memory) => {
                adapt::execute(args, security, &namespace, in_memory, global).await
            }
            Prepared::Wrap(args) => wrap::execute(args, global).await,
            Prepared::Validate(args) => validate::execute(args),
            Prepared::Test(args, loaded, namespace) => {
                test::execute(args, loaded, namespace.as_ref(), global).await
            }
            Prepared::Host(args, prepared, namespace, in_memory) => {
                host::execute(args, prepared, &namespace, in_memory, global).await
            }
            Prepared::HostLs(args) => host::list(args).await,
            Prepared::Exit(code) => Ok(code),
        }
    }
}

/// Enters xfn's user and mount namespace (see `crate::runner::enter_namespace`
/// for why in-process and how ids are mapped). Once per process,
/// single-threaded.
pub(crate) fn enter_namespace(store: &StoreArgs, userns: &UsernsArgs) -> anyhow::Result<Namespace> {
    use anyhow::Context;
    crate::runner::enter_namespace(&userns_options(store, userns))
        .context("cannot enter xfn's user namespace")
}

/// The namespace options of the flags.
fn userns_options(store: &StoreArgs, userns: &UsernsArgs) -> crate::runner::UsernsOptions {
    crate::runner::UsernsOptions {
        map_root_uid: userns.map_root_uid,
        map_root_gid: userns.map_root_gid,
        cache_dir: store.cache_dir.clone(),
        subordinate_ids: userns.subids == SubIds::Auto,
    }
}

/// Puts the servers (`start`, `adapt`) under PID 1 of a PID namespace of
/// their own, so that a SIGKILLed xfn takes every container with it (see
/// `crate::pidns`). In the namespace already entered; single-threaded. Where
/// the kernel refuses the namespace, xfn serves anyway and says what that
/// costs. Returns whether the containers end with xfn: then the runner
/// keeps its run state in memory (`RunnerOptions::state_in_memory`).
fn enter_pid_namespace() -> anyhow::Result<bool> {
    use anyhow::Context;
    match crate::pidns::enter() {
        Ok(entered) => {
            tracing::debug!(?entered, "containers end with xfn");
            Ok(true)
        }
        Err(err @ crate::pidns::PidnsError::Unavailable(_)) => {
            tracing::warn!(error = %crate::chain::Chain(&err), "containers of a killed xfn outlive it until the next xfn on this cache sweeps them");
            Ok(false)
        }
        Err(err) => Err(err).context("cannot tie the containers' lifetime to xfn's"),
    }
}

/// The `xfn` binary's `main`: as PID 1, fork an init (`crate::pid1`);
/// parse flags, enter the user namespace while still single-threaded, then
/// start the async runtime and dispatch.
pub(crate) fn main() -> ExitCode {
    // As PID 1 (a container's main process) xfn leaves PID 1 to a tiny init
    // that reaps orphans and forwards signals: see `crate::pid1`. First, while
    // the process has one thread.
    crate::pid1::init_if_pid1();
    let cli = render::parse_cli(std::env::args_os());
    let command = cli.command;
    let global = Global {
        registry: cli.registry,
        debug: cli.debug,
        log_format: cli.log_format,
    };
    init_logging(&global);

    // Namespaces must be entered before the tokio runtime starts threads:
    // unshare(CLONE_NEWUSER) fails in a multi-threaded process.
    let prepared = match prepare_process(command, &global) {
        Ok(prepared) => prepared,
        Err(err) => {
            eprintln!("xfn: {}", crate::chain::one_line(err.as_ref()));
            return ExitCode::FAILURE;
        }
    };

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("xfn: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(prepared.execute(&global));
    // What calls left on the serving threads goes before the runtime.
    crate::grpc::threads::stop();
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("xfn: {}", crate::chain::one_line(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        runner: RunnerArgs,
    }

    #[test]
    fn size_flags_default_to_the_library_defaults() {
        let flags = Flags::parse_from(["xfn"]);
        assert_eq!(flags.runner.tmp_size, crate::sandbox::spec::TMP_SIZE);
        assert_eq!(flags.runner.rootfs_size, crate::rootfs::DEFAULT_ROOTFS_SIZE);
        assert_eq!(
            flags.runner.max_output_bytes,
            crate::runner::DEFAULT_MAX_OUTPUT_BYTES
        );
    }

    #[test]
    fn byte_caps_take_quantities_and_plain_byte_counts() {
        assert_eq!(parse_byte_count("4Mi"), Ok(4 << 20));
        assert_eq!(parse_byte_count("4194304"), Ok(4 << 20));
        assert_eq!(parse_byte_count("1k"), Ok(1000));
        assert!(parse_byte_count("4 MB").is_err());
    }

    #[test]
    fn sizes_are_quantities_and_never_zero() {
        assert_eq!(parse_nonzero_size("64Mi"), Ok(64 << 20));
        assert_eq!(parse_nonzero_size("1G"), Ok(1_000_000_000));
        assert!(parse_nonzero_size("0")
            .unwrap_err()
            .contains("more than zero"));
        assert!(parse_nonzero_size("lots").is_err());
    }
}
