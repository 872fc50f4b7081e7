//! `xfn render XR COMPOSITION [FUNCTIONS]` and `xfn render OPERATION
//! FUNCTIONS`: run a Composition's or an Operation's pipeline locally, like
//! `crossplane composition render` and `crossplane operation render` but
//! with no Docker engine. The work is done by `xfn::compose::plan`; this
//! module only maps flags onto it.
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

use xfn::compose::output::OutputOptions;
use xfn::compose::plan::{RenderInputs, RenderPlan};
use xfn::compose::runtimes::kept::KeeperCommand;
use xfn::compose::runtimes::ContainerDefaults;
use xfn::compose::ComposeError;
use xfn::image::PullPolicy;
use xfn::runner::{Namespace, Runner};

use super::run::parse_duration;
use super::UsernsArgs;

/// Flags of `xfn render`, as `crossplane composition render`'s and
/// `crossplane operation render`'s.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The composite resource (XR), a YAML file; or an Operation,
    /// CronOperation or WatchOperation (then the next argument is FUNCTIONS).
    #[arg(value_name = "XR|OPERATION")]
    pub composite_resource: PathBuf,
    /// The Composition or CompositionRevision, a YAML file (for an XR); the
    /// Functions (for an Operation).
    #[arg(value_name = "COMPOSITION|FUNCTIONS")]
    pub composition: PathBuf,
    /// The Functions (`pkg.crossplane.io` Function objects), a YAML file or a
    /// directory of them; not needed for alpha (`spec.functions`) Compositions.
    pub functions: Option<PathBuf>,
    /// Observed composed resources, a YAML stream or a directory.
    #[arg(short = 'o', long)]
    pub observed_resources: Option<PathBuf>,
    /// Resources functions may require, a YAML stream or a directory; repeatable.
    #[arg(short = 'e', long)]
    pub required_resources: Vec<PathBuf>,
    /// Deprecated name of --required-resources.
    #[arg(long)]
    pub extra_resources: Vec<PathBuf>,
    /// A directory of OpenAPI v3 documents (`kubectl get --raw
    /// /openapi/v3/<group-version>`) that schema requirements are answered from.
    #[arg(short = 's', long, value_name = "DIR")]
    pub required_schemas: Option<PathBuf>,
    /// The XR's CompositeResourceDefinition: its schema defaults are applied
    /// to the XR, and it says whether the XR is Legacy or Modern.
    #[arg(long)]
    pub xrd: Option<PathBuf>,
    /// `KEY=VALUE` set on every Function's annotations (over their own); repeatable.
    #[arg(short = 'a', long, value_name = "KEY=VALUE")]
    pub function_annotations: Vec<String>,
    /// The resource a WatchOperation watches, a YAML file.
    #[arg(short = 'w', long)]
    pub watched_resource: Option<PathBuf>,
    /// Print the whole Operation, not only its identity and status.
    #[arg(long)]
    pub include_full_operation: bool,
    /// Context for the first step: `key=file` (JSON or YAML), repeatable or comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub context_files: Vec<String>,
    /// Context for the first step: `key=json`, repeatable.
    #[arg(long)]
    pub context_values: Vec<String>,
    /// Print the results functions returned (also `-r` after `render`).
    #[arg(long = "include-function-results")]
    pub include_function_results: bool,
    /// Print the whole XR, not only its status.
    #[arg(short = 'x', long)]
    pub include_full_xr: bool,
    /// Print the context after the last step.
    #[arg(short = 'c', long)]
    pub include_context: bool,
    /// Secrets steps take credentials from, a YAML stream or a directory.
    #[arg(long)]
    pub function_credentials: Option<PathBuf>,
    /// Give up on the whole render after this long.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Directory of the image cache (and per-run state).
    #[arg(long, env = "XFN_CACHE_DIR", default_value_os_t = super::default_cache_dir())]
    pub cache_dir: PathBuf,
    /// Registries reached over plain HTTP (loopback registries always are).
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// A PEM bundle of CAs trusted besides the system roots.
    #[arg(long, env = "CA_BUNDLE_PATH")]
    pub ca_bundle_path: Option<PathBuf>,
    /// Bounds on pulls.
    #[command(flatten)]
    pub bounds: super::PullBoundsArgs,
    /// User namespace flags.
    #[command(flatten)]
    pub userns: UsernsArgs,
    /// Run engine flags.
    #[command(flatten)]
    pub runner: super::RunnerArgs,
    /// Warm containers (as `xfn start`): each Exec Function's and alpha
    /// step's container is made, and started, before the first step runs
    /// (by default the pool holds 2 per CPU, or all of them where a render
    /// has more).
    #[command(flatten)]
    pub warm_pool: super::WarmPoolArgs,
    /// When to pull the images of Docker and Exec Functions that set no pull
    /// policy (alpha steps use their own `imagePullPolicy`).
    #[arg(long, value_enum, default_value = "IfNotPresent")]
    pub image_pull_policy: PullPolicy,
    /// The plan, read once while the process is single-threaded.
    #[arg(skip)]
    pub plan: OnceLock<Result<RenderPlan, ComposeError>>,
}

