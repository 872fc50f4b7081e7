//! The `xfn` binary: as PID 1, fork an init (`xfn::pid1`); parse flags,
//! enter the user namespace while still single-threaded, then start the
//! async runtime and dispatch.
mod cli;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

fn main() -> ExitCode {
    // As PID 1 (a container's main process) xfn leaves PID 1 to a tiny init
    // that reaps orphans and forwards signals: see `xfn::pid1`. First, while
    // the process has one thread.
    xfn::pid1::init_if_pid1();
    let cli = Cli::parse_from(cli::render::rewrite_short_flags(std::env::args_os()));
    let command = cli
        .command
        .unwrap_or_else(|| Command::Start(Default::default()));
    let global = cli::Global {
        registry: cli.registry,
        debug: cli.debug,
        log_format: cli.log_format,
    };
    cli::init_logging(&global);

    // Namespaces must be entered before the tokio runtime starts threads:
    // unshare(CLONE_NEWUSER) fails in a multi-threaded process.
    if let Err(err) = cli::prepare_process(&command, &global) {
        eprintln!("xfn: {err:#}");
        return ExitCode::FAILURE;
    }

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
    let result = runtime.block_on(async move {
        match command {
            Command::Start(args) => cli::start::execute(args, &global).await,
            Command::Run(args) => cli::run::execute(args, &global).await,
            Command::Pull(args) => cli::pull::execute(args, &global).await,
            Command::Cache(command) => cli::cache::execute(command, &global).await,
            Command::Render(args) => cli::render::execute(args, &global).await,
            Command::RenderServers(command) => cli::render_servers::execute(command, &global).await,
            Command::Adapt(args) => cli::adapt::execute(args, &global).await,
            Command::Wrap(args) => cli::wrap::execute(args, &global).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(err) => {
            // One line a user can act on; the chain of causes joined by ": ".
            eprintln!("xfn: {err:#}");
            ExitCode::FAILURE
        }
    }
}
