//! The seccomp profile compiled to BPF once, instead of by crun on every
//! call.
//!
//! # Why
//! crun turns the profile's JSON into a BPF program with libseccomp each time
//! it starts a container: about a tenth of its CPU per call here (Debian's
//! crun is built without the libgcrypt checksum its own cache needs; see
//! benches/PROFILE.md). crun also takes a program already compiled, base64
//! in the `run.oci.seccomp_bpf_data` annotation, and then loads it as is.
//!
//! # How
//! The compiler is crun's own: xfn creates one probe container (never
//! started) from the same spec a run gets, reads the `seccomp.bpf` crun
//! wrote into the container's state dir for its init to load, and deletes
//! the container. So the program is exactly the one crun would have built
//! for every call. It is kept in `<run dir>/seccomp-<key>.bpf`, keyed by the
//! profile, the crun binary and the kernel (and boot), so a one-shot `xfn
//! run` probes once per boot, not per run. Anything unexpected (another
//! runtime, another state layout) only means no annotation: crun then
//! compiles the profile, which stays in the spec, as before.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use base64::Engine;
use sha2::{Digest, Sha256};

use super::{spec, Sandbox};

/// The file in the probe's rootfs named as its process: crun checks the
/// executable exists when creating; it is never run.
const PROBE_EXECUTABLE: &str = "xfn-seccomp-probe";

impl Sandbox {
    /// The default profile as BPF, base64, from the cache or a probe; `None`
    /// when it cannot be had (then crun compiles the profile per call).
    pub(super) fn precompiled_seccomp(&self) -> Option<String> {
        let cache = self.seccomp_cache_file()?;
        let bpf = match std::fs::read(&cache) {
            Ok(bpf) if is_bpf(&bpf) => bpf,
            _ => {
                let bpf = self
                    .compile_with_crun()
                    .map_err(|why| {
                        tracing::debug!(%why, "no precompiled seccomp filter; crun compiles it per run")
                    })
                    .ok()?;
                remember(&cache, &bpf, &self.options.instance.temp_name("seccomp-"));
                bpf
            }
        };
        Some(base64::engine::general_purpose::STANDARD.encode(bpf))
    }

    /// `<run dir>/seccomp-<key>.bpf`, the key naming everything the program
    /// depends on.
    fn seccomp_cache_file(&self) -> Option<PathBuf> {
        let binary = super::crun::resolve_binary(&self.crun.binary)?;
        let meta = std::fs::metadata(&binary).ok()?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos());
        let kernel = |name: &str| {
            std::fs::read_to_string(Path::new("/proc/sys/kernel").join(name)).unwrap_or_default()
        };
        // The ABIs named depend on the kernel too (`seccomp::x32_runs`).
        let abis = format!(
            "{:?}",
            super::seccomp::profile().map(|p| p.architectures().clone())
        );
        let mut key = Sha256::new();
        for part in [
            super::seccomp::PROFILE_JSON.as_bytes(),
            abis.as_bytes(),
            binary.as_os_str().as_encoded_bytes(),
            format!("{} {mtime:?}", meta.len()).as_bytes(),
            kernel("osrelease").as_bytes(),
            kernel("version").as_bytes(),
            kernel("random/boot_id").as_bytes(),
        ] {
            key.update(part);
            key.update([0]);
        }
        let key = hex::encode(&key.finalize()[..12]);
        Some(self.options.run_dir.join(format!("seccomp-{key}.bpf")))
    }

    /// Creates a probe container, takes the filter crun compiled for it and
    /// deletes it.
    fn compile_with_crun(&self) -> Result<Vec<u8>, String> {
        self.check_runtime().map_err(|e| e.to_string())?;
        let probe = tempfile::Builder::new()
            .prefix(&self.options.instance.temp_name("seccomp-probe-"))
            .tempdir_in(&self.options.run_dir)
            .map_err(|e| format!("probe dir: {e}"))?;
        let rootfs = probe.path().join("rootfs");
        std::fs::create_dir(&rootfs).map_err(|e| format!("probe rootfs: {e}"))?;
        // The container's root sets it up (mkdir /proc): it must own it.
        let root = self.function_ids.root();
        std::os::unix::fs::lchown(&rootfs, Some(root), Some(root))
            .map_err(|e| format!("probe rootfs: {e}"))?;
        let executable = rootfs.join(PROBE_EXECUTABLE);
        std::fs::write(&executable, b"").map_err(|e| format!("probe file: {e}"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&executable, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("probe file: {e}"))?;
        let image = oci_spec::image::ConfigBuilder::default()
            .cmd(vec![format!("/{PROBE_EXECUTABLE}")])
            .build()
            .map_err(|e| e.to_string())?;
        let (bundle, run_cgroup) = self
            .prepare_bundle(&self.spec_input(&super::ContainerRequest {
                rootfs: &rootfs,
                image: Some(&image),
                host_network: false,
                limits: spec::Limits::default(),
                cmd: None,
                env: &[],
            }))
            .map_err(|e| e.to_string())?;
        // Errors go to a file: the created container keeps crun's stdio
        // open, so a pipe would never reach its end.
        let log_path = probe.path().join("crun.log");
        let log = std::fs::File::create(&log_path).map_err(|e| format!("probe log: {e}"))?;
        let created = crate::fork_lock::status(
            self.crun
                .std_command()
                .arg("create")
                .arg("--bundle")
                .arg(&bundle.dir)
                .arg("--no-new-keyring")
                .arg(&bundle.id)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log),
        )
        .map_err(|e| format!("crun create: {e}"))?;
        let bpf = std::fs::read(self.crun.state_root.join(&bundle.id).join("seccomp.bpf"));
        super::crun::delete_sync(&self.crun, &bundle.id);
        drop(run_cgroup);
        drop(bundle);
        if !created.success() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(format!("crun create: {}", log.trim()));
        }
        let bpf = bpf.map_err(|e| format!("reading the filter crun compiled: {e}"))?;
        if !is_bpf(&bpf) {
            return Err(format!("{} bytes are not a BPF program", bpf.len()));
        }
        Ok(bpf)
    }
}

/// A classic BPF program: whole 8-byte instructions, at least one.
fn is_bpf(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.len() % 8 == 0
}

/// Writes `bpf` to `cache` through a temp file and a rename, so that a
/// concurrent reader never sees half of it. Failing costs only a probe.
fn remember(cache: &Path, bpf: &[u8], temp_prefix: &str) {
    let Some(dir) = cache.parent() else {
        return;
    };
    let Ok(mut temp) = tempfile::Builder::new()
        .prefix(temp_prefix)
        .tempfile_in(dir)
    else {
        return;
    };
    if temp.write_all(bpf).is_ok() {
        let _ = temp.persist(cache);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_instructions_are_a_program() {
        assert!(is_bpf(&[0; 16]));
        assert!(!is_bpf(&[]));
        assert!(!is_bpf(&[0; 12]));
    }
}
