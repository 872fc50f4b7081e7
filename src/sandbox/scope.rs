//! Functions cannot connect to abstract Unix sockets made outside the
//! runs: every `crun create` (and so the container it makes) is in one
//! Landlock domain scoped to abstract sockets (`LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`,
//! ABI 6, Linux 6.12), shared by all runs. It handles no file system or
//! network access: nothing else a function may do changes.
//!
//! Why: with `NetworkPolicy Runner` a function shares xfn's network
//! namespace, where `xfn start`'s abstract socket lives. The gatekeeper
//! refuses it (`crate::sidecar::gate`), but each refusal costs about what
//! the function's `connect()` cost, so a function looping `connect()` wins
//! the race for CPU where limits are not enforced and fills the listen
//! queue allowed callers share (issue 31: 0-8 of 30 calls served). Scoped,
//! the kernel refuses the `connect()` itself (`EPERM`) before the
//! connection reaches the queue: no refusal costs the gatekeeper anything.
//!
//! How: one thread of xfn's, started once, enters the domain itself
//! (Landlock restricts the calling thread, and a child inherits the
//! credentials of the thread that spawned it) and spawns every crun on
//! request ([`spawn`]). The rest of xfn stays outside. Not a `pre_exec`
//! hook: that makes std fork instead of `posix_spawn` (vfork), which costs
//! 5-15 ms more per spawn for a daemon of 15-40 MB on this machine.
//! Hand-written system calls: three, on a `#[repr(C)]` struct.
//!
//! Where the kernel lacks the scope (or Landlock), [`scoping`] says why and
//! `xfn start` logs it: the gatekeeper's refusal is then all there is.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

