//! `xfn run`: run one function once, like Crossplane's `xfn run`.
use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::image::{PullPolicy, RegistryAuth};
use crate::runner::{Limits, Namespace, NetworkPolicy, RunConfig, RunError, Runner};
use crate::sidecar::validate::{check_function_io, InvalidRequest};

use super::{StoreArgs, UsernsArgs};

/// Flags of `xfn run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The function image.
    pub(crate) image: String,
    /// The input document (a FunctionIO, or a RunFunctionRequest as JSON); `-` for stdin.
    pub(crate) input: String,
    /// Image cache flags.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// User namespace flags.
    #[command(flatten)]
    pub(crate) userns: UsernsArgs,
    /// Kill the function after this long (`30s`, `1m`, `1m30s`, `500ms`).
    #[arg(short = 't', long, default_value = "30s", value_parser = parse_timeout)]
    pub(crate) timeout: Duration,
    /// When to pull the image.
    #[arg(long, value_enum, default_value = "IfNotPresent")]
    pub(crate) image_pull_policy: PullPolicy,
    /// Whether the function may use the network.
    #[arg(long, value_enum, default_value = "Isolated")]
    pub(crate) network_policy: NetworkPolicy,
    /// CPU limit, a Kubernetes quantity (`100m`, `0.5`, `2`).
    #[arg(long, value_parser = parse_cpu)]
    pub(crate) cpu: Option<u64>,
    /// Memory limit, a Kubernetes quantity (`128Mi`, `1G`).
    #[arg(long, value_parser = super::parse_size)]
    pub(crate) memory: Option<u64>,
    /// Run engine flags.
    #[command(flatten)]
    pub(crate) runner: super::RunnerArgs,
}

/// `--cpu`: a quantity of cores, in millicores.
pub(crate) fn parse_cpu(text: &str) -> Result<u64, String> {
    crate::quantity::Quantity::parse(text)
        .and_then(|q| q.millis())
        .map_err(|e| e.to_string())
}

/// Parses a Go-style duration: `30s`, `1m`, `1m30s`, `1.5h`, `500ms`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::duration::parse_go_duration(text)
}

/// [`parse_duration`] for timeouts: zero would kill every run at once.
pub(crate) fn parse_timeout(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(format!("{text:?}: a timeout must be longer than zero")),
        d => Ok(d),
    }
}

/// What `xfn run` does while the process is single-threaded, before it
/// enters xfn's namespace: reads the input with the user's own uid (xfn's
/// mapped root may not read a file only the user can) and checks it as
/// `xfn start` checks a call's, before anything is pulled or run. A
/// function of Crossplane reads a FunctionIO: a wrong or unreadable file
/// or a forgotten pipe is the user's to fix, said as such, exiting 2 (a
/// usage error). The input is the user's own: no size limit but memory.
pub(crate) fn prepare(args: RunArgs) -> anyhow::Result<super::Prepared> {
    let checked = read_input(&args.input).and_then(|input| {
        check_function_io(&input, usize::MAX)
            .map_err(|err| anyhow::anyhow!(refusal(&args.input, &err)))?;
        Ok(input)
    });
    let input = match checked {
        Ok(input) => input,
        Err(err) => {
            eprintln!("xfn: {}", crate::chain::one_line(err.as_ref()));
            return Ok(super::Prepared::Exit(ExitCode::from(USAGE)));
        }
    };
    let namespace = super::enter_namespace(&args.store, &args.userns)?;
    Ok(super::Prepared::Run(args, input, namespace))
}

/// Runs `xfn run` on the input [`prepare`] read and checked.
pub(crate) async fn execute(
    args: RunArgs,
    input: Vec<u8>,
    namespace: &Namespace,
    global: &super::Global,
) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let store = args.store.open_store(&global.registry)?;
    let runner = Runner::new(namespace, store, args.runner.options())?;
    // Before the pull: a missing or wrong runtime is the first thing to say.
    runner.check_runtime()?;
    tracing::debug!(elapsed = ?started.elapsed(), "runner ready");
    let config = RunConfig {
        pull_policy: args.image_pull_policy,
        auth: RegistryAuth::default(),
        timeout: args.timeout,
        network: args.network_policy,
        limits: Limits {
            cpu_millis: args.cpu,
            memory_bytes: args.memory,
            // `--pids-limit`, the runner's.
            pids: None,
        },
    };
    // Ctrl-C or SIGTERM stop the run: dropping its future kills the
    // container and removes its bundle, state and rootfs before xfn exits,
    // with the shell's code for the signal.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let result = tokio::select! {
        result = runner.run(&args.image, &input, &config) => result,
        _ = tokio::signal::ctrl_c() => return Ok(stopped_by("interrupted", libc::SIGINT)),
        _ = terminate.recv() => return Ok(stopped_by("terminated", libc::SIGTERM)),
    };
    match result {
        Ok(output) => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(&output.stdout)?;
            stdout.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            // One line: the function's stderr tail may span many.
            eprintln!(
                "xfn: running {}: {}",
                args.image,
                crate::chain::one_line(&err)
            );
            Ok(exit_code_of(&err))
        }
    }
}

