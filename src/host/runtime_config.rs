//! A Function's limits, read where Crossplane users already write them: the
//! `DeploymentRuntimeConfig` (`pkg.crossplane.io/v1beta1`) its
//! `spec.runtimeConfigRef.name` names (Crossplane's default: `default`),
//! whose `package-runtime` container's `resources.limits.cpu`/`.memory`
//! are the limits of each of the function's containers, as they would be of
//! its pod's, and whose Deployment's `replicas` is its minimum of warm
//! servers; and its annotations: `xfn.crossplane.io/pids-limit` and the
//! server settings ([`ServerSettings`]: the host's flags, per function).
//!
//! Invariant: one mapping for both catalogs (the functions file, the
//! controller): what is not set stays `None` and the host fills in its
//! flags' defaults; a value that is set but not a quantity (or a setting
//! past its bound) is refused, never dropped or clamped, so a typo cannot
//! lift a limit. A Function naming a
//! config that does not exist is refused, as Crossplane refuses to deploy
//! it, except for `default` (an install may not have one): then it has no
//! config, only the defaults.
use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::quantity::{Quantity, QuantityError};
use crate::runner::{Limits, NetworkPolicy};

/// The annotation of a Function that sets its pids limit.
pub(crate) const PIDS_ANNOTATION: &str = "xfn.crossplane.io/pids-limit";
/// Most servers of the function at once (`--max-servers-per-function`).
pub(crate) const MAX_SERVERS_ANNOTATION: &str = "xfn.crossplane.io/max-servers";
/// Most calls one of its servers takes at once (`--calls-per-server`).
pub(crate) const CALLS_PER_SERVER_ANNOTATION: &str = "xfn.crossplane.io/calls-per-server";
/// Its server with no call this long is stopped (`--server-idle`).
pub(crate) const SERVER_IDLE_ANNOTATION: &str = "xfn.crossplane.io/server-idle";
/// Its servers kept running from the start, whatever their idle time
/// (its config's `replicas` else; none by default).
pub(crate) const MIN_SERVERS_ANNOTATION: &str = "xfn.crossplane.io/min-servers";
/// `Runner`: its servers share xfn's network (egress); `Isolated`, the
/// default: their own, empty one.
pub(crate) const NETWORK_ANNOTATION: &str = "xfn.crossplane.io/network-policy";
/// The most calls one server may be asked to take at once.
pub(crate) const MAX_CALLS_PER_SERVER: usize = 1024;
/// The longest idle time a Function may ask for.
pub(crate) const MAX_SERVER_IDLE: Duration = Duration::from_secs(24 * 3600);
/// The container of a DeploymentRuntimeConfig that runs the function.
pub(crate) const RUNTIME_CONTAINER: &str = "package-runtime";
/// The config a Function without `runtimeConfigRef` uses, as Crossplane.
pub(crate) const DEFAULT_CONFIG: &str = "default";
/// The config's kind (`pkg.crossplane.io/v1beta1`).
pub(crate) const KIND: &str = "DeploymentRuntimeConfig";

