//! The peers xfn is compared with, as scripts/peers.sh leaves them (built
//! from the Go module proxy at pinned versions): the `crossplane` CLI, its
//! renderer (Crossplane's core binary), and Crossplane's composition
//! functions with their examples and package metadata.
//!
//! Invariant: a missing peer fails the test that needs it, naming
//! scripts/peers.sh (and the proxy's refusal, when that is why), never a
//! skip: a comparison that did not run must not read as one that agreed.
//! Function images are made here, at test time, in the test's own registry
//! (each test starts one on a random port, so no image can be pushed ahead).
use std::path::{Path, PathBuf};

use crate::{Compression, ImageBuilder, Layer, Registry};

/// Where scripts/peers.sh leaves the peers (`XFN_TEST_PEERS_DIR` overrides it,
/// for both).
pub const DIR: &str = "/var/cache/xfn-test/peers";

/// The peers' directory.
pub fn dir() -> PathBuf {
    PathBuf::from(std::env::var("XFN_TEST_PEERS_DIR").unwrap_or_else(|_| DIR.into()))
}

/// Panics saying that `what` of peer `name` is missing, and why when the
/// script recorded that the proxy refused the module.
fn missing(name: &str, what: &Path) -> ! {
    let refused = std::fs::read_to_string(dir().join("NOT-SERVED"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .map(|l| format!(" (the Go module proxy did not serve {l})"))
        .unwrap_or_default();
    panic!(
        "peer {name} is missing: no {}{refused}; run scripts/peers.sh (scripts/setup.sh runs it)",
        what.display()
    )
}

/// A peer program (`crossplane`, `crossplane-core`, `xprin`).
pub fn binary(name: &str) -> PathBuf {
    let path = dir().join("bin").join(name);
    if !path.is_file() {
        missing(name, &path);
    }
    path
}

/// One of Crossplane's composition functions, built by scripts/peers.sh.
pub struct PeerFunction {
    /// Its repository's name (`function-patch-and-transform`).
    pub name: String,
    dir: PathBuf,
}

impl PeerFunction {
    /// Function `name`; panics (naming scripts/peers.sh) if it is missing.
    pub fn get(name: &str) -> PeerFunction {
        let dir = dir().join("functions").join(name);
        for part in ["VERSION", "function", "package.yaml", "example"] {
            if !dir.join(part).exists() {
                missing(name, &dir.join(part));
            }
        }
        PeerFunction {
            name: name.to_string(),
            dir,
        }
    }

    /// The static binary (a gRPC function server: `--insecure --address`).
    pub fn binary(&self) -> PathBuf {
        self.dir.join("function")
    }

    /// The module's `example/` directory.
    pub fn example(&self) -> PathBuf {
        self.dir.join("example")
    }

    /// `module@version`.
    pub fn version(&self) -> String {
        std::fs::read_to_string(self.dir.join("VERSION"))
            .expect("read the peer's VERSION")
            .trim()
            .to_string()
    }

    /// The function's runtime image as its Dockerfile makes it, on a
    /// minimal root: the binary at `/function`, the entrypoint
    /// `["/function"]`, the user `nonroot:nonroot` (65532) of distroless.
    fn runtime_image(&self) -> ImageBuilder {
        let binary = std::fs::read(self.binary()).expect("read the peer function's binary");
        ImageBuilder::new()
            // Uncompressed: gzip of tens of MB by the unoptimised test build
            // takes seconds, and the registry is on loopback.
            .layer(
                Layer::new()
                    .compression(Compression::None)
                    .file("/function", 0o755, binary),
            )
            .entrypoint(["/function"])
            .user("65532:65532")
    }

    /// Pushes the function's runtime image plus the package metadata layer
    /// (`package.yaml`, annotated `io.crossplane.xpkg: base`) of a
    /// Crossplane package, as `name`. Returns its reference.
    pub fn image(&self, registry: &Registry, name: &str) -> String {
        let package =
            std::fs::read(self.dir.join("package.yaml")).expect("read the peer's package.yaml");
        self.runtime_image()
            .layer(
                Layer::new()
                    .file("/package.yaml", 0o644, package)
                    .annotation("io.crossplane.xpkg", "base"),
            )
            .push(registry, name)
            .reference
    }

    /// Pushes the function as a real xpkg, as its release is made: the
    /// runtime image ([`PeerFunction::image`]'s, pushed as `NAME-runtime`)
    /// saved as a tarball by skopeo, `crossplane xpkg build
    /// --embed-runtime-image-tarball` with `package.yaml` as the package's
    /// `crossplane.yaml`, `crossplane xpkg push` as `name` (`repo:semver`).
    /// Returns its reference.
    pub fn xpkg(&self, registry: &Registry, name: &str) -> String {
        let (repo, tag) = name.split_once(':').expect("an xpkg name is repo:tag");
        let runtime = self
            .runtime_image()
            .push(registry, &format!("{repo}-runtime:{tag}"))
            .reference;
        let work = tempfile::tempdir().expect("a directory for the xpkg");
        let tarball = work.path().join("runtime.tar");
        let root = work.path().join("package");
        let xpkg = work.path().join("function.xpkg");
        std::fs::create_dir(&root).expect("the package root");
        std::fs::copy(self.dir.join("package.yaml"), root.join("crossplane.yaml"))
            .expect("copy the peer's package.yaml");
        let run = |program: &Path, args: &[&std::ffi::OsStr]| {
            let out = std::process::Command::new(program)
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
            assert!(
                out.status.success(),
                "{} {args:?}: {}",
                program.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let archive = format!("docker-archive:{}", tarball.display());
        let source = format!("docker://{runtime}");
        run(
            Path::new("skopeo"),
            &[
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                &source,
                &archive,
            ]
            .map(AsRef::as_ref),
        );
        let cli = binary("crossplane");
        run(
            &cli,
            &[
                "xpkg".as_ref(),
                "build".as_ref(),
                "--package-root".as_ref(),
                root.as_os_str(),
                "--embed-runtime-image-tarball".as_ref(),
                tarball.as_os_str(),
                "-o".as_ref(),
                xpkg.as_os_str(),
            ],
        );
        let reference = registry.reference(name);
        run(
            &cli,
            &[
                "xpkg".as_ref(),
                "push".as_ref(),
                "-f".as_ref(),
                xpkg.as_os_str(),
                reference.as_ref(),
            ],
        );
        reference
    }
}

/// One resource's verdict in `crossplane resource validate -o json`:
/// `(apiVersion, kind, name, status)`, status `valid`, `invalid`,
/// `missingSchema` or `defaultingFailed`.
pub type Verdict = (String, String, String, String);

/// What `crossplane resource validate` (the CLI's `beta validate` before
/// v2.5) says of `resources` against `extensions` (comma-separated, as the
/// CLI takes them): its exit code and each resource's verdict, in order.
/// Offline: a fresh `--cache-dir` and no Crossplane image to fetch, so give
/// it only CRDs, XRDs and documents it skips (no Provider, Function or
/// Configuration, whose packages it would download).
pub fn crossplane_validate(
    extensions: &str,
    resources: &Path,
    flags: &[&str],
) -> (Option<i32>, Vec<Verdict>) {
    let cache = tempfile::tempdir().expect("a cache dir for crossplane");
    let out = std::process::Command::new(binary("crossplane"))
        .args(["resource", "validate", "-o", "json", "--crossplane-image="])
        .arg("--cache-dir")
        .arg(cache.path())
        .args(flags)
        .arg(extensions)
        .arg(resources)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run crossplane resource validate");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "crossplane resource validate printed no JSON report ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let field = |r: &serde_json::Value, k: &str| r[k].as_str().unwrap_or_default().to_string();
    let verdicts = report["resources"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|r| {
            (
                field(r, "apiVersion"),
                field(r, "kind"),
                field(r, "name"),
                field(r, "status"),
            )
        })
        .collect();
    (out.status.code(), verdicts)
}
