//! Kept function servers (`render.crossplane.io/runtime-docker-cleanup:
//! Orphan`, named by `runtime-docker-name`): a server that outlives the
//! render that started it, reused by the next render that names it, so
//! back-to-back renders skip the server's start.
//!
//! # Choice: a keeper process per server, reached through a socket file
//!
//! So each kept server has a *keeper*: a small detached `xfn render-servers
//! keep` process, started by the render before it enters any namespace (so
//! the keeper enters its own, like any xfn), which runs the server exactly
//! as the `Docker` runtime does and forwards each connection on a Unix
//! socket file, `<cache>/run/kept/<name>/server.sock`, into the server's
//! namespace. A socket file is reachable from any namespace that sees the
//! file system, and its permissions (the keeper's uid) decide who may call.
//! The keeper owns the container: on SIGTERM (`xfn render-servers stop`) or
//! when the server dies, it stops it and removes everything, its directory
//! included. A keeper killed outright leaves a container the next xfn on
//! that cache sweeps, as it sweeps any dead xfn's runs.
//!
//! More of the why: docs/design.md, "Notes behind the code", `src/compose/run/runtimes/kept.rs`.
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tonic::Status;

use super::docker::start;
use super::runtime::{served, Runtime};
use crate::call::{self, FunctionRunner};
use crate::compose::read::model::Function;
use crate::compose::{ComposeError, StartError};
use crate::function_server::{Client, Dial, ResponseBudget};
use crate::image::PullPolicy;
use crate::runner::{RunConfig, Runner};

/// How to start a keeper: xfn's own binary and the flags (cache, registry,
/// user namespace, runner) it shares with the render.
#[derive(Debug, Clone)]
pub(crate) struct KeeperCommand {
    /// The xfn binary.
    pub(crate) program: PathBuf,
    /// Flags before `keep`'s own (`render-servers keep --cache-dir … …`).
    pub(crate) args: Vec<OsString>,
    /// The cache dir (where `run/kept/` is).
    pub(crate) cache_dir: PathBuf,
}

/// What `info.json` says about a kept server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct KeptInfo {
    /// Its name.
    pub(crate) name: String,
    /// The Function that started it.
    pub(crate) function: String,
    /// The image it runs.
    pub(crate) image: String,
    /// The keeper's pid.
    pub(crate) pid: u32,
    /// When it started (seconds since the epoch).
    pub(crate) started: u64,
}

/// The files of kept server `name` in `cache_dir`.
#[derive(Debug, Clone)]
pub(crate) struct KeptDir(PathBuf);

impl KeptDir {
    /// Where kept servers live in `cache_dir`.
    pub(crate) fn root(cache_dir: &Path) -> PathBuf {
        cache_dir.join("run").join("kept")
    }
    /// The files of `name`.
    pub(crate) fn new(cache_dir: &Path, name: &str) -> Self {
        Self(Self::root(cache_dir).join(name))
    }
    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
    /// The socket renders connect to.
    pub(crate) fn socket(&self) -> PathBuf {
        self.0.join("server.sock")
    }
    fn info_file(&self) -> PathBuf {
        self.0.join("info.json")
    }
    fn log(&self) -> PathBuf {
        self.0.join("keeper.log")
    }
    /// What `info.json` says, if it is there.
    pub(crate) fn info(&self) -> Option<KeptInfo> {
        let text = std::fs::read(self.info_file()).ok()?;
        serde_json::from_slice(&text).ok()
    }
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join(" | ")
    }
    /// Whether the server answers on its socket.
    fn answers(&self) -> bool {
        std::os::unix::net::UnixStream::connect(self.socket()).is_ok()
    }
}

/// Whether `pid` is a live keeper (and not some process that got its pid).
fn is_keeper(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| {
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.iter().any(|a| *a == b"render-servers") && args.iter().any(|a| *a == b"keep")
        })
        .unwrap_or(false)
}

