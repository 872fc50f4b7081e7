//! One function's gRPC servers: started on demand from the package image
//! through the runner (`Runner::serve`, the lifecycle every kept container
//! has), from the container of its next server when one was created ahead
//! (at most one, only while fewer than `max_servers` run and its last call
//! is younger than `--prepared-idle`, so that a function scaled to zero for
//! long costs nothing; it holds a `--max-servers` slot and is the first to
//! go when another function needs one). They are reached privately inside
//! their own network namespace (or on xfn's, its network policy `Runner`),
//! stopped when idle or dead (or, when every `--max-servers` slot is taken,
//! the one idle the longest of any function, for another's) but never
//! below its `min_servers` (kept warm: started when hosted, a dead one
//! replaced), at most `max_servers` of them, each taking at most
//! `calls_per_server` calls at once; further calls wait their turn (FIFO)
//! within their deadline, in the daemon's one queue
//! ([`crate::grpc::admission`]: its caps on calls and bytes). Calls pass
//! through as their bytes ([`crate::grpc::raw`]) on each server's
//! [`function_server::Client`] (its bounds on answers); a server's exit is
//! told by its pidfd. This file picks, prepares, idles and stops; starting
//! and calling are the room's.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tonic::{Code, Status};

use super::metrics::FunctionStats;
use super::runtime_config::ServerSettings;
use bytes::Bytes;

use crate::call::admit::Waiting;
use crate::call::{self, FunctionRunner};
use crate::function_server::{
    self, lost_connection, Client, ResponseBudget, ResponseShare, Server, ServerError,
};
use crate::grpc::admission::Lane;
use crate::runner::{NetworkPolicy, Origin, RunConfig, RunError, Runner};
use crate::sandbox::exit_watch::ExitWatch;

/// How a function's servers run (the host's flags, or the function's own
/// settings: `runtime_config::ServerSettings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerLimits {
    /// Most servers of one function at once.
    pub(crate) max_servers: usize,
    /// Most calls one server takes at once.
    pub(crate) calls_per_server: usize,
    /// A server with no call this long is stopped.
    pub(crate) idle: Duration,
    /// The longest a server may take to listen.
    pub(crate) start_timeout: Duration,
    /// Servers kept running, idle or not (at most `max_servers`).
    pub(crate) min_servers: usize,
    /// Whether its servers share xfn's network instead of their own.
    pub(crate) host_network: bool,
    /// Whether its next server's container is created ahead of its start
    /// (`--prepare-servers`): for as long as its last call is younger
    /// than this (`--prepared-idle`), `None` never.
    pub(crate) prepared_idle: Option<Duration>,
}

impl ServerLimits {
    /// These (the host's flags) where `own` (a function's) sets nothing;
    /// its minimum of warm servers raises its maximum to it.
    pub(crate) fn with(self, own: &ServerSettings) -> Self {
        let min_servers = own.min_servers.unwrap_or(self.min_servers);
        Self {
            max_servers: own.max_servers.unwrap_or(self.max_servers).max(min_servers),
            calls_per_server: own.calls_per_server.unwrap_or(self.calls_per_server),
            idle: own.idle.unwrap_or(self.idle),
            start_timeout: self.start_timeout,
            min_servers,
            host_network: own
                .network
                .map_or(self.host_network, |n| n == NetworkPolicy::Runner),
            prepared_idle: self.prepared_idle,
        }
    }
}

/// The host's `--max-servers` slots, shared by every function, and how
/// one is freed when none is.
pub(crate) trait ServerSlots: Send + Sync {
    /// One permit per server that may run.
    fn slots(&self) -> &Arc<Semaphore>;
    /// Stops the server idle the longest among every function's (but
    /// `except`'s); whether there was one.
    fn stop_least_recently_used<'a>(
        &'a self,
        except: &'a str,
    ) -> futures::future::BoxFuture<'a, bool>;
}

