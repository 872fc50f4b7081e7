//! The `xfn` binary: everything is in the library (`xfn::cli_main`), so that
//! the command line is one more front end over the same crate, and the
//! library's public API is what embedders and tests need, not what the
//! command line uses.
use std::process::ExitCode;

fn main() -> ExitCode {
    xfn::cli_main()
}