impl RenderArgs {
    /// The store flags in the shape the namespace entry takes.
    pub fn store_args(&self) -> super::StoreArgs {
        super::StoreArgs {
            cache_dir: self.cache_dir.clone(),
            insecure_registries: self.insecure_registries.clone(),
            ca_bundle_path: self.ca_bundle_path.clone(),
            bounds: self.bounds.clone(),
        }
    }

    /// The inputs the flags name.
    fn inputs(&self) -> RenderInputs {
        RenderInputs {
            subject: self.composite_resource.clone(),
            second: Some(self.composition.clone()),
            third: self.functions.clone(),
            observed_resources: self.observed_resources.clone(),
            required_resources: self
                .required_resources
                .iter()
                .chain(&self.extra_resources)
                .cloned()
                .collect(),
            required_schemas: self.required_schemas.clone(),
            xrd: self.xrd.clone(),
            watched_resource: self.watched_resource.clone(),
            function_credentials: self.function_credentials.clone(),
            function_annotations: self.function_annotations.clone(),
            context_files: self.context_files.clone(),
            context_values: self.context_values.clone(),
            output: OutputOptions {
                include_full: self.include_full_xr || self.include_full_operation,
                include_results: self.include_function_results,
                include_context: self.include_context,
            },
        }
    }

    /// The plan (read on first use, before the namespace and the runtime).
    pub fn plan(&self) -> &Result<RenderPlan, ComposeError> {
        self.plan.get_or_init(|| RenderPlan::read(&self.inputs()))
    }

    /// Whether this render runs containers, and so needs xfn's user
    /// namespace (see [`RenderPlan::needs_containers`]). Unreadable inputs
    /// answer false; the render then reports them, naming the file.
    pub fn needs_containers(&self) -> bool {
        self.plan().as_ref().is_ok_and(RenderPlan::needs_containers)
    }
}

/// Starts (or finds) the kept servers the render's Functions ask for,
/// before the process enters any namespace. Unreadable inputs are left to
/// the render to report.
pub fn start_kept(args: &RenderArgs, global: &super::Global) -> anyhow::Result<()> {
    let Ok(plan) = args.plan() else {
        return Ok(());
    };
    plan.start_kept(&keeper_command(args, global)?, args.image_pull_policy)?;
    Ok(())
}

