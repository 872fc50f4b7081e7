//! Building the OCI runtime spec (config.json) of one run from the image
//! config, the limits and the network policy, with xfn's hardening.
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use oci_spec::image::Config as ImageConfig;
use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxIdMappingBuilder,
    LinuxMemoryBuilder, LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder,
    LinuxResourcesBuilder, Mount, MountBuilder, PosixRlimit, PosixRlimitBuilder, PosixRlimitType,
    ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use super::user::{self, UserError};
use super::userns::FunctionIds;
use crate::quantity::{Quantity, QuantityError};

/// PATH used when the image sets none (Docker's default).
pub(crate) const DEFAULT_PATH: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The default pids limit of a run (processes and threads at once): a
/// function is one process, maybe a shell and a few helpers, with a thread
/// pool of one thread per CPU and tokio's or Go's blocking threads on top
/// (tokio caps those at 512), so 1024 fits every real function, even on a
/// 128-CPU node, and stops a fork bomb at a thousand sleeping tasks. It
/// holds with and without cgroups: `pids.max` where limits are enforced,
/// `RLIMIT_NPROC` where they are not (see `rlimits`).
pub const PIDS_LIMIT: i64 = 1024;

/// The default size of a run's `/tmp` (a tmpfs: memory, taken only as
/// written): room for any function's scratch files, a stop for one that
/// would fill the node's memory.
pub(crate) const TMP_SIZE: u64 = 128 << 20;

/// Errors of spec building.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The image names nothing to run.
    #[error("the image config has neither an Entrypoint nor a Cmd; there is nothing to run")]
    NothingToRun,
    /// The image's User cannot be resolved.
    #[error(transparent)]
    User(#[from] UserError),
    /// The embedded seccomp profile is broken (a build defect).
    #[error("the embedded seccomp profile is invalid")]
    Seccomp(#[source] std::sync::Arc<serde_json::Error>),
    /// oci-spec refused a value.
    #[error("cannot build the runtime spec")]
    Build(#[from] oci_spec::OciSpecError),
}

/// Resource limits of a run, already parsed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Limits {
    /// CPU in millicores.
    pub cpu_millis: Option<u64>,
    /// Memory in bytes.
    pub memory_bytes: Option<u64>,
    /// Most processes and threads at once; `None` takes the runner's
    /// (`--pids-limit`).
    pub pids: Option<i64>,
}

impl Limits {
    /// The limits given as Kubernetes quantities (`cpu`: `100m`, `0.5`, `2`;
    /// `memory`: `128Mi`, `1G`), either left out for none. Front ends call
    /// it where they read a request, so a bad quantity is refused there and
    /// no run ever sees text.
    pub fn parse(cpu: Option<&str>, memory: Option<&str>) -> Result<Self, QuantityError> {
        Ok(Self {
            cpu_millis: cpu.map(|q| Quantity::parse(q)?.millis()).transpose()?,
            memory_bytes: memory.map(|q| Quantity::parse(q)?.bytes()).transpose()?,
            pids: None,
        })
    }
}

/// Everything a spec is built from.
#[derive(Debug, Clone)]
pub(crate) struct SpecInput<'a> {
    /// The prepared, writable root filesystem of this run.
    pub(crate) rootfs: &'a Path,
    /// The image config's `config` section.
    pub(crate) image: Option<&'a ImageConfig>,
    /// Share xfn's network namespace (NetworkPolicy::Runner).
    pub(crate) host_network: bool,
    /// Limits.
    pub(crate) limits: Limits,
    /// Hostname of the container.
    pub(crate) hostname: &'a str,
    /// Most processes the run may have at once, unless `limits.pids` says.
    pub(crate) pids_limit: i64,
    /// The container's cgroup (`linux.cgroupsPath`), where limits are
    /// enforced through a delegated cgroup v2 subtree.
    pub(crate) cgroups_path: Option<&'a str>,
    /// Replaces the image's `Cmd` (its entrypoint stays), as `docker run
    /// IMAGE ARGS...` does: how a function image is started as a server.
    pub(crate) cmd: Option<&'a [String]>,
    /// `KEY=VALUE`s added to the image's environment (a key given again
    /// replaces the image's), as `docker run -e` does.
    pub(crate) env: &'a [String],
    /// The seccomp profile already compiled to BPF (base64), handed to crun
    /// in the `run.oci.seccomp_bpf_data` annotation so that it does not
    /// compile the profile again; the profile stays in the spec too, for
    /// runtimes that do not know the annotation.
    pub(crate) seccomp_bpf: Option<&'a str>,
    /// Size of the run's `/tmp` tmpfs, in bytes.
    pub(crate) tmp_size_bytes: u64,
    /// The ids of xfn's namespace functions run under (`userns.rs`): the
    /// run's user namespace maps the image's ids onto them.
    pub(crate) function_ids: FunctionIds,
}

