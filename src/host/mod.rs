//! `xfn host`: one rootless daemon serving every hosted Function of a
//! Crossplane v2 cluster on one port, each in its own containers, started
//! on its first call and stopped when idle.
//!
//! ```text
//! TCP :9443 ─► TLS, certificate chosen by SNI (grpc::sni; unknown: refused)
//!           ─► v1 / v1beta1 service (service.rs) ─► the connection's function
//!           ─► Server kind: one of its gRPC servers (servers.rs: which takes the
//!              call, idle, stop), each a crate::function_server (start, client)
//!              StdinStdout kind: one run per call (as adaptor::stack runs one)
//!   each function's call stacked in one place (Host::stack, crate::call)
//! ```
//!
//! # Invariants
//! - **A call is served by the function its connection names, or refused**:
//!   the route is the TLS SNI (or, plaintext, the `:authority` host), looked
//!   up among the names of the functions the catalog holds now
//!   (`NAME`, `NAME.NAMESPACE`, `NAME.NAMESPACE.svc`); nothing else routes.
//! - **Every server is bounded and goes**: at most `--max-servers-per-function`
//!   per function (or its own, `runtime_config::ServerSettings`) and
//!   `--max-servers` in all; one idle past `--server-idle` (or its own),
//!   but its warm ones, or dead is stopped (container, mounts, processes), and so is the one
//!   idle the longest when a new server finds no slot free (after any
//!   function's container created ahead, which takes a slot too: at most
//!   one per function); unhosting and the end of the drain stop them all.
//! - **Every call waits in the daemon's one queue** (`grpc::admission`:
//!   its caps on calls and bytes), whatever its function's kind.
//! - **Every log line of a call names its function** (`function` field).
pub(crate) mod catalog;
pub(crate) mod controller;
pub(crate) mod functions_file;
pub(crate) mod metrics;
pub(crate) mod runtime_config;
pub(crate) mod servers;
pub(crate) mod service;
pub(crate) mod status;
pub(crate) mod tls;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::Status;

use crate::call::admit::{Admitted, Waiting};
use crate::call::record::Recorded;
use crate::call::{self, FunctionRunner};
use crate::function_server::ResponseBudget;
use crate::grpc::sni::SniConfigs;
use crate::grpc::Calls;
use crate::image::{PullPolicy, RegistryAuth};
use crate::runner::{Limits, RunConfig, Runner};
use catalog::{FunctionKind, HostedFunction};
use controller::Hosting;
use metrics::{FunctionStats, HostStats, PackageState};
use servers::{ServerLimits, ServerSlots, Servers};

/// How the host runs functions.
#[derive(Debug, Clone)]
pub(crate) struct HostOptions {
    /// The namespace in the names functions are served under.
    pub(crate) namespace: String,
    /// Servers' bounds and idle time where a function sets none
    /// (`HostedFunction::servers`).
    pub(crate) servers: ServerLimits,
    /// Most servers of all functions at once.
    pub(crate) max_servers: usize,
    /// Most bytes of function servers' responses held at once.
    pub(crate) response_budget: usize,
    /// A stdin/stdout function's run timeout (a caller's deadline wins).
    pub(crate) run_timeout: Duration,
    /// Pulls of packages.
    pub(crate) pull_policy: PullPolicy,
    /// Every function's limits where its own (`HostedFunction::limits`)
    /// set none (`--cpu`, `--memory`; pids unset: `--pids-limit`).
    pub(crate) limits: Limits,
    /// When `/readyz` says the host is ready (`--ready-when`).
    pub(crate) ready_when: status::ReadyWhen,
}

impl HostOptions {
    /// The limits `function`'s containers run under: its own, else the
    /// defaults.
    pub(crate) fn limits_of(&self, function: &HostedFunction) -> Limits {
        let (own, default) = (function.limits, self.limits);
        Limits {
            cpu_millis: own.cpu_millis.or(default.cpu_millis),
            memory_bytes: own.memory_bytes.or(default.memory_bytes),
            pids: own.pids.or(default.pids),
        }
    }

