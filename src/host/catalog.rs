//! What `xfn host` serves: the functions a catalog (a static file, or the
//! controller watching Crossplane's FunctionRevisions) says are active now.
//! The host only ever serves a name the catalog holds, so a call is never
//! served by another function; the catalog only ever says what, never how
//! (the controller tells the host through the seam the controller owns).

/// How a function's package runs: decided from its package metadata or image
/// config, overridable per function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FunctionKind {
    /// A gRPC function server (every SDK): kept running, called over gRPC.
    Server,
    /// A stdin/stdout function (what `xfn wrap` packages): one run per call.
    StdinStdout,
}

/// One function the host serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostedFunction {
    /// The Function's `metadata.name`: routing names are derived from it.
    pub(crate) name: String,
    /// The package image reference (`spec.package`, or the Active
    /// revision's `spec.image`).
    pub(crate) package: String,
    /// An override of the kind; `None` decides from the package.
    pub(crate) kind: Option<FunctionKind>,
    /// Its cpu/memory/pids limits (`runtime_config`); each one unset takes
    /// the host's default.
    pub(crate) limits: crate::runner::Limits,
    /// Its server settings (`runtime_config`); each one unset takes the
    /// host's flag.
    pub(crate) servers: super::runtime_config::ServerSettings,
}
