//! The seccomp profile every function runs under: `seccomp/default.json`,
//! embedded in the binary (see `seccomp/README.md` for each syscall group).
//!
//! Choice: **an allow-list whose default is ENOSYS, with an explicit EPERM
//! list**, as containers/common (podman) does, rather than Docker's default
//! of EPERM for everything unlisted. A syscall newer than the profile is
//! answered as if the kernel lacked it, so libcs fall back to the older call
//! (glibc tries clone3, faccessat2, fchmodat2, … and falls back on ENOSYS,
//! not on EPERM); the syscalls refused on purpose (mounts, namespaces,
//! keyrings, BPF, kexec, …) answer EPERM, as a kernel would to a caller
//! without the privilege, so a program reports "not permitted" instead of
//! looking for a fallback.
//!
//! The file is OCI `linux.seccomp` JSON with two keys of xfn's own per rule:
//! `comment` (the group's documentation) and `arches` (Rust
//! `target_arch` names the rule is for; absent: every arch). The
//! `architectures` are filled in here for the arch xfn runs on, with the
//! compat ABIs the kernel also accepts (x86-64: also x86, and x32 where the
//! kernel runs it; aarch64: also arm), as Docker's `archMap` does: naming
//! only those keeps the filter small.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/sandbox/seccomp.rs`.
use std::sync::{Arc, LazyLock};

use oci_spec::runtime::{Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSyscall};
use serde::Deserialize;

/// The profile as written in `seccomp/default.json`.
pub(crate) const PROFILE_JSON: &str = include_str!("../../seccomp/default.json");

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Profile {
    default_action: LinuxSeccompAction,
    default_errno_ret: Option<u32>,
    syscalls: Vec<Rule>,
}

#[derive(Deserialize)]
struct Rule {
    /// Rust `target_arch` names this rule applies to (absent: all).
    arches: Option<Vec<String>>,
    #[serde(flatten)]
    syscall: LinuxSyscall,
}

/// Parsed once per process; the error shared (an `Arc`) by every run that
/// asks, as the source of its own.
static PROFILE: LazyLock<Result<LinuxSeccomp, Arc<serde_json::Error>>> = LazyLock::new(|| {
    profile_for(PROFILE_JSON, std::env::consts::ARCH, x32_runs()).map_err(Arc::new)
});

/// The functions' profile for this machine's arch (parsed once per process).
pub(crate) fn profile() -> Result<LinuxSeccomp, Arc<serde_json::Error>> {
    PROFILE.clone()
}

/// `json` as an OCI profile for `arch` (a Rust `target_arch` name), naming
/// x32 among its ABIs if `x32` (the kernel runs x32 syscalls).
fn profile_for(json: &str, arch: &str, x32: bool) -> Result<LinuxSeccomp, serde_json::Error> {
    let profile: Profile = serde_json::from_str(json)?;
    let syscalls: Vec<LinuxSyscall> = profile
        .syscalls
        .into_iter()
        .filter(|rule| {
            rule.arches
                .as_ref()
                .is_none_or(|arches| arches.iter().any(|a| a == arch))
        })
        .map(|rule| rule.syscall)
        .collect();
    let mut seccomp = LinuxSeccomp::default();
    seccomp
        .set_default_action(profile.default_action)
        .set_default_errno_ret(profile.default_errno_ret)
        .set_architectures(architectures(arch, x32))
        .set_syscalls(Some(syscalls));
    Ok(seccomp)
}

/// The ABIs a process on `arch` can make syscalls with; None (the native
/// one only) for arches without compat ABIs.
fn architectures(arch: &str, x32: bool) -> Option<Vec<Arch>> {
    match arch {
        "x86_64" if x32 => Some(vec![
            Arch::ScmpArchX86_64,
            Arch::ScmpArchX86,
            Arch::ScmpArchX32,
        ]),
        "x86_64" => Some(vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86]),
        "aarch64" => Some(vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm]),
        _ => None,
    }
}

/// Whether this kernel runs x32 syscalls: a child makes one (`getpid`
/// with the x32 bit) and says whether it was answered. In a child, so that
/// a filter of xfn's own pod that kills on an arch it does not name kills
/// the child only (then no function could make one either).
#[cfg(target_arch = "x86_64")]
pub(crate) fn x32_runs() -> bool {
    const X32_SYSCALL_BIT: libc::c_long = 0x4000_0000;
    crate::fork_lock::run_forked(|| {
        // SAFETY: getpid takes no arguments; on a kernel without x32 it
        // fails with ENOSYS, which is the answer sought.
        let answered = unsafe { libc::syscall(X32_SYSCALL_BIT | libc::SYS_getpid) } > 0;
        i32::from(!answered)
    })
    // Unknown: name it, as Docker does.
    .map_or(true, |code| code == 0)
}