    /// How `function`'s servers run: its own settings, else the host's
    /// flags.
    pub(crate) fn servers_of(&self, function: &HostedFunction) -> ServerLimits {
        self.servers.with(&function.servers)
    }
}

/// How one function runs, once its package was looked at.
struct Resolved {
    /// Its servers, when it is of the server kind.
    servers: Option<Arc<Servers>>,
    function: call::Function,
    /// Its call, built by [`Host::stack`].
    stack: Box<dyn FunctionRunner>,
}

/// One hosted function.
struct Function {
    spec: HostedFunction,
    resolved: tokio::sync::OnceCell<Resolved>,
    stats: Arc<FunctionStats>,
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// The daemon's state: what it hosts and how.
pub(crate) struct Host {
    runner: Arc<Runner>,
    calls: Arc<Calls>,
    options: HostOptions,
    ca: Option<tls::Ca>,
    /// By function name.
    functions: RwLock<HashMap<String, Arc<Function>>>,
    /// Routing name ─► function name.
    names: RwLock<HashMap<String, String>>,
    /// `--max-servers` slots.
    server_slots: Arc<Semaphore>,
    /// `--response-budget`.
    responses: Arc<ResponseBudget>,
    stats: HostStats,
    /// Told whenever a hosted package's state changes.
    changed: tokio::sync::watch::Sender<()>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl Host {
    /// A host running functions on `runner`, its calls admitted by
    /// `calls`, with TLS from `ca` (`None`: plaintext).
    pub(crate) fn new(
        runner: Arc<Runner>,
        calls: Arc<Calls>,
        options: HostOptions,
        ca: Option<tls::Ca>,
    ) -> Arc<Self> {
        let server_slots = Arc::new(Semaphore::new(options.max_servers.max(1)));
        let responses = Arc::new(ResponseBudget::new(options.response_budget));
        Arc::new(Self {
            runner,
            calls,
            options,
            ca,
            functions: RwLock::default(),
            names: RwLock::default(),
            server_slots,
            responses,
            stats: HostStats::default(),
            changed: tokio::sync::watch::Sender::new(()),
        })
    }

    /// The per-function metrics, for the daemon's `/metrics`.
    pub(crate) fn stats(&self) -> HostStats {
        self.stats.clone()
    }

    /// The names `function` is served under, as Crossplane's Deployment
    /// runtime names its Service.
    pub(crate) fn names_of(&self, function: &str) -> Vec<String> {
        let ns = &self.options.namespace;
        vec![
            function.to_string(),
            format!("{function}.{ns}"),
            format!("{function}.{ns}.svc"),
        ]
    }

    fn function_named(&self, name: &str) -> Option<Arc<Function>> {
        // In the order `host` writes them; the name is not copied per call.
        let functions = read(&self.functions);
        let names = read(&self.names);
        functions.get(names.get(name)?).cloned()
    }

    /// Answers one call to the function `name` routes to: the request and
    /// the response as their bytes on the wire (v1 and v1beta1 alike).
    pub(crate) async fn call(
        self: &Arc<Self>,
        name: Option<&str>,
        request: Bytes,
        deadline: Option<Instant>,
    ) -> Result<Bytes, Status> {
        let Some(name) = name else {
            return Err(Status::invalid_argument(
                "the call names no function: dial the function by its name (TLS SNI, or the :authority host)",
            ));
        };
        let Some(function) = self.function_named(name) else {
            tracing::warn!(function = %crate::echo::Echo(name), "call to a name no function is hosted under: refused");
            return Err(Status::not_found(format!(
                "no function is hosted under the name {}",
                crate::echo::Echo(name)
            )));
        };
        let stats = Arc::clone(&function.stats);
        stats.calls.inc();
        let arrived = Instant::now();
        let answer = self.answer(&function, request, deadline).await;
        stats.observe_call(arrived.elapsed());
        if answer.is_err() {
            stats.errors.inc();
        }
        answer
    }

    async fn answer(
        self: &Arc<Self>,
        function: &Function,
        request: Bytes,
        deadline: Option<Instant>,
    ) -> Result<Bytes, Status> {
        let resolved = function
            .resolved
            .get_or_try_init(|| self.resolve(function))
            .await?;
        let request = call::Request {
            input: request,
            deadline,
        };
        let response = resolved
            .stack
            .run_function(&resolved.function, request)
            .await?;
        Ok(response.output)
    }

    /// Pulls `function`'s package and decides how it runs (see
    /// [`decide_kind`]); its package's state says how that went.
    async fn resolve(self: &Arc<Self>, function: &Function) -> Result<Resolved, Status> {
        let resolved = self.resolve_spec(&function.spec, &function.stats).await;
        let state = match &resolved {
            Ok((_, state)) => state.clone(),
            Err(status) => PackageState::failing(status.message()),
        };
        self.set_package(function, Some(state));
        resolved.map(|(resolved, _)| resolved)
    }

    /// Sets `function`'s package state while it is the one hosted under
    /// its name, telling whoever watches the changes.
    fn set_package(&self, function: &Function, state: Option<PackageState>) {
        if (state.is_none() || self.is_current(function)) && function.stats.set_package(state) {
            self.changed.send_replace(());
        }
    }

    /// Whether `function` is the one hosted under its name now.
    fn is_current(&self, function: &Function) -> bool {
        read(&self.functions)
            .get(&function.spec.name)
            .is_some_and(|hosted| std::ptr::eq(Arc::as_ptr(hosted), function))
    }

    async fn resolve_spec(
        self: &Arc<Self>,
        spec: &HostedFunction,
        stats: &Arc<FunctionStats>,
    ) -> Result<(Resolved, PackageState), Status> {
        let pulled = self
            .runner
            .store()
            .ensure(
                &spec.package,
                self.options.pull_policy,
                &RegistryAuth::default(),
            )
            .await
            .map_err(|e| {
                let status = crate::grpc::status_of(&crate::runner::RunError::from(e));
                Status::new(
                    status.code(),
                    format!("function {}: {}", spec.name, status.message()),
                )
            })?;
        let kind = spec.kind.unwrap_or_else(|| decide_kind(&pulled.config));
        tracing::info!(function = %spec.name, package = %spec.package, digest = %pulled.digest, ?kind, overridden = spec.kind.is_some(), "function package ready");
        let state = PackageState::Ready {
            digest: pulled.digest.clone(),
            kind,
        };
        let (config, servers) = self.runs_as(spec, kind, stats);
        let resolved = Resolved {
            stack: self.stack(servers.as_ref(), stats),
            servers,
            function: call::Function {
                name: Some(spec.name.clone()),
                image: spec.package.clone(),
                config,
            },
        };
        Ok((resolved, state))
    }

    /// How a function of `kind` runs: its containers' config, and its
    /// servers when it is of the server kind.
    fn runs_as(
        self: &Arc<Self>,
        spec: &HostedFunction,
        kind: FunctionKind,
        stats: &Arc<FunctionStats>,
    ) -> (RunConfig, Option<Arc<Servers>>) {
        let limits = self.options.limits_of(spec);
        match kind {
            FunctionKind::Server => {
                let slots: std::sync::Weak<Host> = Arc::downgrade(self);
                let servers = Servers::new(
                    spec.name.clone(),
                    spec.package.clone(),
                    self.options.servers_of(spec),
                    Arc::clone(stats),
                    &self.responses,
                    Arc::clone(&self.runner),
                    slots,
                );
                let config = RunConfig {
                    pull_policy: self.options.pull_policy,
                    limits,
                    ..RunConfig::default()
                };
                (config, Some(Arc::new(servers)))
            }
            FunctionKind::StdinStdout => {
                let config = RunConfig {
                    pull_policy: PullPolicy::IfNotPresent,
                    timeout: self.options.run_timeout,
                    limits,
                    ..RunConfig::default()
                };
                (config, None)
            }
        }
    }

    /// A hosted function's call, top to bottom: recorded (metrics, its
    /// `function=` log lines), admitted in the daemon's one queue, then
    /// either on its servers (waiting for room on them: their lane) or,
    /// a stdin/stdout function, as the adaptor runs one (`adaptor::stack`).
    fn stack(
        &self,
        servers: Option<&Arc<Servers>>,
        stats: &Arc<FunctionStats>,
    ) -> Box<dyn FunctionRunner> {
        let calls = &self.calls;
        match servers {
            Some(servers) => Box::new(Recorded::new(
                calls,
                Admitted::to_lane(
                    calls,
                    servers.lane(),
                    Arc::clone(stats) as Arc<dyn Waiting>,
                    Arc::clone(servers),
                ),
            )),
            None => crate::adaptor::stack(Arc::clone(&self.runner), calls, None),
        }
    }

    /// Stops the servers idle past their idle time (and dead ones), and
    /// starts those kept warm that are missing, every quarter of the
    /// shortest idle time, until the host is dropped.
    pub(crate) fn keep_tidy(self: &Arc<Self>) {
        let host = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(every) = host.upgrade().map(|host| host.tidy_every()) else {
                    return;
                };
                tokio::time::sleep(every).await;
                let Some(host) = host.upgrade() else { return };
                let all: Vec<Arc<Function>> = read(&host.functions).values().cloned().collect();
                // Every stop first: a slot it frees serves any function's
                // warm server or container created ahead in the same sweep.
                for function in &all {
                    if let Some(servers) = servers_of(function) {
                        servers.stop_idle().await;
                    }
                }
                for function in &all {
                    host.keep_warm(function).await;
                }
            }
        });
    }

    /// A quarter of the shortest idle time of the host's and its
    /// functions' (and of `--prepared-idle`), within 100 ms … 30 s.
    fn tidy_every(&self) -> Duration {
        let host = &self.options.servers;
        let shortest = read(&self.functions)
            .values()
            .filter_map(|f| f.spec.servers.idle)
            .chain(host.prepared_idle)
            .fold(host.idle, Duration::min);
        (shortest / 4).clamp(Duration::from_millis(100), Duration::from_secs(30))
    }

    /// Starts `function`'s servers kept warm (its `min_servers`) that are
    /// not running, once its package is ready.
    async fn keep_warm(&self, function: &Function) {
        if let Some(resolved) = function.resolved.get() {
            if let Some(servers) = &resolved.servers {
                servers.keep_warm(&resolved.function.config).await;
            }
        }
    }

    /// Stops every function's servers (after the drain).
    pub(crate) async fn shutdown(&self) {
        let all: Vec<Arc<Function>> = write(&self.functions).drain().map(|(_, f)| f).collect();
        write(&self.names).clear();
        for function in all {
            stop(&function).await;
        }
        tracing::info!("every function server stopped");
    }
}

