//! Test binary `server_alone`: the daemon tests that must have the machine
//! to themselves (a race for CPU they make on purpose). Cargo runs test
//! binaries one after another, so nothing else runs beside them; tests/README.md.
#[path = "server_common/mod.rs"]
mod server_common;
#[path = "support/mod.rs"]
mod support;

#[path = "server_flood.rs"]
mod server_flood;
