//! What `xfn host` tells of its functions on its metrics address:
//! `/readyz` (as a whole, or `?function=NAME`) and `/status` (JSON, what
//! `xfn host ls` prints), both read from each hosted function's package
//! state ([`PackageState`]) and numbers, the one record the host keeps of
//! it (`metrics::FunctionStats`); and the retries that move a failing
//! package to ready.
//!
//! Invariants:
//! - **Ready means its calls need no pull**: a function is ready once its
//!   package is pulled and its kind decided; the host is ready once every
//!   hosted function is (`--ready-when any`: once one is, or none is
//!   hosted), so a rollout waits for the pulls, not the first calls.
//! - **A failing package is tried again while hosted**: after a doubling
//!   backoff (1 s … 60 s) and by each call meanwhile, so it becomes ready
//!   once its registry serves it, without a restart.
//! - **Bounded**: one entry per hosted function (the catalog's), each
//!   error cut as an echo is ([`crate::echo`]).
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::controller::Readiness;
use super::metrics::PackageState;
use super::{read, Function, Host};
use crate::grpc::metrics::FrontEndStatus;

/// When `/readyz` says the host as a whole is ready (`--ready-when`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum ReadyWhen {
    /// Once every hosted function's package is ready.
    #[default]
    All,
    /// Once any is (or none is hosted).
    Any,
}

/// The first wait before a failed package is tried again.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Gets `hosted`'s package ready, trying again after a doubling backoff
/// while it fails and is still the function hosted under its name.
pub(super) fn keep_resolving(host: Weak<Host>, hosted: Arc<Function>) {
    tokio::spawn(async move {
        let mut wait = FIRST_RETRY;
        loop {
            let Some(host) = host.upgrade() else { return };
            if !host.is_current(&hosted) {
                return;
            }
            let resolved = hosted
                .resolved
                .get_or_try_init(|| host.resolve(&hosted))
                .await;
            match resolved {
                Ok(_) => {
                    // Its servers kept warm start now, not at the next tidy.
                    host.keep_warm(&hosted).await;
                    return;
                }
                Err(status) => {
                    tracing::warn!(function = %hosted.spec.name, error = status.message(), retry_in = ?wait, "cannot get the function's package ready; tried again after the wait (and by each call)");
                }
            }
            drop(host);
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_RETRY);
        }
    });
}

/// Whether a function whose package is in `state` is ready: `Err(why)`.
fn ready(state: Option<&PackageState>) -> Result<(), String> {
    match state {
        Some(PackageState::Ready { .. }) => Ok(()),
        Some(PackageState::Pulling) => Err("its package is being pulled".to_owned()),
        Some(PackageState::Failing { error }) => Err(format!("its package failed: {error}")),
        None => Err("not hosted yet".to_owned()),
    }
}

impl Host {
    fn hosted(&self) -> Vec<Arc<Function>> {
        let mut all: Vec<Arc<Function>> = read(&self.functions).values().cloned().collect();
        all.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        all
    }

    /// Whether the function `name` is hosted and its package ready.
    pub(crate) fn readiness_of(&self, name: &str) -> Option<Result<(), String>> {
        let function = read(&self.functions).get(name).cloned()?;
        Some(ready(function.stats.package().as_ref()))
    }

    /// The same, for the controller: a failure told from a wait.
    pub(super) fn package_readiness(&self, name: &str) -> Readiness {
        let package = read(&self.functions)
            .get(name)
            .and_then(|f| f.stats.package());
        match (&package, ready(package.as_ref())) {
            (_, Ok(())) => Readiness::Ready,
            (Some(PackageState::Failing { .. }), Err(why)) => Readiness::Failed(why),
            (_, Err(why)) => Readiness::Pending(why),
        }
    }
}

impl FrontEndStatus for Host {
    fn ready(&self) -> Result<(), String> {
        let all = self.hosted();
        let not_ready: Vec<String> = all
            .iter()
            .filter_map(|f| {
                let why = ready(f.stats.package().as_ref()).err()?;
                Some(format!("function {}: {why}", f.spec.name))
            })
            .collect();
        let ready = match self.options.ready_when {
            ReadyWhen::All => not_ready.is_empty(),
            ReadyWhen::Any => not_ready.len() < all.len() || all.is_empty(),
        };
        match ready {
            true => Ok(()),
            false => Err(format!("not ready:\n{}\n", not_ready.join("\n"))),
        }
    }

    fn ready_of(&self, name: &str) -> Option<Result<(), String>> {
        self.readiness_of(name)
    }

    fn status(&self) -> Value {
        let functions: Vec<Value> = self.hosted().iter().map(|f| status_of(f)).collect();
        json!({
            "ready": FrontEndStatus::ready(self).is_ok(),
            "functions": functions,
        })
    }
}

/// One function's entry in `/status`.
fn status_of(function: &Function) -> Value {
    let stats = &function.stats;
    let package = stats.package();
    let (digest, kind, error) = match &package {
        Some(PackageState::Ready { digest, kind }) => (Some(digest.as_str()), Some(*kind), None),
        Some(PackageState::Failing { error }) => (None, function.spec.kind, Some(error.as_str())),
        _ => (None, function.spec.kind, None),
    };
    let last_cold_start = stats.last_cold_start().map(|(took, at)| {
        json!({
            "seconds": took.as_secs_f64(),
            "at": rfc3339(at),
        })
    });
    json!({
        "name": function.spec.name,
        "package": function.spec.package,
        "digest": digest,
        "kind": kind.map(|k| format!("{k:?}")),
        "state": package.as_ref().map_or("unhosted", PackageState::name),
        "error": error,
        "serversRunning": stats.running.get(),
        "serversStarting": stats.starting.get(),
        "serversPrepared": stats.prepared.get(),
        "callsQueued": stats.queued.get(),
        "calls": stats.calls.get(),
        "callErrors": stats.errors.get(),
        "coldStarts": stats.cold_starts.get(),
        "lastColdStart": last_cold_start,
    })
}

/// `at` as RFC 3339, UTC.
fn rfc3339(at: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(at)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_ready_package_is_ready_and_a_failure_says_its_error() {
        assert_eq!(
            ready(Some(&PackageState::Ready {
                digest: "sha256:ab".into(),
                kind: super::super::catalog::FunctionKind::Server,
            })),
            Ok(())
        );
        assert_eq!(
            ready(Some(&PackageState::Pulling)),
            Err("its package is being pulled".to_owned())
        );
        let failing = PackageState::failing(&"x".repeat(1 << 20));
        let why = ready(Some(&failing)).unwrap_err();
        assert!(why.starts_with("its package failed: xxx"), "{why}");
        assert!(
            why.len() < crate::echo::ECHO_BYTES + 64,
            "cut: {}",
            why.len()
        );
        assert_eq!(ready(None), Err("not hosted yet".to_owned()));
    }
}