/// Why a Function's limits cannot be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RuntimeConfigError {
    /// A limit of the config is not a quantity.
    #[error("DeploymentRuntimeConfig {config}: container {RUNTIME_CONTAINER}'s resources.limits.{field}")]
    Quantity {
        config: String,
        field: &'static str,
        #[source]
        source: QuantityError,
    },
    /// The pids annotation is not a positive integer.
    #[error("{PIDS_ANNOTATION} is {value:?}, not a positive integer")]
    Pids { value: String },
    /// A server setting is not one, or past its bound.
    #[error("{annotation} is {value:?}: {why}")]
    Setting {
        annotation: &'static str,
        value: String,
        why: String,
    },
    /// The config asks for more warm servers than the host may run.
    #[error("DeploymentRuntimeConfig {config}: spec.deploymentTemplate.spec.replicas is {replicas}, more than the host's --max-servers ({max_servers})")]
    Replicas {
        config: String,
        replicas: u32,
        max_servers: usize,
    },
    /// The Function names a config that does not exist.
    #[error("its runtimeConfigRef names DeploymentRuntimeConfig {name}, which does not exist")]
    Missing { name: String },
    /// The config's spec is not a DeploymentRuntimeConfig's.
    #[error("DeploymentRuntimeConfig {config} is malformed")]
    Malformed {
        config: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A `runtimeConfigRef` of a Function (or FunctionRevision) spec.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct RuntimeConfigRef {
    /// The config's name.
    #[serde(default)]
    pub(crate) name: Option<String>,
}

/// The name of the config `reference` picks (`default` without one).
pub(crate) fn config_name(reference: Option<&RuntimeConfigRef>) -> &str {
    reference
        .and_then(|r| r.name.as_deref())
        .filter(|n| !n.is_empty())
        .unwrap_or(DEFAULT_CONFIG)
}

/// The part of a DeploymentRuntimeConfig's spec xfn reads.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RuntimeConfigSpec {
    #[serde(default)]
    deployment_template: Option<Template<PodTemplate>>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
struct Template<T> {
    #[serde(default)]
    spec: Option<T>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
struct PodTemplate {
    #[serde(default)]
    replicas: Option<u32>,
    #[serde(default)]
    template: Option<Template<PodSpec>>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
struct PodSpec {
    #[serde(default)]
    containers: Vec<PodContainer>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
/// One container of a pod template (a Kubernetes pod's, not a lifecycle container).
struct PodContainer {
    #[serde(default)]
    name: String,
    #[serde(default)]
    resources: Option<Resources>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
struct Resources {
    #[serde(default)]
    limits: BTreeMap<String, QuantityText>,
}

/// A quantity as Kubernetes YAML writes it: `512Mi`, `"1"`, or a bare `1`
/// or `0.5`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
enum QuantityText {
    Text(String),
    Integer(i64),
    Float(f64),
}

impl QuantityText {
    fn text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Integer(n) => n.to_string(),
            Self::Float(f) => f.to_string(),
        }
    }
}

impl RuntimeConfigSpec {
    /// A config's spec from its object's `spec` (the controller's JSON);
    /// none at all sets nothing.
    pub(crate) fn from_json(
        config: &str,
        spec: serde_json::Value,
    ) -> Result<Self, RuntimeConfigError> {
        if spec.is_null() {
            return Ok(Self::default());
        }
        warn_ignored(config, &spec);
        serde_json::from_value(spec).map_err(|source| RuntimeConfigError::Malformed {
            config: config.to_owned(),
            source,
        })
    }

    fn replicas(&self) -> Option<u32> {
        self.deployment_template.as_ref()?.spec.as_ref()?.replicas
    }

    fn runtime_limits(&self) -> Option<&BTreeMap<String, QuantityText>> {
        let containers = &self
            .deployment_template
            .as_ref()?
            .spec
            .as_ref()?
            .template
            .as_ref()?
            .spec
            .as_ref()?
            .containers;
        let container = containers.iter().find(|c| c.name == RUNTIME_CONTAINER)?;
        Some(&container.resources.as_ref()?.limits)
    }
}

/// What of a DeploymentRuntimeConfig's spec xfn does not apply (all but
/// the `package-runtime` container's cpu and memory limits, the
/// Deployment's `replicas` and its required `selector`), as paths: an
/// operator who set `args` or `env` for Crossplane's Deployment runtime must
/// hear that xfn does not follow them rather than find out.
pub(crate) fn ignored_fields(spec: &serde_json::Value) -> Vec<String> {
    use serde_json::Value;
    fn others(value: &Value, path: &str, kept: &[&str], out: &mut Vec<String>) {
        if let Value::Object(map) = value {
            out.extend(
                map.keys()
                    .filter(|k| !kept.contains(&k.as_str()))
                    .map(|k| format!("{path}.{k}")),
            );
        }
    }
    let mut out = Vec::new();
    others(spec, "spec", &["deploymentTemplate"], &mut out);
    let deployment = &spec["deploymentTemplate"];
    others(deployment, "spec.deploymentTemplate", &["spec"], &mut out);
    let path = "spec.deploymentTemplate.spec";
    others(
        &deployment["spec"],
        path,
        &["replicas", "selector", "template"],
        &mut out,
    );
    let template = &deployment["spec"]["template"];
    others(template, &format!("{path}.template"), &["spec"], &mut out);
    let path = format!("{path}.template.spec");
    others(&template["spec"], &path, &["containers"], &mut out);
    for container in template["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = container["name"].as_str().unwrap_or_default();
        let path = format!("{path}.containers[{name}]");
        if name != RUNTIME_CONTAINER {
            out.push(path);
            continue;
        }
        others(container, &path, &["name", "resources"], &mut out);
        let resources = &container["resources"];
        others(
            resources,
            &format!("{path}.resources"),
            &["limits"],
            &mut out,
        );
        let path = format!("{path}.resources.limits");
        others(&resources["limits"], &path, &["cpu", "memory"], &mut out);
    }
    out
}

/// Names in one WARN what of config `name` xfn ignores, once per config and
/// set of fields (the controller reads a config on every reconcile).
fn warn_ignored(name: &str, spec: &serde_json::Value) {
    static WARNED: std::sync::Mutex<BTreeMap<String, Vec<String>>> =
        std::sync::Mutex::new(BTreeMap::new());
    let ignored = ignored_fields(spec);
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if ignored.is_empty() || warned.get(name) == Some(&ignored) {
        return;
    }
    tracing::warn!(
        config = name,
        ignored = ignored.join(", "),
        "xfn applies only the package-runtime container's cpu and memory limits and the \
         replicas (minimum warm servers) of a DeploymentRuntimeConfig; these fields have no effect"
    );
    warned.insert(name.to_owned(), ignored);
}

/// How a Function's servers run where it says so (its annotations, its
/// config's `replicas`); each one unset takes the host's flag.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ServerSettings {
    /// [`MAX_SERVERS_ANNOTATION`].
    pub(crate) max_servers: Option<usize>,
    /// [`CALLS_PER_SERVER_ANNOTATION`].
    pub(crate) calls_per_server: Option<usize>,
    /// [`SERVER_IDLE_ANNOTATION`].
    pub(crate) idle: Option<Duration>,
    /// [`MIN_SERVERS_ANNOTATION`], else the config's `replicas`.
    pub(crate) min_servers: Option<usize>,
    /// [`NETWORK_ANNOTATION`].
    pub(crate) network: Option<NetworkPolicy>,
}

/// What a Function sets for itself: its limits and its server settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FunctionSettings {
    /// Its containers' limits.
    pub(crate) limits: Limits,
    /// Its servers'.
    pub(crate) servers: ServerSettings,
}

/// A Function's settings from its annotations and the config its reference
/// named (`name`; `config`: what was found under it, `None` when nothing
/// was), servers bounded by the host's `--max-servers` (`max_servers`).
/// Unset parts stay `None`: the host's defaults apply.
pub(crate) fn settings_of(
    annotations: &BTreeMap<String, String>,
    name: &str,
    config: Option<&RuntimeConfigSpec>,
    max_servers: usize,
) -> Result<FunctionSettings, RuntimeConfigError> {
    let mut servers = server_settings(annotations, max_servers)?;
    if servers.min_servers.is_none() {
        if let Some(replicas) = config.and_then(RuntimeConfigSpec::replicas) {
            let warm = usize::try_from(replicas).unwrap_or(usize::MAX);
            if warm > max_servers {
                return Err(RuntimeConfigError::Replicas {
                    config: name.to_owned(),
                    replicas,
                    max_servers,
                });
            }
            servers.min_servers = Some(warm);
        }
    }
    let limits = limits_of(annotations, name, config)?;
    Ok(FunctionSettings { limits, servers })
}

/// The server settings `annotations` give, each within its bound.
fn server_settings(
    annotations: &BTreeMap<String, String>,
    max_servers: usize,
) -> Result<ServerSettings, RuntimeConfigError> {
    fn read<T>(
        annotations: &BTreeMap<String, String>,
        annotation: &'static str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, RuntimeConfigError> {
        let Some(value) = annotations.get(annotation) else {
            return Ok(None);
        };
        parse(value.trim())
            .map(Some)
            .map_err(|why| RuntimeConfigError::Setting {
                annotation,
                value: value.clone(),
                why,
            })
    }
    let count = |least: usize, most: usize, ceiling: &'static str| {
        move |text: &str| match text.parse::<usize>() {
            Ok(n) if n < least => Err(format!("less than {least}")),
            Ok(n) if n > most => Err(format!("more than {ceiling} ({most})")),
            Ok(n) => Ok(n),
            Err(_) => Err("not a whole number".to_owned()),
        }
    };
    let servers_ceiling = "the host's --max-servers";
    let max = read(
        annotations,
        MAX_SERVERS_ANNOTATION,
        count(1, max_servers, servers_ceiling),
    )?;
    let min = read(
        annotations,
        MIN_SERVERS_ANNOTATION,
        count(
            0,
            max.unwrap_or(max_servers),
            match max {
                Some(_) => "its max-servers",
                None => servers_ceiling,
            },
        ),
    )?;
    let calls = read(
        annotations,
        CALLS_PER_SERVER_ANNOTATION,
        count(1, MAX_CALLS_PER_SERVER, "xfn's bound"),
    )?;
    let idle =
        read(
            annotations,
            SERVER_IDLE_ANNOTATION,
            |text| match crate::duration::parse_go_duration(text)? {
                d if d.is_zero() => Err("zero: its server would stop between calls".to_owned()),
                d if d > MAX_SERVER_IDLE => {
                    Err(format!("longer than xfn's bound ({MAX_SERVER_IDLE:?})"))
                }
                d => Ok(d),
            },
        )?;
    let network = read(annotations, NETWORK_ANNOTATION, |text| {
        text.parse::<NetworkPolicy>().map_err(|e| e.to_string())
    })?;
    Ok(ServerSettings {
        max_servers: max,
        calls_per_server: calls,
        idle,
        min_servers: min,
        network,
    })
}

