//! Test binary `render`: `xfn render` end to end: the Exec, Development and Docker runtimes, and what Crossplane v2 renders.
//!
//! One binary per area (tests/README.md says which file goes where): one
//! link, and its tests run side by side.

#[path = "render_bounds.rs"]
mod render_bounds;
#[path = "render_docker.rs"]
mod render_docker;
#[path = "render_e2e.rs"]
mod render_e2e;
#[path = "render_parity.rs"]
mod render_parity;
#[path = "render_peers.rs"]
mod render_peers;
#[path = "render_pythonic.rs"]
mod render_pythonic;
#[path = "render_v2.rs"]
mod render_v2;
