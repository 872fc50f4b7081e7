//! The Debian trixie root with Python that scripts/setup.sh builds for the
//! tests (Debian bookworm's Python is too old for function-pythonic):
//! function-pythonic 0.6.3 at `/opt/function-pythonic`, the Python SDK at
//! `/opt/function-sdk`. One place finds it, so every test that needs it
//! skips (loudly) on the same condition.
use std::path::PathBuf;

/// Where scripts/setup.sh leaves the root (`XFN_TEST_PYTHONIC_ROOT`
/// overrides it).
pub const ROOT: &str = "/var/cache/xfn-test/function-pythonic-0.6.3";

/// The crossplane-function-sdk-python version installed in the root.
pub const SDK_VERSION: &str = "0.15.1";

/// What no function reads in the root, left out of a layer made of it
/// ([`crate::Layer::tree`]): the image stays ~190 MB, not ~250.
pub const LEAVE_OUT: &[&str] = &[
    "tmp",
    "dev",
    "proc",
    "sys",
    "run",
    "root",
    "home",
    "var",
    "usr/share",
    "usr/bin/perl",
    "usr/bin/perl5.40.1",
    "usr/bin/sqv",
    "usr/lib/apt",
    "usr/lib/python3.13/test",
    "usr/lib/x86_64-linux-gnu/gconv",
    "usr/lib/x86_64-linux-gnu/perl-base",
];

/// The root, if it holds python3 and function-pythonic (and, when `sdk`,
/// the SDK too).
pub fn root(sdk: bool) -> Option<PathBuf> {
    let root =
        PathBuf::from(std::env::var("XFN_TEST_PYTHONIC_ROOT").unwrap_or_else(|_| ROOT.into()));
    let pythonic = root.join("opt/function-pythonic/crossplane_function_pythonic-0.6.3.dist-info");
    let sdk_here = root.join(format!(
        "opt/function-sdk/crossplane_function_sdk_python-{SDK_VERSION}.dist-info"
    ));
    (pythonic.is_dir() && (!sdk || sdk_here.is_dir()) && root.join("usr/bin/python3").exists())
        .then_some(root)
}
