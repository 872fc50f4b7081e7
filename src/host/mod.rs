//! `xfn host`: one rootless daemon that serves every Function of a
//! Crossplane v2 cluster (installed with `Function=External`).
//!
//! A catalog says which functions are active now; the host serves exactly
//! those, each under the names Crossplane dials. The catalog is a static file
//! (laptops, CI, tests) or the controller, which watches Crossplane's
//! Functions and FunctionRevisions and does what the Deployment runtime would
//! have done for each: a headless Service, a server certificate from
//! Crossplane's root CA, the revision's `status.endpoint`.

// Wired into `xfn host` by the command line; until then the catalog's kinds
// and the controller's entry are only reached by their tests.
#[allow(dead_code)]
pub(crate) mod catalog;
#[allow(dead_code)]
pub(crate) mod controller;
