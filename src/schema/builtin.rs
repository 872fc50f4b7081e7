//! Kubernetes' own kinds (ConfigMap, Secret, Deployment, Service, …):
//! validated against the OpenAPI v3 documents Kubernetes publishes
//! (`api/openapi-spec/v3` of kubernetes v1.35.3, vendored zstd-compressed
//! in src/schema/openapi/ with their Apache-2.0 licence), as Crossplane's
//! CLI validates them: by decoding strictly into the Go types
//! (`pkg/validate/validate.go`, `kubernetesResourceValidator`), which
//! refuses a field the type lacks and a value its Go field cannot hold —
//! a string where an `int32` is, `3000000000` in an `int32`, bad base64 in
//! a `[]byte`, a time that is not RFC 3339, a malformed quantity — and
//! checks nothing else (not `required`, not enums: the API server's own
//! validation of built-in kinds is Go code no schema carries).
//!
//! Invariant: a CRD or XRD given for the same kind wins (the CLI looks
//! there first); a kind none of the documents defines is a missing schema.
//!
//! Why bounded: the documents are constants; each is decompressed and
//! parsed once per process, and only when a resource of its group and
//! version is met (startup stays fast: 11 MiB of JSON, 800 KiB in the
//! binary). The walk follows the resource, whose size and nesting are
//! bounded before it gets here, so `$ref` cycles (JSONSchemaProps) cannot
//! loop.
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::{Map, Value};

use super::Issue;

macro_rules! documents {
    ($($name:literal),* $(,)?) => {
        /// `(document name, zstd bytes)`, by `api__v1`/`apis__GROUP__VERSION`.
        const DOCUMENTS: &[(&str, &[u8])] = &[$(
            ($name, include_bytes!(concat!("openapi/", $name, "_openapi.json.zst"))),
        )*];
    };
}

documents!(
    "api__v1",
    "apis__admissionregistration.k8s.io__v1",
    "apis__admissionregistration.k8s.io__v1alpha1",
    "apis__admissionregistration.k8s.io__v1beta1",
    "apis__apiextensions.k8s.io__v1",
    "apis__apiregistration.k8s.io__v1",
    "apis__apps__v1",
    "apis__authentication.k8s.io__v1",
    "apis__authorization.k8s.io__v1",
    "apis__autoscaling__v1",
    "apis__autoscaling__v2",
    "apis__batch__v1",
    "apis__certificates.k8s.io__v1",
    "apis__certificates.k8s.io__v1alpha1",
    "apis__certificates.k8s.io__v1beta1",
    "apis__coordination.k8s.io__v1",
    "apis__coordination.k8s.io__v1alpha2",
    "apis__coordination.k8s.io__v1beta1",
    "apis__discovery.k8s.io__v1",
    "apis__events.k8s.io__v1",
    "apis__flowcontrol.apiserver.k8s.io__v1",
    "apis__internal.apiserver.k8s.io__v1alpha1",
    "apis__networking.k8s.io__v1",
    "apis__networking.k8s.io__v1beta1",
    "apis__node.k8s.io__v1",
    "apis__policy__v1",
    "apis__rbac.authorization.k8s.io__v1",
    "apis__resource.k8s.io__v1",
    "apis__resource.k8s.io__v1alpha3",
    "apis__resource.k8s.io__v1beta1",
    "apis__resource.k8s.io__v1beta2",
    "apis__scheduling.k8s.io__v1",
    "apis__scheduling.k8s.io__v1alpha1",
    "apis__storage.k8s.io__v1",
    "apis__storage.k8s.io__v1beta1",
    "apis__storagemigration.k8s.io__v1beta1",
);

/// The largest document decompressed (core v1 is 3.5 MiB).
const MAX_DOCUMENT_BYTES: u64 = 16 << 20;

/// A parsed document; `None` for one that could not be read.
type Parsed = Option<Arc<Value>>;

/// Parsed documents by name.
static PARSED: LazyLock<Mutex<HashMap<&'static str, Parsed>>> = LazyLock::new(Default::default);

/// The document of `group`/`version`, parsed once per process.
fn document(group: &str, version: &str) -> Option<Arc<Value>> {
    let name = if group.is_empty() {
        format!("api__{version}")
    } else {
        format!("apis__{group}__{version}")
    };
    let (name, bytes) = DOCUMENTS.iter().find(|(n, _)| *n == name)?;
    let mut parsed = PARSED.lock().unwrap_or_else(|e| e.into_inner());
    parsed
        .entry(name)
        .or_insert_with(|| {
            use std::io::Read;
            let mut json = Vec::new();
            zstd::stream::read::Decoder::new(*bytes)
                .ok()?
                .take(MAX_DOCUMENT_BYTES)
                .read_to_end(&mut json)
                .ok()?;
            serde_json::from_slice(&json).ok().map(Arc::new)
        })
        .clone()
}

