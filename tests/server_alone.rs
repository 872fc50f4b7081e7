//! Test binary `server_alone`: the daemon tests that must have the machine
//! to themselves (a race for CPU they make on purpose). Cargo runs test
//! binaries one after another, so nothing else runs beside them; tests/README.md.
//! Within the binary too: each test holds [`ALONE`] throughout, or the
//! test harness would run two floods at once, each deciding the other's
//! outcome.

#[path = "server_flood.rs"]
mod server_flood;

/// Held by each test of this binary for its whole run: one at a time.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