/// The crun annotation that carries a precompiled seccomp filter.
pub(crate) const SECCOMP_BPF_ANNOTATION: &str = "run.oci.seccomp_bpf_data";

/// Builds the spec.
pub(crate) fn build(input: &SpecInput<'_>) -> Result<Spec, SpecError> {
    let empty = ImageConfig::default();
    let image = input.image.unwrap_or(&empty);

    let mut args: Vec<String> = image.entrypoint().clone().unwrap_or_default();
    match input.cmd {
        Some(cmd) => args.extend_from_slice(cmd),
        None => args.extend(image.cmd().clone().unwrap_or_default()),
    }
    if args.is_empty() {
        return Err(SpecError::NothingToRun);
    }
    let mut env: Vec<String> = image.env().clone().unwrap_or_default();
    for extra in input.env {
        let key = extra.split_once('=').map_or(extra.as_str(), |(k, _)| k);
        env.retain(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) != key);
        env.push(extra.clone());
    }
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.push(DEFAULT_PATH.to_string());
    }
    let pids_limit = input.limits.pids.unwrap_or(input.pids_limit);
    let cwd = match image.working_dir().as_deref() {
        Some(dir) if !dir.is_empty() => dir.to_string(),
        _ => "/".to_string(),
    };
    let user_field = image.user().as_deref().unwrap_or("");
    let resolved = user::resolve(user_field, input.rootfs)?;
    // crun leaves HOME unset where runc (Docker, Kubernetes) sets it from
    // the user's /etc/passwd entry, else `/`: functions expand `~`, and
    // Go's os.UserHomeDir fails without it.
    if !env.iter().any(|e| e.starts_with("HOME=")) {
        env.push(format!("HOME={}", resolved.home));
    }
    let mapped = user::map(user_field, resolved, input.function_ids)?;
    let user = UserBuilder::default()
        .uid(mapped.user.uid)
        .gid(mapped.user.gid)
        .additional_gids(mapped.user.additional_gids)
        .build()?;

    let caps = capabilities();
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .effective(caps.clone())
        .permitted(caps)
        .inheritable(HashSet::new())
        .ambient(HashSet::new())
        .build()?;
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(user)
        .args(args)
        .env(env)
        .cwd(PathBuf::from(cwd))
        .capabilities(capabilities)
        .no_new_privileges(true)
        .rlimits(rlimits(input.cgroups_path.is_none().then_some(pids_limit))?)
        .build()?;

    // A user namespace of its own first, over xfn's ids (one to one, or
    // xfn's one id as the image's user: user.rs): the run's capabilities
    // then stop at its own namespaces instead of reaching xfn's (its mount
    // namespace, where every run's rootfs is mounted).
    let mut namespaces = vec![
        LinuxNamespaceType::User,
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Cgroup,
    ];
    if !input.host_network {
        namespaces.push(LinuxNamespaceType::Network);
    }
    let namespaces = namespaces
        .into_iter()
        .map(|typ| LinuxNamespaceBuilder::default().typ(typ).build())
        .collect::<Result<Vec<_>, _>>()?;

    let seccomp = super::seccomp::profile().map_err(SpecError::Seccomp)?;
    let map = |container_id: u32| {
        LinuxIdMappingBuilder::default()
            .container_id(container_id)
            .host_id(mapped.host_base)
            .size(mapped.size)
            .build()
    };
    let mut linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .uid_mappings(vec![map(mapped.uid_base)?])
        .gid_mappings(vec![map(mapped.gid_base)?])
        .masked_paths(masked_paths())
        .readonly_paths(readonly_paths())
        .resources(resources(input.limits, pids_limit)?)
        .seccomp(seccomp);
    if let Some(path) = input.cgroups_path {
        linux = linux.cgroups_path(PathBuf::from(path));
    }
    let linux = linux.build()?;

    let mut spec = SpecBuilder::default();
    if let Some(bpf) = input.seccomp_bpf {
        spec = spec.annotations(
            [(SECCOMP_BPF_ANNOTATION.to_string(), bpf.to_string())]
                .into_iter()
                .collect::<std::collections::HashMap<_, _>>(),
        );
    }
    Ok(spec
        .version("1.0.2")
        .hostname(input.hostname.to_string())
        .root(
            RootBuilder::default()
                .path(input.rootfs.to_path_buf())
                // Each run's rootfs is its own (tmpfs upper or copy), so a
                // function may write to it; nothing outlives the run.
                .readonly(false)
                .build()?,
        )
        .mounts(mounts(input.host_network, input.tmp_size_bytes)?)
        .process(process)
        .linux(linux)
        .build()?)
}

