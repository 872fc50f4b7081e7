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
            eprintln!("xfn: {}", xfn::chain::one_line(err.as_ref()));
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
            eprintln!("xfn: {}", xfn::chain::one_line(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}
