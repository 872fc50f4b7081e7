//! The OCI runtime xfn finds must be crun, at least [`MIN_CRUN`]: checked
//! once per process, before its first container, so that a missing, foreign
//! or old runtime is named with the version found and the version needed,
//! rather than failing later on a flag or spec field it does not know.
//!
//! Why 1.8.1: it is the oldest crun xfn is tested with (Debian bookworm's,
//! the one `runtime/install.sh` pins in the runner image). xfn relies on
//! `--cgroup-manager=disabled` (hybrid hosts), `run --no-new-keyring`,
//! cgroup v2 limits through the cgroupfs manager and the seccomp and
//! masked-path parts of the spec it writes; older versions are not tested,
//! so they are refused. To raise it, see `runtime/README.md`.
//!
//! `RUNTIME --version` costs a process (a few ms, as much as a warm run),
//! so the accepted version is remembered in the run dir, keyed by the
//! binary's path, inode, size and modification time: `xfn run` pays the
//! check once per crun binary, not per call. A refusal is never remembered.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The oldest crun xfn runs with.
pub(crate) const MIN_CRUN: CrunVersion = CrunVersion {
    major: 1,
    minor: 8,
    patch: 1,
};

/// Errors of the runtime check (strings, so one verdict can be shared).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The runtime could not be started.
    #[error("cannot run the OCI runtime {runtime}: {reason}; xfn needs crun {MIN_CRUN} or newer (see runtime/README.md)")]
    Missing {
        /// The runtime as configured (`--runtime`).
        runtime: PathBuf,
        /// Why it could not be run.
        reason: String,
    },
    /// `--version` did not say `crun version X.Y[.Z]`.
    #[error("the OCI runtime {runtime} is not crun (`{runtime} --version` said {said:?}); xfn needs crun {MIN_CRUN} or newer (see runtime/README.md)")]
    NotCrun {
        /// The runtime as configured.
        runtime: PathBuf,
        /// The first line it printed.
        said: String,
    },
    /// crun, but too old.
    #[error("the OCI runtime {runtime} is crun {found}; xfn needs crun {needed} or newer (see runtime/README.md)")]
    TooOld {
        /// The runtime as configured.
        runtime: PathBuf,
        /// The version it reported.
        found: CrunVersion,
        /// [`MIN_CRUN`].
        needed: CrunVersion,
    },
}

/// A crun version (missing parts are 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CrunVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl std::fmt::Display for CrunVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl CrunVersion {
    /// Parses `X.Y[.Z]`, ignoring anything after the numbers (`1.8.1-dirty`).
    pub fn parse(text: &str) -> Option<Self> {
        let numbers = text
            .split(|c: char| !c.is_ascii_digit() && c != '.')
            .next()?;
        let mut parts = numbers.split('.').map(|p| p.parse::<u32>());
        let major = parts.next()?.ok()?;
        let minor = parts.next()?.ok()?;
        let patch = parts.next().and_then(Result::ok).unwrap_or(0);
        Some(Self {
            major,
            minor,
            patch,
        })
    }
}

/// The verdict on `--version` output of `runtime`.
pub(crate) fn judge(runtime: &Path, version_output: &str) -> Result<CrunVersion, RuntimeError> {
    let first = version_output.lines().next().unwrap_or("").trim();
    let found = first
        .strip_prefix("crun version ")
        .and_then(CrunVersion::parse)
        .ok_or_else(|| RuntimeError::NotCrun {
            runtime: runtime.to_path_buf(),
            said: first.to_string(),
        })?;
    if found < MIN_CRUN {
        return Err(RuntimeError::TooOld {
            runtime: runtime.to_path_buf(),
            found,
            needed: MIN_CRUN,
        });
    }
    Ok(found)
}