/// The capabilities a function keeps: only what a process running as root
/// inside the container needs to manage its own files and processes:
/// CHOWN, DAC_OVERRIDE, FOWNER, FSETID (files in its own rootfs), KILL (its
/// own children), SETUID/SETGID (dropping to another user). No NET_RAW,
/// MKNOD, SYS_CHROOT, SETFCAP, SETPCAP, AUDIT_WRITE or NET_BIND_SERVICE:
/// functions talk over stdin/stdout and need none of them. All of these are
/// capabilities in xfn's user namespace only, never on the host.
fn capabilities() -> HashSet<Capability> {
    [
        Capability::Chown,
        Capability::DacOverride,
        Capability::Fowner,
        Capability::Fsetid,
        Capability::Kill,
        Capability::Setuid,
        Capability::Setgid,
    ]
    .into_iter()
    .collect()
}

/// The function's resource limits, which hold with or without cgroups:
/// - `RLIMIT_NOFILE` 65536: plenty of descriptors, not unbounded.
/// - `RLIMIT_CORE` 0: a crashing function writes no core file, and the
///   host's core handler (`core_pattern`, which runs outside every
///   namespace) is never fed a function's memory.
/// - `RLIMIT_NPROC` the pids limit (`nproc`), given where no cgroup
///   enforces `pids.max` (hybrid and v1 hosts, a read-only cgroupfs in a
///   pod): there this is what stops a fork bomb. Where a cgroup does,
///   `pids.max` alone holds, as it is exact (all uids, only the run's
///   tasks) while this count also holds a few tasks of crun's setting the
///   container up (6 to 8 here), which would make it bite first and hide
///   the cgroup's limit. The kernel (5.14+, `kernel/ucount.c`) counts a
///   task at its (user namespace, uid) against its own `RLIMIT_NPROC`, and
///   at every ancestor namespace under the uid that created the one below,
///   against the `RLIMIT_NPROC` that one was created with. crun sets this
///   limit before it creates the run's namespace, so the level above the
///   run holds every task of the run, whatever its uid, against this
///   limit; crun creates the run's namespace inside one made for the run
///   alone (`nproc.rs`), so that level counts this run and nothing of its
///   neighbours', and one function's bomb cannot fail another's fork.
///   The run's own level stops each of its uids at the limit too. Nothing
///   in the container can lift it: the only exemptions are
///   `CAP_SYS_RESOURCE`/`CAP_SYS_ADMIN` in the *initial* namespace and the
///   host's root uid, which no function holds or is mapped to.
///
/// Each is capped at xfn's own hard limit (no namespace can raise one).
///
/// RLIMIT_FSIZE is not set: every place a function can write is a sized
/// tmpfs, which answers ENOSPC; FSIZE would kill with SIGXFSZ instead.
fn rlimits(nproc: Option<i64>) -> Result<Vec<PosixRlimit>, SpecError> {
    use nix::sys::resource::{getrlimit, Resource};
    let capped = |resource, want: u64| {
        let hard = getrlimit(resource).map(|(_, hard)| hard).unwrap_or(want);
        want.min(hard)
    };
    let nproc = nproc.map(|limit| {
        (
            PosixRlimitType::RlimitNproc,
            capped(
                Resource::RLIMIT_NPROC,
                u64::try_from(limit).unwrap_or(1).max(1),
            ),
        )
    });
    [
        (
            PosixRlimitType::RlimitNofile,
            capped(Resource::RLIMIT_NOFILE, 65536),
        ),
        (PosixRlimitType::RlimitCore, 0),
    ]
    .into_iter()
    .chain(nproc)
    .map(|(typ, limit)| {
        Ok(PosixRlimitBuilder::default()
            .typ(typ)
            .soft(limit)
            .hard(limit)
            .build()?)
    })
    .collect()
}

