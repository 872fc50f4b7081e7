//! The one pipeline every front end calls: (image, input, config) -> output.
//!
//! image store (pull under a policy) → per-run rootfs → OCI spec → crun.
//! Every run is disposable: its rootfs, bundle and container are gone when
//! [`Runner::run`] returns or its future is dropped.
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::image::{ImageStore, PulledImage};
use crate::lifecycle::pool::{self, PoolKey};
use crate::lifecycle::teardown::Teardown;
use crate::lifecycle::{FunctionContainer, Recipe, RootfsMaker, Settings};
use crate::rootfs::{overlay_supported, ResolvedMode, Rootfs, RootfsOptions};
use crate::sandbox::{Sandbox, SandboxOptions};
// Carried by `RunError` as the sandbox found them (one definition each).
pub use crate::sandbox::{LimitsUnavailable, MemoryLimitExceeded, NotServing};

// The public surface (what an embedding program and the integration tests
// use: run a function, pool and serve containers, and the types in those
// signatures); the `pub(crate)` rest is what xfn's own front ends need of
// the private `lifecycle`, `rootfs` and `sandbox` modules.
pub use crate::lifecycle::pool::{PoolOptions, PoolStats, WarmStart};
pub(crate) use crate::lifecycle::serve::PreparedServer;
use crate::lifecycle::serve::ServerPlan;
pub use crate::lifecycle::serve::{FunctionServer, FunctionServerOptions};
pub(crate) use crate::lifecycle::Origin;
pub use crate::lifecycle::RunError;
pub use crate::rootfs::RootfsMode;
pub use crate::sandbox::crun::STDERR_TAIL_BYTES;
pub use crate::sandbox::spec::PIDS_LIMIT as DEFAULT_PIDS_LIMIT;
pub use crate::sandbox::userns::{enter as enter_namespace, Namespace, UsernsError, UsernsOptions};
pub use config::{Limits, NetworkPolicy, RunConfig, UnknownNetworkPolicy};

pub(crate) use crate::lifecycle::pool::default_size as default_pool_size;
pub(crate) use crate::sandbox::cgroup::run::RunUsage;
pub(crate) use crate::sandbox::crun::tail_text as stderr_tail_text;
pub(crate) use crate::sandbox::oci_runtime::CrunVersion;
pub(crate) use crate::sandbox::DEFAULT_MAX_OUTPUT_BYTES;

pub(crate) mod budget;
mod config;

/// What a successful run produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// What the function wrote to stdout.
    pub stdout: Vec<u8>,
    /// The tail of what it wrote to stderr.
    pub stderr_tail: Vec<u8>,
    /// CPU time and peak memory, where the run had a cgroup of its own.
    pub usage: Option<RunUsage>,
}

/// How the runner runs (fixed per process, unlike [`RunConfig`]).
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// The OCI runtime binary (`crun`, looked up in PATH, by default).
    pub runtime: PathBuf,
    /// Cap on stdout and on stderr of a run, each.
    pub max_output_bytes: usize,
    /// Refuse runs when cpu/memory/pids limits are not enforced.
    pub require_limits: bool,
    /// How per-run root filesystems are made.
    pub rootfs: crate::rootfs::RootfsMode,
    /// Most processes a run may have at once (enforced with the other
    /// limits).
    pub pids_limit: i64,
    /// Size of each run's `/tmp`, in bytes.
    pub tmp_size_bytes: u64,
    /// The most a run may write to its rootfs, in bytes.
    pub rootfs_size_bytes: u64,
    /// Warm containers created ahead of calls (see `lifecycle/pool.rs`);
    /// `None`, or a size of 0: every call creates its own (what a one-shot
    /// `xfn run` wants).
    pub warm_pool: Option<PoolOptions>,
    /// Keep the run state (bundles, crun's state, the rootfs mount points)
    /// in a tmpfs of xfn's mount namespace instead of on the cache's disk:
    /// no inode churn on the disk per call. Only for a process whose
    /// containers end with it (a server in its own PID namespace,
    /// `crate::pidns`): a killed xfn's state goes with its namespace, so
    /// nothing could find containers that outlived it (`sandbox/bundle.rs`).
    pub state_in_memory: bool,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        Self {
            runtime: PathBuf::from("crun"),
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            require_limits: false,
            rootfs: crate::rootfs::RootfsMode::default(),
            pids_limit: crate::sandbox::spec::PIDS_LIMIT,
            tmp_size_bytes: crate::sandbox::spec::TMP_SIZE,
            rootfs_size_bytes: crate::rootfs::DEFAULT_ROOTFS_SIZE,
            warm_pool: None,
            state_in_memory: false,
        }
    }
}