/// A function's servers, once resolved, if it is of the server kind.
fn servers_of(function: &Function) -> Option<&Arc<Servers>> {
    function.resolved.get()?.servers.as_ref()
}

async fn stop(function: &Function) {
    if let Some(servers) = servers_of(function) {
        servers.stop_all().await;
    }
}

impl ServerSlots for Host {
    fn slots(&self) -> &Arc<Semaphore> {
        &self.server_slots
    }

    fn stop_least_recently_used<'a>(
        &'a self,
        except: &'a str,
    ) -> futures::future::BoxFuture<'a, bool> {
        Box::pin(async move {
            let all: Vec<Arc<Function>> = read(&self.functions).values().cloned().collect();
            // A container created ahead goes first: losing it costs its
            // function only the creation it saved.
            for servers in all
                .iter()
                .filter(|f| f.spec.name != except)
                .filter_map(|f| servers_of(f))
            {
                if servers.discard_prepared().await {
                    return true;
                }
            }
            let mut idle: Vec<(Instant, &Servers)> = all
                .iter()
                .filter(|f| f.spec.name != except)
                .filter_map(|f| {
                    let servers = servers_of(f)?;
                    Some((servers.least_recently_used()?, servers.as_ref()))
                })
                .collect();
            idle.sort_by_key(|(used, _)| *used);
            for (_, servers) in idle {
                if servers.stop_least_recently_used().await {
                    return true;
                }
            }
            false
        })
    }
}

