//! `xfn test [PATH…]`: runs Composition test suites in xprin's format
//! (`crate::suite`), every suite in this one process, as `go test` reports:
//! exit 0 when every test passed, 1 when one failed, 2 when a suite (or the
//! configuration) could not be read. This module maps flags onto the suite
//! runner and makes its runner and function servers.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use crate::compose::{ContainerDefaults, Needs};
use crate::image::PullPolicy;
use crate::runner::{Namespace, Runner};
use crate::suite::beneath::Beneath;
use crate::suite::progress::Line;
use crate::suite::report::{self, SuiteOutcome};
use crate::suite::run::{Env, Options, Show};
use crate::suite::servers::SharedServers;
use crate::suite::spec::{discover, Suite};
use crate::suite::template::Vars;
use crate::suite::writes::{Open, Opened};
use crate::suite::SuiteError;

use super::run::parse_duration;

/// Exit code when a suite could not be read.
const EXIT_UNREADABLE: u8 = 2;

/// Flags of `xfn test`. `-c` is xprin's `-c FILE` (the configuration), so
/// the cache directory is `--cache-dir` alone here.
#[derive(Debug, Args)]
#[command(mut_arg("cache_dir", |a| a.short(None)))]
pub(crate) struct TestArgs {
    /// Suite files (`xprin.yaml`, `*_xprin.yaml`) or directories searched
    /// recursively for them (`DIR/...` too); default: the current directory.
    #[arg(value_name = "PATH")]
    pub(crate) paths: Vec<PathBuf>,
    /// Print every test with each of its checks (`=== RUN`, `--- PASS`).
    #[arg(short = 'v', long)]
    pub(crate) verbose: bool,
    /// Run only the tests whose name matches this regular expression.
    #[arg(long, value_name = "REGEX")]
    pub(crate) run: Option<regex::Regex>,
    /// Write a JUnit XML report here.
    #[arg(long, value_name = "FILE")]
    pub(crate) junit: Option<PathBuf>,
    /// Rewrite the golden files of `diff` and `dyff` assertions with what rendered.
    #[arg(long)]
    pub(crate) update: bool,
    /// The repository root every golden file must be beneath (default:
    /// each suite's own directory); a suite outside it is refused.
    #[arg(long, value_name = "DIR")]
    pub(crate) root: Option<PathBuf>,
    /// Run at most N tests at once (default: the CPUs).
    #[arg(short = 'p', long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) parallel: Option<u16>,
    /// xprin's configuration file; its `repositories:` give
    /// `{{ .Repositories.NAME }}`, its `subcommands.validate` whether a
    /// kind no CRD defines fails validation (default: ~/.config/xprin.yaml
    /// when there).
    #[arg(short = 'c', long, value_name = "FILE", env = "XPRIN_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Do not print `[no test cases found]` for a suite without tests.
    #[arg(short = 'q', long)]
    pub(crate) quiet: bool,
    /// Colour the check marks and verdicts: on, off, or auto (on a terminal).
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) color: Color,
    /// Under -v, list each test's rendered resources (`Kind/name`).
    #[arg(long)]
    pub(crate) show_render: bool,
    /// Under -v, list each resource validated.
    #[arg(long)]
    pub(crate) show_validate: bool,
    /// Under -v, print each hook's output.
    #[arg(long)]
    pub(crate) show_hooks: bool,
    /// Under -v, print every assertion (as -v always does in xfn test).
    #[arg(long)]
    pub(crate) show_assertions: bool,
    /// Print the whole XR, not only its status (`--include-full-xr=false`:
    /// as `crossplane render` by default); the whole XR is what a chained
    /// test's `{{ .Tests.ID.Outputs.XR }}` renders again.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) include_full_xr: bool,
    /// Give up on one test's render after this long.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// How long a Development runtime's function server may take to accept
    /// its first connection (as `xfn render`'s).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) development_wait: Duration,
    /// Kill a hook (and its children) after this long.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub(crate) hook_timeout: Duration,
    /// Image cache and registry flags.
    #[command(flatten)]
    pub(crate) store: super::StoreArgs,
    /// User namespace flags.
    #[command(flatten)]
    pub(crate) userns: super::UsernsArgs,
    /// Run engine flags.
    #[command(flatten)]
    pub(crate) runner: super::RunnerArgs,
    /// Warm containers for Exec Functions.
    #[command(flatten)]
    pub(crate) warm_pool: super::WarmPoolArgs,
    /// When to pull the images of Docker and Exec Functions that set no pull policy.
    #[arg(long, value_enum, default_value = "IfNotPresent")]
    pub(crate) image_pull_policy: PullPolicy,
}