/// The runner: shared by every call (put it in an `Arc`).
#[derive(Debug)]
pub struct Runner {
    store: ImageStore,
    sandbox: Arc<Sandbox>,
    rootfs: Arc<RootfsMaker>,
    pool: Option<Arc<pool::Pool>>,
    /// A call's own teardowns: on the blocking threads at normal priority,
    /// awaited by the call (the pool has its own, at idle priority).
    teardown: Teardown,
}

impl Runner {
    /// A runner over `store` in `namespace`, which [`enter_namespace`]
    /// returned while the process was single-threaded; runs go under
    /// `<store root>/run`.
    pub fn new(
        namespace: &Namespace,
        store: ImageStore,
        options: RunnerOptions,
    ) -> Result<Self, RunError> {
        // Absolute: the rootfs path goes into the spec, which crun reads
        // relative to the bundle dir, not to xfn's working dir.
        let run_dir =
            std::path::absolute(store.root().join("run")).map_err(|source| RunError::RunDir {
                path: store.root().join("run"),
                source,
            })?;
        let sandbox = Sandbox::new(
            namespace,
            SandboxOptions {
                runtime: options.runtime.clone(),
                run_dir: run_dir.clone(),
                max_output_bytes: options.max_output_bytes,
                require_limits: options.require_limits,
                pids_limit: options.pids_limit,
                instance: store.instance().clone(),
                tmp_size_bytes: options.tmp_size_bytes,
                state_in_memory: options.state_in_memory,
            },
        )?;
        // Dead instances' rootfs dirs are on the disk; this one's may be in
        // memory (the sandbox's run state).
        sweep_stale_rootfs(&run_dir.join("rootfs"), store.instance());
        let rootfs_dir = sandbox.rootfs_dir();
        // Probed once, inside the namespace runs use, next to the layer cache.
        let overlay_ok = match options.rootfs {
            crate::rootfs::RootfsMode::Copy => false,
            _ => overlay_supported_cached(
                &run_dir,
                &rootfs_dir,
                store.instance(),
                namespace.mapping(),
            ),
        };
        let rootfs_mode = options
            .rootfs
            .resolve(overlay_ok)
            .map_err(RunError::RootfsMode)?;
        tracing::debug!(?rootfs_mode, "per-run rootfs mode");
        let sandbox = Arc::new(sandbox);
        // The sandbox made this process a child subreaper: whatever is
        // orphaned to it must be reaped, pool or not.
        if tokio::runtime::Handle::try_current().is_ok() {
            let sandbox = Arc::downgrade(&sandbox);
            tokio::spawn(crate::sandbox::reaper::sweep(move || {
                sandbox.strong_count() > 0
            }));
        }
        let rootfs = Arc::new(RootfsMaker {
            mode: rootfs_mode,
            options: RootfsOptions {
                size_bytes: options.rootfs_size_bytes,
                root_id: store.content().owner_shift(),
                ..RootfsOptions::default()
            },
            dir: rootfs_dir,
            instance: store.instance().clone(),
            next: AtomicU64::new(0),
        });
        let pool = match (options.warm_pool, rootfs_mode) {
            (Some(pool), ResolvedMode::Overlay) if pool.size > 0 => Some(pool::Pool::new(
                Arc::clone(&sandbox),
                Arc::clone(&rootfs),
                pool,
            )),
            // A warm container in copy mode would hold a whole copy of its
            // image in memory while it waits: calls copy on demand instead.
            (Some(pool), ResolvedMode::Copy) if pool.size > 0 => {
                tracing::info!("no warm containers in copy mode (each would hold a copy of its image in memory)");
                None
            }
            _ => None,
        };
        Ok(Self {
            store,
            sandbox,
            rootfs,
            pool,
            teardown: Teardown::inline(),
        })
    }