/// How a kept server was got ready for a render.
#[derive(Debug)]
pub(crate) enum KeptStart {
    /// A running server with the same image: reused.
    Reused,
    /// A keeper was started; it is ready once its socket answers. The
    /// lock is held until then, so a render starting the same server at
    /// the same time waits and reuses it.
    // The lock file is held, never read: dropping it releases the lock.
    Spawned(std::process::Child, #[allow(dead_code)] std::fs::File),
}

/// Gets kept server `function.keep` ready for a render, before the render
/// enters any namespace: reuses a running one with the same image, else
/// (stopping one with another image) starts its keeper.
pub(crate) fn prepare(
    function: &Function,
    image: &str,
    pull_policy: PullPolicy,
    keeper: &KeeperCommand,
) -> Result<KeptStart, ComposeError> {
    let Some(name) = &function.keep else {
        return Err(ComposeError::FunctionInvalid {
            function: function.name.clone(),
            message: "not a kept server".into(),
        });
    };
    let failed = |source: StartError| ComposeError::FunctionStart {
        function: function.name.clone(),
        image: image.to_string(),
        source: Box::new(source),
    };
    let io = |what, path: PathBuf| move |source| failed(StartError::Io { what, path, source });
    let dir = KeptDir::new(&keeper.cache_dir, name);
    create_owned(&keeper.cache_dir, dir.path()).map_err(io("create", dir.path().to_path_buf()))?;
    if dir.socket().as_os_str().len() >= 108 {
        return Err(failed(StartError::Failed(format!(
            "the socket path {} is too long for a Unix socket; use a shorter --cache-dir",
            dir.socket().display()
        ))));
    }
    // One render at a time starts a given server.
    let lock = std::fs::File::create(dir.path().join("lock"))
        .and_then(|f| own_like(&keeper.cache_dir, &dir.path().join("lock")).map(|()| f))
        .map_err(io("lock", dir.path().to_path_buf()))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| io("lock", dir.path().to_path_buf())(e.into()))?;
    if let Some(info) = dir.info() {
        if info.image == image && is_keeper(info.pid) && dir.answers() {
            tracing::info!(server = %name, pid = info.pid, "reusing the kept function server");
            return Ok(KeptStart::Reused);
        }
        if is_keeper(info.pid) {
            tracing::info!(server = %name, old = %info.image, new = %image, "the kept server runs another image: replacing it");
            stop_and_wait(&dir, info.pid, Duration::from_secs(10));
        }
    }
    let _ = std::fs::remove_file(dir.socket());
    let _ = std::fs::remove_file(dir.info_file());
    let log = std::fs::File::create(dir.log())
        .and_then(|f| own_like(&keeper.cache_dir, &dir.log()).map(|()| f))
        .map_err(io("write", dir.log()))?;
    let mut command = std::process::Command::new(&keeper.program);
    command
        .args(&keeper.args)
        .arg("--name")
        .arg(name)
        .arg("--function")
        .arg(&function.name)
        .arg("--image")
        .arg(image)
        .arg("--image-pull-policy")
        .arg(pull_policy.as_str());
    for env in &function.env {
        command.arg("--env").arg(env);
    }
    if function.host_network {
        command.arg("--host-network");
    }
    use std::os::unix::process::CommandExt;
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        // Its own process group: a Ctrl-C meant for the render does not
        // reach the server it leaves running.
        .process_group(0);
    let child = crate::fork_lock::spawn(&mut command)
        .map_err(io("start its keeper", keeper.program.clone()))?;
    tracing::info!(server = %name, pid = child.id(), "starting a kept function server");
    Ok(KeptStart::Spawned(child, lock))
}

/// Creates `path` (under `cache_dir`) and every missing directory on the
/// way, owned like `cache_dir`. The render creates them before any
/// namespace, as itself; the keeper writes in them as the namespace's root,
/// which owns the cache dir (xfn makes it so when it enters), and root of
/// the host is not root in there.
fn create_owned(cache_dir: &Path, path: &Path) -> std::io::Result<()> {
    // A new cache dir is handed to the namespace's root by the keeper, as
    // by any xfn that enters it.
    std::fs::create_dir_all(cache_dir)?;
    let relative = path.strip_prefix(cache_dir).unwrap_or(path);
    let mut current = cache_dir.to_path_buf();
    for part in relative.components() {
        current.push(part);
        if !current.exists() {
            std::fs::create_dir(&current)?;
            own_like(cache_dir, &current)?;
        }
    }
    Ok(())
}

