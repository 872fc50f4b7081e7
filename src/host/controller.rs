//! The in-cluster catalog of `xfn host`: what Crossplane's Deployment runtime
//! does for a Function, done for the host when Crossplane runs with
//! `--package-runtime=Function=External`.
//!
//! Invariant: a Function is hosted exactly while it exists and one of its
//! FunctionRevisions is `Active`; then a headless Service named for the
//! Function selects the host's pods on 9443, the revision's `status.endpoint`
//! is `dns:///NAME.NS:9443`, and the revision's server Secret holds a
//! certificate for NAME, NAME.NS and NAME.NS.svc from `crossplane-root-ca`;
//! the revision's status names that Secret and says its runtime is healthy
//! once the host has its package ready, unhealthy (and why) until then
//! (what core's package manager waits for from any runtime).
//! Otherwise the Function is unhosted and the Service this controller made
//! is deleted. Why: core dials the Active revision's endpoint as written and
//! verifies the host by those names, as it would a function's own pod.
//!
//! Every replica of the host runs this controller (each must know every
//! Function to serve it), so every write is idempotent: reconcile reads the
//! objects, writes only what differs, and writes by server-side apply with
//! one field manager; two replicas converge on the same objects. One
//! reconcile is one Function, keyed by name, so a revision changing hands
//! (upgrade) is one decision, not two racing ones. Deletions seen by no
//! watch (the controller was down) are caught by the relist after a restart
//! of a watch, which reconciles every name hosted before, and by the
//! Services' owner reference to their Function (garbage collection).

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde_json::Value;

use super::catalog::HostedFunction;
use super::runtime_config::{self, RuntimeConfigRef, RuntimeConfigSpec};

/// What the controller tells of the functions it finds (the seam it owns,
/// so it is unit-tested against a recording of it; the host implements it).
pub(crate) trait Hosting: Send + Sync + 'static {
    /// Serve `function` under its names. Idempotent: the same function
    /// again is a no-op; a new package or new limits replace the old servers.
    fn host(&self, function: HostedFunction);
    /// Stop serving `name` and stop its servers; unknown names are a no-op.
    fn unhost(&self, name: &str);
    /// Whether `name`'s package is ready to serve.
    fn readiness(&self, name: &str) -> Readiness;
    /// Marked changed whenever a hosted package's readiness may have.
    fn readiness_changes(&self) -> tokio::sync::watch::Receiver<()>;
}

/// Whether a hosted Function's package is ready, as the host tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Pulled and its kind decided: its calls need no pull.
    Ready,
    /// Not yet (not hosted yet, or being pulled): why.
    Pending(String),
    /// Its last pull failed (tried again meanwhile): why.
    Failed(String),
}

/// Crossplane's package API group and version.
const PKG_API_VERSION: &str = "pkg.crossplane.io/v1";
/// The label Crossplane puts on a revision naming its Function.
const LABEL_PARENT_PACKAGE: &str = "pkg.crossplane.io/package";
/// The gRPC port and its name, as Crossplane's Deployment runtime has them.
const GRPC_PORT: i32 = 9443;
const GRPC_PORT_NAME: &str = "grpc";
/// The label marking what this controller made, so it deletes only that.
const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The Secret keys Crossplane's certificate generator writes.
const TLS_CRT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const CA_CRT: &str = "ca.crt";
/// Crossplane's server Secret name suffix when a revision names none.
const TLS_SERVER_SECRET_SUFFIX: &str = "-tls-server";
/// The longest wait before a failed reconcile is tried again.
const MAX_RETRY: Duration = Duration::from_secs(300);