/// A Function's limits from its annotations and the config its reference
/// named (`name`; `config`: what was found under it, `None` when nothing
/// was). Unset parts stay `None`: the host's defaults apply.
fn limits_of(
    annotations: &BTreeMap<String, String>,
    name: &str,
    config: Option<&RuntimeConfigSpec>,
) -> Result<Limits, RuntimeConfigError> {
    let pids = match annotations.get(PIDS_ANNOTATION) {
        None => None,
        Some(value) => match value.trim().parse::<i64>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                return Err(RuntimeConfigError::Pids {
                    value: value.clone(),
                })
            }
        },
    };
    let config = match config {
        Some(config) => config,
        None if name == DEFAULT_CONFIG => {
            return Ok(Limits {
                pids,
                ..Limits::default()
            })
        }
        None => {
            return Err(RuntimeConfigError::Missing {
                name: name.to_owned(),
            })
        }
    };
    let limits = config.runtime_limits();
    let quantity = |field: &'static str| {
        limits
            .and_then(|l| l.get(field))
            .map(|q| Quantity::parse(&q.text()))
            .transpose()
            .map_err(|source| RuntimeConfigError::Quantity {
                config: name.to_owned(),
                field,
                source,
            })
    };
    let in_field = |field: &'static str| {
        move |source| RuntimeConfigError::Quantity {
            config: name.to_owned(),
            field,
            source,
        }
    };
    let cpu_millis = quantity("cpu")?
        .map(|q| q.millis())
        .transpose()
        .map_err(in_field("cpu"))?;
    let memory_bytes = quantity("memory")?
        .map(|q| q.bytes())
        .transpose()
        .map_err(in_field("memory"))?;
    Ok(Limits {
        cpu_millis,
        memory_bytes,
        pids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_xfn_does_not_apply_is_named_and_the_limits_and_replicas_it_applies_are_not() {
        let spec = serde_json::json!({
            "serviceTemplate": {"metadata": {"name": "x"}},
            "deploymentTemplate": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {
                    "replicas": 2,
                    "selector": {},
                    "template": {
                        "spec": {
                            "serviceAccountName": "sa",
                            "containers": [
                                {
                                    "name": "package-runtime",
                                    "args": ["--debug"],
                                    "env": [],
                                    "resources": {
                                        "limits": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"},
                                        "requests": {"cpu": "100m"}
                                    }
                                },
                                {"name": "sidecar", "image": "x"}
                            ]
                        }
                    }
                }
            }
        });
        let base = "spec.deploymentTemplate.spec.template.spec";
        let expected: Vec<String> = [
            "spec.serviceTemplate".to_string(),
            "spec.deploymentTemplate.metadata".into(),
            format!("{base}.serviceAccountName"),
            format!("{base}.containers[package-runtime].args"),
            format!("{base}.containers[package-runtime].env"),
            format!("{base}.containers[package-runtime].resources.requests"),
            format!("{base}.containers[package-runtime].resources.limits.ephemeral-storage"),
            format!("{base}.containers[sidecar]"),
        ]
        .into();
        let mut found = ignored_fields(&spec);
        found.sort();
        let mut expected = expected;
        expected.sort();
        assert_eq!(found, expected);
        let only_limits = serde_json::json!({"deploymentTemplate": {"spec": {"replicas": 1, "selector": {}, "template": {"spec": {"containers": [{"name": "package-runtime", "resources": {"limits": {"cpu": "1"}}}]}}}}});
        assert!(ignored_fields(&only_limits).is_empty());
    }

    fn spec(yaml: &str) -> RuntimeConfigSpec {
        yaml_serde::from_str(yaml).unwrap()
    }

    const LIMITED: &str = "deploymentTemplate:\n  spec:\n    selector: {}\n    template:\n      spec:\n        containers:\n          - name: sidecar\n            resources:\n              limits: {memory: 8Gi}\n          - name: package-runtime\n            image: ignored\n            resources:\n              requests: {cpu: 50m}\n              limits:\n                cpu: 0.5\n                memory: 64Mi\n";

    #[test]
    fn the_package_runtime_containers_limits_and_the_pids_annotation_are_the_functions() {
        let annotations = BTreeMap::from([(PIDS_ANNOTATION.to_owned(), "64".to_owned())]);
        let limits = limits_of(&annotations, "small", Some(&spec(LIMITED))).unwrap();
        assert_eq!(
            limits,
            Limits {
                cpu_millis: Some(500),
                memory_bytes: Some(64 << 20),
                pids: Some(64),
            }
        );
    }

    #[test]
    fn what_the_config_does_not_set_is_left_to_the_hosts_defaults() {
        let none = BTreeMap::new();
        for config in [
            "{}",
            "deploymentTemplate: {}",
            "deploymentTemplate:\n  spec:\n    template:\n      spec:\n        containers: [{name: package-runtime}]\n",
        ] {
            assert_eq!(
                limits_of(&none, "default", Some(&spec(config))).unwrap(),
                Limits::default(),
                "{config}"
            );
        }
        assert_eq!(
            limits_of(&none, DEFAULT_CONFIG, None).unwrap(),
            Limits::default(),
            "no default config installed"
        );
    }

    #[test]
    fn a_limit_that_is_no_quantity_a_bad_pids_annotation_or_a_missing_config_is_refused() {
        let none = BTreeMap::new();
        let bad = LIMITED.replace("memory: 64Mi", "memory: lots");
        let err = limits_of(&none, "small", Some(&spec(&bad))).unwrap_err();
        assert!(
            crate::chain::Chain(&err)
                .to_string()
                .contains("resources.limits.memory"),
            "{err}"
        );
        for value in ["0", "-1", "many"] {
            let annotations = BTreeMap::from([(PIDS_ANNOTATION.to_owned(), value.to_owned())]);
            assert!(matches!(
                limits_of(&annotations, DEFAULT_CONFIG, None),
                Err(RuntimeConfigError::Pids { .. })
            ));
        }
        assert!(matches!(
            limits_of(&none, "gone", None),
            Err(RuntimeConfigError::Missing { .. })
        ));
    }

    #[test]
    fn a_reference_without_a_name_picks_the_default_config() {
        assert_eq!(config_name(None), "default");
        assert_eq!(config_name(Some(&RuntimeConfigRef::default())), "default");
        let named = RuntimeConfigRef {
            name: Some("big".into()),
        };
        assert_eq!(config_name(Some(&named)), "big");
    }

    fn annotated(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_functions_server_settings_are_its_annotations_and_its_configs_replicas() {
        let annotations = annotated(&[
            (MAX_SERVERS_ANNOTATION, "4"),
            (CALLS_PER_SERVER_ANNOTATION, " 2 "),
            (SERVER_IDLE_ANNOTATION, "90s"),
            (MIN_SERVERS_ANNOTATION, "1"),
            (NETWORK_ANNOTATION, "Runner"),
        ]);
        let settings = settings_of(&annotations, DEFAULT_CONFIG, None, 32).unwrap();
        assert_eq!(
            settings.servers,
            ServerSettings {
                max_servers: Some(4),
                calls_per_server: Some(2),
                idle: Some(Duration::from_secs(90)),
                min_servers: Some(1),
                network: Some(NetworkPolicy::Runner),
            }
        );
        let none = BTreeMap::new();
        assert_eq!(
            settings_of(&none, DEFAULT_CONFIG, None, 32).unwrap(),
            FunctionSettings::default(),
            "nothing set: every flag of the host's applies"
        );
        let replicas = LIMITED.replace("selector: {}", "selector: {}\n    replicas: 3");
        let from_config = settings_of(&none, "small", Some(&spec(&replicas)), 32).unwrap();
        assert_eq!(
            from_config.servers.min_servers,
            Some(3),
            "replicas: warm servers"
        );
        assert_eq!(from_config.limits.memory_bytes, Some(64 << 20));
        let annotation_wins = annotated(&[(MIN_SERVERS_ANNOTATION, "0")]);
        let settings = settings_of(&annotation_wins, "small", Some(&spec(&replicas)), 32).unwrap();
        assert_eq!(settings.servers.min_servers, Some(0), "the annotation wins");
    }

    #[test]
    fn a_server_setting_that_is_no_value_or_past_its_bound_is_refused_naming_its_annotation() {
        for (annotation, value, why) in [
            (MAX_SERVERS_ANNOTATION, "0", "less than 1"),
            (
                MAX_SERVERS_ANNOTATION,
                "33",
                "more than the host's --max-servers (32)",
            ),
            (
                MIN_SERVERS_ANNOTATION,
                "10000",
                "more than the host's --max-servers (32)",
            ),
            (MIN_SERVERS_ANNOTATION, "-1", "not a whole number"),
            (CALLS_PER_SERVER_ANNOTATION, "0", "less than 1"),
            (
                CALLS_PER_SERVER_ANNOTATION,
                "1025",
                "more than xfn's bound (1024)",
            ),
            (CALLS_PER_SERVER_ANNOTATION, "many", "not a whole number"),
            (SERVER_IDLE_ANNOTATION, "0s", "zero"),
            (SERVER_IDLE_ANNOTATION, "25h", "longer than xfn's bound"),
            (SERVER_IDLE_ANNOTATION, "soon", "not a duration"),
            (NETWORK_ANNOTATION, "Host", "unknown network policy"),
        ] {
            let annotations = annotated(&[(annotation, value)]);
            let err = settings_of(&annotations, DEFAULT_CONFIG, None, 32).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(annotation) && text.contains(value) && text.contains(why),
                "{annotation}={value}: {text}"
            );
        }
        let min_above_max =
            annotated(&[(MAX_SERVERS_ANNOTATION, "2"), (MIN_SERVERS_ANNOTATION, "3")]);
        let err = settings_of(&min_above_max, DEFAULT_CONFIG, None, 32).unwrap_err();
        assert!(
            err.to_string().contains("more than its max-servers (2)"),
            "{err}"
        );
        let many = LIMITED.replace("selector: {}", "selector: {}\n    replicas: 10000");
        let err = settings_of(&BTreeMap::new(), "small", Some(&spec(&many)), 32).unwrap_err();
        assert_eq!(
            err.to_string(),
            "DeploymentRuntimeConfig small: spec.deploymentTemplate.spec.replicas is 10000, \
             more than the host's --max-servers (32)"
        );
    }
}