/// A built-in kind's schema: its document and the schema's name in it.
#[derive(Debug, Clone)]
pub(super) struct Builtin {
    document: Arc<Value>,
    name: String,
}

impl Builtin {
    /// The built-in kind `group`/`version`/`kind`, if Kubernetes has it.
    pub(super) fn find(group: &str, version: &str, kind: &str) -> Option<Self> {
        let document = document(group, version)?;
        let schemas = document.pointer("/components/schemas")?.as_object()?;
        let name = schemas.iter().find_map(|(name, schema)| {
            let gvks = schema.get("x-kubernetes-group-version-kind")?.as_array()?;
            gvks.iter()
                .any(|gvk| {
                    gvk.get("group").and_then(Value::as_str) == Some(group)
                        && gvk.get("version").and_then(Value::as_str) == Some(version)
                        && gvk.get("kind").and_then(Value::as_str) == Some(kind)
                })
                .then(|| name.clone())
        })?;
        Some(Self { document, name })
    }

    /// What strict decoding into the Go type would refuse in `resource`.
    pub(super) fn check(&self, resource: &Value) -> Vec<Issue> {
        let mut issues = Vec::new();
        let root = Value::String(format!("#/components/schemas/{}", self.name));
        let root = Value::Object(Map::from_iter([("$ref".to_string(), root)]));
        self.decode(resource, &root, "", &mut issues);
        issues
    }

    /// `schema` with its `$ref` (alone or as the one `allOf`) followed.
    fn resolve<'a>(&'a self, mut schema: &'a Value) -> &'a Value {
        for _ in 0..8 {
            let reference = schema.get("$ref").or_else(|| {
                schema
                    .get("allOf")
                    .and_then(Value::as_array)
                    .filter(|all| all.len() == 1)
                    .and_then(|all| all[0].get("$ref"))
            });
            let Some(name) = reference
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
            else {
                break;
            };
            match self
                .document
                .pointer("/components/schemas")
                .and_then(|s| s.get(name))
            {
                Some(target) => schema = target,
                None => break,
            }
        }
        schema
    }

    fn decode(&self, value: &Value, schema: &Value, path: &str, issues: &mut Vec<Issue>) {
        // Go's decoder leaves a field at its zero value for `null`.
        if value.is_null() {
            return;
        }
        let schema = self.resolve(schema);
        let mut refuse = |wanted: &str| {
            issues.push(Issue {
                path: path.to_string(),
                message: format!(
                    "Invalid value: {}: cannot be decoded into the built-in type's {wanted} field",
                    super::structural::short(value)
                ),
                rule: "built-in schema".into(),
            });
        };
        let format = schema.get("format").and_then(Value::as_str);
        if format == Some("int-or-string") {
            if !(value.is_string() || integer_fits(value, Some("int32"))) {
                refuse("int-or-string");
            }
            return;
        }
        if let Some(one_of) = schema.get("oneOf").and_then(Value::as_array) {
            // resource.Quantity: a string or a number, either parsed.
            let ok = match value {
                Value::String(text) => quantity(text.trim()),
                Value::Number(_) => true,
                _ => false,
            };
            if !ok && !one_of.is_empty() {
                refuse("quantity");
            }
            return;
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("string") => match value.as_str() {
                None => refuse("string"),
                Some(text) if format == Some("byte") && !base64(text) => refuse("base64 []byte"),
                Some(text) if format == Some("date-time") && !rfc3339(text) => {
                    refuse("RFC 3339 time")
                }
                Some(_) => {}
            },
            Some("boolean") if !value.is_boolean() => refuse("boolean"),
            Some("integer") if !integer_fits(value, format) => refuse(format.unwrap_or("integer")),
            Some("number") if !value.is_number() => refuse("number"),
            Some("array") => match value.as_array() {
                None => refuse("list"),
                Some(items) => {
                    let item = schema.get("items").unwrap_or(&Value::Null);
                    for (i, v) in items.iter().enumerate() {
                        self.decode(v, item, &format!("{path}[{i}]"), issues);
                    }
                }
            },
            Some("object") => {
                let properties = schema.get("properties").and_then(Value::as_object);
                let additional = schema.get("additionalProperties");
                // RawExtension, FieldsV1, JSON: any value, kept raw.
                if properties.is_none() && additional.is_none() {
                    return;
                }
                let Some(map) = value.as_object() else {
                    refuse("object");
                    return;
                };
                for (key, v) in map {
                    let child = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    if let Some(property) = properties.and_then(|p| p.get(key)) {
                        self.decode(v, property, &child, issues);
                    } else if let Some(additional) = additional.filter(|a| a.is_object()) {
                        self.decode(v, additional, &format!("{path}[{key}]"), issues);
                    } else {
                        issues.push(Issue {
                            path: child,
                            message: format!(
                                "Unknown field: {key:?} is not in the built-in type (strict decoding refuses it)"
                            ),
                            rule: "unknown field".into(),
                        });
                    }
                }
            }
            _ => {}
        }
    }
}