/// How this render starts keepers: this binary with the flags they share.
fn keeper_command(args: &RenderArgs, global: &super::Global) -> anyhow::Result<KeeperCommand> {
    let mut flags: Vec<OsString> = vec![
        "render-servers".into(),
        "keep".into(),
        "--cache-dir".into(),
        args.cache_dir.clone().into(),
        "--registry".into(),
        global.registry.clone().into(),
        "--timeout".into(),
        format!("{}ms", args.timeout.as_millis()).into(),
        "--map-root-uid".into(),
        args.userns.map_root_uid.to_string().into(),
        "--map-root-gid".into(),
        args.userns.map_root_gid.to_string().into(),
        "--runtime".into(),
        args.runner.runtime.clone().into(),
        "--pids-limit".into(),
        args.runner.pids_limit.to_string().into(),
        "--max-output-bytes".into(),
        args.runner.max_output_bytes.to_string().into(),
    ];
    if let Some(mode) = args.runner.rootfs.to_possible_value() {
        flags.extend(["--rootfs".into(), mode.get_name().into()]);
    }
    if args.runner.require_limits {
        flags.push("--require-limits".into());
    }
    for registry in &args.insecure_registries {
        flags.extend(["--insecure-registry".into(), registry.into()]);
    }
    if let Some(ca) = &args.ca_bundle_path {
        flags.extend(["--ca-bundle-path".into(), ca.clone().into()]);
    }
    if global.debug {
        flags.push("--debug".into());
    }
    Ok(KeeperCommand {
        program: std::env::current_exe()?,
        args: flags,
        cache_dir: args.cache_dir.clone(),
    })
}

/// Exit code of a render cut short by a Fatal result (its partial output
/// is printed), as Crossplane's render engine.
pub const EXIT_FATAL: u8 = 3;

/// `-r` means `--include-function-results` after `render`, as in
/// `crossplane render`, but it is xfn's global `--registry` everywhere else;
/// clap cannot have both, so it is rewritten before parsing.
pub fn rewrite_short_flags(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut seen_render = false;
    args.into_iter()
        .map(|arg| {
            if seen_render && arg == "-r" {
                return OsString::from("--include-function-results");
            }
            if arg == "render" {
                seen_render = true;
            }
            arg
        })
        .collect()
}

/// Runs `xfn render`: 0 when it rendered, 3 (with the partial output)
/// when a Fatal result cut it short, 1 on any other failure.
pub async fn execute(
    mut args: RenderArgs,
    namespace: Option<&Namespace>,
    global: &super::Global,
) -> anyhow::Result<ExitCode> {
    args.plan();
    let plan = match std::mem::take(&mut args.plan).into_inner() {
        Some(plan) => plan?,
        None => unreachable!("initialised above"),
    };
    let timeout = args.timeout;
    let runner = if plan.needs_containers() {
        let namespace = namespace.context("xfn did not enter its user namespace")?;
        let store = args.store_args().open_store(&global.registry)?;
        let options = xfn::runner::RunnerOptions {
            warm_pool: Some(
                args.warm_pool
                    .options_for_at_least(plan.per_call_containers()),
            ),
            ..args.runner.options()
        };
        Some(Arc::new(Runner::new(namespace, store, options)?))
    } else {
        None
    };
    let defaults = ContainerDefaults {
        default_registry: global.registry.clone(),
        timeout,
        pull_policy: args.image_pull_policy,
        keeper: Some(keeper_command(&args, global)?),
    };
    let pooled = runner.clone();
    let rendered = tokio::time::timeout(timeout, plan.run(runner, defaults)).await;
    // Warm containers the render made and did not use (a step's refill)
    // go before xfn exits, whatever the render's outcome.
    if let Some(runner) = pooled {
        runner.shutdown().await;
    }
    let rendered = rendered.map_err(|_| {
        anyhow::anyhow!("the render did not finish within {timeout:?} (--timeout)")
    })??;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(rendered.stream.as_bytes())?;
    stdout.flush()?;
    Ok(match rendered.fatal {
        Some(fatal) => {
            eprintln!("xfn: {fatal}");
            ExitCode::from(EXIT_FATAL)
        }
        None => ExitCode::SUCCESS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_r_after_render_means_include_results() {
        let args: Vec<OsString> = ["xfn", "-r", "reg", "render", "-r", "a"]
            .into_iter()
            .map(OsString::from)
            .collect();
        let rewritten = rewrite_short_flags(args);
        assert_eq!(rewritten[1], "-r");
        assert_eq!(rewritten[4], "--include-function-results");
    }
}