    /// Removes every warm container and waits for teardowns in flight: a
    /// daemon calls this as it exits (dropping the runner removes them
    /// too, synchronously).
    pub async fn shutdown(&self) {
        if let Some(pool) = &self.pool {
            pool.shutdown().await;
        }
    }

    /// Drops the warm containers of the images `digests` (manifest
    /// digests) that no call uses, and waits until they are gone and
    /// their pins with them (`GcReport::over_budget_in_use` names the
    /// images: a daemon's collector calls this so that idle warm
    /// containers never keep the cache over its budget). Returns how many
    /// of the pool's keys (image and settings) went.
    pub async fn release_idle_images(&self, digests: &[String]) -> usize {
        let Some(pool) = &self.pool else {
            return 0;
        };
        let (count, done) = pool.release_idle(digests);
        done.await;
        count
    }

    /// What the warm pool holds and did; `None` without a pool.
    pub fn pool_stats(&self) -> Option<PoolStats> {
        self.pool.as_ref().map(|pool| pool.stats())
    }

    /// Why cpu/memory/pids limits are not enforced, when they are not (log it
    /// at start and export it in metrics).
    pub fn limits_unavailable(&self) -> Option<&str> {
        self.sandbox.limits_unavailable()
    }

    /// Checks that the OCI runtime is crun, new enough: daemons call it at
    /// start (runs check it before their first container anyway).
    pub fn check_runtime(&self) -> Result<CrunVersion, RunError> {
        Ok(self.sandbox.check_runtime()?)
    }

    /// The image store.
    pub fn store(&self) -> &ImageStore {
        &self.store
    }

    /// Runs `image` once with `input` on stdin and returns its stdout.
    pub async fn run(
        &self,
        image: &str,
        input: &[u8],
        config: &RunConfig,
    ) -> Result<RunOutput, RunError> {
        self.sandbox.check_limits()?;
        let started = std::time::Instant::now();
        // The call's timeout bounds its pull too, not only --pull-timeout.
        let pulled = self
            .store
            .ensure_within(image, config.pull_policy, &config.auth, config.timeout)
            .await?;
        let pulled_at = started.elapsed();
        // Counts this call in its key's demand, cold or warm, until it ends.
        let mut lease = self.pool.as_ref().map(|pool| {
            pool.lease(pool_key(&pulled.digest, config), || Recipe {
                config: pulled.config.config().clone(),
                layers: pulled.layers.clone(),
                flattened: None,
                pin: pulled.pin.clone(),
            })
        });
        if let Some(warm) = lease.as_mut().and_then(pool::Lease::take) {
            let output = warm.run(input, config.timeout).await?;
            tracing::debug!(
                image,
                ?pulled_at,
                done_at = ?started.elapsed(),
                "warm run phases (cumulative)"
            );
            return Ok(output.into());
        }
        let recipe = self.recipe(&pulled).await?;
        let settings = Settings {
            host_network: config.network == NetworkPolicy::Runner,
            limits: config.limits,
            ..Settings::default()
        };
        // The call's timeout bounds the container's creation too.
        let since = std::time::Instant::now();
        let created = tokio::time::timeout(
            config.timeout,
            FunctionContainer::create(
                &*self.sandbox,
                &self.rootfs,
                &recipe,
                settings,
                &self.teardown,
            ),
        )
        .await
        .map_err(|_| RunError::Timeout(config.timeout))??;
        let created_at = started.elapsed();
        let (result, remains) = created.run(input, config.timeout, since).await;
        let ran_at = started.elapsed();
        // Awaited, so the rootfs is gone when this call returns. (Dropped
        // mid-run, the container and rootfs are cleaned by their own Drop
        // instead.)
        self.teardown.drop_later(remains).await;
        let output = result?;
        tracing::debug!(
            image,
            ?pulled_at,
            ?created_at,
            ?ran_at,
            done_at = ?started.elapsed(),
            "run phases (cumulative)"
        );
        Ok(output.into())
    }