/// A package's kind from its image config: a gRPC function server unless
/// the image says it reads a request on stdin, by the label
/// `io.crossplane.xfn.kind: stdin-stdout`. Every SDK's function image is a
/// server listening on 9443, the default; `xfn wrap`'s packages embed
/// `xfn adapt` (a server too, but one that needs a container runtime in its
/// container): host the wrapped function image itself, with the override.
pub(crate) fn decide_kind(config: &oci_spec::image::ImageConfiguration) -> FunctionKind {
    let stdin = config
        .config()
        .as_ref()
        .and_then(|c| c.labels().as_ref())
        .and_then(|labels| labels.get(KIND_LABEL))
        .is_some_and(|kind| kind == "stdin-stdout");
    match stdin {
        true => FunctionKind::StdinStdout,
        false => FunctionKind::Server,
    }
}

/// The image label that marks a stdin/stdout function image.
pub(crate) const KIND_LABEL: &str = "io.crossplane.xfn.kind";

impl Hosting for Arc<Host> {
    fn host(&self, function: HostedFunction) {
        let names = self.names_of(&function.name);
        let tls = match &self.ca {
            Some(ca) => match ca.server_config(&names) {
                Ok(config) => Some(config),
                Err(err) => {
                    tracing::error!(function = %function.name, error = %crate::chain::Chain(&err), "cannot issue the function's server certificate: not hosted");
                    return;
                }
            },
            None => None,
        };
        let (old, hosted) = {
            let mut functions = write(&self.functions);
            if let Some(old) = functions.get(&function.name) {
                if old.spec == function {
                    return;
                }
            }
            let hosted = Arc::new(Function {
                stats: self.stats.of(&function.name),
                spec: function.clone(),
                resolved: tokio::sync::OnceCell::new(),
                tls,
            });
            let mut by_name = write(&self.names);
            for name in &names {
                by_name.insert(name.clone(), function.name.clone());
            }
            let old = functions.insert(function.name.clone(), Arc::clone(&hosted));
            (old, hosted)
        };
        self.set_package(&hosted, Some(PackageState::Pulling));
        let limits = self.options.limits_of(&function);
        let servers = self.options.servers_of(&function);
        tracing::info!(
            function = %function.name,
            package = %function.package,
            ?names,
            cpu_limit_millis = limits.cpu_millis,
            memory_limit_bytes = limits.memory_bytes,
            pids_limit = limits.pids,
            max_servers = servers.max_servers,
            min_servers = servers.min_servers,
            calls_per_server = servers.calls_per_server,
            server_idle = ?servers.idle,
            host_network = servers.host_network,
            "hosted"
        );
        if let Some(old) = old {
            tokio::spawn(async move { stop(&old).await });
        }
        // The package is pulled now, so the first call does not wait for
        // it; its servers still start on demand. A failure is logged and
        // tried again with a backoff (and by each call meanwhile) while the
        // function is hosted, so its readiness comes when its package does.
        status::keep_resolving(Arc::downgrade(self), hosted);
    }

    fn readiness(&self, name: &str) -> controller::Readiness {
        self.package_readiness(name)
    }

    fn readiness_changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    fn unhost(&self, name: &str) {
        let old = write(&self.functions).remove(name);
        write(&self.names).retain(|_, function| function != name);
        if let Some(old) = old {
            self.set_package(&old, None);
            tracing::info!(function = %name, "unhosted");
            tokio::spawn(async move { stop(&old).await });
        }
    }
}

impl SniConfigs for Host {
    fn config_for(&self, server_name: &str) -> Option<Arc<rustls::ServerConfig>> {
        self.function_named(server_name)?.tls.clone()
    }
}

// The static catalog never unhosts; the controller's catalog does.
const _: fn(&Arc<Host>, &str) = <Arc<Host> as Hosting>::unhost;