/// Checks `runtime` (a path, or a name looked up in PATH), remembering an
/// accepted version in `run_dir` (written as `instance`'s temp entry first).
pub(crate) fn check(
    runtime: &Path,
    run_dir: &Path,
    instance: &crate::instance::Instance,
) -> Result<CrunVersion, RuntimeError> {
    // Named as missing when it is: spawning a name PATH lacks can fail with
    // EACCES instead (a PATH dir the mapped uid cannot search).
    let Some(path) = super::crun::resolve_binary(runtime) else {
        return Err(RuntimeError::Missing {
            runtime: runtime.to_path_buf(),
            reason: if runtime.as_os_str().as_encoded_bytes().contains(&b'/') {
                "no such file".to_string()
            } else {
                "not found in PATH".to_string()
            },
        });
    };
    let key = std::fs::metadata(&path).ok().map(|meta| {
        format!(
            "{} {} {} {}.{}",
            path.display(),
            meta.ino(),
            meta.size(),
            meta.mtime(),
            meta.mtime_nsec()
        )
    });
    let memo = run_dir.join("runtime-version");
    if let (Some(key), Ok(text)) = (&key, std::fs::read_to_string(&memo)) {
        if let Some(version) = text
            .strip_prefix(key.as_str())
            .and_then(|rest| CrunVersion::parse(rest.trim()))
        {
            return Ok(version);
        }
    }
    let output = crate::fork_lock::output(
        std::process::Command::new(runtime)
            .arg("--version")
            .stdin(std::process::Stdio::null()),
    )
    .map_err(|e| RuntimeError::Missing {
        runtime: runtime.to_path_buf(),
        reason: e.to_string(),
    })?;
    let version = judge(runtime, &String::from_utf8_lossy(&output.stdout))?;
    if let Some(key) = key {
        // A temp name renamed into place: concurrent xfn processes never
        // read half a file. Failing to remember only costs the next check.
        let temp = run_dir.join(instance.temp_name("runtime-version"));
        if std::fs::write(&temp, format!("{key} {version}\n")).is_ok() {
            let _ = std::fs::rename(&temp, &memo);
        }
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRUN_1_8_1: &str = "crun version 1.8.1\ncommit: f8a096be060b22ccd3d5f3ebe44108517fbf6c30\nrundir: /run/crun\nspec: 1.0.0\n+SYSTEMD +SELINUX +APPARMOR +CAP +SECCOMP +EBPF +YAJL\n";

    fn instance(cache: &Path) -> std::sync::Arc<crate::instance::Instance> {
        crate::instance::of_cache(cache).unwrap()
    }

    fn v(major: u32, minor: u32, patch: u32) -> CrunVersion {
        CrunVersion {
            major,
            minor,
            patch,
        }
    }

    #[test]
    fn debian_bookworms_crun_is_accepted() {
        assert_eq!(judge(Path::new("crun"), CRUN_1_8_1), Ok(v(1, 8, 1)));
    }

    #[test]
    fn newer_versions_compare_numerically_not_as_text() {
        assert_eq!(
            judge(Path::new("crun"), "crun version 1.14\ncommit: x\n"),
            Ok(v(1, 14, 0))
        );
        assert_eq!(
            judge(Path::new("crun"), "crun version 1.10.2-dirty\n"),
            Ok(v(1, 10, 2))
        );
    }

    #[test]
    fn an_old_crun_is_refused_naming_both_versions() {
        let err = judge(Path::new("/usr/bin/crun"), "crun version 0.17\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the OCI runtime /usr/bin/crun is crun 0.17.0; xfn needs crun 1.8.1 or newer (see runtime/README.md)"
        );
        assert!(judge(Path::new("crun"), "crun version 1.8.0\n").is_err());
    }

    #[test]
    fn another_runtime_is_refused_quoting_what_it_said() {
        let err = judge(Path::new("runc"), "runc version 1.1.12\ncommit: v1.1.12\n").unwrap_err();
        assert!(
            err.to_string().contains("is not crun")
                && err.to_string().contains("runc version 1.1.12"),
            "{err}"
        );
        assert!(matches!(
            judge(Path::new("/bin/false"), ""),
            Err(RuntimeError::NotCrun { .. })
        ));
    }

    #[test]
    fn the_crun_the_image_pins_is_new_enough() {
        let install = include_str!("../../runtime/install.sh");
        let pinned = install
            .lines()
            .find_map(|l| l.strip_prefix("CRUN_VERSION="))
            .expect("runtime/install.sh pins CRUN_VERSION");
        let version = CrunVersion::parse(pinned).expect("a Debian version X.Y.Z-...");
        assert!(version >= MIN_CRUN, "runtime/install.sh pins {pinned}");
    }

    #[test]
    fn an_accepted_version_is_remembered_per_binary_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("crun");
        std::fs::write(&fake, "#!/bin/sh\necho crun version 1.9.0\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        assert_eq!(
            check(&fake, dir.path(), &instance(dir.path())),
            Ok(v(1, 9, 0))
        );
        let memo = std::fs::read_to_string(dir.path().join("runtime-version")).unwrap();
        assert!(memo.ends_with(" 1.9.0\n"), "{memo}");
        // Replaced by an older binary (another size and mtime): checked again.
        std::fs::write(&fake, "#!/bin/sh\necho crun version 1.2.3 # older\n").unwrap();
        assert!(matches!(
            check(&fake, dir.path(), &instance(dir.path())),
            Err(RuntimeError::TooOld { .. })
        ));
        let missing = check(
            &dir.path().join("no-such-crun"),
            dir.path(),
            &instance(dir.path()),
        )
        .unwrap_err();
        assert!(
            missing.to_string().contains("cannot run the OCI runtime")
                && missing.to_string().contains("no such file"),
            "{missing}"
        );
        let unknown = check(
            Path::new("no-such-runtime-in-path"),
            dir.path(),
            &instance(dir.path()),
        )
        .unwrap_err();
        assert!(
            unknown.to_string().contains("not found in PATH"),
            "{unknown}"
        );
    }
}