/// How the controller writes what it writes.
#[derive(Debug, Clone)]
pub(crate) struct ControllerOptions {
    /// Crossplane's namespace: where the Services, the Secrets and
    /// `crossplane-root-ca` live, and the NS of every endpoint.
    pub(crate) namespace: String,
    /// The labels of the host's pods, the Services' selector.
    pub(crate) pod_selector: BTreeMap<String, String>,
    /// The server-side apply field manager, and the `managed-by` label value.
    pub(crate) field_manager: String,
    /// The Secret holding Crossplane's root CA (`tls.crt`, `tls.key`).
    pub(crate) ca_secret: String,
    /// How often every hosted Function is reconciled again regardless.
    pub(crate) resync: Duration,
    /// The host's `--max-servers`: the most servers a Function may ask for.
    pub(crate) max_servers: usize,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            namespace: "crossplane-system".to_owned(),
            pod_selector: BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                "xfn-host".to_owned(),
            )]),
            field_manager: "xfn-host".to_owned(),
            ca_secret: "crossplane-root-ca".to_owned(),
            resync: Duration::from_secs(600),
            max_servers: 32,
        }
    }
}

/// What went wrong reconciling or watching.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ControllerError {
    /// A call to the API server failed.
    #[error("cannot {verb} {kind} {name}")]
    Api {
        verb: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The CA Secret is missing or lacks a key.
    #[error("the CA secret {name} has no {key}")]
    CaIncomplete { name: String, key: &'static str },
    /// The CA's certificate or key cannot be used to sign.
    #[error("cannot use the CA in secret {name}")]
    Ca {
        name: String,
        #[source]
        source: rcgen::Error,
    },
    /// The server certificate could not be made.
    #[error("cannot issue the server certificate of {name}")]
    Issue {
        name: String,
        #[source]
        source: rcgen::Error,
    },
    /// The Function's limits or settings cannot be read from its runtime
    /// config and annotations.
    #[error("cannot read the limits and settings of Function {name}")]
    Limits {
        name: String,
        #[source]
        source: runtime_config::RuntimeConfigError,
    },
    /// A watch stream ended, which a watcher never does on its own.
    #[error("the watch of {kind} ended")]
    WatchEnded { kind: &'static str },
}

impl ControllerError {
    fn api(verb: &'static str, kind: &'static str, name: &str) -> impl FnOnce(kube::Error) -> Self {
        let name = name.to_owned();
        move |source| Self::Api {
            verb,
            kind,
            name,
            source,
        }
    }
}

fn function_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("pkg.crossplane.io", "v1", "Function"),
        "functions",
    )
}

fn runtime_config_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("pkg.crossplane.io", "v1beta1", runtime_config::KIND),
        "deploymentruntimeconfigs",
    )
}

fn revision_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("pkg.crossplane.io", "v1", "FunctionRevision"),
        "functionrevisions",
    )
}

/// Watch Functions and FunctionRevisions and keep `hosting` and the cluster
/// as the module header says, until a watch ends (never, short of the
/// client going away) — the caller runs it beside the server.
pub(crate) async fn run(
    client: Client,
    hosting: Arc<dyn Hosting>,
    options: ControllerOptions,
) -> Result<(), ControllerError> {
    let functions: Api<DynamicObject> = Api::all_with(client.clone(), &function_resource());
    let revisions: Api<DynamicObject> = Api::all_with(client.clone(), &revision_resource());
    let function_events = watcher::watcher(functions, watcher::Config::default()).default_backoff();
    let revision_events = watcher::watcher(revisions, watcher::Config::default()).default_backoff();
    let configs: Api<DynamicObject> = Api::all_with(client.clone(), &runtime_config_resource());
    let config_events = watcher::watcher(configs, watcher::Config::default()).default_backoff();
    let reconciler = Reconciler::new(client, hosting, options);
    drive(reconciler, function_events, revision_events, config_events).await
}