fn masked_paths() -> Vec<String> {
    [
        "/proc/acpi",
        "/proc/asound",
        "/proc/interrupts",
        "/proc/kcore",
        "/proc/keys",
        "/proc/latency_stats",
        "/proc/sched_debug",
        "/proc/scsi",
        "/proc/timer_list",
        "/proc/timer_stats",
        "/sys/devices/virtual/powercap",
        "/sys/firmware",
    ]
    .map(String::from)
    .to_vec()
}

fn readonly_paths() -> Vec<String> {
    [
        "/proc/bus",
        "/proc/fs",
        "/proc/irq",
        "/proc/sys",
        "/proc/sysrq-trigger",
    ]
    .map(String::from)
    .to_vec()
}

/// cpu, memory and pids go into the spec even where crun cannot apply them
/// (cgroup manager disabled) so the spec is the same either way. On cgroup
/// v2 crun writes them as `cpu.max`, `memory.max`, `memory.swap.max` (the
/// OCI swap value is memory plus swap, so swap = limit means no swap) and
/// `pids.max`.
fn resources(
    limits: Limits,
    pids_limit: i64,
) -> Result<oci_spec::runtime::LinuxResources, SpecError> {
    const PERIOD_US: u64 = 100_000;
    let mut builder = LinuxResourcesBuilder::default()
        .pids(LinuxPidsBuilder::default().limit(pids_limit).build()?);
    if let Some(bytes) = limits.memory_bytes {
        let limit = i64::try_from(bytes).unwrap_or(i64::MAX);
        builder = builder.memory(
            LinuxMemoryBuilder::default()
                .limit(limit)
                .swap(limit)
                .build()?,
        );
    }
    if let Some(millis) = limits.cpu_millis {
        // quota per 100ms period: 1000m = 100_000us; at least 1ms (the kernel minimum).
        let quota = i64::try_from(millis.saturating_mul(PERIOD_US) / 1000)
            .unwrap_or(i64::MAX)
            .max(1000);
        builder = builder.cpu(
            LinuxCpuBuilder::default()
                .quota(quota)
                .period(PERIOD_US)
                .build()?,
        );
    }
    Ok(builder.build()?)
}

fn mount(destination: &str, typ: &str, source: &str, options: &[&str]) -> Result<Mount, SpecError> {
    Ok(MountBuilder::default()
        .destination(PathBuf::from(destination))
        .typ(typ.to_string())
        .source(PathBuf::from(source))
        .options(options.iter().map(|o| o.to_string()).collect::<Vec<_>>())
        .build()?)
}

