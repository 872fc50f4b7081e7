//! `xfn render XR COMPOSITION [FUNCTIONS]` and `xfn render OPERATION
//! FUNCTIONS`: run a Composition's or an Operation's pipeline locally, like
//! `crossplane composition render` and `crossplane operation render` but
//! with no Docker daemon. The work is done by the composition core's plan
//! (`crate::compose::RenderPlan`); this module only maps flags onto it.
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::compose::{
    ComposeError, ContainerDefaults, KeeperCommand, OutputOptions, RenderInputs, RenderPlan,
};
use crate::image::PullPolicy;
use crate::runner::{Namespace, Runner};

use super::map_flag::{annotation_overrides, map_entries};
use super::run::parse_duration;
use super::UsernsArgs;

/// What `xfn render` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    /// A YAML stream, as `crossplane render`.
    Yaml,
    /// One JSON object a line per XR (or Operation).
    Json,
}

/// Flags of `xfn render`, as `crossplane composition render`'s and
/// `crossplane operation render`'s.
#[derive(Debug, Args)]
pub(crate) struct RenderArgs {
    /// The composite resource (XR), a YAML file (several XRs as documents
    /// of one file render each in turn); or an Operation, CronOperation or
    /// WatchOperation (then the next argument is FUNCTIONS).
    #[arg(value_name = "XR|OPERATION")]
    pub(crate) composite_resource: PathBuf,
    /// More XRs, a YAML file (or stream) each; repeatable: rendered after
    /// XR's, with the same Composition and Functions, the function servers
    /// started once for all (xfn only).
    #[arg(long = "xr", value_name = "FILE")]
    pub(crate) more_xrs: Vec<PathBuf>,
    /// A Composition (mode Pipeline) of XRs that are composed resources;
    /// repeatable: a composed resource of the type one composes is
    /// rendered through it, recursively, after the XR that composed it
    /// (with the same Functions; xfn only).
    #[arg(long, value_name = "FILE")]
    pub(crate) nested_composition: Vec<PathBuf>,
    /// `yaml`: the YAML stream `crossplane render` prints (several XRs'
    /// outputs one after the other); `json`: one JSON object a line per XR
    /// (`xr`, `resources`, `results`, `context`, …; xfn only). Long form
    /// only: `-o` is --observed-resources, as upstream.
    #[arg(long, value_enum, default_value = "yaml")]
    pub(crate) output: OutputFormat,
    /// The Composition or CompositionRevision, a YAML file (for an XR); the
    /// Functions (for an Operation).
    #[arg(value_name = "COMPOSITION|FUNCTIONS")]
    pub(crate) composition: PathBuf,
    /// The Functions (`pkg.crossplane.io` Function objects), a YAML file or a
    /// directory of them; not needed for alpha (`spec.functions`) Compositions.
    pub(crate) functions: Option<PathBuf>,
    /// Observed composed resources, a YAML stream or a directory.
    #[arg(short = 'o', long)]
    pub(crate) observed_resources: Option<PathBuf>,
    /// Resources functions may require, a YAML stream or a directory; repeatable.
    #[arg(short = 'e', long)]
    pub(crate) required_resources: Vec<PathBuf>,
    /// Deprecated name of --required-resources.
    #[arg(long)]
    pub(crate) extra_resources: Vec<PathBuf>,
    /// A directory of OpenAPI v3 documents (`kubectl get --raw
    /// /openapi/v3/<group-version>`) that schema requirements are answered from.
    #[arg(short = 's', long, value_name = "DIR")]
    pub(crate) required_schemas: Option<PathBuf>,
    /// The XR's CompositeResourceDefinition: its schema defaults are applied
    /// to the XR, and it says whether the XR is Legacy or Modern.
    #[arg(long)]
    pub(crate) xrd: Option<PathBuf>,
    /// `KEY=VALUE` set on every Function's annotations (over their own); repeatable.
    #[arg(short = 'a', long, value_name = "KEY=VALUE")]
    pub(crate) function_annotations: Vec<String>,
    /// The resource a WatchOperation watches, a YAML file.
    #[arg(short = 'w', long)]
    pub(crate) watched_resource: Option<PathBuf>,
    /// Print the whole Operation, not only its identity and status.
    #[arg(long)]
    pub(crate) include_full_operation: bool,
    /// Context for the first step: `key=file` (the file JSON or YAML),
    /// `;`-separated and repeatable, as upstream's map flag.
    #[arg(long, value_name = "KEY=FILE;…")]
    pub(crate) context_files: Vec<String>,
    /// Context for the first step: `key=value` (the value JSON or YAML;
    /// these win over --context-files), `;`-separated and repeatable.
    #[arg(long, value_name = "KEY=VALUE;…")]
    pub(crate) context_values: Vec<String>,
    /// Print the results functions returned as `Result` objects (`-r`
    /// here; before `render`, `-r` is --registry).
    #[arg(long = "include-function-results")]
    pub(crate) include_function_results: bool,
    /// Print the observed composed resources Crossplane would delete, as
    /// `DeletedResource` objects (Crossplane's renderer's deleted
    /// resources; xfn only).
    #[arg(long)]
    pub(crate) include_deleted_resources: bool,
    /// Print what the pipeline required, as a `Requirements` object
    /// (Crossplane's renderer's required resources and schemas; xfn only).
    #[arg(long)]
    pub(crate) include_requirements: bool,
    /// Print the whole XR, not only its status.
    #[arg(short = 'x', long)]
    pub(crate) include_full_xr: bool,
    /// Render the XR up to N times, each render observing what the
    /// previous one composed, until the output is stable (bi-directional
    /// patching); xfn only.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) iterations: u32,
    /// Print the context after the last step (`-c` here; the cache
    /// directory is --cache-dir).
    #[arg(short = 'c', long)]
    pub(crate) include_context: bool,
    /// Secrets steps take credentials from, a YAML stream or a directory.
    #[arg(long)]
    pub(crate) function_credentials: Option<PathBuf>,
    /// Give up on the whole render after this long.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// How long a Development runtime's function server may take to accept
    /// its first connection (one started just before the render).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) development_wait: Duration,
    /// Directory of the image cache (and per-run state).
    #[arg(long, env = "XFN_CACHE_DIR", default_value_os_t = super::default_cache_dir())]
    pub(crate) cache_dir: PathBuf,
    /// Registries reached over plain HTTP (loopback registries always are).
    #[arg(long = "insecure-registry")]
    pub(crate) insecure_registries: Vec<String>,
    /// A PEM bundle of CAs trusted besides the system roots.
    #[arg(long, env = "CA_BUNDLE_PATH")]
    pub(crate) ca_bundle_path: Option<PathBuf>,
    /// Bounds on pulls.
    #[command(flatten)]
    pub(crate) bounds: super::PullBoundsArgs,
    /// User namespace flags.
    #[command(flatten)]
    pub(crate) userns: UsernsArgs,
    /// Run engine flags.
    #[command(flatten)]
    pub(crate) runner: super::RunnerArgs,
    /// Warm containers (as `xfn start`): each Exec Function's and alpha
    /// step's container is made, and started, before the first step runs
    /// (by default the pool holds 2 per CPU, or all of them where a render
    /// has more).
    #[command(flatten)]
    pub(crate) warm_pool: super::WarmPoolArgs,
    /// When to pull the images of Docker and Exec Functions that set no pull
    /// policy (alpha steps use their own `imagePullPolicy`).
    #[arg(long, value_enum, default_value = "IfNotPresent")]
    pub(crate) image_pull_policy: PullPolicy,
    /// The plan, read once while the process is single-threaded.
    #[arg(skip)]
    pub(crate) plan: OnceLock<Result<RenderPlan, ComposeError>>,
}