/// SIGINT and SIGTERM, as they stop a run.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

/// A signal that stopped the run.
struct Stop {
    name: &'static str,
    /// 128 + its number, as a shell reports a process it killed.
    exit_code: u8,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        })
    }

    /// The next SIGINT or SIGTERM.
    async fn next(&mut self) -> Stop {
        tokio::select! {
            _ = self.interrupt.recv() => Stop { name: "SIGINT", exit_code: 130 },
            _ = self.terminate.recv() => Stop { name: "SIGTERM", exit_code: 143 },
        }
    }
}

/// `--color`, as xprin's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Color {
    On,
    Off,
    Auto,
}

/// What xprin's configuration file says that `xfn test` reads.
#[derive(Debug, Default)]
struct Config {
    /// `repositories:`.
    repositories: BTreeMap<String, String>,
    /// `subcommands.validate` passes `--error-on-missing-schemas` (as
    /// xprin's default, `beta validate --error-on-missing-schemas`, does).
    error_on_missing_schemas: bool,
}

/// The suites and configuration, read while the process is single-threaded.
#[derive(Debug)]
pub(crate) struct Loaded {
    suites: Vec<(PathBuf, Result<Suite, SuiteError>)>,
    config: Result<Config, SuiteError>,
    /// A path given that is not there (or unreadable).
    discovery: Option<SuiteError>,
    /// What the tests run in containers here.
    containers: Needs,
    /// The JUnit report and golden files, opened before the namespace
    /// ([`Loaded::open_writes`]).
    writes: Opened,
    /// Where the JUnit report is written, or why it cannot be.
    junit: Option<Result<Beneath, String>>,
}