/// No x32 off x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn x32_runs() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn names_with(profile: &LinuxSeccomp, keep: impl Fn(&LinuxSyscall) -> bool) -> HashSet<String> {
        profile
            .syscalls()
            .iter()
            .flatten()
            .filter(|s| keep(s))
            .flat_map(|s| s.names().iter().cloned())
            .collect()
    }

    fn refused(profile: &LinuxSeccomp) -> HashSet<String> {
        names_with(profile, |s| {
            s.action() == LinuxSeccompAction::ScmpActErrno
                && s.errno_ret() == Some(1)
                && s.args().is_none()
        })
    }

    #[test]
    fn the_profile_is_an_allow_list_answering_enosys_by_default() {
        let profile = profile().unwrap();
        assert_eq!(profile.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(profile.default_errno_ret(), Some(38));
        let allowed = names_with(&profile, |s| s.action() == LinuxSeccompAction::ScmpActAllow);
        for everyday in [
            "read",
            "write",
            "openat",
            "execve",
            "futex",
            "mmap",
            "exit_group",
        ] {
            assert!(allowed.contains(everyday), "{everyday}");
        }
        assert!(allowed.len() > 300, "{}", allowed.len());
    }

    /// Everything the deny-list before it refused stays refused.
    #[test]
    fn every_syscall_the_old_deny_list_refused_is_still_refused() {
        let old = [
            "acct",
            "add_key",
            "adjtimex",
            "afs_syscall",
            "bpf",
            "clock_adjtime",
            "clock_settime",
            "create_module",
            "delete_module",
            "fanotify_init",
            "finit_module",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "get_kernel_syms",
            "init_module",
            "io_uring_enter",
            "io_uring_register",
            "io_uring_setup",
            "ioperm",
            "iopl",
            "kcmp",
            "kexec_file_load",
            "kexec_load",
            "keyctl",
            "lookup_dcookie",
            "mbind",
            "migrate_pages",
            "mount",
            "mount_setattr",
            "move_mount",
            "move_pages",
            "name_to_handle_at",
            "nfsservctl",
            "open_by_handle_at",
            "open_tree",
            "perf_event_open",
            "pivot_root",
            "process_madvise",
            "process_vm_readv",
            "process_vm_writev",
            "ptrace",
            "query_module",
            "quotactl",
            "quotactl_fd",
            "reboot",
            "request_key",
            "set_mempolicy",
            "setns",
            "settimeofday",
            "stime",
            "swapoff",
            "swapon",
            "sysfs",
            "_sysctl",
            "syslog",
            "umount",
            "umount2",
            "unshare",
            "uselib",
            "userfaultfd",
            "ustat",
            "vhangup",
            "vm86",
            "vm86old",
            "open_tree_attr",
            "lsm_set_self_attr",
        ];
        let profile = profile().unwrap();
        let refused = refused(&profile);
        let allowed = names_with(&profile, |s| s.action() == LinuxSeccompAction::ScmpActAllow);
        for name in old {
            assert!(refused.contains(name), "{name} is not refused with EPERM");
            assert!(!allowed.contains(name), "{name} is allowed");
        }
    }

    #[test]
    fn no_syscall_is_both_allowed_unconditionally_and_refused() {
        let profile = profile().unwrap();
        let plain_allowed = names_with(&profile, |s| {
            s.action() == LinuxSeccompAction::ScmpActAllow && s.args().is_none()
        });
        let refused = refused(&profile);
        let both: Vec<_> = plain_allowed.intersection(&refused).collect();
        assert!(both.is_empty(), "{both:?}");
    }

    #[test]
    fn clone_is_allowed_only_without_namespace_flags_and_clone3_reports_enosys() {
        let profile = profile().unwrap();
        let rules: Vec<_> = profile
            .syscalls()
            .iter()
            .flatten()
            .filter(|s| s.names().iter().any(|n| n == "clone" || n == "clone3"))
            .collect();
        let allow = rules
            .iter()
            .find(|s| s.action() == LinuxSeccompAction::ScmpActAllow)
            .unwrap();
        let arg = allow.args().as_ref().unwrap()[0];
        assert_eq!((arg.index(), arg.value()), (0, 0x7E02_0000));
        let clone3 = rules.iter().find(|s| s.names() == &["clone3"]).unwrap();
        assert_eq!(clone3.errno_ret(), Some(38));
    }

    #[test]
    fn arch_specific_rules_go_only_to_their_arch() {
        let allowed = |arch| {
            names_with(&profile_for(PROFILE_JSON, arch, false).unwrap(), |s| {
                s.action() == LinuxSeccompAction::ScmpActAllow
            })
        };
        assert!(allowed("x86_64").contains("arch_prctl"));
        assert!(!allowed("x86_64").contains("set_tls"));
        assert!(allowed("aarch64").contains("set_tls"));
        assert!(!allowed("aarch64").contains("arch_prctl"));
        let abis = |x32| {
            profile_for(PROFILE_JSON, "x86_64", x32)
                .unwrap()
                .architectures()
                .clone()
                .unwrap()
        };
        assert_eq!(abis(false), [Arch::ScmpArchX86_64, Arch::ScmpArchX86]);
        assert_eq!(
            abis(true),
            [Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
        );
    }

    #[test]
    fn every_group_is_documented() {
        let raw: serde_json::Value = serde_json::from_str(PROFILE_JSON).unwrap();
        let rules = raw["syscalls"].as_array().unwrap();
        // A rule without a comment continues the group above it (e.g. the
        // second `socket` condition).
        assert!(rules[0]["comment"].is_string());
        let documented = rules.iter().filter(|r| r["comment"].is_string()).count();
        assert!(documented >= 15, "{documented} of {}", rules.len());
    }
}