/// A running server of the function's, and its calls.
#[derive(Debug)]
struct HostedServer {
    id: u64,
    client: Client,
    served: tokio::sync::Mutex<Option<Server>>,
    exit_watch: ExitWatch,
    in_flight: AtomicUsize,
    last_used: Mutex<Instant>,
    /// One of the host's `--max-servers` slots, given back when it stops.
    _slot: OwnedSemaphorePermit,
}

impl HostedServer {
    /// Whether its pidfd told of its exit: readiness the runtime already
    /// holds, so a live server costs no syscall (no `waitid` per call).
    fn seen_exited(&self) -> bool {
        use futures::FutureExt;
        self.exit_watch.exited().now_or_never().is_some()
    }

    /// Whether it exited, and why.
    async fn exited(&self) -> Option<String> {
        match self.exit().await? {
            Exit::Failed(e) => Some(crate::chain::Chain(&e).to_string()),
            Exit::Stopped => Some("stopped".into()),
        }
    }

    /// Whether it exited, and how.
    async fn exit(&self) -> Option<Exit> {
        let mut served = self.served.lock().await;
        match served.as_mut() {
            Some(served) => served.exited().map(Exit::Failed),
            None => Some(Exit::Stopped),
        }
    }

    /// How it ended, once its exit is seen within `within`.
    async fn exit_within(&self, within: Duration) -> Option<Exit> {
        // Told by its pidfd; an error of the watch is only a look now.
        let _ = tokio::time::timeout(within, self.exit_watch.exited()).await;
        self.exit().await
    }

    async fn stop(&self) {
        let served = self.served.lock().await.take();
        if let Some(served) = served {
            served.stop().await;
        }
    }
}

/// The container of a function's next server, created ahead, and the
/// `--max-servers` slot it holds (the server started from it keeps it).
#[derive(Debug)]
struct Prepared {
    container: function_server::Prepared,
    slot: OwnedSemaphorePermit,
}

/// How long a failed creation ahead keeps a function from trying again
/// (its calls still start servers meanwhile, creating their containers).
const PREPARE_RETRY: Duration = Duration::from_secs(60);

/// How a server ended.
#[derive(Debug)]
enum Exit {
    /// It exited or was killed (its code, an OOM kill, its output's tail).
    Failed(RunError),
    /// xfn stopped it.
    Stopped,
}

/// One function's servers.
#[derive(Debug)]
pub(crate) struct Servers {
    function: String,
    image: String,
    limits: ServerLimits,
    /// `max_servers × calls_per_server` call slots, waited for in the
    /// daemon's one queue (`grpc::admission`).
    lane: Lane,
    running: Mutex<Vec<Arc<HostedServer>>>,
    /// Set by `stop_all`: a server started after it is stopped at once.
    stopped: std::sync::atomic::AtomicBool,
    /// Held while a server is picked, started or prepared: one at a time.
    picking: tokio::sync::Mutex<()>,
    /// Its next server's container, created ahead (at most one), while
    /// fewer than `max_servers` run.
    prepared: Mutex<Option<Prepared>>,
    /// When creating one ahead last failed.
    prepare_failed: Mutex<Option<Instant>>,
    /// When its last call came (when it was hosted, before any): a
    /// container is created ahead only within `prepared_idle` of it.
    last_call: Mutex<Instant>,
    next_id: std::sync::atomic::AtomicU64,
    /// Servers that failed to start or died in a call, in a row.
    backoff: Mutex<Backoff>,
    stats: Arc<FunctionStats>,
    /// This function's share of the host's response budget, shared by
    /// its servers.
    responses: Arc<ResponseShare>,
    /// What starts its servers.
    runner: Arc<Runner>,
    /// The host's `--max-servers` slots (the host owns its functions).
    host: Weak<dyn ServerSlots>,
}