impl RenderArgs {
    /// The store flags in the shape the namespace entry takes.
    pub(crate) fn store_args(&self) -> super::StoreArgs {
        super::StoreArgs {
            cache_dir: self.cache_dir.clone(),
            insecure_registries: self.insecure_registries.clone(),
            ca_bundle_path: self.ca_bundle_path.clone(),
            bounds: self.bounds.clone(),
        }
    }

    /// The inputs the flags name, their `key=value` syntax parsed.
    fn inputs(&self) -> Result<RenderInputs, ComposeError> {
        // `-o json` read as "output JSON": say what -o is.
        if let Some(path) = &self.observed_resources {
            let format = path.to_str().filter(|p| matches!(*p, "json" | "yaml"));
            if let (Some(format), false) = (format, path.exists()) {
                return Err(ComposeError::Invalid {
                    path: path.clone(),
                    message: format!(
                        "no such file: -o is --observed-resources (a file or directory of \
                         observed resources), as in crossplane render; to print {}, use \
                         --output {format}",
                        format.to_uppercase()
                    ),
                });
            }
        }
        let context_files = map_entries("--context-files", &self.context_files)?;
        Ok(RenderInputs {
            xr_or_operation: self.composite_resource.clone(),
            more_xrs: self.more_xrs.clone(),
            composition_or_functions: Some(self.composition.clone()),
            functions: self.functions.clone(),
            observed_resources: self.observed_resources.clone(),
            required_resources: self
                .required_resources
                .iter()
                .chain(&self.extra_resources)
                .cloned()
                .collect(),
            required_schemas: self.required_schemas.clone(),
            xrd: self.xrd.clone(),
            claim: false,
            watched_resource: self.watched_resource.clone(),
            function_credentials: self.function_credentials.clone(),
            function_annotations: annotation_overrides(&self.function_annotations)?,
            context_files: context_files
                .into_iter()
                .map(|(key, file)| (key, PathBuf::from(file)))
                .collect(),
            context_values: map_entries("--context-values", &self.context_values)?,
            output: OutputOptions {
                include_full: self.include_full_xr || self.include_full_operation,
                include_results: self.include_function_results,
                include_context: self.include_context,
                include_deleted: self.include_deleted_resources,
                include_requirements: self.include_requirements,
            },
            iterations: self.iterations,
            nested_compositions: self.nested_composition.clone(),
        })
    }

