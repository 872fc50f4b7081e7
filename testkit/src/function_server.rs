//! The gRPC composition function server of `tests/fixtures/fn_server.rs` (the
//! Rust twin of `tests/render/function.py`), linked statically so that it
//! runs in a busybox image, which has no libc:
//!
//! - [`function_server_binary`]: the static binary, built on demand.
//! - [`function_server_image`]: busybox + `/fn_server`, pushed.
//! - [`FunctionServer`]: a running server on 127.0.0.1, killed on drop.
//!
//! Static linking: `cargo rustc --example fn_server -- -C
//! target-feature=+crt-static`. The flag applies to the example's own
//! compile and link only (its dependencies are the same ones every other
//! target uses, so nothing else rebuilds), and cargo hashes `cargo rustc`'s
//! extra flags into the unit's identity: this static unit and the dynamic
//! one `cargo test` builds of every example keep separate fingerprints and
//! never rebuild each other. They do share the uplifted
//! `target/<profile>/examples/fn_server`, so the static one is copied out of
//! it right after its build.
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::image::ImageBuilder;
use super::layer::{Compression, Layer};
use super::registry::Registry;

/// The static `fn_server`, built (or found fresh: cargo decides) once per
/// test process. Panics, saying what to do, when it cannot be built or does
/// not come out static.
pub fn function_server_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(build_static).clone()
}

fn build_static() -> PathBuf {
    // The test binaries and `xfn` live in target[/<triple>]/<profile dir>/:
    // build into the same target dir with the same profile, so the
    // dependencies are the ones already built.
    let xfn = crate::xfn_binary();
    let profile_dir = xfn.parent().expect("xfn is in a profile dir");
    let mut target_dir = profile_dir
        .parent()
        .expect("a profile dir is in a target dir");
    let mut triple = None;
    // cargo keeps its rustc info cache (and, in a dir it made, a
    // CACHEDIR.TAG) in the target dir's root; a dir under it is `--target`'s.
    let is_root =
        |dir: &Path| dir.join(".rustc_info.json").exists() || dir.join("CACHEDIR.TAG").exists();
    if let Some(parent) = target_dir
        .parent()
        .filter(|parent| !is_root(target_dir) && is_root(parent))
    {
        triple = target_dir.file_name();
        target_dir = parent;
    }
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => panic!("odd profile dir {}", profile_dir.display()),
    };
    // `cargo test` sets CARGO for the tests it runs; a test binary run by
    // hand finds cargo on PATH.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    command
        .args([
            "rustc",
            "--quiet",
            "--example",
            "fn_server",
            "--profile",
            profile,
        ])
        .arg("--manifest-path")
        .arg(crate::repo_root().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    if let Some(triple) = triple {
        command.arg("--target").arg(triple);
    }
    // crt-static: a static-pie with glibc's static libraries. Without debug
    // info the debug build is ~17 MB instead of ~160 MB, which matters for
    // the image layer.
    command.args([
        "--",
        "-C",
        "target-feature=+crt-static",
        "-C",
        "strip=debuginfo",
    ]);
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cargo.to_string_lossy()));
    assert!(
        out.status.success(),
        "building the static fn_server failed ({:?}): {}\n\
         It needs glibc's static libraries (Debian package libc6-dev).",
        command,
        String::from_utf8_lossy(&out.stderr)
    );

    // Copy it out of the shared uplifted path (see the module docs), via a
    // rename so no reader ever sees half a file.
    let built = profile_dir.join("examples/fn_server");
    let dir = profile_dir.join("fn-server-static");
    std::fs::create_dir_all(&dir).expect("create fn-server-static dir");
    let binary = dir.join("fn_server");
    let partial = dir.join(format!("fn_server.{}", std::process::id()));
    std::fs::copy(&built, &partial).unwrap_or_else(|e| panic!("copy {}: {e}", built.display()));
    std::fs::rename(&partial, &binary).expect("rename the static fn_server into place");
    if let Err(why) = check_static(&binary) {
        panic!(
            "{} is not statically linked: {why}. Another cargo may have rebuilt the \
             dynamic examples/fn_server at the same moment: run the test again. Otherwise \
             check that `cargo rustc --example fn_server -- -C target-feature=+crt-static` \
             links statically here (glibc static libs: Debian libc6-dev).",
            binary.display()
        );
    }
    binary
}