/// The backend of a kept server: a call admitted for room on the
/// function's servers ([`Servers::lane`]) is answered by one of them,
/// started when none has room.
#[async_trait::async_trait]
impl FunctionRunner for Servers {
    async fn run_function(
        &self,
        function: &call::Function,
        request: call::Request,
    ) -> Result<call::Response, Status> {
        let host = self
            .host
            .upgrade()
            .ok_or_else(|| Status::unavailable("xfn is shutting down"))?;
        let answer = self
            .call_admitted(
                host.as_ref(),
                &function.config,
                request.input,
                request.deadline,
            )
            .await?;
        Ok(call::Response::ran(answer))
    }
}

/// A function's calls waiting for room on its servers (`queued`).
impl Waiting for FunctionStats {
    fn raise(&self) {
        self.queued.add(1);
    }
    fn lower(&self) {
        self.queued.add(-1);
    }
}

impl Servers {
    pub(crate) fn new(
        function: String,
        image: String,
        limits: ServerLimits,
        stats: Arc<FunctionStats>,
        responses: &Arc<ResponseBudget>,
        runner: Arc<Runner>,
        host: Weak<dyn ServerSlots>,
    ) -> Self {
        let slots = limits.max_servers.max(1) * limits.calls_per_server.max(1);
        let responses = Arc::new(responses.share());
        stats.set_responses(&responses);
        Self {
            function,
            image,
            limits,
            lane: Lane::new(slots),
            running: Mutex::default(),
            stopped: Default::default(),
            picking: tokio::sync::Mutex::new(()),
            prepared: Mutex::default(),
            prepare_failed: Mutex::default(),
            last_call: Mutex::new(Instant::now()),
            next_id: Default::default(),
            backoff: Mutex::default(),
            stats,
            responses,
            runner,
            host,
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Vec<Arc<HostedServer>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its prepared container, taken out (the gauge follows).
    fn take_prepared(&self) -> Option<Prepared> {
        let taken = self
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        self.stats.prepared.set(0);
        taken
    }

    /// The slots its calls wait for in the daemon's one queue.
    pub(crate) fn lane(&self) -> Lane {
        self.lane.clone()
    }

    async fn call_admitted(
        &self,
        host: &dyn ServerSlots,
        config: &RunConfig,
        request: Bytes,
        deadline: Option<Instant>,
    ) -> Result<Bytes, Status> {
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        // Counted in its `in_flight` already.
        let server = self.pick(host, config, deadline).await?;
        let answer = server.client.call(&request, deadline).await;
        *server.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        server.in_flight.fetch_sub(1, Ordering::Relaxed);
        let status = match answer {
            Ok(response) => {
                self.backoff().answered();
                return Ok(response);
            }
            Err(status) => status,
        };
        // An answer of the function's own is passed on; a broken connection
        // is the server's death (its exit may be seen a moment after).
        if !lost_connection(&status) {
            return Err(status);
        }
        let exit = server.exit_within(EXIT_SEEN_WITHIN).await;
        self.remove(&server).await;
        let lost = lost_during_call(&self.function, exit, &status);
        self.backoff().failed(lost.message());
        tracing::warn!(function = %self.function, server = server.id, code = ?lost.code(), why = lost.message(), "function server lost during a call; the next call starts a new one");
        Err(lost)
    }

    /// A live server with room, or a new one, its call counted in its
    /// `in_flight` before the pick is let go (so no stop of idle servers
    /// takes it meanwhile).
    async fn pick(
        &self,
        host: &dyn ServerSlots,
        config: &RunConfig,
        deadline: Option<Instant>,
    ) -> Result<Arc<HostedServer>, Status> {
        let _picking = until(deadline, self.picking.lock()).await.ok_or_else(|| {
            Status::deadline_exceeded(format!(
                "function {}: the caller's deadline passed while a server started",
                self.function
            ))
        })?;
        let candidates: Vec<Arc<HostedServer>> = self.running().clone();
        for server in candidates {
            // Told by its pidfd, then why (reaping it).
            if server.seen_exited() {
                if let Some(why) = server.exited().await {
                    tracing::warn!(function = %self.function, server = server.id, %why, "function server found dead; removed");
                    self.remove(&server).await;
                    continue;
                }
            }
            if server.in_flight.load(Ordering::Relaxed) < self.limits.calls_per_server {
                server.in_flight.fetch_add(1, Ordering::Relaxed);
                return Ok(server);
            }
        }
        let server = self.start(host, config, deadline).await?;
        server.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(server)
    }

    /// A free `--max-servers` slot; when there is none, another
    /// function's container created ahead is removed for one, else the
    /// server idle the longest (of another function) is stopped.
    async fn host_slot(
        &self,
        host: &dyn ServerSlots,
        deadline: Option<Instant>,
    ) -> Result<OwnedSemaphorePermit, Status> {
        let shutting_down = |_| Status::unavailable("xfn is shutting down");
        // A slot freed here may be taken by another function's creation
        // ahead before this call takes it: then that goes too.
        loop {
            if let Ok(slot) = Arc::clone(host.slots()).try_acquire_owned() {
                return Ok(slot);
            }
            if !host.stop_least_recently_used(&self.function).await {
                break;
            }
        }
        until(deadline, Arc::clone(host.slots()).acquire_owned())
            .await
            .ok_or_else(|| {
                Status::deadline_exceeded(format!(
                    "function {}: the caller's deadline passed while waiting for a server slot (--max-servers; every server was busy)",
                    self.function
                ))
            })?
            .map_err(shutting_down)
    }

    /// Starts a server unless its last ones failed and their backoff has
    /// not passed.
    async fn start(
        &self,
        host: &dyn ServerSlots,
        config: &RunConfig,
        deadline: Option<Instant>,
    ) -> Result<Arc<HostedServer>, Status> {
        self.backoff().refuse(&self.function)?;
        let started = self.start_now(host, config, deadline).await;
        if let Err(status) = &started {
            // Not the caller's deadline: the server's own failure.
            if status.code() != Code::DeadlineExceeded {
                self.backoff().failed(status.message());
            }
        }
        started
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn start_now(
        &self,
        host: &dyn ServerSlots,
        config: &RunConfig,
        deadline: Option<Instant>,
    ) -> Result<Arc<HostedServer>, Status> {
        let _starting = self.stats.starting.raise();
        let started = std::time::Instant::now();
        // A container created ahead is started with the slot it holds.
        let (prepared, host_slot) = match self.take_prepared() {
            Some(Prepared { container, slot }) => (Some(container), slot),
            None => (None, self.host_slot(host, deadline).await?),
        };
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let timeout = match left {
            Some(left) => left.min(self.limits.start_timeout),
            None => self.limits.start_timeout,
        };
        let config = RunConfig {
            timeout,
            ..config.clone()
        };
        let (served, origin) = function_server::start_from(
            prepared,
            &self.runner,
            &self.image,
            &config,
            &[],
            self.limits.host_network,
            Some(self.function.as_str()),
        )
        .await
        .map_err(|e| self.not_started(e))?;
        let client = served.client(
            &self.function,
            self.limits.calls_per_server,
            Arc::clone(&self.responses),
        );
        let exit_watch = served.exit_watch().clone();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let server = Arc::new(HostedServer {
            id,
            client,
            exit_watch,
            served: tokio::sync::Mutex::new(Some(served)),
            in_flight: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            _slot: host_slot,
        });
        self.running().push(Arc::clone(&server));
        // Unhosted (or shut down) while it started: it never stays.
        if self.stopped.load(Ordering::SeqCst) {
            self.remove(&server).await;
            return Err(Status::unavailable(format!(
                "function {}: no longer hosted",
                self.function
            )));
        }
        self.stats.cold_started(started.elapsed());
        self.stats.running.set(self.running().len() as i64);
        let prepared = origin == Origin::Prepared;
        tracing::info!(function = %self.function, server = id, took = ?started.elapsed(), prepared, "function server started");
        Ok(server)
    }

    /// What a caller is told of a server that did not start: its own
    /// failure `UNAVAILABLE` (or `RESOURCE_EXHAUSTED`, killed past its
    /// memory limit), what the caller asked for (a pull refused, a bad
    /// image) as the runner's status says.
    fn not_started(&self, err: ServerError) -> Status {
        let code = match &err {
            ServerError::NotListening(RunError::MemoryLimitExceeded(_)) => Code::ResourceExhausted,
            ServerError::Run(run) => {
                let status = crate::grpc::status_of(run);
                match status.code() {
                    Code::Unavailable | Code::DeadlineExceeded | Code::Internal => {
                        Code::Unavailable
                    }
                    code => {
                        let message = format!("function {}: {}", self.function, status.message());
                        return Status::new(code, message);
                    }
                }
            }
            _ => Code::Unavailable,
        };
        let mut why = crate::chain::Chain(&err).to_string();
        // A server never ends by itself; a stdin/stdout function does, at
        // once, having read an empty stdin and written its document.
        if let ServerError::NotListening(RunError::FunctionFailed { code: 0, .. }) = &err {
            why.push_str(&format!(
                " (a server never exits by itself: if this image is a stdin/stdout function, \
                 annotate its Function {}: StdinStdout)",
                crate::host::functions_file::KIND_ANNOTATION
            ));
        }
        tracing::warn!(function = %self.function, image = %self.image, error = %why, "function server did not start");
        let message = format!(
            "function {}: its server ({}) did not start: {why}",
            self.function, self.image
        );
        Status::new(code, message)
    }

    async fn remove(&self, server: &Arc<HostedServer>) {
        let removed = {
            let mut running = self.running();
            let before = running.len();
            running.retain(|s| !Arc::ptr_eq(s, server));
            let removed = running.len() != before;
            self.stats.running.set(running.len() as i64);
            removed
        };
        if removed {
            server.stop().await;
        }
    }

    /// When its server idle the longest was last used (`None`: none is
    /// idle).
    pub(crate) fn least_recently_used(&self) -> Option<Instant> {
        self.idle_servers().map(|(_, used)| used).min()
    }

    fn idle_servers(&self) -> impl Iterator<Item = (Arc<HostedServer>, Instant)> {
        let running: Vec<Arc<HostedServer>> = self.running().clone();
        running
            .into_iter()
            .filter(|s| s.in_flight.load(Ordering::Relaxed) == 0)
            .map(|s| {
                let used = *s.last_used.lock().unwrap_or_else(|p| p.into_inner());
                (s, used)
            })
    }

    /// Stops its server idle the longest to make room for another
    /// function's (counted in `xfn_host_servers_evicted_total`); whether
    /// it had one idle and not being picked.
    pub(crate) async fn stop_least_recently_used(&self) -> bool {
        // No call picks a server meanwhile.
        let Ok(_picking) = self.picking.try_lock() else {
            return false;
        };
        if self.running().len() <= self.limits.min_servers {
            return false;
        }
        let Some((server, used)) = self.idle_servers().min_by_key(|(_, used)| *used) else {
            return false;
        };
        tracing::info!(function = %self.function, server = server.id, idle = ?used.elapsed(), "no server slot free (--max-servers): the server idle the longest stopped to make room");
        self.stats.evicted.inc();
        self.remove(&server).await;
        true
    }

    /// Stops the servers idle past the idle time (but `min_servers`), and
    /// the dead ones.
    pub(crate) async fn stop_idle(&self) {
        // No call picks a server meanwhile; one being started is looked at
        // next time.
        let Ok(_picking) = self.picking.try_lock() else {
            return;
        };
        let mut candidates: Vec<Arc<HostedServer>> = self.running().clone();
        // The most recently used are the ones kept warm.
        candidates.sort_by_key(|s| *s.last_used.lock().unwrap_or_else(|p| p.into_inner()));
        let mut left = candidates.len();
        for server in candidates {
            if server.in_flight.load(Ordering::Relaxed) > 0 {
                continue;
            }
            let idle = server
                .last_used
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed();
            if idle >= self.limits.idle && left > self.limits.min_servers {
                left -= 1;
                tracing::info!(function = %self.function, server = server.id, ?idle, "function server idle: stopped");
                self.remove(&server).await;
            } else if let Some(why) = server.exited().await {
                left -= 1;
                tracing::warn!(function = %self.function, server = server.id, %why, "function server died: removed");
                self.remove(&server).await;
            }
        }
        if !self.in_prepare_window() && self.discard_prepared_now().await {
            tracing::info!(function = %self.function, no_call_for = ?self.limits.prepared_idle, "the container created ahead for its next server removed: no call for --prepared-idle (made again after its next call)");
        }
    }

    /// Whether its last call is younger than `--prepared-idle` (a
    /// container of its next server is then created ahead).
    fn in_prepare_window(&self) -> bool {
        self.limits.prepared_idle.is_some_and(|window| {
            self.last_call
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed()
                < window
        })
    }

    /// Starts servers until `min_servers` run (when hosted, and after one
    /// died or was killed), each within the start timeout; one failing is
    /// logged and tried again the next time, after its backoff. Then
    /// creates its next server's container ahead ([`Servers::prepare`]).
    pub(crate) async fn keep_warm(&self, config: &RunConfig) {
        // Failing in a row: tried after its backoff, not logged per sweep.
        if (self.running().len() >= self.limits.min_servers && !self.wants_prepared())
            || self.backoff().refuse(&self.function).is_err()
        {
            return;
        }
        let Some(host) = self.host.upgrade() else {
            return;
        };
        // No call picks a server meanwhile: a call's own start counts too.
        let _picking = self.picking.lock().await;
        while self.running().len() < self.limits.min_servers {
            let deadline = Instant::now() + self.limits.start_timeout;
            if let Err(status) = self.start(host.as_ref(), config, Some(deadline)).await {
                tracing::warn!(function = %self.function, error = status.message(), "cannot start a server kept warm (min-servers); tried again later");
                return;
            }
        }
        self.prepare(host.as_ref(), config).await;
    }

    /// Whether its next server's container should be created ahead now:
    /// on (`--prepare-servers`), called within `--prepared-idle`, hosted,
    /// none prepared, fewer than `max_servers` running, and no creation
    /// ahead failed lately.
    fn wants_prepared(&self) -> bool {
        self.in_prepare_window()
            && !self.stopped.load(Ordering::SeqCst)
            && self
                .prepared
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none()
            && self.running().len() < self.limits.max_servers
            && self
                .prepare_failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none_or(|at| at.elapsed() >= PREPARE_RETRY)
    }

    /// Creates its next server's container ahead (everything up to the
    /// server's exec: rootfs, spec, cgroup, `crun create`), so that a call
    /// finding no server only starts it, in a free `--max-servers` slot
    /// (none free: not now; a call's server needs it more). The caller
    /// holds `picking`.
    async fn prepare(&self, host: &dyn ServerSlots, config: &RunConfig) {
        if !self.wants_prepared() {
            return;
        }
        let Ok(slot) = Arc::clone(host.slots()).try_acquire_owned() else {
            return;
        };
        let config = RunConfig {
            timeout: self.limits.start_timeout,
            ..config.clone()
        };
        let made = std::time::Instant::now();
        let container = match function_server::prepare(
            &self.runner,
            &self.image,
            &config,
            &[],
            self.limits.host_network,
        )
        .await
        {
            Ok(container) => container,
            Err(err) => {
                *self
                    .prepare_failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                tracing::warn!(function = %self.function, error = %crate::chain::Chain(&err), retry_in = ?PREPARE_RETRY, "cannot create the next server's container ahead; a call creates its own meanwhile");
                return;
            }
        };
        *self.prepared.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Prepared { container, slot });
        self.stats.prepared.set(1);
        tracing::debug!(function = %self.function, took = ?made.elapsed(), "the next server's container created ahead");
        // Unhosted (or shut down) meanwhile: it never stays.
        if self.stopped.load(Ordering::SeqCst) {
            self.discard_prepared_now().await;
        }
    }

    /// Tears down its prepared container, if any; whether there was one.
    async fn discard_prepared_now(&self) -> bool {
        match self.take_prepared() {
            Some(prepared) => {
                prepared.container.discard().await;
                true
            }
            None => false,
        }
    }

    /// Tears down its prepared container to free its `--max-servers` slot
    /// for another function's server; whether it had one not being
    /// started.
    pub(crate) async fn discard_prepared(&self) -> bool {
        let Ok(_picking) = self.picking.try_lock() else {
            return false;
        };
        let discarded = self.discard_prepared_now().await;
        if discarded {
            tracing::info!(function = %self.function, "no server slot free (--max-servers): the container created ahead for its next server removed to make room");
        }
        discarded
    }

    /// Stops every server (unhost, shutdown).
    pub(crate) async fn stop_all(&self) {
        self.lane.close();
        self.stopped.store(true, Ordering::SeqCst);
        let all: Vec<Arc<HostedServer>> = std::mem::take(&mut *self.running());
        self.stats.running.set(0);
        if self.discard_prepared_now().await {
            tracing::info!(function = %self.function, "the container created ahead for its next server removed");
        }
        for server in all {
            server.stop().await;
        }
    }
}

/// The wait after a second failure in a row (after one, the next call
/// starts a new server at once), doubled per failure after it.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between a crash-looping function's starts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A function's servers failing in a row (failed starts, deaths during a
/// call): no new one is started before `next`, and calls meanwhile are
/// refused `UNAVAILABLE` naming the last failure, so a server that
/// crashes at once costs a container start per backoff, not per call.
/// One failure alone waits for nothing; an answered call ends the count.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
    next: Option<Instant>,
    last: String,
}

impl Backoff {
    fn failed(&mut self, why: &str) {
        self.failures = self.failures.saturating_add(1);
        let wait = match self.failures {
            0 | 1 => Duration::ZERO,
            n => FIRST_BACKOFF
                .saturating_mul(1 << (n - 2).min(16))
                .min(MAX_BACKOFF),
        };
        self.next = Some(Instant::now() + wait);
        self.last = why.to_string();
    }

