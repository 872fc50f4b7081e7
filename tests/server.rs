//! Test binary `server`: The daemons end to end as they are deployed: `xfn start` (calls, callers, lifecycle, warm pool, restarts, a bounded soak) `xfn adapt` and `xfn host` (with Crossplane's Go functions, called as core calls them).
//!
//! One binary per area (tests/README.md says which file goes where): one
//! link, and its tests run side by side.

#[path = "adapt_e2e.rs"]
mod adapt_e2e;
#[path = "host_bounds.rs"]
mod host_bounds;
#[path = "host_e2e.rs"]
mod host_e2e;
#[path = "host_peers.rs"]
mod host_peers;
#[path = "server_bounds.rs"]
mod server_bounds;
#[path = "server_calls.rs"]
mod server_calls;
#[path = "server_http2.rs"]
mod server_http2;
#[path = "server_lifecycle.rs"]
mod server_lifecycle;
#[path = "server_pool.rs"]
mod server_pool;
#[path = "server_restart.rs"]
mod server_restart;
#[path = "server_soak.rs"]
mod server_soak;