    /// Starts `image` as `options` say and leaves it running as a
    /// function server. `config.timeout` bounds the start (pull excluded);
    /// `config.network` is not used (see
    /// [`FunctionServerOptions::host_network`]).
    pub async fn serve(
        &self,
        image: &str,
        options: FunctionServerOptions<'_>,
        config: &RunConfig,
    ) -> Result<FunctionServer, RunError> {
        let (server, _) = self.serve_prepared(image, options, config, None).await?;
        Ok(server)
    }

    /// [`Runner::serve`] from `prepared`, a container created ahead by
    /// [`Runner::prepare_server`], when it was made for the image's digest
    /// now and `options` (else it is discarded) and is still there (else
    /// one is created). Says whether it started the prepared one.
    pub(crate) async fn serve_prepared(
        &self,
        image: &str,
        options: FunctionServerOptions<'_>,
        config: &RunConfig,
        prepared: Option<PreparedServer>,
    ) -> Result<(FunctionServer, Origin), RunError> {
        let since = std::time::Instant::now();
        let plan = match self.server_plan(image, options, config).await {
            Ok(plan) => plan,
            Err(err) => {
                if let Some(prepared) = prepared {
                    prepared.discard().await;
                }
                return Err(err);
            }
        };
        tracing::debug!(image, resolved_at = ?since.elapsed(), "function server's package resolved");
        FunctionServer::start(plan, prepared).await
    }

    /// Creates the container of a server of `image` served as `options`
    /// say, ahead of its start by [`Runner::serve_prepared`] (pulled
    /// under `config`'s policy; `config.timeout` bounds the creation).
    pub(crate) async fn prepare_server(
        &self,
        image: &str,
        options: FunctionServerOptions<'_>,
        config: &RunConfig,
    ) -> Result<PreparedServer, RunError> {
        FunctionServer::prepare(self.server_plan(image, options, config).await?).await
    }

    /// Whether a container made ahead costs only its process and empty
    /// mounts: with overlays, not copies (a copy of its image, in memory,
    /// for as long as it waits).
    pub(crate) fn makes_cheap_containers(&self) -> bool {
        self.rootfs.mode == ResolvedMode::Overlay
    }

    /// What a server of `image` served as `options` say is made from: its
    /// image pulled under `config`'s policy (the pull not bounded by its
    /// timeout), where limits may run.
    async fn server_plan<'a>(
        &'a self,
        image: &str,
        options: FunctionServerOptions<'a>,
        config: &RunConfig,
    ) -> Result<ServerPlan<'a>, RunError> {
        self.sandbox.check_limits()?;
        let pulled = self
            .store
            .ensure(image, config.pull_policy, &config.auth)
            .await?;
        let recipe = self.recipe(&pulled).await?;
        Ok(ServerPlan {
            sandbox: &self.sandbox,
            rootfs: &self.rootfs,
            teardown: &self.teardown,
            recipe,
            digest: pulled.digest.clone(),
            options,
            limits: config.limits,
            timeout: config.timeout,
        })
    }

    /// Prepares a warm container of `image` with `config`'s settings ahead
    /// of a call that will come (a render prepares every step's container
    /// before the first step runs, so that no step waits for its own):
    /// pulls the image under the pull policy and, with a pool, waits until
    /// the container is made (and started, by default). Without a pool it
    /// only pulls. A container that cannot be made is no error here: the
    /// call takes the cold path and reports why.
    pub async fn prewarm(&self, image: &str, config: &RunConfig) -> Result<(), RunError> {
        let pulled = self
            .store
            .ensure(image, config.pull_policy, &config.auth)
            .await?;
        if let Some(pool) = &self.pool {
            pool.prepare(pool_key(&pulled.digest, config), || Recipe {
                config: pulled.config.config().clone(),
                layers: pulled.layers.clone(),
                flattened: None,
                pin: pulled.pin.clone(),
            })
            .await;
        }
        Ok(())
    }

    /// What a container of `image` is made from: in copy mode, with the
    /// image's flattened copy (made once per image, shared).
    async fn recipe(&self, image: &PulledImage) -> Result<Recipe, RunError> {
        let flattened = match self.rootfs.mode {
            ResolvedMode::Copy => Some(self.store.flattened_rootfs(image).await?),
            ResolvedMode::Overlay => None,
        };
        Ok(Recipe {
            config: image.config.config().clone(),
            layers: image.layers.clone(),
            flattened,
            pin: image.pin.clone(),
        })
    }
}