    fn answered(&mut self) {
        *self = Self::default();
    }

    fn refuse(&self, function: &str) -> Result<(), Status> {
        match self.next {
            Some(next) if next > Instant::now() => Err(Status::unavailable(format!(
                "function {function}: its server failed {} times in a row (last: {}); no new one is started for {:?}",
                self.failures,
                self.last,
                next.saturating_duration_since(Instant::now()),
            ))),
            _ => Ok(()),
        }
    }
}

/// What the caller of a call whose server went away during it is told:
/// `RESOURCE_EXHAUSTED` when the server was killed past its memory limit
/// (as a stdin/stdout function's run is: the same call would only be
/// killed again), else `UNAVAILABLE` (a retry starts a new server).
fn lost_during_call(function: &str, exit: Option<Exit>, broken: &Status) -> Status {
    match exit {
        Some(Exit::Failed(err @ RunError::MemoryLimitExceeded(_))) => {
            Status::resource_exhausted(format!(
                "function {function}: its server was killed during the call: {}; the next call starts a new one (raise the limit in the Function's DeploymentRuntimeConfig)",
                crate::chain::Chain(&err)
            ))
        }
        exit => {
            let why = match exit {
                Some(Exit::Failed(err)) => crate::chain::Chain(&err).to_string(),
                Some(Exit::Stopped) => "stopped".to_string(),
                None => format!("the connection to it broke: {}", broken.message()),
            };
            Status::unavailable(format!(
                "function {function}: its server died during the call ({why}); a retry starts a new one"
            ))
        }
    }
}

/// How long after its connection broke a server's exit is waited for.
const EXIT_SEEN_WITHIN: Duration = Duration::from_secs(2);

/// `future`'s output, or `None` once `deadline` passed first.
async fn until<T>(
    deadline: Option<Instant>,
    future: impl std::future::Future<Output = T>,
) -> Option<T> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, future).await.ok(),
        None => Some(future.await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_killed_past_its_memory_limit_fails_its_call_resource_exhausted_naming_the_limit() {
        let oom = RunError::MemoryLimitExceeded(crate::runner::MemoryLimitExceeded {
            limit_bytes: 64 << 20,
            code: 137,
            stderr_tail: b"allocating".to_vec(),
        });
        let status = lost_during_call("big", Some(Exit::Failed(oom)), &Status::unknown("x"));
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(
            status
                .message()
                .contains("function big: its server was killed during the call: the function exceeded its memory limit of 64Mi"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn a_server_that_died_otherwise_fails_its_call_unavailable() {
        let broken = Status::unknown("transport error");
        let status = lost_during_call("f", None, &broken);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("the connection to it broke"));
        let status = lost_during_call("f", Some(Exit::Stopped), &broken);
        assert_eq!(status.code(), Code::Unavailable);
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_failing_in_a_row_is_started_again_only_after_a_doubling_backoff() {
        let mut backoff = Backoff::default();
        assert!(backoff.refuse("f").is_ok());
        backoff.failed("killed");
        assert!(
            backoff.refuse("f").is_ok(),
            "one failure: the next call starts one"
        );
        backoff.failed("exited with code 2");
        let refused = backoff.refuse("f").unwrap_err();
        assert_eq!(refused.code(), Code::Unavailable);
        assert!(
            refused
                .message()
                .contains("failed 2 times in a row (last: exited with code 2)"),
            "{refused:?}"
        );
        tokio::time::advance(FIRST_BACKOFF).await;
        assert!(backoff.refuse("f").is_ok());
        backoff.failed("again");
        tokio::time::advance(FIRST_BACKOFF).await;
        assert!(
            backoff.refuse("f").is_err(),
            "the second wait is twice the first"
        );
        tokio::time::advance(FIRST_BACKOFF).await;
        assert!(backoff.refuse("f").is_ok());
        for _ in 0..20 {
            backoff.failed("again");
        }
        tokio::time::advance(MAX_BACKOFF).await;
        assert!(
            backoff.refuse("f").is_ok(),
            "never more than the longest wait"
        );
        backoff.answered();
        backoff.failed("once more");
        assert!(
            backoff.refuse("f").is_ok(),
            "an answer starts the count again"
        );
    }

    #[test]
    fn a_functions_own_settings_win_over_the_flags_and_its_warm_servers_raise_its_maximum() {
        let flags = ServerLimits {
            max_servers: 1,
            calls_per_server: 16,
            idle: Duration::from_secs(300),
            start_timeout: Duration::from_secs(30),
            min_servers: 0,
            host_network: false,
            prepared_idle: Some(Duration::from_secs(600)),
        };
        assert_eq!(flags.with(&ServerSettings::default()), flags);
        let own = ServerSettings {
            calls_per_server: Some(2),
            idle: Some(Duration::from_secs(9)),
            min_servers: Some(3),
            network: Some(NetworkPolicy::Runner),
            ..Default::default()
        };
        assert_eq!(
            flags.with(&own),
            ServerLimits {
                max_servers: 3,
                calls_per_server: 2,
                idle: Duration::from_secs(9),
                start_timeout: Duration::from_secs(30),
                min_servers: 3,
                host_network: true,
                prepared_idle: Some(Duration::from_secs(600)),
            }
        );
        let isolated = ServerSettings {
            max_servers: Some(4),
            network: Some(NetworkPolicy::Isolated),
            ..Default::default()
        };
        let limits = flags.with(&isolated);
        assert_eq!((limits.max_servers, limits.host_network), (4, false));
    }
}