    /// The plan (read on first use, before the namespace and the runtime).
    pub(crate) fn plan(&self) -> &Result<RenderPlan, ComposeError> {
        self.plan
            .get_or_init(|| self.inputs().and_then(|inputs| RenderPlan::read(&inputs)))
    }

    /// Whether this render runs containers, and so needs xfn's user
    /// namespace (see [`RenderPlan::needs`]). Unreadable inputs answer
    /// false; the render then reports them, naming the file.
    pub(crate) fn needs_containers(&self) -> bool {
        self.plan()
            .as_ref()
            .is_ok_and(|plan| plan.needs().containers)
    }
}

/// Starts (or finds) the kept servers the render's Functions ask for,
/// before the process enters any namespace. Unreadable inputs are left to
/// the render to report.
pub(crate) fn start_kept(args: &RenderArgs, global: &super::Global) -> anyhow::Result<()> {
    let Ok(plan) = args.plan() else {
        return Ok(());
    };
    plan.start_kept(&keeper_command(args, global)?, args.image_pull_policy)?;
    Ok(())
}

/// How this render starts keepers: this binary with the flags they share,
/// written by the same flag types `keep` parses them with
/// ([`super::StoreArgs::to_args`] and its kind), so a flag added to one is
/// passed on.
fn keeper_command(args: &RenderArgs, global: &super::Global) -> anyhow::Result<KeeperCommand> {
    let mut flags: Vec<OsString> = vec!["render-servers".into(), "keep".into()];
    flags.extend(args.store_args().to_args());
    flags.extend(args.userns.to_args());
    flags.extend(args.runner.to_args());
    flags.extend([
        "--registry".into(),
        global.registry.clone().into(),
        "--timeout".into(),
        format!("{}ns", args.timeout.as_nanos()).into(),
    ]);
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
/// is printed), as `crossplane internal render` (the CLI exits 1).
pub(crate) const EXIT_FATAL: u8 = 3;

/// What `-c` and `-r` mean after `render`, for errors that may come from
/// reading them as they mean elsewhere.
const SHORT_FLAGS_NOTE: &str = "note: in `xfn render`, -c is --include-context and -r \
     --include-function-results, as in `crossplane render`; the cache directory is \
     --cache-dir and the registry --registry (or -r before `render`)";

/// Parses xfn's command line. `-r` is xfn's global `--registry`, but after
/// `render` it is `--include-function-results` (and `-c`
/// `--include-context`, where elsewhere it is the cache dir), as in
/// `crossplane render`: render gets `--registry` without its short form,
/// so its help and its errors say what its `-r` is. A usage error of a
/// render that used `-c` or `-r` says what they mean there.
pub(crate) fn parse_cli(args: impl IntoIterator<Item = OsString>) -> super::Cli {
    use clap::{CommandFactory, FromArgMatches};
    let args: Vec<OsString> = args.into_iter().collect();
    let command = super::Cli::command();
    let registry = command
        .get_arguments()
        .find(|a| a.get_id() == "registry")
        .cloned();
    let command = command.mut_subcommand("render", |render| {
        let render = render.mut_arg("include_function_results", |a| a.short('r'));
        // An arg of the subcommand's own is not propagated over.
        match registry {
            Some(registry) => render.arg(registry.short(None)),
            None => render,
        }
    });
    let in_render = |flags: &[&str]| {
        args.iter()
            .skip_while(|a| *a != "render")
            .any(|a| flags.iter().any(|f| a == f))
    };
    let parsed = command
        .try_get_matches_from(&args)
        .and_then(|matches| super::Cli::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(err) => {
            let usage = !matches!(
                err.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            );
            if usage && in_render(&["-c", "-r"]) {
                let _ = err.print();
                eprintln!("\n{SHORT_FLAGS_NOTE}");
                std::process::exit(err.exit_code());
            }
            err.exit()
        }
    };
    // `xfn render -c DIR XR COMPOSITION`: DIR became the XR.
    if let super::Command::Render(render) = &cli.command {
        if render.include_context && render.composite_resource.is_dir() {
            eprintln!(
                "error: the XR {} is a directory\n\n{SHORT_FLAGS_NOTE}",
                render.composite_resource.display()
            );
            std::process::exit(2);
        }
    }
    cli
}

/// Runs `xfn render`: 0 when it rendered, 3 (with the partial output)
/// when a Fatal result cut it short, 1 on any other failure, 128 + the
/// signal's number on SIGINT or SIGTERM (every function server and
/// container the render started is killed and removed first).
pub(crate) async fn execute(
    mut args: RenderArgs,
    namespace: Option<&Namespace>,
    global: &super::Global,
) -> anyhow::Result<ExitCode> {
    // Before anything starts: from here on a signal stops the render.
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    args.plan();
    let plan = match std::mem::take(&mut args.plan).into_inner() {
        Some(plan) => plan?,
        None => unreachable!("initialised above"),
    };
    let timeout = args.timeout;
    let format = args.output;
    let needs = plan.needs();
    let runner = if needs.containers {
        let namespace = namespace.context("xfn did not enter its user namespace")?;
        let store = args.store_args().open_store(&global.registry)?;
        let options = crate::runner::RunnerOptions {
            // Warm containers only for what runs per call (Exec steps,
            // alpha steps): a render of Docker servers makes none.
            warm_pool: (needs.per_call > 0)
                .then(|| args.warm_pool.options_for_at_least(needs.per_call)),
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
        development_wait: args.development_wait,
    };
    let pooled = runner.clone();
    let mut render = Box::pin(tokio::time::timeout(timeout, plan.render(runner, defaults)));
    let rendered = tokio::select! {
        biased;
        _ = interrupt.recv() => Err(nix::sys::signal::Signal::SIGINT),
        _ = terminate.recv() => Err(nix::sys::signal::Signal::SIGTERM),
        rendered = &mut render => Ok(rendered),
    };
    // Dropping the render kills and removes, synchronously, every server
    // and container it started (a kept server stays: it is its keeper's).
    drop(render);
    // Warm containers the render made and did not use (a step's refill)
    // go before xfn exits, whatever the render's outcome.
    if let Some(runner) = pooled {
        runner.shutdown().await;
    }
    let rendered = match rendered {
        Ok(rendered) => rendered,
        Err(signal) => {
            eprintln!("xfn: the render was stopped by {signal}; its function servers are removed");
            return Ok(ExitCode::from(128 + signal as u8));
        }
    };
    let rendered = rendered.map_err(|_| {
        anyhow::anyhow!("the render did not finish within {timeout:?} (--timeout)")
    })??;
    let mut stdout = std::io::stdout().lock();
    let text = match format {
        OutputFormat::Yaml => rendered.to_yaml()?,
        OutputFormat::Json => rendered.to_json_lines()?,
    };
    stdout.write_all(text.as_bytes())?;
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

    fn parse(args: &[&str]) -> super::super::Cli {
        parse_cli(args.iter().map(OsString::from))
    }

    #[test]
    fn short_r_after_render_means_include_results_and_before_it_the_registry() {
        let cli = parse(&["xfn", "-r", "reg.example", "render", "-r", "-c", "a", "b"]);
        assert_eq!(cli.registry, "reg.example");
        let super::super::Command::Render(render) = cli.command else {
            panic!("not a render");
        };
        assert!(render.include_function_results && render.include_context);
        let cli = parse(&["xfn", "render", "--registry", "other.example", "a", "b"]);
        assert_eq!(cli.registry, "other.example");
        let cli = parse(&["xfn", "pull", "-r", "third.example", "img"]);
        assert_eq!(cli.registry, "third.example");
    }

    #[test]
    fn a_flag_given_twice_is_taken_as_the_clis_kong_takes_it_the_last_value_winning() {
        let cli = parse(&[
            "xfn",
            "render",
            "-x",
            "--include-full-xr",
            "-r",
            "-r",
            "-o",
            "first.yaml",
            "--observed-resources",
            "last.yaml",
            "-e",
            "a.yaml",
            "-e",
            "b.yaml",
            "xr.yaml",
            "composition.yaml",
        ]);
        let super::super::Command::Render(render) = cli.command else {
            panic!("not a render");
        };
        assert!(render.include_full_xr && render.include_function_results);
        assert_eq!(render.observed_resources, Some(PathBuf::from("last.yaml")));
        // A list flag still gathers every value.
        assert_eq!(
            render.required_resources,
            [PathBuf::from("a.yaml"), PathBuf::from("b.yaml")]
        );
        // xprin (kong too) takes them as well.
        let cli = parse(&["xfn", "test", "-v", "--verbose", "suite_xprin.yaml"]);
        let super::super::Command::Test(test) = cli.command else {
            panic!("not a test");
        };
        assert!(test.verbose);
    }

    /// Renders `flags`, starts (on paper) its kept server and parses that
    /// server's command line as the server would: what it was given, what
    /// the server got.
    fn render_and_keeper(flags: &[&str]) -> (RenderArgs, super::super::Cli, super::super::Global) {
        let mut args = vec!["xfn"];
        args.extend_from_slice(flags);
        args.extend(["xr.yaml", "composition.yaml", "functions.yaml"]);
        let cli = parse(&args);
        let global = super::super::Global {
            registry: cli.registry,
            debug: cli.debug,
            log_format: cli.log_format,
        };
        let super::super::Command::Render(render) = cli.command else {
            panic!("not a render");
        };
        let keeper = keeper_command(&render, &global).unwrap();
        let mut kept = vec![OsString::from("xfn")];
        kept.extend(keeper.args);
        kept.extend(["--name", "n", "--function", "f", "--image", "i"].map(OsString::from));
        (render, parse_cli(kept), global)
    }

    fn assert_kept_as_given(flags: &[&str]) {
        let (render, kept, global) = render_and_keeper(flags);
        assert_eq!(kept.registry, global.registry);
        assert_eq!(kept.debug, global.debug);
        let super::super::Command::RenderServers(
            super::super::render_servers::RenderServersCommand::Keep(keep),
        ) = kept.command
        else {
            panic!("not a keeper");
        };
        assert_eq!(keep.store, render.store_args());
        assert_eq!(keep.userns, render.userns);
        assert_eq!(keep.runner, render.runner);
        assert_eq!(keep.timeout, render.timeout);
    }

    #[test]
    fn a_kept_server_parses_back_every_shared_flag_the_render_was_given() {
        assert_kept_as_given(&[
            "--registry",
            "reg.example",
            "--debug",
            "render",
            "--cache-dir",
            "/cache",
            "--insecure-registry",
            "a.example:5000",
            "--insecure-registry",
            "b.example",
            "--ca-bundle-path",
            "/ca.pem",
            "--max-image-size",
            "1Gi",
            "--max-layer-entries",
            "7",
            "--pull-timeout",
            "1m30.000000001s",
            "--map-root-uid",
            "200000",
            "--map-root-gid",
            "300000",
            "--subids",
            "off",
            "--rootfs",
            "copy",
            "--runtime",
            "/opt/crun",
            "--require-limits",
            "--max-output-bytes",
            "3Mi",
            "--pids-limit",
            "9",
            "--tmp-size",
            "64Mi",
            "--rootfs-size",
            "1Gi",
            "--timeout",
            "1.25s",
        ]);
    }

    #[test]
    fn a_kept_server_of_a_render_with_no_flags_gets_the_render_defaults() {
        assert_kept_as_given(&["render", "--cache-dir", "/cache"]);
        assert_kept_as_given(&["render"]);
    }
}
