//! The `xfn` binary: as PID 1, fork an init (`xfn::pid1`); parse flags,
//! enter the user namespace while still single-threaded, then start the
//! async runtime and dispatch.
mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    // As PID 1 (a container's main process) xfn leaves PID 1 to a tiny init
    // that reaps orphans and forwards signals: see `xfn::pid1`. First, while
    // the process has one thread.
    xfn::pid1::init_if_pid1();
    let cli = cli::render::parse_cli(std::env::args_os());
    let command = cli.command;
    let global = cli::Global {
        registry: cli.registry,
        debug: cli.debug,
        log_format: cli.log_format,
    };
    cli::init_logging(&global);

    // Namespaces must be entered before the tokio runtime starts threads:
    // unshare(CLONE_NEWUSER) fails in a multi-threaded process.
    let prepared = match cli::prepare_process(command, &global) {
        Ok(prepared) => prepared,
        Err(err) => {
            eprintln!("xfn: {}", one_line(&err));
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
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("xfn: {}", one_line(&err));
            ExitCode::FAILURE
        }
    }
}

/// One line a user can act on: the chain of causes joined by ": ", each
/// once. xfn's error types put their cause in their own message (a gRPC
/// status carries only that message) and also expose it as their source,
/// so anyhow's `{:#}` would print every such cause twice; a cause whose
/// text the line already holds is left out.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("extracting layer sha256:1: {source}")]
    struct Outer {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_its_parents_message_is_printed_once() {
        let inner = std::io::Error::other("the image unpacks to more than 8 bytes");
        let err = anyhow::Error::new(Outer { source: inner }).context("pulling fn:v1");
        assert_eq!(
            one_line(&err),
            "pulling fn:v1: extracting layer sha256:1: the image unpacks to more than 8 bytes"
        );
        let plain = anyhow::anyhow!("root").context("middle").context("top");
        assert_eq!(one_line(&plain), "top: middle: root");
    }
}