/// The event loop: names to reconcile from the Function and revision
/// watches (a DeploymentRuntimeConfig's change reconciles every hosted
/// Function: few, and a reconcile that changes nothing writes nothing), a
/// periodic resync,
/// and retries with a doubling delay. One reconcile at a time (a cluster
/// has tens of Functions; each reconcile is a few reads when nothing
/// changed), so the pending set and the retry table are bounded by the
/// number of Function names.
async fn drive<F, R, C>(
    reconciler: Reconciler,
    function_events: F,
    revision_events: R,
    config_events: C,
) -> Result<(), ControllerError>
where
    F: Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>,
    R: Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>,
    C: Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>,
{
    let mut function_events = std::pin::pin!(function_events);
    let mut revision_events = std::pin::pin!(revision_events);
    let mut config_events = std::pin::pin!(config_events);
    let mut resync = tokio::time::interval(reconciler.options.resync);
    // A package becoming ready (or failing) changes its revision's
    // runtime conditions: every hosted Function is reconciled again.
    let mut readiness = reconciler.hosting.readiness_changes();
    let mut watching_readiness = true;
    let mut pending = BTreeSet::new();
    let mut retries: HashMap<String, (tokio::time::Instant, u32)> = HashMap::new();
    loop {
        let next_retry = retries.values().map(|(at, _)| *at).min();
        tokio::select! {
            event = function_events.next() => match event {
                Some(Ok(event)) => pending.extend(reconciler.names_of(event, |o| o.metadata.name.clone())),
                Some(Err(error)) => tracing::warn!(error = %crate::chain::Chain(&error), "watching Functions"),
                None => return Err(ControllerError::WatchEnded { kind: "Function" }),
            },
            event = revision_events.next() => match event {
                Some(Ok(event)) => pending.extend(reconciler.names_of(event, parent_function)),
                Some(Err(error)) => tracing::warn!(error = %crate::chain::Chain(&error), "watching FunctionRevisions"),
                None => return Err(ControllerError::WatchEnded { kind: "FunctionRevision" }),
            },
            event = config_events.next() => match event {
                Some(Ok(event)) => pending.extend(reconciler.names_using(&event)),
                Some(Err(error)) => tracing::warn!(error = %crate::chain::Chain(&error), "watching DeploymentRuntimeConfigs"),
                None => return Err(ControllerError::WatchEnded { kind: "DeploymentRuntimeConfig" }),
            },
            _ = resync.tick() => pending.extend(reconciler.hosted()),
            changed = readiness.changed(), if watching_readiness => match changed {
                Ok(()) => pending.extend(reconciler.hosted()),
                Err(_) => watching_readiness = false,
            },
            _ = sleep_until(next_retry), if next_retry.is_some() => {
                let now = tokio::time::Instant::now();
                pending.extend(retries.iter().filter(|(_, (at, _))| *at <= now).map(|(n, _)| n.clone()));
            }
        }
        while let Some(name) = pending.pop_first() {
            match reconciler.reconcile(&name).await {
                Ok(()) => {
                    retries.remove(&name);
                }
                Err(error) => {
                    let attempts = retries.get(&name).map_or(0, |(_, n)| *n);
                    let delay = Duration::from_secs(1u64 << attempts.min(9)).min(MAX_RETRY);
                    tracing::warn!(function = %name, error = %crate::chain::Chain(&error), retry_in = ?delay, "reconcile failed");
                    retries.insert(name, (tokio::time::Instant::now() + delay, attempts + 1));
                }
            }
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A revision's Function: Crossplane labels every revision with it.
fn parent_function(revision: &DynamicObject) -> Option<String> {
    revision
        .metadata
        .labels
        .as_ref()?
        .get(LABEL_PARENT_PACKAGE)
        .cloned()
}

/// One reconcile's view of the cluster and the catalog it keeps.
pub(crate) struct Reconciler {
    functions: Api<DynamicObject>,
    revisions: Api<DynamicObject>,
    configs: Api<DynamicObject>,
    services: Api<Service>,
    secrets: Api<Secret>,
    hosting: Arc<dyn Hosting>,
    options: ControllerOptions,
    /// The names hosted now, reconciled again on every relist and resync
    /// (a Function deleted while no watch ran is seen gone then).
    hosted: std::sync::Mutex<BTreeSet<String>>,
}

impl Reconciler {
    pub(crate) fn new(
        client: Client,
        hosting: Arc<dyn Hosting>,
        options: ControllerOptions,
    ) -> Self {
        Self {
            functions: Api::all_with(client.clone(), &function_resource()),
            revisions: Api::all_with(client.clone(), &revision_resource()),
            configs: Api::all_with(client.clone(), &runtime_config_resource()),
            services: Api::namespaced(client.clone(), &options.namespace),
            secrets: Api::namespaced(client, &options.namespace),
            hosting,
            options,
            hosted: std::sync::Mutex::new(BTreeSet::new()),
        }
    }

    fn hosted(&self) -> BTreeSet<String> {
        self.hosted.lock().map(|h| h.clone()).unwrap_or_default()
    }

    fn set_hosted(&self, name: &str, hosted: bool) {
        if let Ok(mut set) = self.hosted.lock() {
            if hosted {
                set.insert(name.to_owned());
            } else {
                set.remove(name);
            }
        }
    }

    /// The Function names an event asks to reconcile; a relist starting
    /// asks for every name hosted now too.
    fn names_of(
        &self,
        event: watcher::Event<DynamicObject>,
        name: impl Fn(&DynamicObject) -> Option<String>,
    ) -> Vec<String> {
        match event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => {
                name(&o).into_iter().collect()
            }
            watcher::Event::Init => self.hosted().into_iter().collect(),
            watcher::Event::InitDone => Vec::new(),
        }
    }

    /// The Function names a DeploymentRuntimeConfig's event asks to
    /// reconcile: every hosted one for a change (which Functions name it is
    /// in their revisions; a reconcile that changes nothing writes
    /// nothing), none for a relist (the other watches' relists cover it).
    fn names_using(&self, event: &watcher::Event<DynamicObject>) -> Vec<String> {
        match event {
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => {
                self.hosted().into_iter().collect()
            }
            watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => {
                Vec::new()
            }
        }
    }

    /// Bring one Function's Service, Secret, endpoint and catalog entry to
    /// what its revisions say, writing only what differs.
    pub(crate) async fn reconcile(&self, name: &str) -> Result<(), ControllerError> {
        let function = self
            .functions
            .get_opt(name)
            .await
            .map_err(ControllerError::api("get", "Function", name))?
            .filter(|f| f.metadata.deletion_timestamp.is_none());
        let active = match &function {
            Some(_) => self.active_revision(name).await?,
            None => None,
        };
        match (function, active) {
            (Some(function), Some(revision)) => self.host(&function, &revision).await,
            _ => self.unhost(name).await,
        }
    }

    /// The Function's Active revision, the newest if (briefly) several.
    async fn active_revision(&self, name: &str) -> Result<Option<DynamicObject>, ControllerError> {
        let list = self
            .revisions
            .list(&ListParams::default().labels(&format!("{LABEL_PARENT_PACKAGE}={name}")))
            .await
            .map_err(ControllerError::api("list", "FunctionRevision", name))?;
        Ok(list
            .items
            .into_iter()
            .filter(|r| str_at(&r.data, &["spec", "desiredState"]) == Some("Active"))
            .max_by_key(|r| r.data.pointer("/spec/revision").and_then(Value::as_i64)))
    }

    async fn host(
        &self,
        function: &DynamicObject,
        revision: &DynamicObject,
    ) -> Result<(), ControllerError> {
        let name = function.metadata.name.as_deref().unwrap_or_default();
        let revision_name = revision.metadata.name.as_deref().unwrap_or_default();
        let apply = PatchParams::apply(&self.options.field_manager).force();

        let service = self.desired_service(function);
        let current = self
            .services
            .get_opt(name)
            .await
            .map_err(ControllerError::api("get", "Service", name))?;
        if !current
            .as_ref()
            .is_some_and(|c| service_matches(c, &service))
        {
            tracing::info!(function = %name, "applying the Service");
            self.services
                .patch(name, &apply, &Patch::Apply(&service))
                .await
                .map_err(ControllerError::api("apply", "Service", name))?;
        }

        let secret_name = self.ensure_certificate(function, revision).await?;

        let endpoint = format!("dns:///{name}.{}:{GRPC_PORT}", self.options.namespace);
        let conditions = runtime_conditions(self.hosting.readiness(name), &revision.data);
        if str_at(&revision.data, &["status", "endpoint"]) != Some(endpoint.as_str())
            || str_at(&revision.data, &["status", "tlsServerSecretName"])
                != Some(secret_name.as_str())
            || !runtime_conditions_hold(&revision.data, &conditions)
        {
            tracing::info!(function = %name, revision = %revision_name, %endpoint, "writing the endpoint and runtime conditions");
            let status = serde_json::json!({
                "apiVersion": PKG_API_VERSION,
                "kind": "FunctionRevision",
                "metadata": { "name": revision_name },
                "status": {
                    "endpoint": endpoint,
                    "tlsServerSecretName": secret_name,
                    "conditions": runtime_conditions_to_write(&revision.data, &conditions),
                },
            });
            self.revisions
                .patch_status(revision_name, &apply, &Patch::Apply(&status))
                .await
                .map_err(ControllerError::api(
                    "apply the status of",
                    "FunctionRevision",
                    revision_name,
                ))?;
        }

        // What core resolved (an ImageConfig may rewrite it), else the spec's.
        let package = str_at(&revision.data, &["status", "resolvedImage"])
            .filter(|s| !s.is_empty())
            .or_else(|| str_at(&revision.data, &["spec", "image"]))
            .unwrap_or_default()
            .to_owned();
        let settings = self.settings_of(function, revision).await?;
        self.hosting.host(HostedFunction {
            name: name.to_owned(),
            package,
            kind: None,
            limits: settings.limits,
            servers: settings.servers,
        });
        self.set_hosted(name, true);
        Ok(())
    }

    /// The Function's limits and server settings, from the
    /// DeploymentRuntimeConfig its revision names (as Crossplane's runtime
    /// reads it; else the Function's reference, else `default`) and its
    /// annotations: the mapping the functions file uses too
    /// (`runtime_config`).
    async fn settings_of(
        &self,
        function: &DynamicObject,
        revision: &DynamicObject,
    ) -> Result<runtime_config::FunctionSettings, ControllerError> {
        let name = function.metadata.name.as_deref().unwrap_or_default();
        let reference = |object: &DynamicObject| {
            object
                .data
                .pointer("/spec/runtimeConfigRef")
                .and_then(|r| serde_json::from_value::<RuntimeConfigRef>(r.clone()).ok())
                .filter(|r| r.name.as_deref().is_some_and(|n| !n.is_empty()))
        };
        let reference = reference(revision).or_else(|| reference(function));
        let config_name = runtime_config::config_name(reference.as_ref());
        let config = self
            .configs
            .get_opt(config_name)
            .await
            .map_err(ControllerError::api(
                "get",
                "DeploymentRuntimeConfig",
                config_name,
            ))?;
        let limits_error = |source| ControllerError::Limits {
            name: name.to_owned(),
            source,
        };
        let spec = config
            .map(|c| {
                RuntimeConfigSpec::from_json(
                    config_name,
                    c.data.get("spec").cloned().unwrap_or(Value::Null),
                )
            })
            .transpose()
            .map_err(limits_error)?;
        let annotations = function.metadata.annotations.clone().unwrap_or_default();
        runtime_config::settings_of(
            &annotations,
            config_name,
            spec.as_ref(),
            self.options.max_servers,
        )
        .map_err(limits_error)
    }

    async fn unhost(&self, name: &str) -> Result<(), ControllerError> {
        self.hosting.unhost(name);
        self.set_hosted(name, false);
        let current = self
            .services
            .get_opt(name)
            .await
            .map_err(ControllerError::api("get", "Service", name))?;
        let ours = current
            .as_ref()
            .and_then(|s| s.metadata.labels.as_ref()?.get(LABEL_MANAGED_BY))
            == Some(&self.options.field_manager);
        if ours {
            tracing::info!(function = %name, "deleting the Service");
            match self.services.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.is_not_found() => {}
                Err(source) => return Err(ControllerError::api("delete", "Service", name)(source)),
            }
        }
        Ok(())
    }

    /// The Service the Deployment runtime would make, selecting the host.
    fn desired_service(&self, function: &DynamicObject) -> Service {
        let name = function.metadata.name.clone().unwrap_or_default();
        Service {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(self.options.namespace.clone()),
                labels: Some(self.managed_by()),
                owner_references: Some(vec![owner(function)]),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".to_owned()),
                selector: Some(self.options.pod_selector.clone()),
                ports: Some(vec![ServicePort {
                    name: Some(GRPC_PORT_NAME.to_owned()),
                    protocol: Some("TCP".to_owned()),
                    port: GRPC_PORT,
                    target_port: Some(IntOrString::String(GRPC_PORT_NAME.to_owned())),
                    app_protocol: Some("tls".to_owned()),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        }
    }

    fn managed_by(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(
            LABEL_MANAGED_BY.to_owned(),
            self.options.field_manager.clone(),
        )])
    }

    /// Keep the revision's server Secret holding a certificate from the
    /// current CA; one already there from it (Crossplane's, another
    /// replica's) is kept, as Crossplane's own generator keeps it. Returns
    /// the Secret's name.
    async fn ensure_certificate(
        &self,
        function: &DynamicObject,
        revision: &DynamicObject,
    ) -> Result<String, ControllerError> {
        let name = function.metadata.name.as_deref().unwrap_or_default();
        let secret_name = str_at(&revision.data, &["spec", "tlsServerSecretName"])
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{name}{TLS_SERVER_SECRET_SUFFIX}"));
        let ca_name = &self.options.ca_secret;
        let ca = self
            .secrets
            .get_opt(ca_name)
            .await
            .map_err(ControllerError::api("get", "Secret", ca_name))?;
        let ca_cert =
            secret_key(ca.as_ref(), TLS_CRT).ok_or_else(|| ControllerError::CaIncomplete {
                name: ca_name.clone(),
                key: TLS_CRT,
            })?;
        let current = self
            .secrets
            .get_opt(&secret_name)
            .await
            .map_err(ControllerError::api("get", "Secret", &secret_name))?;
        let complete = secret_key(current.as_ref(), TLS_CRT).is_some()
            && secret_key(current.as_ref(), TLS_KEY).is_some()
            && secret_key(current.as_ref(), CA_CRT) == Some(ca_cert);
        if complete {
            return Ok(secret_name);
        }
        let ca_key =
            secret_key(ca.as_ref(), TLS_KEY).ok_or_else(|| ControllerError::CaIncomplete {
                name: ca_name.clone(),
                key: TLS_KEY,
            })?;
        let issued = issue_server_certificate(
            ca_name,
            ca_cert,
            ca_key,
            &dns_names(name, &self.options.namespace),
        )?;
        tracing::info!(function = %name, secret = %secret_name, "issuing the server certificate");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name.clone()),
                namespace: Some(self.options.namespace.clone()),
                labels: Some(self.managed_by()),
                owner_references: Some(vec![owner(function)]),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                (TLS_CRT.to_owned(), ByteString(issued.cert_pem.into_bytes())),
                (TLS_KEY.to_owned(), ByteString(issued.key_pem.into_bytes())),
                (CA_CRT.to_owned(), ByteString(ca_cert.to_vec())),
            ])),
            ..Secret::default()
        };
        self.secrets
            .patch(
                &secret_name,
                &PatchParams::apply(&self.options.field_manager).force(),
                &Patch::Apply(&secret),
            )
            .await
            .map_err(ControllerError::api("apply", "Secret", &secret_name))?;
        Ok(secret_name)
    }
}