fn mounts(host_network: bool, tmp_size_bytes: u64) -> Result<Vec<Mount>, SpecError> {
    // Sized in bytes and in inodes: a function filling /tmp with data or
    // with empty files gets ENOSPC, and the node's memory is not touched
    // beyond the size.
    let tmp_size = format!("size={tmp_size_bytes}");
    let tmp_inodes = format!("nr_inodes={}", crate::rootfs::tmpfs_inodes(tmp_size_bytes));
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        // No gid=5: group tty is not mapped in an own-id namespace.
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
            ],
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        mount(
            "/tmp",
            "tmpfs",
            "tmpfs",
            &["nosuid", "nodev", "mode=1777", &tmp_size, &tmp_inodes],
        )?,
    ];
    if host_network {
        // A sysfs mount needs a network namespace of our own; without one,
        // bind the host's read-only instead.
        mounts.push(mount(
            "/sys",
            "none",
            "/sys",
            &["rbind", "nosuid", "noexec", "nodev", "ro"],
        )?);
        if Path::new("/etc/resolv.conf").exists() {
            mounts.push(mount(
                "/etc/resolv.conf",
                "none",
                "/etc/resolv.conf",
                &["rbind", "nosuid", "noexec", "nodev", "ro"],
            )?);
        }
    } else {
        mounts.push(mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        )?);
    }
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::image::ConfigBuilder;

    /// An image config with a command and nothing else.
    fn plain_image() -> ImageConfig {
        ConfigBuilder::default()
            .cmd(vec!["x".to_string()])
            .build()
            .unwrap()
    }

    fn input<'a>(rootfs: &'a Path, image: &'a ImageConfig) -> SpecInput<'a> {
        SpecInput {
            rootfs,
            image: Some(image),
            host_network: false,
            limits: Limits::default(),
            hostname: "fn",
            pids_limit: PIDS_LIMIT,
            cgroups_path: None,
            cmd: None,
            env: &[],
            seccomp_bpf: None,
            tmp_size_bytes: TMP_SIZE,
            function_ids: FunctionIds::Spare { count: 65535 },
        }
    }

    #[test]
    fn a_cmd_override_replaces_cmd_and_keeps_the_entrypoint() {
        let dir = tempfile::tempdir().unwrap();
        let image = ConfigBuilder::default()
            .entrypoint(vec!["/function".to_string()])
            .cmd(vec!["--debug".to_string()])
            .build()
            .unwrap();
        let cmd = ["--insecure".to_string()];
        let spec = build(&SpecInput {
            cmd: Some(&cmd),
            env: &[],
            ..input(dir.path(), &image)
        })
        .unwrap();
        let args = spec.process().as_ref().unwrap().args().clone().unwrap();
        assert_eq!(args, ["/function", "--insecure"]);
    }

    #[test]
    fn entrypoint_and_cmd_are_joined() {
        let dir = tempfile::tempdir().unwrap();
        let image = ConfigBuilder::default()
            .entrypoint(vec!["/bin/sh".to_string(), "-c".to_string()])
            .cmd(vec!["echo hi".to_string()])
            .build()
            .unwrap();
        let spec = build(&input(dir.path(), &image)).unwrap();
        let process = spec.process().as_ref().unwrap();
        assert_eq!(
            process.args().as_ref().unwrap(),
            &["/bin/sh", "-c", "echo hi"]
        );
        assert!(process
            .env()
            .as_ref()
            .unwrap()
            .contains(&DEFAULT_PATH.to_string()));
        assert_eq!(process.cwd(), Path::new("/"));
    }

    #[test]
    fn nothing_to_run_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let image = ImageConfig::default();
        assert!(matches!(
            build(&input(dir.path(), &image)),
            Err(SpecError::NothingToRun)
        ));
    }

    #[test]
    fn home_is_set_from_the_users_passwd_entry_unless_the_image_sets_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532::/home/nonroot:/bin/sh\n",
        )
        .unwrap();
        let env = |user: &str, env: Vec<String>| {
            let image = ConfigBuilder::default()
                .cmd(vec!["x".to_string()])
                .user(user.to_string())
                .env(env)
                .build()
                .unwrap();
            let spec = build(&input(dir.path(), &image)).unwrap();
            spec.process().as_ref().unwrap().env().clone().unwrap()
        };
        assert!(env("nonroot", vec![]).contains(&"HOME=/home/nonroot".to_string()));
        assert!(env("", vec![]).contains(&"HOME=/root".to_string()));
        assert!(env("2000:2000", vec![]).contains(&"HOME=/".to_string()));
        let own = env("nonroot", vec!["HOME=/data".to_string()]);
        assert_eq!(own.iter().filter(|e| e.starts_with("HOME=")).count(), 1);
        assert!(own.contains(&"HOME=/data".to_string()));
    }

    #[test]
    fn image_path_env_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let image = ConfigBuilder::default()
            .cmd(vec!["x".to_string()])
            .env(vec!["PATH=/only".to_string(), "A=b".to_string()])
            .working_dir("/work".to_string())
            .build()
            .unwrap();
        let spec = build(&input(dir.path(), &image)).unwrap();
        let process = spec.process().as_ref().unwrap();
        assert_eq!(
            process.env().as_ref().unwrap(),
            &["PATH=/only", "A=b", "HOME=/"]
        );
        assert_eq!(process.cwd(), Path::new("/work"));
    }

    #[test]
    fn network_policy_decides_the_netns_and_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let image = plain_image();
        let has_netns = |spec: &Spec| {
            spec.linux()
                .as_ref()
                .unwrap()
                .namespaces()
                .as_ref()
                .unwrap()
                .iter()
                .any(|n| n.typ() == LinuxNamespaceType::Network)
        };
        let isolated = build(&input(dir.path(), &image)).unwrap();
        assert!(has_netns(&isolated));
        let mut runner = input(dir.path(), &image);
        runner.host_network = true;
        let runner = build(&runner).unwrap();
        assert!(!has_netns(&runner));
        let sys = runner
            .mounts()
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.destination() == Path::new("/sys"))
            .unwrap();
        assert_eq!(sys.typ().as_deref(), Some("none"));
    }

    #[test]
    fn limits_land_in_resources() {
        let dir = tempfile::tempdir().unwrap();
        let image = plain_image();
        let mut i = input(dir.path(), &image);
        i.limits = Limits {
            cpu_millis: Some(500),
            memory_bytes: Some(128 << 20),
            pids: None,
        };
        let spec = build(&i).unwrap();
        let resources = spec.linux().as_ref().unwrap().resources().as_ref().unwrap();
        assert_eq!(
            resources.memory().as_ref().unwrap().limit(),
            Some(128 << 20)
        );
        assert_eq!(resources.cpu().as_ref().unwrap().quota(), Some(50_000));
        assert_eq!(resources.pids().as_ref().unwrap().limit(), PIDS_LIMIT);
        assert_eq!(
            resources.memory().as_ref().unwrap().swap(),
            Some(128 << 20),
            "swap = limit: no swap"
        );
        assert_eq!(resources.cpu().as_ref().unwrap().period(), Some(100_000));
        assert!(spec.linux().as_ref().unwrap().cgroups_path().is_none());
        i.cgroups_path = Some("/a/xfn-run-1-0/container");
        let spec = build(&i).unwrap();
        assert_eq!(
            spec.linux().as_ref().unwrap().cgroups_path().as_deref(),
            Some(Path::new("/a/xfn-run-1-0/container"))
        );
    }

    #[test]
    fn a_pids_limit_of_the_run_replaces_the_runners_in_pids_max_and_rlimit_nproc() {
        let dir = tempfile::tempdir().unwrap();
        let image = plain_image();
        let mut i = input(dir.path(), &image);
        i.limits.pids = Some(64);
        let nproc = |spec: &Spec| {
            spec.process()
                .as_ref()
                .unwrap()
                .rlimits()
                .iter()
                .flatten()
                .find(|r| r.typ() == PosixRlimitType::RlimitNproc)
                .map(|r| (r.soft(), r.hard()))
        };
        let spec = build(&i).unwrap();
        let resources = spec.linux().as_ref().unwrap().resources().as_ref().unwrap();
        assert_eq!(resources.pids().as_ref().unwrap().limit(), 64);
        assert_eq!(nproc(&spec), Some((64, 64)), "no cgroup: RLIMIT_NPROC");
        i.limits.pids = None;
        let spec = build(&i).unwrap();
        let resources = spec.linux().as_ref().unwrap().resources().as_ref().unwrap();
        assert_eq!(resources.pids().as_ref().unwrap().limit(), PIDS_LIMIT);
    }

    #[test]
    fn cpu_millis_become_a_quota_per_100ms_period() {
        // Kubernetes' conversion: 100m = 10000us of every 100000us.
        for (millis, quota) in [(100, 10_000), (1500, 150_000), (1, 1000)] {
            let r = resources(
                Limits {
                    cpu_millis: Some(millis),
                    ..Limits::default()
                },
                PIDS_LIMIT,
            )
            .unwrap();
            let cpu = r.cpu().as_ref().unwrap();
            assert_eq!((cpu.quota(), cpu.period()), (Some(quota), Some(100_000)));
        }
    }

    #[test]
    fn the_seccomp_profile_goes_into_the_spec() {
        let dir = tempfile::tempdir().unwrap();
        let image = plain_image();
        let spec = build(&input(dir.path(), &image)).unwrap();
        let seccomp = spec.linux().as_ref().unwrap().seccomp().as_ref().unwrap();
        assert_eq!(seccomp, &crate::sandbox::seccomp::profile().unwrap());
    }

    #[test]
    fn a_run_has_its_own_user_namespace_over_the_functions_ids_never_xfns_when_it_has_others() {
        let dir = tempfile::tempdir().unwrap();
        let image = plain_image();
        // A root image: xfn's one id as root, or container 0.. from id 1.
        for (ids, want) in [
            (FunctionIds::Own, (0, 0, 1)),
            (FunctionIds::Spare { count: 65536 }, (0, 1, 65536)),
        ] {
            let spec = build(&SpecInput {
                function_ids: ids,
                ..input(dir.path(), &image)
            })
            .unwrap();
            let linux = spec.linux().as_ref().unwrap();
            assert!(linux
                .namespaces()
                .as_ref()
                .unwrap()
                .iter()
                .any(|n| n.typ() == LinuxNamespaceType::User));
            for maps in [linux.uid_mappings(), linux.gid_mappings()] {
                let map = &maps.as_ref().unwrap()[..];
                assert_eq!(map.len(), 1);
                assert_eq!(
                    (map[0].container_id(), map[0].host_id(), map[0].size()),
                    want
                );
            }
        }
    }

    #[test]
    fn rlimits_bound_files_and_processes_and_forbid_core_files() {
        let limits = rlimits(Some(PIDS_LIMIT)).unwrap();
        let get = |typ| limits.iter().find(|l| l.typ() == typ).unwrap();
        let core = get(PosixRlimitType::RlimitCore);
        assert_eq!((core.soft(), core.hard()), (0, 0));
        let nofile = get(PosixRlimitType::RlimitNofile);
        assert!(nofile.hard() <= 65536 && nofile.hard() > 0);
        let nproc = get(PosixRlimitType::RlimitNproc);
        assert_eq!(nproc.soft(), nproc.hard());
        assert!(nproc.hard() <= PIDS_LIMIT as u64 && nproc.hard() > 0);
        let nproc = |spec: &Spec| {
            let rlimits = spec.process().as_ref().unwrap().rlimits().clone();
            rlimits
                .unwrap()
                .into_iter()
                .find(|l| l.typ() == PosixRlimitType::RlimitNproc)
                .map(|l| (l.soft(), l.hard()))
        };
        let dir = tempfile::tempdir().unwrap();
        let image = plain_image();
        let without_cgroups = SpecInput {
            pids_limit: 7,
            ..input(dir.path(), &image)
        };
        assert_eq!(nproc(&build(&without_cgroups).unwrap()), Some((7, 7)));
        let with_cgroups = SpecInput {
            cgroups_path: Some("/a/xfn-run-1-0/container"),
            ..without_cgroups
        };
        assert_eq!(
            nproc(&build(&with_cgroups).unwrap()),
            None,
            "pids.max alone"
        );
    }

    #[test]
    fn tmp_is_a_tmpfs_sized_in_bytes_and_inodes() {
        let dir = tempfile::tempdir().unwrap();
        let image = plain_image();
        let spec = build(&SpecInput {
            tmp_size_bytes: 64 << 20,
            ..input(dir.path(), &image)
        })
        .unwrap();
        let tmp = spec
            .mounts()
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.destination() == Path::new("/tmp"))
            .unwrap();
        let options = tmp.options().as_ref().unwrap();
        assert!(
            options.contains(&format!("size={}", 64 << 20)),
            "{options:?}"
        );
        assert!(
            options.contains(&format!(
                "nr_inodes={}",
                crate::rootfs::tmpfs_inodes(64 << 20)
            )),
            "{options:?}"
        );
    }
}
