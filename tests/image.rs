//! Test binary `image`: The image cache and pulls: the store against a real registry, `xfn pull` and `xfn cache`, hostile layers and registries, TLS and auth, garbage collection, the runner image and `xfn wrap`, the deploy manifests, and the test kit's own checks.
//!
//! One binary per area (tests/README.md says which file goes where): one
//! link, and its tests run side by side.

#[path = "deploy_manifests.rs"]
mod deploy_manifests;
#[path = "harness.rs"]
mod harness;
#[path = "image_auth.rs"]
mod image_auth;
#[path = "image_bench.rs"]
mod image_bench;
#[path = "image_cache.rs"]
mod image_cache;
#[path = "image_cli.rs"]
mod image_cli;
#[path = "image_e2e.rs"]
mod image_e2e;
#[path = "image_fuzz.rs"]
mod image_fuzz;
#[path = "image_gc.rs"]
mod image_gc;
#[path = "image_hostile.rs"]
mod image_hostile;
#[path = "image_hostile_registry.rs"]
mod image_hostile_registry;
#[path = "image_pull.rs"]
mod image_pull;
#[path = "image_tls.rs"]
mod image_tls;
#[path = "wrap_e2e.rs"]
mod wrap_e2e;
