//! The sandbox: user namespace entry, cgroups, OCI spec building and crun
//! invocation (owned by the sandbox work).