impl Loaded {
    /// Finds and reads every suite.
    pub(crate) fn read(args: &TestArgs) -> Self {
        let paths = if args.paths.is_empty() {
            vec![PathBuf::from(".")]
        } else {
            args.paths.clone()
        };
        let (files, discovery) = match discover(&paths) {
            Ok(files) => (files, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        let suites = files
            .into_iter()
            .map(|path| {
                let suite = Suite::read(&path, args.root.as_deref());
                (path, suite)
            })
            .collect();
        let mut loaded = Self {
            suites,
            config: read_config(args.config.as_deref()),
            discovery,
            containers: Needs::default(),
            writes: Opened::default(),
            junit: None,
        };
        loaded.containers = loaded.read_containers();
        loaded
    }

    /// What the tests run in containers here (see [`Loaded::read_containers`]).
    pub(crate) fn containers(&self) -> Needs {
        self.containers
    }

    /// What the tests run in containers here: whether any does (Exec or
    /// Docker Functions, alpha steps no daemon runs), so that xfn must
    /// enter its user namespace, and how many containers a call makes at
    /// most (distinct Exec Functions, or alpha steps), which the warm pool
    /// is sized for (none without them: an idle pool costs the run's exit
    /// its own teardown). Each Functions and Composition file is read once;
    /// those that cannot be read yet (templated from other tests) are left
    /// to the test.
    fn read_containers(&self) -> Needs {
        let repositories = self.config.as_ref().ok().map(|c| &c.repositories);
        let vars = Vars {
            repositories,
            ..Default::default()
        };
        let mut functions_files = std::collections::BTreeSet::new();
        let mut composition_files = std::collections::BTreeSet::new();
        for (path, suite) in &self.suites {
            let Ok(suite) = suite else { continue };
            let dir = path.parent().unwrap_or(Path::new("."));
            for test in &suite.tests {
                let inputs = &test.inputs;
                for (raw, files) in [
                    (&inputs.functions, &mut functions_files),
                    (&inputs.composition, &mut composition_files),
                ] {
                    if let Some(raw) = raw.as_deref().and_then(|r| vars.expand(r).ok()) {
                        files.insert(dir.join(raw));
                    }
                }
            }
        }
        Needs::of_files(
            functions_files.iter().map(PathBuf::as_path),
            composition_files.iter().map(PathBuf::as_path),
        )
    }

    /// Whether the run goes on past reading: a path given is there, the
    /// configuration reads and a suite was found (else it exits 2 first).
    fn runnable(&self) -> bool {
        self.discovery.is_none() && self.config.is_ok() && !self.suites.is_empty()
    }

    /// Opens what the run writes where the user keeps it, before xfn
    /// enters its namespace (`crate::suite::writes`): the `--junit` report;
    /// with `host_uid` (the host uid xfn becomes there, when another than
    /// the user's) and `--update`, the golden files of the tests `--run`
    /// selects whose paths are known before the run.
    pub(crate) fn open_writes(&mut self, args: &TestArgs, host_uid: Option<u32>) {
        if !self.runnable() {
            return;
        }
        let mut writes = host_uid.map_or_else(Opened::default, Opened::as_host_uid);
        self.junit = args.junit.as_deref().map(|junit| {
            let path = Beneath::anywhere(junit).map_err(|e| crate::chain::Chain(&e).to_string())?;
            writes.open(&path, Open::Fresh);
            Ok(path)
        });
        if let (true, Some(_)) = (args.update, host_uid) {
            let vars = Vars {
                repositories: self.config.as_ref().ok().map(|c| &c.repositories),
                ..Default::default()
            };
            for suite in self.suites.iter().filter_map(|(_, s)| s.as_ref().ok()) {
                let tests = suite
                    .tests
                    .iter()
                    .filter(|t| args.run.as_ref().is_none_or(|r| r.is_match(&t.name)));
                for test in tests {
                    let golden = test.assertions.diff.iter().chain(&test.assertions.dyff);
                    for path in golden.filter_map(|a| suite.golden(a, &vars).ok()) {
                        writes.open(&path, Open::InPlace);
                    }
                }
            }
        }
        self.writes = writes;
    }

    /// Whether a test `--run` selects has a hook.
    fn hooks(&self, run: Option<&regex::Regex>) -> bool {
        self.selected_tests(run)
            .any(|t| !t.hooks.pre_test.is_empty() || !t.hooks.post_test.is_empty())
    }

    /// How many tests the run selects (`--run`), for the progress line.
    fn selected(&self, run: Option<&regex::Regex>) -> usize {
        self.selected_tests(run).count()
    }

    fn selected_tests<'a>(
        &'a self,
        run: Option<&'a regex::Regex>,
    ) -> impl Iterator<Item = &'a crate::suite::spec::TestCase> {
        self.suites
            .iter()
            .filter_map(|(_, s)| s.as_ref().ok())
            .flat_map(|s| &s.tests)
            .filter(move |t| run.is_none_or(|r| r.is_match(&t.name)))
    }
}

/// Reads the suites and, while the process is single-threaded, enters
/// xfn's namespace where the run needs it: when a test runs a container
/// here, and, where xfn maps a range (as root), when a test has a hook, so
/// that hooks always run as the mapped host uid (100000), never as host
/// root. What the run writes is opened first, as the user who ran xfn.
pub(crate) fn prepare(args: TestArgs) -> anyhow::Result<super::Prepared> {
    let mut loaded = Loaded::read(&args);
    let mapped = super::userns_options(&args.store, &args.userns)
        .range()
        .map(|(uid, _)| uid)
        .filter(|uid| *uid != nix::unistd::geteuid().as_raw());
    let enters = loaded.containers().containers
        || (mapped.is_some() && loaded.runnable() && loaded.hooks(args.run.as_ref()));
    loaded.open_writes(&args, mapped.filter(|_| enters));
    let namespace = if enters {
        Some(super::enter_namespace(&args.store, &args.userns)?)
    } else {
        None
    };
    Ok(super::Prepared::Test(args, loaded, namespace))
}

