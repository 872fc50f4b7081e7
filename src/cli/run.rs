//! `xfn run`: run one function once, like Crossplane's `xfn run`.
use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use xfn::image::{PullPolicy, RegistryAuth};
use xfn::runner::{Limits, Namespace, NetworkPolicy, RunConfig, RunError, Runner};

use super::{StoreArgs, UsernsArgs};

/// Flags of `xfn run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The function image.
    pub image: String,
    /// The input document (a FunctionIO, or a RunFunctionRequest as JSON); `-` for stdin.
    pub input: String,
    /// Image cache flags.
    #[command(flatten)]
    pub store: StoreArgs,
    /// User namespace flags.
    #[command(flatten)]
    pub userns: UsernsArgs,
    /// Kill the function after this long (`30s`, `1m`, `1m30s`, `500ms`).
    #[arg(short = 't', long, default_value = "30s", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// When to pull the image.
    #[arg(long, value_enum, default_value = "IfNotPresent")]
    pub image_pull_policy: PullPolicy,
    /// Whether the function may use the network.
    #[arg(long, value_enum, default_value = "Isolated")]
    pub network_policy: NetworkPolicy,
    /// CPU limit, a Kubernetes quantity (`100m`, `0.5`, `2`).
    #[arg(long, value_parser = parse_cpu)]
    pub cpu: Option<u64>,
    /// Memory limit, a Kubernetes quantity (`128Mi`, `1G`).
    #[arg(long, value_parser = super::parse_size)]
    pub memory: Option<u64>,
    /// Run engine flags.
    #[command(flatten)]
    pub runner: super::RunnerArgs,
}

/// `--cpu`: a quantity of cores, in millicores.
fn parse_cpu(text: &str) -> Result<u64, String> {
    xfn::quantity::Quantity::parse(text)
        .and_then(|q| q.millis())
        .map_err(|e| e.to_string())
}

/// Parses a Go-style duration: `30s`, `1m`, `1m30s`, `1.5h`, `500ms`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    xfn::duration::parse_go_duration(text)
}

/// [`parse_duration`] for timeouts: zero would kill every run at once.
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(format!("{text:?}: a timeout must be longer than zero")),
        d => Ok(d),
    }
}

/// Runs `xfn run`.
pub async fn execute(
    args: RunArgs,
    namespace: &Namespace,
    global: &super::Global,
) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let input = read_input(&args.input)?;
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
                err.to_string().trim().replace('\n', " | ")
            );
            Ok(exit_code_of(&err))
        }
    }
}

/// Exit code for the error `xfn run` got, as a shell would give it: the
/// function's own code when it failed (128 + n when signal n killed it),
/// 124 when it timed out (as `timeout(1)`), 1 for xfn's own failures. A
/// script or CI step can then tell a failing function from a broken set-up.
fn exit_code_of(err: &RunError) -> ExitCode {
    let code = match err {
        RunError::FunctionFailed { code, .. } | RunError::MemoryLimitExceeded { code, .. } => {
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
            exit_code_of(&RunError::Internal("crun".into())),
            ExitCode::from(1)
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