/// One runtime condition as this controller writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RuntimeCondition {
    kind: &'static str,
    status: String,
    reason: String,
    message: Option<String>,
}

impl RuntimeCondition {
    fn new(kind: &'static str, status: &str, reason: &str, message: Option<String>) -> Self {
        Self {
            kind,
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
        }
    }
}

/// The conditions a package runtime owns on an Active revision, as
/// Crossplane's Deployment runtime sets them: core's package manager
/// reports a Function `Healthy` only when its revision's `RuntimeHealthy`
/// is True (`PackageHealth`), and with an External runtime nothing of
/// core's sets it. `RuntimeActive` is True: the host serves the endpoint.
/// `RuntimeHealthy` is True once the package is ready (`readiness`), as
/// the Deployment runtime's is once its Deployment is Available; False
/// (`UnhealthyPackageRevision`, why) once its pull failed; Unknown
/// (`UnknownPackageRevisionHealth`) while it is pulled.
///
/// Every replica writes it from its own view, so a worse view never
/// overwrites a better one, nor a failure another's: True stays once one
/// replica had the package ready (a revision's package does not change; a
/// replica that cannot pull it says so in its own `/readyz` and metrics),
/// False stays against a replica still pulling or failing otherwise.
/// Without that, a replica starting (pulling) and one serving would each
/// rewrite the condition at every write of the other's, as fast as their
/// watches tell them (tests/cluster.rs saw the revisions keep changing).
fn runtime_conditions(readiness: Readiness, revision: &Value) -> [RuntimeCondition; 2] {
    let current = condition_of(revision, "RuntimeHealthy");
    let status = current.and_then(|c| str_at(c, &["status"]));
    let keep = match (&readiness, status) {
        (Readiness::Ready, _) => false,
        (Readiness::Failed(_), Some(status)) => status == "True" || status == "False",
        (Readiness::Pending(_), Some(status)) => ["True", "False", "Unknown"].contains(&status),
        (_, None) => false,
    };
    let healthy = match (readiness, current) {
        (_, Some(current)) if keep => RuntimeCondition::new(
            "RuntimeHealthy",
            str_at(current, &["status"]).unwrap_or_default(),
            str_at(current, &["reason"]).unwrap_or_default(),
            str_at(current, &["message"])
                .filter(|m| !m.is_empty())
                .map(str::to_owned),
        ),
        (Readiness::Ready, _) => {
            RuntimeCondition::new("RuntimeHealthy", "True", "HealthyPackageRevision", None)
        }
        (Readiness::Failed(why), _) => RuntimeCondition::new(
            "RuntimeHealthy",
            "False",
            "UnhealthyPackageRevision",
            Some(format!("xfn host: {}", crate::echo::Echo(&why))),
        ),
        (Readiness::Pending(why), _) => RuntimeCondition::new(
            "RuntimeHealthy",
            "Unknown",
            "UnknownPackageRevisionHealth",
            Some(format!("xfn host: {}", crate::echo::Echo(&why))),
        ),
    };
    let active = RuntimeCondition::new("RuntimeActive", "True", "ActiveRuntime", None);
    [healthy, active]
}