/// What `xfn test` reads of xprin's configuration file: `repositories:`
/// and whether `subcommands.validate` passes `--error-on-missing-schemas`
/// (xprin's default does; so does no file).
fn read_config(config: Option<&Path>) -> Result<Config, SuiteError> {
    let default = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/xprin.yaml"));
    let path = match (config, default) {
        (Some(path), _) => path.to_path_buf(),
        (None, Some(path)) if path.exists() => path,
        _ => {
            return Ok(Config {
                error_on_missing_schemas: true,
                ..Config::default()
            })
        }
    };
    let invalid = |message: String| SuiteError::Config {
        path: path.clone(),
        message,
    };
    let object = crate::compose::read_objects(&path)
        .map_err(|e| invalid(crate::chain::Chain(&e).to_string()))?;
    let config = object.first().cloned().unwrap_or_default();
    let repositories = match config.get("repositories") {
        None | Some(serde_json::Value::Null) => BTreeMap::new(),
        Some(map) => serde_json::from_value(map.clone())
            .map_err(|e| invalid(format!("repositories must map names to paths: {e}")))?,
    };
    let validate = config.pointer("/subcommands/validate");
    let error_on_missing_schemas = match validate {
        None | Some(serde_json::Value::Null) => true,
        Some(serde_json::Value::String(s)) if s.trim().is_empty() => true,
        Some(serde_json::Value::String(s)) => s
            .split_whitespace()
            .any(|w| w == "--error-on-missing-schemas" || w == "--error-on-missing-schemas=true"),
        Some(_) => return Err(invalid("subcommands.validate must be a string".into())),
    };
    Ok(Config {
        repositories,
        error_on_missing_schemas,
    })
}

/// The runner of a run whose tests run containers (`containers`), in
/// `namespace`.
fn runner(
    args: &TestArgs,
    global: &super::Global,
    namespace: &Namespace,
    containers: Needs,
) -> anyhow::Result<Arc<Runner>> {
    let store = args.store.open_store(&global.registry)?;
    // Warm containers only for calls that make one (Exec Functions,
    // alpha steps), as `xfn render` has them.
    let per_call = containers.per_call;
    let options = crate::runner::RunnerOptions {
        warm_pool: (per_call > 0).then(|| args.warm_pool.options_for_at_least(per_call)),
        ..args.runner.options()
    };
    Ok(Arc::new(Runner::new(namespace, store, options)?))
}

/// Says which `--show-…` flags show nothing without `-v`.
fn warn_unshown(args: &TestArgs) {
    if args.verbose {
        return;
    }
    for (flag, given) in [
        ("--show-render", args.show_render),
        ("--show-validate", args.show_validate),
        ("--show-hooks", args.show_hooks),
        ("--show-assertions", args.show_assertions),
    ] {
        if given {
            eprintln!("xfn: {flag} requires -v (verbose mode) to display results");
        }
    }
}

/// What every test of the run is run with.
fn options(
    args: &TestArgs,
    repositories: BTreeMap<String, String>,
    global: &super::Global,
) -> Options {
    Options {
        update: args.update,
        hook_timeout: args.hook_timeout,
        render_timeout: args.timeout,
        repositories,
        keep: global.debug,
        run: args.run.clone(),
        full_xr: args.include_full_xr,
        show: Show {
            render: args.show_render,
            validate: args.show_validate,
            hooks: args.show_hooks,
        },
    }
}

/// Prints each suite's lines as soon as it and every suite before it
/// ended (the order given), as `go test` prints a package when it is
/// done, until all have or a signal stops the run (then returned).
/// Dropped on return, the runs left kill their hooks' process groups and
/// remove their temporary directories.
async fn report_each(
    runs: impl Iterator<Item = impl std::future::Future<Output = SuiteOutcome>>,
    signals: &mut Signals,
    line: &Line,
    args: &TestArgs,
    color: bool,
) -> anyhow::Result<(Vec<SuiteOutcome>, Option<Stop>)> {
    let mut runs: futures::stream::FuturesOrdered<_> = runs.collect();
    let mut outcomes = Vec::new();
    loop {
        let outcome = tokio::select! {
            outcome = futures::StreamExt::next(&mut runs) => outcome,
            signal = signals.next() => return Ok((outcomes, Some(signal))),
        };
        let Some(outcome) = outcome else {
            return Ok((outcomes, None));
        };
        line.suite_done(|| {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(report::text(&outcome, args.verbose, color).as_bytes())?;
            stdout.flush()
        })?;
        outcomes.push(outcome);
    }
}

