//! Test binary `run`: `xfn run` end to end: the real binary, real crun, a real registry: what a function sees, its bounds without cgroups, the runtime check.
//!
//! One binary per area (tests/README.md says which file goes where): one
//! link, and its tests run side by side.

#[path = "run_bounds.rs"]
mod run_bounds;
#[path = "run_kernel_counts.rs"]
mod run_kernel_counts;
#[path = "run_pod_shape.rs"]
mod run_pod_shape;
#[path = "run_users.rs"]
mod run_users;
#[path = "run_xfn.rs"]
mod run_xfn;
#[path = "runtime_check.rs"]
mod runtime_check;
