//! Test binary `run_in_process`: the runner library in-process, inside a
//! user, mount and PID namespace this binary enters in `main` (`harness =
//! false`: a process must still be single-threaded to enter a user
//! namespace, which libtest's threads would make impossible). What only an
//! in-process test sees: the per-run rootfs mounts live in this process's
//! mount namespace, so after every case /proc/self/mountinfo must show none
//! of them, and no container process, bundle or rootfs dir may be left.
//!
//! Each file's cases run one after another and print `ok: …` as they pass;
//! a failing case panics, which fails the binary.

#[path = "run_pool.rs"]
mod run_pool;
#[path = "run_runner.rs"]
mod run_runner;

use xfn::runner::{enter_namespace, UsernsOptions};
use xfn_testkit::*;

fn main() {
    let base = world_traversable_tempdir();
    let cache = base.path().join("cache");
    let ns = enter_namespace(&UsernsOptions {
        map_root_uid: None,
        map_root_gid: None,
        cache_dir: cache.clone(),
        subordinate_ids: true,
    })
    .expect("enter the user namespace");
    // As `xfn start` does: whatever a failing case leaves running (a warm
    // container, a run) dies with this process.
    xfn::pidns::enter().expect("a PID namespace of the test's own");
    println!("entered: {:?}", ns.mapping());
    let registry = Registry::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the async runtime");
    runtime.block_on(async {
        run_runner::all(&ns, &cache, &registry).await;
        run_pool::all(&ns, &cache, &registry).await;
    });
}