/// Runs `xfn test`.
pub(crate) async fn execute(
    args: TestArgs,
    loaded: Loaded,
    namespace: Option<&Namespace>,
    global: &super::Global,
) -> anyhow::Result<ExitCode> {
    if let Some(e) = &loaded.discovery {
        eprintln!("xfn: {}", crate::chain::Chain(e));
        return Ok(ExitCode::from(EXIT_UNREADABLE));
    }
    let containers = loaded.containers();
    let selected = loaded.selected(args.run.as_ref());
    let config = match loaded.config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xfn: {}", crate::chain::Chain(&e));
            return Ok(ExitCode::from(EXIT_UNREADABLE));
        }
    };
    if loaded.suites.is_empty() {
        eprintln!("xfn: no test suites (xprin.yaml, *_xprin.yaml) under the paths given");
        return Ok(ExitCode::from(EXIT_UNREADABLE));
    }
    // A report that cannot be written fails the run before it starts.
    let junit = match (&args.junit, &loaded.junit) {
        (Some(given), Some(Err(e))) => anyhow::bail!("cannot write {}: {e}", given.display()),
        (_, Some(Ok(path))) => match loaded.writes.open_error(&path.path()) {
            Some(e) => anyhow::bail!("cannot write {}: {e}", path.path().display()),
            None => Some(path),
        },
        _ => None,
    };
    // The namespace may be entered for hooks alone (see `prepare`).
    let runner = match namespace.filter(|_| containers.containers) {
        Some(namespace) => Some(runner(&args, global, namespace, containers)?),
        None => None,
    };
    // Listened for from here: SIGINT (Ctrl-C) and SIGTERM stop the run.
    let mut signals = Signals::new()?;
    warn_unshown(&args);
    let defaults = ContainerDefaults {
        default_registry: global.registry.clone(),
        timeout: args.timeout,
        pull_policy: args.image_pull_policy,
        keeper: None,
        development_wait: args.development_wait,
    };
    let servers = SharedServers::new(runner.clone(), defaults);
    let options = options(&args, config.repositories, global);
    let parallel = args
        .parallel
        .map(usize::from)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let limit = tokio::sync::Semaphore::new(parallel);
    // `crds:` validation judges a create: no old resources.
    let validator = crate::schema::Validator {
        error_on_missing_schemas: config.error_on_missing_schemas,
        ..Default::default()
    };
    let line = Line::new(Line::wanted(args.verbose), loaded.suites.len(), selected);
    let env = Env {
        options: &options,
        servers: &servers,
        validator: &validator,
        limit: &limit,
        line: &line,
        writes: &loaded.writes,
    };
    // A suite without tests has nothing to run, as xprin says of it.
    let (empty, suites): (Vec<_>, Vec<_>) = loaded
        .suites
        .iter()
        .partition(|(_, s)| s.as_ref().is_ok_and(|s| s.tests.is_empty()));
    if !args.quiet {
        for (path, _) in &empty {
            eprintln!("?   \t{}\t[no test cases found]", path.display());
        }
    }
    let color = match args.color {
        Color::On => true,
        Color::Off => false,
        Color::Auto => std::io::IsTerminal::is_terminal(&std::io::stdout()),
    };
    let runs = suites.into_iter().map(|(path, suite)| {
        let env = &env;
        async move {
            let started = Instant::now();
            let tests = match suite {
                Ok(suite) => crate::suite::run::run_suite(suite, env).await,
                Err(e) => Err(crate::chain::Chain(e).to_string()),
            };
            SuiteOutcome {
                path: path.clone(),
                duration: started.elapsed(),
                tests,
            }
        }
    });
    let (outcomes, stopped) = report_each(runs, &mut signals, &line, &args, color).await?;
    line.finish();
    servers.stop().await;
    if let Some(runner) = runner {
        runner.shutdown().await;
    }
    if let Some(signal) = stopped {
        eprintln!("xfn: {} received: stopped", signal.name);
        return Ok(ExitCode::from(signal.exit_code));
    }
    tracing::debug!(servers = servers.len(), "function servers started");
    if let Some(path) = junit {
        let xml = report::junit(&outcomes).context("cannot write the JUnit report")?;
        loaded.writes.write(path, &xml)?;
    }
    let unreadable = loaded.suites.iter().any(|(_, s)| s.is_err());
    Ok(if unreadable {
        ExitCode::from(EXIT_UNREADABLE)
    } else if outcomes.iter().all(SuiteOutcome::passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
