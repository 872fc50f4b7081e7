//! The static catalog: Crossplane `Function` objects (`pkg.crossplane.io`,
//! the file `crossplane render` takes), multi-document YAML, read under the
//! crate's bounds on nesting and aliases. `metadata.name` and
//! `spec.package` are used; the annotation `xfn.crossplane.io/kind`
//! (`Server` or `StdinStdout`) overrides the kind the package says. The
//! file may also hold `DeploymentRuntimeConfig` objects: a Function's
//! `spec.runtimeConfigRef` picks one for its limits and its minimum of warm
//! servers; its `xfn.crossplane.io/*` annotations set the rest
//! (`runtime_config`).
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::catalog::{FunctionKind, HostedFunction};
use super::runtime_config::{self, RuntimeConfigRef, RuntimeConfigSpec};

/// The annotation that overrides a function's kind.
pub(crate) const KIND_ANNOTATION: &str = "xfn.crossplane.io/kind";

/// The largest functions file read.
const MAX_FILE: u64 = 4 << 20;

/// Errors of reading the functions file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FunctionsFileError {
    /// It could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// It is larger than the bound.
    #[error("{path} is larger than {MAX_FILE} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// It nests too deep or its aliases expand too far.
    #[error("{path}")]
    Bounds {
        /// The file.
        path: PathBuf,
        /// The bound it broke.
        source: crate::nesting::NestingError,
    },
    /// A document is not what the file should hold.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Object {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    spec: yaml_serde::Value,
}

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    name: Option<String>,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    package: Option<String>,
    runtime_config_ref: Option<RuntimeConfigRef>,
}

