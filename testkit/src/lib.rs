//! xfn's one test kit: what its tests share. Images ([`Layer`],
//! [`ImageBuilder`]) pushed to a real `docker-registry` ([`Registry`]) or
//! served with faults ([`registry::hostile`], [`hostile`]); daemons started as
//! they are deployed ([`Daemon`]) and their clients ([`dial`], [`pb`]); child
//! guards and measures ([`child`]), `/proc` views ([`proc`]), a cache's run
//! state ([`state`]), TLS ([`tls`]), property-test settings ([`fuzz`]), render
//! fixtures ([`render`]), function servers ([`function_server`]), raw gRPC
//! calls and protobuf bytes ([`raw`]), the tests' Python root ([`python`]),
//! the peers scripts/peers.sh builds ([`peers`]), a real control plane
//! from scripts/cluster.sh ([`cluster`]),
//! tree snapshots ([`tree`]), percentiles ([`stats`]) and re-running one
//! test as another user ([`reexec`]).
//!
//! Invariant: the kit never links xfn's library. It knows xfn as a program
//! (the binary cargo built, [`xfn_binary`]) and by its wire protocol (the
//! runner client is generated from `proto/v1alpha1.proto` by this crate's
//! build script). Why: xfn's unit tests use this crate as a dev-dependency
//! too, and cargo has no dev-dependency for integration tests alone; a kit
//! that linked xfn would build xfn a second time for the unit tests, hand
//! them a second copy of every type, and rebuild on every change in `src/`.
//! Being a crate, the kit compiles once, not once per test binary.
//!
//! Every test binary's files `use xfn_testkit::*;` (the common names are
//! re-exported here) or name a module (`xfn_testkit::child::measure`).
pub mod child;
pub mod cluster;
pub mod daemon;
pub mod dial;
pub mod format;
pub mod function_server;
pub mod fuzz;
pub mod hostile;
pub mod http;
pub mod image;
pub mod layer;
pub mod peers;
pub mod proc;
pub mod program;
pub mod python;
pub mod raw;
pub mod reexec;
pub mod registry;
pub mod render;
pub mod state;
pub mod static_bin;
pub mod stats;
pub mod tcp_daemon;
pub mod tls;
pub mod tree;

/// The alpha runner protocol (`apiextensions.fn.proto.v1alpha1`), generated
/// from `proto/v1alpha1.proto`: requests to and the client of `xfn start`.
pub mod pb {
    #![allow(missing_docs, clippy::all)]
    // `fn` is a keyword: the generated file's name spells it `r#fn`.
    include!(concat!(
        env!("OUT_DIR"),
        "/apiextensions.r#fn.proto.v1alpha1.rs"
    ));
}

pub use daemon::*;
pub use dial::*;
pub use format::Format;
pub use function_server::{function_server_binary, function_server_image, FunctionServer};
pub use image::{
    echo_image, foreign_arch, host_arch, script_image, sleeper_image, ImageBuilder, IndexBuilder,
    PushedImage,
};
pub use layer::{pseudo_random_bytes, sha256_digest, Compression, Layer};
pub use proc::*;
pub use program::*;
pub use registry::{non_loopback_ip, Registry, RegistryConfig};
pub use state::*;
pub use static_bin::*;
pub use tcp_daemon::{free_port, TcpDaemon};