/// Gives `path` the owner of `like`, where that is another.
fn own_like(like: &Path, path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(like)?;
    let own = std::fs::metadata(path)?;
    if (own.uid(), own.gid()) != (owner.uid(), owner.gid()) {
        std::os::unix::fs::chown(path, Some(owner.uid()), Some(owner.gid()))?;
    }
    Ok(())
}

/// SIGTERM to the keeper, then waits (at most `patience`) for it to remove
/// its directory; SIGKILL after that.
fn stop_and_wait(dir: &KeptDir, pid: u32, patience: Duration) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let started = Instant::now();
    while started.elapsed() < patience {
        if !dir.info_file().exists() && !is_keeper(pid.as_raw_nonzero().get() as u32) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    false
}

/// A Function served by a kept server, reached through its socket file.
#[derive(Debug)]
pub(crate) struct Kept {
    function: call::Function,
    dir: KeptDir,
    start: Mutex<Option<KeptStart>>,
    timeout: Duration,
    client: tokio::sync::OnceCell<Client>,
}

impl Kept {
    /// The runtime of `function`, kept in `dir`, got ready by `start`
    /// (none: its server was found running), waiting at most `timeout`
    /// for its socket to answer.
    pub(super) fn new(
        function: &Function,
        dir: KeptDir,
        start: Option<KeptStart>,
        timeout: Duration,
    ) -> Self {
        Self {
            function: call::Function {
                name: Some(function.name.clone()),
                image: function.image().to_string(),
                config: RunConfig::default(),
            },
            dir,
            start: Mutex::new(start),
            timeout,
            client: tokio::sync::OnceCell::new(),
        }
    }

