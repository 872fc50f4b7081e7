//! The static catalog: Crossplane `Function` objects (`pkg.crossplane.io`,
//! the file `crossplane render` takes), multi-document YAML, read under the
//! crate's bounds on nesting and aliases. `metadata.name` and
//! `spec.package` are used; the annotation `xfn.crossplane.io/kind`
//! (`Server` or `StdinStdout`) overrides the kind the package says.
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::catalog::{FunctionKind, HostedFunction};

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
    spec: Spec,
}

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    name: Option<String>,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
struct Spec {
    package: Option<String>,
}

/// The functions `path` holds.
pub(crate) fn read(path: &Path) -> Result<Vec<HostedFunction>, FunctionsFileError> {
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
    parse(&text).map_err(|e| match e {
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

fn parse(text: &str) -> Result<Vec<HostedFunction>, Parse> {
    crate::nesting::check(text.as_bytes()).map_err(Parse::Bounds)?;
    let mut functions: Vec<HostedFunction> = Vec::new();
    for (i, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let value = yaml_serde::Value::deserialize(document)
            .map_err(|e| Parse::Invalid(format!("document {}: {e}", i + 1)))?;
        if value.is_null() {
            continue;
        }
        let object: Object = yaml_serde::from_value(value)
            .map_err(|e| Parse::Invalid(format!("document {}: {e}", i + 1)))?;
        let group_ok = object
            .api_version
            .as_deref()
            .is_some_and(|v| v.starts_with("pkg.crossplane.io/"));
        if !group_ok || object.kind.as_deref() != Some("Function") {
            return Err(Parse::Invalid(format!(
                "document {}: not a pkg.crossplane.io Function (apiVersion {:?}, kind {:?})",
                i + 1,
                object.api_version,
                object.kind
            )));
        }
        let Some(name) = object.metadata.name.filter(|n| valid_name(n)) else {
            return Err(Parse::Invalid(format!(
                "document {}: metadata.name must be a DNS label (lower case letters, digits, '-', at most 63)",
                i + 1
            )));
        };
        let Some(package) = object.spec.package.filter(|p| !p.is_empty()) else {
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
        if functions.iter().any(|f| f.name == name) {
            return Err(Parse::Invalid(format!("Function {name} appears twice")));
        }
        functions.push(HostedFunction {
            name,
            package,
            kind,
        });
    }
    Ok(functions)
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
        let Ok(functions) = parse(text) else {
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
            assert!(matches!(parse(text), Err(Parse::Invalid(_))), "{text}");
        }
    }

    #[test]
    fn an_alias_bomb_is_refused_before_it_is_parsed() {
        let bomb = crate::nesting::bombs::laughs();
        assert!(matches!(parse(&bomb), Err(Parse::Bounds(_))));
    }
}