/// Whether Go's decoder puts `value` in an integer field of `format`: the
/// JSON number the CLI re-encodes (a whole float prints as an integer,
/// below 1e21) within the field's range.
fn integer_fits(value: &Value, format: Option<&str>) -> bool {
    let n = if let Some(n) = value.as_i64() {
        i128::from(n)
    } else if let Some(n) = value.as_u64() {
        i128::from(n)
    } else if let Some(f) = value
        .as_f64()
        .filter(|f| f.fract() == 0.0 && f.abs() < 1e21)
    {
        f as i128
    } else {
        return false;
    };
    match format {
        Some("int32") => i32::try_from(n).is_ok(),
        _ => i64::try_from(n).is_ok(),
    }
}

/// Go's `base64.StdEncoding` as encoding/json decodes a `[]byte`: padded,
/// `\r` and `\n` ignored, empty allowed.
fn base64(text: &str) -> bool {
    use base64::Engine;
    let text: String = text.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .is_ok()
}

/// `metav1.Time`: Go's `time.Parse(time.RFC3339, …)` (`T` and `Z` upper
/// case, an offset's hours up to 24 and minutes up to 60, as Go's
/// `parseRFC3339` bounds them).
fn rfc3339(text: &str) -> bool {
    static RFC3339: LazyLock<Option<regex::Regex>> = LazyLock::new(|| {
        regex::Regex::new(
            r"^([0-9]{4}-[0-9]{2}-[0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?(Z|[+-]([0-9]{2}):([0-9]{2}))$",
        )
        .ok()
    });
    let Some(c) = RFC3339.as_ref().and_then(|r| r.captures(text)) else {
        return false;
    };
    let n = |i: usize| -> u32 { c.get(i).and_then(|m| m.as_str().parse().ok()).unwrap_or(0) };
    super::format::check("date", c.get(1).map_or("", |m| m.as_str())) == Some(true)
        && n(2) < 24
        && n(3) < 60
        && n(4) < 60
        && n(7) <= 24
        && n(8) <= 60
}

/// apimachinery's `resource.ParseQuantity`: a signed decimal, then a
/// binary (`Ki` … `Ei`), decimal (`n` `u` `m` `k` `M` `G` `T` `P` `E`) or
/// exponent (`e3`, `E-2`) suffix.
fn quantity(text: &str) -> bool {
    if text.is_empty() {
        return false;
    }
    let s = text.strip_prefix(['+', '-']).unwrap_or(text);
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let mut rest = &s[digits..];
    if let Some(after) = rest.strip_prefix('.') {
        let fraction = after.bytes().take_while(u8::is_ascii_digit).count();
        rest = &after[fraction..];
    }
    let suffix_len = rest
        .bytes()
        .take_while(|b| b"eEinumkKMGTP".contains(b))
        .count();
    let (letters, exponent) = rest.split_at(suffix_len);
    let exponent_digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    if !exponent_digits.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let suffix = rest;
    match letters {
        "" => exponent.is_empty(),
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P"
        | "E"
            if exponent.is_empty() =>
        {
            true
        }
        "e" | "E" => suffix.len() > 1 && exponent_digits.parse::<i32>().is_ok(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_apimachinery_parses_them() {
        for (text, ok) in [
            ("1", true),
            ("100m", true),
            ("1.5Gi", true),
            ("-2k", true),
            ("1e3", true),
            ("1E-2", true),
            ("1E", true),
            ("", false),
            ("1 Gi", false),
            ("1Gb", false),
            ("abc", false),
            ("1e", false),
            ("1.5.5", false),
        ] {
            assert_eq!(quantity(text), ok, "{text:?}");
        }
    }

    #[test]
    fn every_vendored_document_parses_and_defines_its_kinds() {
        for (name, _) in DOCUMENTS {
            let (group, version) = match name.strip_prefix("api__") {
                Some(version) => ("", version),
                None => name
                    .strip_prefix("apis__")
                    .and_then(|gv| gv.split_once("__"))
                    .unwrap(),
            };
            let document = document(group, version).unwrap_or_else(|| panic!("{name}"));
            assert!(document.pointer("/components/schemas").is_some(), "{name}");
        }
        assert!(Builtin::find("", "v1", "ConfigMap").is_some());
        assert!(Builtin::find("apps", "v1", "Deployment").is_some());
        assert!(Builtin::find("apps", "v1", "Nonesuch").is_none());
        assert!(Builtin::find("nonesuch.example.org", "v1", "Thing").is_none());
    }
}