/// Whether the revision already has `conditions` as they are to be.
fn runtime_conditions_hold(revision: &Value, conditions: &[RuntimeCondition]) -> bool {
    conditions.iter().all(|want| {
        condition_of(revision, want.kind).is_some_and(|c| {
            str_at(c, &["status"]) == Some(want.status.as_str())
                && str_at(c, &["reason"]) == Some(want.reason.as_str())
                && str_at(c, &["message"]).filter(|m| !m.is_empty()) == want.message.as_deref()
        })
    })
}

/// The runtime conditions to apply, keeping the transition time of one
/// already of the same status (so a re-apply changes nothing), else now.
fn runtime_conditions_to_write(revision: &Value, conditions: &[RuntimeCondition]) -> Vec<Value> {
    let now = serde_json::to_value(Time(k8s_openapi::jiff::Timestamp::now()))
        .ok()
        .and_then(|t| t.as_str().map(str::to_owned))
        .unwrap_or_default();
    conditions
        .iter()
        .map(|want| {
            let since = condition_of(revision, want.kind)
                .filter(|c| str_at(c, &["status"]) == Some(want.status.as_str()))
                .and_then(|c| str_at(c, &["lastTransitionTime"]))
                .unwrap_or(now.as_str());
            let mut condition = serde_json::json!({
                "type": want.kind,
                "status": want.status,
                "reason": want.reason,
                "lastTransitionTime": since,
            });
            if let Some(message) = &want.message {
                condition["message"] = Value::from(message.as_str());
            }
            condition
        })
        .collect()
}