/// The exit code of a usage error (bad flags, as clap exits, or input that
/// is no FunctionIO), as a shell's builtins give it.
const USAGE: u8 = 2;

/// The line saying why input `path` (`-` for stdin) was refused.
fn refusal(path: &str, err: &InvalidRequest) -> String {
    let source = if path == "-" { "stdin" } else { path };
    match err {
        InvalidRequest::Empty => format!(
            "{source}: {err} (xfn run gives the function a FunctionIO on its stdin: \
             name a file of one, or pipe one to `-`)"
        ),
        _ => format!("{source}: {}", crate::chain::one_line(err)),
    }
}

/// Exit code for the error `xfn run` got, as a shell would give it: the
/// function's own code when it failed (128 + n when signal n killed it),
/// 124 when it timed out (as `timeout(1)`), 1 for xfn's own failures. A
/// script or CI step can then tell a failing function from a broken set-up.
fn exit_code_of(err: &RunError) -> ExitCode {
    let code = match err {
        RunError::FunctionFailed { code, .. }
        | RunError::MemoryLimitExceeded(crate::runner::MemoryLimitExceeded { code, .. }) => {
            u8::try_from(*code)
                .ok()
                .filter(|code| *code != 0)
                .unwrap_or(1)
        }
        RunError::Timeout(_) => 124,
        _ => 1,
    };
    ExitCode::from(code)
}

/// A run stopped by `signal`: said on stderr, exit code 128 + signal.
fn stopped_by(what: &str, signal: i32) -> ExitCode {
    eprintln!("xfn: {what}; the run was stopped");
    ExitCode::from(u8::try_from(128 + signal).unwrap_or(1))
}

fn read_input(path: &str) -> anyhow::Result<Vec<u8>> {
    let mut input = Vec::new();
    if path == "-" {
        if std::io::stdin().is_terminal() {
            // `xfn run IMAGE -` typed at a prompt would wait in silence.
            eprintln!("xfn: reading the FunctionIO from the terminal; end it with Ctrl-D");
        }
        std::io::stdin()
            .read_to_end(&mut input)
            .context("cannot read the input from stdin")?;
    } else {
        input = std::fs::read(path).with_context(|| format!("cannot read the input {path}"))?;
    }
    Ok(input)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_function_s_exit_code_is_passed_through() {
        let failed = |code| RunError::FunctionFailed {
            code,
            stderr_tail: Vec::new(),
        };
        assert_eq!(exit_code_of(&failed(3)), ExitCode::from(3));
        assert_eq!(exit_code_of(&failed(137)), ExitCode::from(137));
        assert_eq!(exit_code_of(&failed(300)), ExitCode::from(1));
        assert_eq!(
            exit_code_of(&RunError::Timeout(Duration::from_secs(1))),
            ExitCode::from(124)
        );
        assert_eq!(
            exit_code_of(&RunError::RunDir {
                path: "/cache/run".into(),
                source: std::io::Error::other("read-only file system")
            }),
            ExitCode::from(1)
        );
    }

    #[test]
    fn refused_input_is_named_and_empty_input_says_what_to_give() {
        let empty = check_function_io(b"", usize::MAX).unwrap_err();
        assert_eq!(
            refusal("-", &empty),
            "stdin: input is empty: a FunctionIO is required (xfn run gives the function \
             a FunctionIO on its stdin: name a file of one, or pipe one to `-`)"
        );
        let list = check_function_io(b"- a\n", usize::MAX).unwrap_err();
        assert_eq!(
            refusal("in.yaml", &list),
            "in.yaml: input is not a FunctionIO: not a YAML mapping"
        );
        // What the parser found is said too (the error's source).
        let unclosed = check_function_io(b"{ unclosed", usize::MAX).unwrap_err();
        let line = refusal("in.yaml", &unclosed);
        assert!(
            line.starts_with("in.yaml: input is not a FunctionIO: not YAML: ") && line.len() > 48,
            "{line}"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "30", "s", "1x", "1m30", "-1s", "1..2s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_timeout("0s").is_err());
        assert_eq!(parse_timeout("2s"), Ok(Duration::from_secs(2)));
    }
}