impl From<crate::sandbox::CrunOutput> for RunOutput {
    fn from(output: crate::sandbox::CrunOutput) -> Self {
        Self {
            stdout: output.stdout,
            stderr_tail: output.stderr_tail,
            usage: output.usage,
        }
    }
}

/// The pool's key of a call of the image `digest` with `config`.
fn pool_key(digest: &str, config: &RunConfig) -> PoolKey {
    // Every setting of a call, named: a setting added to RunConfig does
    // not compile here until it is decided whether containers must match
    // it.
    let RunConfig {
        // How the image is found, not what runs: the digest says what.
        pull_policy: _,
        auth: _,
        // Not part of a container: xfn enforces it from the start of the
        // call, warm or cold (and it varies per call, by what the caller's
        // deadline left after queueing).
        timeout: _,
        network,
        limits,
    } = config;
    PoolKey {
        digest: digest.to_string(),
        host_network: *network == NetworkPolicy::Runner,
        limits: *limits,
    }
}

/// Removes rootfs dirs of xfn instances that are gone (`<instance>-<n>`);
/// their mounts died with their mount namespace.
fn sweep_stale_rootfs(dir: &std::path::Path, instance: &crate::instance::Instance) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if instance.is_dead_name(&name) {
            tracing::info!(rootfs = %entry.path().display(), "removing a rootfs left by an earlier xfn");
            if let Err(err) = Rootfs::cleanup_stale(&entry.path()) {
                tracing::warn!(error = %crate::chain::Chain(&err), "cannot remove a rootfs left by an earlier xfn");
            }
        }
    }
}

/// [`overlay_supported`], remembered in `<run_dir>/overlay-probe` for this
/// boot and id mapping: the probe writes, mounts and removes files, which
/// costs tens of milliseconds, more than the rest of a warm `xfn run`.
fn overlay_supported_cached(
    run_dir: &std::path::Path,
    scratch: &std::path::Path,
    instance: &crate::instance::Instance,
    mapping: crate::sandbox::userns::IdMapping,
) -> bool {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let key = format!("{} {:?}", boot_id.trim(), mapping);
    let file = run_dir.join("overlay-probe");
    if let Ok(text) = std::fs::read_to_string(&file) {
        match text.strip_prefix(&key).map(str::trim) {
            Some("true") => return true,
            Some("false") => return false,
            _ => {}
        }
    }
    // In a dir named for this instance: a probe cut short by a crash is
    // swept with the rest of a dead instance's rootfs dirs.
    let scratch = scratch.join(format!("{}-overlay-probe", instance.id()));
    let ok = std::fs::create_dir_all(&scratch).is_ok() && overlay_supported(&scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    // Written to a temp name and renamed: concurrent xfn processes never
    // read half a file. Failing to remember only costs the next probe.
    let temp = run_dir.join(instance.temp_name("overlay-probe"));
    if std::fs::write(&temp, format!("{key} {ok}\n")).is_ok() {
        let _ = std::fs::rename(&temp, &file);
    }
    ok
}