/// Whether the ELF file at `path` runs without a dynamic loader or shared
/// libraries: no `PT_INTERP`, and no `DT_NEEDED` in its `PT_DYNAMIC` (which a
/// static-pie still has, for its self-relocation).
pub fn check_static(path: &Path) -> Result<(), String> {
    let elf = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    // 64-bit little-endian ELF, as every target these tests run on.
    if elf.get(..6) != Some(b"\x7fELF\x02\x01") {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let truncated = || "truncated ELF file".to_string();
    let phoff = u64_at(0x20).ok_or_else(truncated)? as usize;
    let phentsize = usize::from(u16_at(0x36).ok_or_else(truncated)?);
    let phnum = usize::from(u16_at(0x38).ok_or_else(truncated)?);
    for header in (0..phnum).map(|i| phoff + i * phentsize) {
        const PT_DYNAMIC: u32 = 2;
        const PT_INTERP: u32 = 3;
        match u32_at(header).ok_or_else(truncated)? {
            PT_INTERP => return Err("it names a dynamic loader (PT_INTERP)".into()),
            PT_DYNAMIC => {
                let offset = u64_at(header + 8).ok_or_else(truncated)? as usize;
                let size = u64_at(header + 32).ok_or_else(truncated)? as usize;
                for entry in (offset..offset + size).step_by(16) {
                    const DT_NULL: u64 = 0;
                    const DT_NEEDED: u64 = 1;
                    match u64_at(entry).ok_or_else(truncated)? {
                        DT_NULL => break,
                        DT_NEEDED => return Err("it needs shared libraries (DT_NEEDED)".into()),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Pushes busybox + `/fn_server` as `name` (`repo:tag`) to `registry`, with
/// entrypoint `["/fn_server", entrypoint_args...]` and no Cmd: a runtime
/// appends its own flags (`--insecure`, as `crossplane render`'s Docker
/// runtime does). Returns the pushed reference.
pub fn function_server_image(registry: &Registry, name: &str, entrypoint_args: &[&str]) -> String {
    function_server_builder(entrypoint_args)
        .push(registry, name)
        .reference
}

/// As [`function_server_image`], its server writing no line per call
/// (`FN_SERVER_QUIET=1` in its config's `Env`): then a call wakes nothing in
/// xfn that reads the server's output, only what carries the call.
pub fn quiet_function_server_image(
    registry: &Registry,
    name: &str,
    entrypoint_args: &[&str],
) -> String {
    function_server_builder(entrypoint_args)
        .with_env("FN_SERVER_QUIET=1")
        .push(registry, name)
        .reference
}

/// busybox + `/fn_server`, its entrypoint `["/fn_server", entrypoint_args...]`.
fn function_server_builder(entrypoint_args: &[&str]) -> ImageBuilder {
    let binary = std::fs::read(function_server_binary()).expect("read the static fn_server");
    let entrypoint = std::iter::once("/fn_server").chain(entrypoint_args.iter().copied());
    ImageBuilder::new()
        .layer(Layer::busybox())
        // Uncompressed: gzip of 17 MB by the unoptimised test build takes
        // seconds, and the registry is on loopback.
        .layer(
            Layer::new()
                .compression(Compression::None)
                .file("/fn_server", 0o755, binary),
        )
        .entrypoint(entrypoint)
}

/// A function server on 127.0.0.1 (stderr kept for [`FunctionServer::log`]),
/// killed on drop.
pub struct FunctionServer {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub address: String,
    log: tempfile::NamedTempFile,
}

impl FunctionServer {
    /// The static binary with `args`, listening on a free port.
    pub fn start(args: &[&str]) -> FunctionServer {
        let mut command = Command::new(function_server_binary());
        command.args(args);
        FunctionServer::start_command(command)
    }

    /// `command` (which runs `fn_server`, possibly through a wrapper such as
    /// `chroot`) with `--insecure --address 127.0.0.1:PORT` appended; returns
    /// once it listens.
    pub fn start_command(mut command: Command) -> FunctionServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("pick a free port")
            .port();
        let address = format!("127.0.0.1:{port}");
        let log = tempfile::NamedTempFile::new().expect("log file");
        let child = command
            .args(["--insecure", "--address", &address])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("reopen log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
        let mut server = FunctionServer {
            child,
            address,
            log,
        };
        let started = Instant::now();
        while TcpStream::connect(&server.address).is_err() {
            if let Some(status) = server.child.try_wait().expect("wait for fn_server") {
                panic!("fn_server exited: {status}: {}", server.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "fn_server never listened on {}: {}",
                server.address,
                server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// What it wrote to stderr so far (one line per call).
    pub fn log(&self) -> String {
        let mut text = String::new();
        self.log
            .reopen()
            .and_then(|mut f| f.read_to_string(&mut text))
            .expect("read fn_server's log");
        text
    }

    /// Sends SIGTERM and waits (at most `timeout`) for it to exit.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM fn_server");
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for fn_server") {
                return status;
            }
            assert!(
                started.elapsed() < timeout,
                "fn_server did not exit within {timeout:?} of SIGTERM: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for FunctionServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `RunFunction` calls fn_server logged, by service version.
pub fn calls_by_version(log: &str) -> (usize, usize) {
    (
        log.matches("fn_server: v1 RunFunction").count(),
        log.matches("fn_server: v1beta1 RunFunction").count(),
    )
}