/// A condition of an object's status, by type.
fn condition_of<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| str_at(c, &["type"]) == Some(kind))
}

/// The names Crossplane's Deployment runtime certifies a Service for.
pub(crate) fn dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
    ]
}

/// A server certificate and its key, both PEM.
pub(crate) struct Issued {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

/// Sign a server certificate for `names` with the CA (Crossplane's: a
/// PKCS#1 RSA key; any key rcgen reads), as Crossplane's generator does:
/// server auth, ten years.
pub(crate) fn issue_server_certificate(
    ca_name: &str,
    ca_cert_pem: &[u8],
    ca_key_pem: &[u8],
    names: &[String],
) -> Result<Issued, ControllerError> {
    let ca_error = |source| ControllerError::Ca {
        name: ca_name.to_owned(),
        source,
    };
    let ca_key =
        rcgen::KeyPair::from_pem(&String::from_utf8_lossy(ca_key_pem)).map_err(ca_error)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&String::from_utf8_lossy(ca_cert_pem), ca_key)
        .map_err(ca_error)?;
    let issue_error = |source| ControllerError::Issue {
        name: names.first().cloned().unwrap_or_default(),
        source,
    };
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(issue_error)?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        names.first().cloned().unwrap_or_default(),
    );
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = time::OffsetDateTime::now_utc();
    params.not_after = params.not_before + time::Duration::days(3650);
    let key = rcgen::KeyPair::generate().map_err(issue_error)?;
    let cert = params.signed_by(&key, &issuer).map_err(issue_error)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The controller's reference to the Function: what garbage-collects the