/// The functions `path` holds, their servers bounded by the host's
/// `--max-servers` (`max_servers`).
pub(crate) fn read(
    path: &Path,
    max_servers: usize,
) -> Result<Vec<HostedFunction>, FunctionsFileError> {
    let read_err = |source| FunctionsFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read_err)?.len();
    if size > MAX_FILE {
        return Err(FunctionsFileError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(read_err)?;
    parse(&text, max_servers).map_err(|e| match e {
        Parse::Bounds(source) => FunctionsFileError::Bounds {
            path: path.to_path_buf(),
            source,
        },
        Parse::Invalid(reason) => FunctionsFileError::Invalid {
            path: path.to_path_buf(),
            reason,
        },
    })
}

enum Parse {
    Bounds(crate::nesting::NestingError),
    Invalid(String),
}

fn parse(text: &str, max_servers: usize) -> Result<Vec<HostedFunction>, Parse> {
    crate::nesting::check(text.as_bytes()).map_err(Parse::Bounds)?;
    let mut functions: Vec<(HostedFunction, Metadata, Option<RuntimeConfigRef>)> = Vec::new();
    let mut configs: std::collections::BTreeMap<String, RuntimeConfigSpec> = Default::default();
    for (i, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let invalid =
            |e: &dyn std::fmt::Display| Parse::Invalid(format!("document {}: {e}", i + 1));
        let value = yaml_serde::Value::deserialize(document).map_err(|e| invalid(&e))?;
        if value.is_null() {
            continue;
        }
        let object: Object = yaml_serde::from_value(value).map_err(|e| invalid(&e))?;
        let group_ok = object
            .api_version
            .as_deref()
            .is_some_and(|v| v.starts_with("pkg.crossplane.io/"));
        let kind = object.kind.as_deref();
        if group_ok && kind == Some(runtime_config::KIND) {
            let Some(name) = object.metadata.name.filter(|n| !n.is_empty()) else {
                return Err(invalid(&"a DeploymentRuntimeConfig without metadata.name"));
            };
            let spec = serde_json::to_value(object.spec)
                .map_err(|e| invalid(&format!("DeploymentRuntimeConfig {name}: {e}")))
                .and_then(|spec| {
                    RuntimeConfigSpec::from_json(&name, spec)
                        .map_err(|e| invalid(&crate::chain::Chain(&e)))
                })?;
            if configs.insert(name.clone(), spec).is_some() {
                return Err(invalid(&format!(
                    "DeploymentRuntimeConfig {name} appears twice"
                )));
            }
            continue;
        }
        if !group_ok || kind != Some("Function") {
            return Err(Parse::Invalid(format!(
                "document {}: not a pkg.crossplane.io Function or DeploymentRuntimeConfig (apiVersion {:?}, kind {:?})",
                i + 1,
                object.api_version,
                object.kind
            )));
        }
        let Some(name) = object.metadata.name.clone().filter(|n| valid_name(n)) else {
            return Err(Parse::Invalid(format!(
                "document {}: metadata.name must be a DNS label (lower case letters, digits, '-', at most 63)",
                i + 1
            )));
        };
        let spec: Spec =
            spec_of(object.spec).map_err(|e| Parse::Invalid(format!("Function {name}: {e}")))?;
        let Some(package) = spec.package.filter(|p| !p.is_empty()) else {
            return Err(Parse::Invalid(format!("Function {name}: no spec.package")));
        };
        let kind = match object
            .metadata
            .annotations
            .get(KIND_ANNOTATION)
            .map(String::as_str)
        {
            None => None,
            Some("Server") => Some(FunctionKind::Server),
            Some("StdinStdout") => Some(FunctionKind::StdinStdout),
            Some(other) => {
                return Err(Parse::Invalid(format!(
                    "Function {name}: {KIND_ANNOTATION} is {other:?}, not Server or StdinStdout"
                )))
            }
        };
        if functions.iter().any(|(f, ..)| f.name == name) {
            return Err(Parse::Invalid(format!("Function {name} appears twice")));
        }
        functions.push((
            HostedFunction {
                name,
                package,
                kind,
                limits: crate::runner::Limits::default(),
                servers: Default::default(),
            },
            object.metadata,
            spec.runtime_config_ref,
        ));
    }
    if functions.is_empty() {
        // Serving nothing is never what an operator meant: say so at start
        // rather than refuse every call as "not hosted" later.
        return Err(Parse::Invalid(
            "no Function in it (apiVersion pkg.crossplane.io/v1, kind Function): xfn would host nothing"
                .to_string(),
        ));
    }
    // Configs may come after the Functions naming them.
    functions
        .into_iter()
        .map(|(mut function, metadata, reference)| {
            let config = runtime_config::config_name(reference.as_ref());
            let settings = runtime_config::settings_of(
                &metadata.annotations,
                config,
                configs.get(config),
                max_servers,
            )
            .map_err(|e| {
                Parse::Invalid(format!(
                    "Function {}: {}",
                    function.name,
                    crate::chain::Chain(&e)
                ))
            })?;
            function.limits = settings.limits;
            function.servers = settings.servers;
            Ok(function)
        })
        .collect()
}

/// An object's `spec` as `T`; none at all is `T`'s default.
fn spec_of<T: serde::de::DeserializeOwned + Default>(
    spec: yaml_serde::Value,
) -> Result<T, yaml_serde::Error> {
    match spec {
        yaml_serde::Value::Null => Ok(T::default()),
        spec => yaml_serde::from_value(spec),
    }
}

/// A DNS-1123 label, as a Service name must be.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_with_their_packages_and_overrides_are_read_from_every_document() {
        let text = "apiVersion: pkg.crossplane.io/v1beta1\nkind: Function\nmetadata:\n  name: a\nspec:\n  package: r/a:v1\n---\napiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: b\n  annotations:\n    xfn.crossplane.io/kind: StdinStdout\nspec:\n  package: r/b:v1\n";
        let Ok(functions) = parse(text, 32) else {
            panic!("parse")
        };
        assert_eq!(functions.len(), 2);
        assert_eq!(functions[0].package, "r/a:v1");
        assert_eq!(functions[0].kind, None);
        assert_eq!(functions[1].kind, Some(FunctionKind::StdinStdout));
    }

    #[test]
    fn a_name_that_is_no_dns_label_or_another_kind_of_object_is_refused() {
        for text in [
            "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: A.b\nspec:\n  package: x\n",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n",
            "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: a\nspec: {}\n",
        ] {
            assert!(matches!(parse(text, 32), Err(Parse::Invalid(_))), "{text}");
        }
    }

    #[test]
    fn a_functions_runtime_config_in_the_file_gives_its_limits_and_default_applies_without_a_ref() {
        let text = "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: small\n  annotations:\n    xfn.crossplane.io/pids-limit: \"32\"\nspec:\n  package: r/a:v1\n  runtimeConfigRef:\n    apiVersion: pkg.crossplane.io/v1beta1\n    kind: DeploymentRuntimeConfig\n    name: small\n---\napiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: plain\nspec:\n  package: r/b:v1\n---\napiVersion: pkg.crossplane.io/v1beta1\nkind: DeploymentRuntimeConfig\nmetadata:\n  name: small\nspec:\n  deploymentTemplate:\n    spec:\n      selector: {}\n      template:\n        spec:\n          containers:\n            - name: package-runtime\n              resources:\n                limits: {cpu: 250m, memory: 64Mi}\n---\napiVersion: pkg.crossplane.io/v1beta1\nkind: DeploymentRuntimeConfig\nmetadata:\n  name: default\nspec:\n  deploymentTemplate:\n    spec:\n      selector: {}\n      template:\n        spec:\n          containers:\n            - name: package-runtime\n              resources:\n                limits: {memory: 1Gi}\n";
        let functions = parse(text, 32).unwrap_or_else(|_| panic!("parse"));
        assert_eq!(
            functions[0].limits,
            crate::runner::Limits {
                cpu_millis: Some(250),
                memory_bytes: Some(64 << 20),
                pids: Some(32),
            }
        );
        assert_eq!(
            functions[1].limits,
            crate::runner::Limits {
                memory_bytes: Some(1 << 30),
                ..Default::default()
            },
            "no runtimeConfigRef: the config named default"
        );
    }

    #[test]
    fn a_function_naming_a_runtime_config_the_file_lacks_is_refused() {
        let text = "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: a\nspec:\n  package: r/a:v1\n  runtimeConfigRef: {name: big}\n";
        match parse(text, 32) {
            Err(Parse::Invalid(reason)) => assert!(reason.contains("big"), "{reason}"),
            _ => panic!("a missing config must be refused"),
        }
    }

    #[test]
    fn a_file_without_a_function_is_refused_rather_than_served_empty() {
        for text in [
            "",
            "---\n",
            "# nothing yet\n",
            "apiVersion: pkg.crossplane.io/v1beta1\nkind: DeploymentRuntimeConfig\nmetadata:\n  name: default\n",
        ] {
            match parse(text, 32) {
                Err(Parse::Invalid(reason)) => assert!(reason.contains("no Function"), "{reason}"),
                _ => panic!("{text:?} must be refused"),
            }
        }
    }

    #[test]
    fn an_alias_bomb_is_refused_before_it_is_parsed() {
        let bomb = crate::nesting::bombs::laughs();
        assert!(matches!(parse(&bomb, 32), Err(Parse::Bounds(_))));
    }

    #[test]
    fn a_functions_server_settings_are_read_and_a_bad_one_refused_naming_the_function() {
        let text = |value: &str| {
            format!("apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: warm\n  annotations:\n    xfn.crossplane.io/min-servers: \"{value}\"\nspec:\n  package: r/a:v1\n")
        };
        let functions = parse(&text("2"), 32).unwrap_or_else(|_| panic!("parse"));
        assert_eq!(functions[0].servers.min_servers, Some(2));
        match parse(&text("100"), 32) {
            Err(Parse::Invalid(reason)) => assert_eq!(
                reason,
                "Function warm: xfn.crossplane.io/min-servers is \"100\": more than the host's --max-servers (32)"
            ),
            _ => panic!("more warm servers than the host runs must be refused"),
        }
    }
}
