//! The sandbox: user namespace entry, cgroup detection, OCI spec building and
//! crun invocation.
pub mod cgroup;
pub mod quantity;
pub mod spec;
pub mod user;
pub mod userns;
pub mod crun;
pub mod bundle;