/// Service and Secret when the Function goes, even with no controller.
fn owner(function: &DynamicObject) -> OwnerReference {
    OwnerReference {
        api_version: PKG_API_VERSION.to_owned(),
        kind: "Function".to_owned(),
        name: function.metadata.name.clone().unwrap_or_default(),
        uid: function.metadata.uid.clone().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    }
}

/// Whether `current` already has every field this controller applies.
fn service_matches(current: &Service, desired: &Service) -> bool {
    let (Some(spec), Some(want)) = (&current.spec, &desired.spec) else {
        return false;
    };
    let has_all = |have: &Option<BTreeMap<String, String>>,
                   want: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    let port_matches = |want: &ServicePort| {
        spec.ports.iter().flatten().any(|p| {
            p.name == want.name
                && p.port == want.port
                && p.target_port == want.target_port
                && p.app_protocol == want.app_protocol
                && p.protocol.as_deref().unwrap_or("TCP")
                    == want.protocol.as_deref().unwrap_or("TCP")
        })
    };
    let owners_match = desired.metadata.owner_references.iter().flatten().all(|w| {
        current
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == w.uid && o.kind == w.kind && o.name == w.name)
    });
    spec.cluster_ip == want.cluster_ip
        && spec.selector == want.selector
        && want.ports.iter().flatten().all(port_matches)
        && has_all(&current.metadata.labels, &desired.metadata.labels)
        && owners_match
}

/// A non-empty value of a Secret.
fn secret_key<'a>(secret: Option<&'a Secret>, key: &str) -> Option<&'a [u8]> {
    let value = secret?.data.as_ref()?.get(key)?;
    (!value.0.is_empty()).then_some(value.0.as_slice())
}

/// A string at a path of a dynamic object's fields.
fn str_at<'a>(data: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(data, |v, k| v.get(k))?.as_str()
}