    /// Waits until the keeper's socket answers, or fails when the keeper
    /// exits (or the render's timeout passes) first, with its log's tail.
    async fn wait_ready(&self) -> Result<(), ComposeError> {
        let failed = |message: String| ComposeError::FunctionStart {
            function: self.function.name.clone().unwrap_or_default(),
            image: self.function.image.clone(),
            source: Box::new(StartError::Failed(message)),
        };
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            if self.dir.answers() {
                // Ready: release the start lock (the keeper runs on).
                if let Ok(mut start) = self.start.lock() {
                    start.take();
                }
                return Ok(());
            }
            let exited = match self.start.lock() {
                Ok(mut start) => match start.as_mut() {
                    Some(KeptStart::Spawned(child, _)) => child.try_wait().ok().flatten(),
                    _ => None,
                },
                Err(_) => None,
            };
            if let Some(status) = exited {
                return Err(failed(format!(
                    "its keeper exited ({status}): {}",
                    self.dir.log_tail()
                )));
            }
            if started.elapsed() >= self.timeout {
                return Err(failed(format!(
                    "the kept server did not answer on {} within {:?}: {}",
                    self.dir.socket().display(),
                    self.timeout,
                    self.dir.log_tail()
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 3 / 2).min(Duration::from_millis(20));
        }
    }
}

/// Ready once its keeper's socket answers; nothing to stop (it is kept).
#[async_trait::async_trait]
impl Runtime for Kept {
    fn function(&self) -> &call::Function {
        &self.function
    }

    async fn start(&self) -> Result<(), ComposeError> {
        self.client
            .get_or_try_init(|| async {
                self.wait_ready().await?;
                let dial = Dial::Unix(self.dir.socket());
                let budget = Arc::new(ResponseBudget::one_answer());
                let name = self.function.name.as_deref().unwrap_or_default();
                Ok(Client::new(name, dial, 1, budget))
            })
            .await
            .map(drop)
    }
}

/// The backend of a kept server: the request on its socket file.
#[async_trait::async_trait]
impl FunctionRunner for Kept {
    async fn run_function(
        &self,
        _function: &call::Function,
        request: call::Request,
    ) -> Result<call::Response, Status> {
        let client = self
            .client
            .get()
            .ok_or_else(|| Status::failed_precondition("the kept server is not ready"))?;
        served(client, request).await
    }
}

/// The keeper: runs the server as the `Docker` runtime would, forwards
/// every connection on its socket file into the server's namespace, and on
/// SIGTERM/SIGINT, or when the server dies, stops it and removes its
/// directory. (`xfn render-servers keep`; runs inside its own namespace.)
pub(crate) async fn keep(
    runner: &Runner,
    dir: &KeptDir,
    info: KeptInfo,
    config: &RunConfig,
    env: &[String],
    host_network: bool,
) -> Result<(), ComposeError> {
    let mut server = start(
        &info.function,
        runner,
        &info.image,
        config,
        env,
        host_network,
    )
    .await?;
    let address = server.address();
    let (function, image) = (info.function.clone(), info.image.clone());
    let failed = |source| ComposeError::FunctionStart {
        function: function.clone(),
        image: image.clone(),
        source: Box::new(source),
    };
    let io = |what, path: PathBuf| move |source| failed(StartError::Io { what, path, source });
    let _ = std::fs::remove_file(dir.socket());
    let listener =
        tokio::net::UnixListener::bind(dir.socket()).map_err(io("listen on", dir.socket()))?;
    let info = KeptInfo {
        pid: std::process::id(),
        started: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        ..info
    };
    let json = serde_json::to_vec(&info).map_err(|e| failed(StartError::Info(e)))?;
    let temp = dir.path().join("info.json.tmp");
    std::fs::write(&temp, json)
        .and_then(|()| std::fs::rename(&temp, dir.info_file()))
        .map_err(io("write", dir.info_file()))?;
    tracing::info!(server = %info.name, image = %info.image, "kept function server ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(io("handle SIGTERM in", dir.path().to_path_buf()))?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(io("handle SIGINT in", dir.path().to_path_buf()))?;
    let network = server.network().clone();
    let exit = server.exit_watch().clone();
    let why = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut client, _)) = accepted else { continue };
                let network = network.clone();
                tokio::spawn(async move {
                    match network.connect(address).await {
                        Ok(mut upstream) => {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                        }
                        Err(err) => tracing::warn!(%err, "cannot reach the kept server"),
                    }
                });
            }
            _ = term.recv() => break "stopped".to_string(),
            _ = interrupt.recv() => break "interrupted".to_string(),
            // Told by its pidfd.
            Ok(()) = exit.exited() => {
                break match server.exited() {
                    Some(err) => format!("the server exited: {}", crate::chain::Chain(&err)),
                    None => "the server exited".to_string(),
                };
            }
        }
    };
    tracing::info!(server = %info.name, why, "kept function server stopping");
    // Renders must not find a socket for a server that is going.
    let _ = std::fs::remove_file(dir.socket());
    let _ = std::fs::remove_file(dir.info_file());
    server.stop().await;
    let _ = std::fs::remove_dir_all(dir.path());
    Ok(())
}

/// The kept servers in `cache_dir` whose keeper runs.
pub(crate) fn list(cache_dir: &Path) -> Vec<KeptInfo> {
    let mut servers: Vec<KeptInfo> = std::fs::read_dir(KeptDir::root(cache_dir))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| KeptDir(entry.path()).info())
        .filter(|info| is_keeper(info.pid))
        .collect();
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    servers
}

/// Stops kept server `name` and waits until everything of it is gone.
/// Returns false when there was none.
pub(crate) fn stop(cache_dir: &Path, name: &str) -> bool {
    let dir = KeptDir::new(cache_dir, name);
    match dir.info() {
        Some(info) if is_keeper(info.pid) => {
            stop_and_wait(&dir, info.pid, Duration::from_secs(30));
            true
        }
        _ => {
            // A dead keeper's leftovers.
            let _ = std::fs::remove_dir_all(dir.path());
            false
        }
    }
}
