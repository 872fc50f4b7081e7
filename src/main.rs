//! The `xfn` binary: parse flags, enter the user namespace while still
//! single-threaded, then start the async runtime and dispatch.
mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let _ = cli;
    eprintln!("xfn: not built yet");
    std::process::ExitCode::FAILURE
}