/// `struct landlock_ruleset_attr` (ABI 6 and later).
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`.
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
/// `LANDLOCK_CREATE_RULESET_VERSION`.
const CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;
/// The first ABI with [`SCOPE_ABSTRACT_UNIX_SOCKET`].
const SCOPE_ABI: libc::c_long = 6;

/// Whether functions are kept from abstract sockets outside their run.
#[derive(Debug)]
pub(crate) enum Scoping {
    /// They are: crun is spawned by the thread in the domain.
    Enforced(Spawner),
    /// They are not, and why.
    Unavailable(String),
}

/// Work for the thread in the domain: a spawn, whose child inherits it.
type Request = Box<dyn FnOnce() + Send>;

/// The way to the thread in the domain.
#[derive(Debug)]
pub(crate) struct Spawner(std::sync::mpsc::Sender<Request>);

/// This process's [`Scoping`], found out (and its thread started) once.
pub(crate) fn scoping() -> &'static Scoping {
    static SCOPING: OnceLock<Scoping> = OnceLock::new();
    SCOPING.get_or_init(|| match ruleset().and_then(start_spawner) {
        Ok(spawner) => Scoping::Enforced(spawner),
        Err(why) => Scoping::Unavailable(why),
    })
}

/// Runs `spawn` (which starts crun) on the thread in the domain where the
/// kernel has the scope, so that its child, and everything the child
/// starts, is in the domain; on the calling thread elsewhere.
pub(crate) async fn in_domain<R: Send + 'static>(
    spawn: impl FnOnce() -> std::io::Result<R> + Send + 'static,
) -> std::io::Result<R> {
    let Scoping::Enforced(Spawner(requests)) = scoping() else {
        return spawn();
    };
    let (reply, result) = tokio::sync::oneshot::channel();
    let gone = || std::io::Error::other("the thread that spawns crun is gone");
    requests
        .send(Box::new(move || {
            let _ = reply.send(spawn());
        }))
        .map_err(|_| gone())?;
    result.await.map_err(|_| gone())?
}

/// Spawns `command` (under the fork lock, `crate::fork_lock`) in the scoped
/// domain where the kernel has the scope, as it is elsewhere. `command` is
/// dropped before this returns: the child holds the only copies of the
/// descriptors it was given.
pub(crate) async fn spawn(
    mut command: tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    let runtime = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
    in_domain(move || {
        let _runtime = runtime.enter();
        let child = crate::fork_lock::spawn_async(&mut command);
        drop(command);
        child
    })
    .await
}

/// The ruleset that scopes abstract sockets, or why there is none.
fn ruleset() -> Result<OwnedFd, String> {
    // SAFETY: the version query takes no attribute (NULL, size 0).
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if abi < 0 {
        return Err(format!(
            "Landlock is not available in this kernel ({})",
            std::io::Error::last_os_error()
        ));
    }
    if abi < SCOPE_ABI {
        return Err(format!(
            "the kernel's Landlock (ABI {abi}) cannot scope abstract Unix sockets (ABI 6, Linux 6.12)"
        ));
    }
    let attr = RulesetAttr {
        handled_access_fs: 0,
        handled_access_net: 0,
        scoped: SCOPE_ABSTRACT_UNIX_SOCKET,
    };
    // SAFETY: `attr` is a valid ruleset attribute of the size passed, and
    // outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0 as libc::c_uint,
        )
    };
    match RawFd::try_from(fd) {
        // SAFETY: the kernel just returned this new descriptor; nothing
        // else owns it.
        Ok(fd) if fd >= 0 => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        _ => Err(format!(
            "cannot make a Landlock ruleset ({})",
            std::io::Error::last_os_error()
        )),
    }
}

/// Starts the thread that enters the domain of `ruleset` and then spawns
/// what it is sent, for the life of the process; or says why it could not.
fn start_spawner(ruleset: OwnedFd) -> Result<Spawner, String> {
    let (requests, incoming) = std::sync::mpsc::channel::<Request>();
    let (entered, outcome) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("xfn-spawn".into())
        .spawn(move || {
            let restricted = restrict(&ruleset);
            drop(ruleset);
            let ok = restricted.is_ok();
            let _ = entered.send(restricted);
            if !ok {
                return;
            }
            for work in incoming {
                work();
            }
        })
        .map_err(|err| format!("cannot start the thread that spawns crun ({err})"))?;
    match outcome.recv() {
        Ok(Ok(())) => Ok(Spawner(requests)),
        Ok(Err(err)) => Err(format!("cannot enter a Landlock domain ({err})")),
        Err(_) => Err("the thread that spawns crun ended at once".into()),
    }
}

/// Puts the calling thread in the domain of `ruleset`. Without
/// `CAP_SYS_ADMIN` in its user namespace the kernel wants `no_new_privs`
/// first (this thread's only), which every function has anyway
/// (`sandbox::spec`).
fn restrict(ruleset: &OwnedFd) -> std::io::Result<()> {
    let restrict_self = || {
        // SAFETY: a system call on a descriptor this process owns.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_landlock_restrict_self,
                ruleset.as_raw_fd(),
                0 as libc::c_uint,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    match restrict_self() {
        Err(err) if err.raw_os_error() == Some(libc::EPERM) => {
            // SAFETY: prctl with integer arguments only.
            if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            restrict_self()
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child in the scoped domain cannot connect to an abstract socket
    /// its parent listens on; one outside can. Gated loudly where the
    /// kernel lacks the scope.
    #[tokio::test]
    async fn a_child_in_the_domain_is_refused_an_abstract_socket_made_outside_it() {
        if let Scoping::Unavailable(why) = scoping() {
            eprintln!("SKIPPED: {why}");
            return;
        }
        use std::os::linux::net::SocketAddrExt;
        let name = format!("xfn-scope-test/{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
        // busybox nc has no abstract sockets; python3 is on this machine
        // (scripts/setup.sh) and its socket module takes "\0name".
        let probe = format!(
            "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect('\\0{name}')\n print('connected')\nexcept OSError as e:\n print(e.errno)"
        );
        let run = |confined: bool| {
            let mut command = tokio::process::Command::new("python3");
            command
                .arg("-c")
                .arg(&probe)
                .stdout(std::process::Stdio::piped());
            async move {
                let child = if confined {
                    spawn(command).await.unwrap()
                } else {
                    command.spawn().unwrap()
                };
                let out = child.wait_with_output().await.unwrap();
                String::from_utf8(out.stdout).unwrap().trim().to_string()
            }
        };
        assert_eq!(run(false).await, "connected");
        assert_eq!(run(true).await, libc::EPERM.to_string());
    }
}
