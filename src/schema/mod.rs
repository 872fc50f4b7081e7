//! Validation of Kubernetes objects against CRDs and XRDs, as `crossplane
//! beta validate` does it, for `xfn validate` and `xfn test`.
//!
//! Invariant: every resource is judged as the API server would judge it on
//! create, or on update of its old version when given (transition rules
//! run, unchanged values ratchet): the served version's structural schema,
//! defaults first ([`crate::compose::read::xrd::apply_schema_defaults`]),
//! then types, value validations, unknown fields (which the API server
//! prunes and `crossplane beta validate` reports), then CEL
//! `x-kubernetes-validations`. An XRD's schema is the XR's as Crossplane
//! makes its CRD ([`xrd`]); a kind no CRD or XRD defines but Kubernetes
//! does is decoded strictly against its published schema ([`builtin`]);
//! documents among the extensions that are neither CRDs nor XRDs are
//! skipped and named, as Crossplane's CLI skips them. CEL values are typed
//! by the schema ([`typed`]) and rules checked against those types
//! ([`check`]); a rule, or a rules' estimated cost ([`estimate`]), the API
//! server would not admit is an error, never a pass. Transition rules
//! without an old value are skipped, and said so.
//!
//! Why bounded: CRDs, XRDs and resources come from users and functions.
//! Files are read through [`crate::nesting`] with a size cap ([`read`]); a
//! pattern has Go's semantics, is compiled once and its compiled size is
//! capped ([`pattern`]); a CEL rule's length, nesting and estimated cost
//! are capped before it runs ([`cel`]), and its cost is metered while it
//! runs, stopping it past the API server's limits ([`meter`]).
mod builtin;
mod cel;
mod check;
mod estimate;
mod format;
mod meter;
mod pattern;
mod quantity;
pub(crate) mod read;
mod structural;
mod timestamps;
mod typed;
mod url;
mod xrd;

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

use crate::value::get_str;

/// One error of the walk.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Issue {
    path: String,
    message: String,
    rule: String,
}

/// One error: which resource, which field, what is wrong, which rule says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    /// `Kind/name (apiVersion, document N)`.
    pub(crate) resource: String,
    /// The field path (`spec.forProvider.region`, `spec.items[2]`), `<root>`
    /// for the object itself.
    pub(crate) path: String,
    /// What is wrong, in the API server's words where it has them.
    pub(crate) message: String,
    /// The schema keyword or CEL rule that says so.
    pub(crate) rule: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {} (rule: {})",
            self.resource, self.path, self.message, self.rule
        )
    }
}

/// What validation said about one resource.
#[derive(Debug, Clone, Default)]
pub(crate) struct ResourceReport {
    /// `Kind/name (apiVersion, document N)`.
    pub(crate) resource: String,
    /// No CRD or XRD defines its kind and version.
    pub(crate) missing_schema: bool,
    /// Its errors.
    pub(crate) findings: Vec<Finding>,
    /// What was not checked and why (transition rules).
    pub(crate) notes: Vec<String>,
}

/// What validation said about every resource.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    /// CRDs and XRDs that could not be used, and why.
    pub(crate) extension_errors: Vec<String>,
    /// The documents among the extensions that are neither CRDs nor XRDs
    /// (a Composition, a Function…), skipped as Crossplane's CLI skips
    /// them, each named as errors name a resource.
    pub(crate) skipped_extensions: Vec<String>,
    /// One per resource, in order.
    pub(crate) resources: Vec<ResourceReport>,
}

impl Report {
    /// Every error as one line; a missing schema is one when `strict`.
    #[cfg_attr(not(test), allow(dead_code))] // through validate(), xfn test's entry
    pub(crate) fn errors(&self, strict: bool) -> Vec<String> {
        let mut errors = self.extension_errors.clone();
        for resource in &self.resources {
            if resource.missing_schema && strict {
                errors.push(format!(
                    "{}: no CRD or XRD given defines this kind and version",
                    resource.resource
                ));
            }
            errors.extend(resource.findings.iter().map(Finding::to_string));
        }
        errors
    }
}

/// The stack of the thread validation runs on (reserved, touched only as
/// deep as a rule recurses).
const STACK_BYTES: usize = 32 << 20;

/// Validates resources against CRDs and XRDs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Validator {
    /// A resource whose kind no CRD or XRD defines is an error (otherwise
    /// a warning, as in `crossplane beta validate`).
    pub(crate) error_on_missing_schemas: bool,
    /// The old versions of resources (`xfn validate --old-resources`): a
    /// resource with one (same apiVersion, kind, namespace and name) is
    /// judged as an update — its transition rules run, and what is
    /// unchanged and invalid is ratcheted. Without one, a create.
    pub(crate) old_resources: Vec<Value>,
}

impl Validator {
    /// `xfn test`'s entry (src/suite/).
    ///
    /// The errors of `rendered` against `crds` (CRDs and XRDs), one string
    /// each naming the resource, the field path and the rule; empty when
    /// everything is valid.
    pub(crate) fn validate(&self, crds: &[Value], rendered: &[Value]) -> Vec<String> {
        let labels: Vec<String> = rendered
            .iter()
            .enumerate()
            .map(|(i, r)| label(r, &format!("document {}", i + 1)))
            .collect();
        self.check(crds, rendered, &labels)
            .errors(self.error_on_missing_schemas)
    }

    /// The whole report on `resources`, each named by its `labels` entry.
    ///
    /// Runs on a thread of its own with a [`STACK_BYTES`] stack: the `cel`
    /// crate's parser and interpreter recurse as deep as a rule's operators
    /// chain (measured in a debug build: 2,040 `+` overflow a tokio
    /// worker's or a test thread's 2 MiB and touch ~80 MiB; 250, the bound,
    /// touch ~9 MiB).
    pub(crate) fn check(
        &self,
        extensions: &[Value],
        resources: &[Value],
        labels: &[String],
    ) -> Report {
        self.check_placed(extensions, &[], resources, labels)
    }

    /// [`Self::check`], each extension named by where it came from
    /// (`places`: `FILE, document N`) in the errors and skipped documents
    /// that name one; `extension N` past the end of `places`.
    pub(crate) fn check_placed(
        &self,
        extensions: &[Value],
        places: &[String],
        resources: &[Value],
        labels: &[String],
    ) -> Report {
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("xfn-validate".into())
                .stack_size(STACK_BYTES)
                .spawn_scoped(scope, || {
                    self.check_here(extensions, places, resources, labels)
                })
                .map(|thread| thread.join())
        })
        .unwrap_or_else(|spawn| {
            Ok(Report {
                extension_errors: vec![format!("cannot start the validation thread: {spawn}")],
                ..Report::default()
            })
        })
        .unwrap_or_else(|_| Report {
            extension_errors: vec!["the validation failed unexpectedly (a panic)".into()],
            ..Report::default()
        })
    }

    fn check_here(
        &self,
        extensions: &[Value],
        places: &[String],
        resources: &[Value],
        labels: &[String],
    ) -> Report {
        let (schemas, extension_errors, skipped_extensions) = Schemas::build(extensions, places);
        let olds: HashMap<[&str; 4], &Value> = self
            .old_resources
            .iter()
            .map(|old| (identity(old), old))
            .collect();
        let resources = resources
            .iter()
            .zip(labels)
            .map(|(resource, label)| {
                let old = olds.get(&identity(resource)).copied();
                schemas.check(resource, old, label)
            })
            .collect();
        Report {
            extension_errors,
            skipped_extensions,
            resources,
        }
    }
}

/// What makes a resource the same object as an old one: apiVersion, kind,
/// namespace, name.
fn identity(resource: &Value) -> [&str; 4] {
    [
        get_str(resource, &["apiVersion"]).unwrap_or_default(),
        get_str(resource, &["kind"]).unwrap_or_default(),
        get_str(resource, &["metadata", "namespace"]).unwrap_or_default(),
        get_str(resource, &["metadata", "name"]).unwrap_or_default(),
    ]
}

/// `Kind/name (apiVersion, WHERE)`: a resource as errors name it. A
/// composed resource without a name is named by its
/// `crossplane.io/composition-resource-name`.
pub(crate) fn label(resource: &Value, place: &str) -> String {
    let kind = get_str(resource, &["kind"]).unwrap_or("<no kind>");
    let api_version = get_str(resource, &["apiVersion"]).unwrap_or("<no apiVersion>");
    let name = get_str(resource, &["metadata", "name"])
        .map(str::to_string)
        .or_else(|| get_str(resource, &["metadata", "generateName"]).map(|g| format!("{g}*")))
        .or_else(|| {
            resource
                .pointer("/metadata/annotations/crossplane.io~1composition-resource-name")
                .and_then(Value::as_str)
                .map(|n| format!("(composition-resource-name {n})"))
        })
        .unwrap_or_else(|| "<no name>".into());
    format!("{kind}/{name} ({api_version}, {place})")
}

/// One version of a kind: its schema, whether it is served, who defined it.
#[derive(Debug, Clone)]
struct Version {
    schema: Value,
    served: bool,
    source: String,
}

/// Schemas by (group, version, kind).
#[derive(Debug, Default)]
struct Schemas {
    by_gvk: HashMap<(String, String, String), Version>,
}

impl Schemas {
    /// Reads every CRD and XRD in `extensions`: a CRD without versions is
    /// an error; anything else is skipped, as Crossplane's CLI skips it
    /// (`PrepExtensions`: a Composition in an `apis/` directory, a Function
    /// or Provider whose package xfn does not fetch), and returned by name.
    fn build(extensions: &[Value], places: &[String]) -> (Self, Vec<String>, Vec<String>) {
        let mut schemas = Schemas::default();
        let mut errors = Vec::new();
        let mut skipped = Vec::new();
        for (i, extension) in extensions.iter().enumerate() {
            let place = places
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("extension {}", i + 1));
            let api_version = get_str(extension, &["apiVersion"]).unwrap_or_default();
            let kind = get_str(extension, &["kind"]).unwrap_or_default();
            let name = get_str(extension, &["metadata", "name"]).unwrap_or_default();
            let source = format!("{kind} {name}");
            let group = get_str(extension, &["spec", "group"]).unwrap_or_default();
            if api_version == "apiextensions.k8s.io/v1" && kind == "CustomResourceDefinition" {
                let crd_kind = get_str(extension, &["spec", "names", "kind"]).unwrap_or_default();
                let versions = extension
                    .pointer("/spec/versions")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                if versions.is_empty() {
                    errors.push(format!(
                        "{}: has no spec.versions",
                        label(extension, &place)
                    ));
                }
                for (v, version) in versions.iter().enumerate() {
                    let version_name = get_str(version, &["name"]).unwrap_or_default();
                    let schema = version
                        .pointer("/schema/openAPIV3Schema")
                        .cloned()
                        .unwrap_or(Value::Null);
                    errors.extend(over_cost(
                        &schema,
                        &format!("{}: spec.versions[{v}].schema", label(extension, &place)),
                    ));
                    schemas.by_gvk.insert(
                        (group.into(), version_name.into(), crd_kind.into()),
                        Version {
                            schema,
                            served: version.get("served") != Some(&Value::Bool(false)),
                            source: source.clone(),
                        },
                    );
                }
            } else if let Some(definition) =
                crate::compose::read::xrd::Xrd::from_object(xrd_as_crossplane_reads_it(extension))
            {
                for (kind, version, schema, served) in xrd::schemas(&definition) {
                    errors.extend(over_cost(
                        &schema,
                        &format!(
                            "{}: the CRD of {kind} {version} Crossplane makes from it",
                            label(extension, &place)
                        ),
                    ));
                    schemas.by_gvk.insert(
                        (group.into(), version, kind),
                        Version {
                            schema,
                            served,
                            source: source.clone(),
                        },
                    );
                }
            } else {
                skipped.push(label(extension, &place));
            }
        }
        (schemas, errors, skipped)
    }

    /// Validates one resource, as an update of `old` when there is one.
    fn check(&self, resource: &Value, old: Option<&Value>, label: &str) -> ResourceReport {
        let mut report = ResourceReport {
            resource: label.to_string(),
            ..ResourceReport::default()
        };
        let api_version = get_str(resource, &["apiVersion"]).unwrap_or_default();
        let kind = get_str(resource, &["kind"]).unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let Some(found) =
            self.by_gvk
                .get(&(group.to_string(), version.to_string(), kind.to_string()))
        else {
            match builtin::Builtin::find(group, version, kind) {
                Some(builtin) if !too_large(resource, label, &mut report) => {
                    report.findings = builtin
                        .check(resource)
                        .into_iter()
                        .map(|issue| finding(label, issue))
                        .collect();
                }
                Some(_) => {}
                None => report.missing_schema = true,
            }
            return report;
        };
        if !found.served {
            report.findings.push(Finding {
                resource: label.to_string(),
                path: "apiVersion".into(),
                message: format!(
                    "version {version:?} is not served by the {} that defines {kind}",
                    found.source
                ),
                rule: "served".into(),
            });
            return report;
        }
        if too_large(resource, label, &mut report) {
            return report;
        }
        let mut object = resource.clone();
        crate::compose::read::xrd::apply_schema_defaults(&mut object, &found.schema);
        let old = old.map(|old| {
            let mut old = old.clone();
            crate::compose::read::xrd::apply_schema_defaults(&mut old, &found.schema);
            old
        });
        let mut walk = structural::Walk::new();
        walk.root(&object, old.as_ref(), &found.schema);
        // The API server has a CEL validator only for a schema with rules.
        let blocked = walk
            .issues
            .iter()
            .any(|i| BLOCKING.contains(&i.rule.as_str()))
            && found
                .schema
                .to_string()
                .contains("\"x-kubernetes-validations\"");
        if blocked {
            walk.issues.retain(|i| !i.rule.starts_with(CEL_RULE));
            walk.issues.push(Issue {
                path: String::new(),
                message: "Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".into(),
                rule: "x-kubernetes-validations".into(),
            });
            walk.notes.retain(|n| !n.contains("transition rule"));
        }
        report.findings = walk
            .issues
            .into_iter()
            .map(|issue| finding(label, issue))
            .collect();
        report.notes = walk.notes;
        report
    }
}

/// The schema errors after which the API server runs no CEL rule
/// (apiextensions-apiserver `registry/customresource/strategy.go`
/// `hasBlockingErr`: NotSupported, Required, TooLong, TooMany,
/// TypeInvalid), by the rule xfn names them with.
const BLOCKING: &[&str] = &[
    "enum",
    "required",
    "maxLength",
    "maxItems",
    "maxProperties",
    "type",
    "nullable",
    "x-kubernetes-int-or-string",
];

/// How a CEL rule's error names its rule ([`cel`]).
const CEL_RULE: &str = "x-kubernetes-validations rule ";

/// Why the API server refuses a CRD with `schema` (an `openAPIV3Schema`)
/// for its rules' estimated cost, each said after `place`: a rule over
/// the per-rule limit, all of them over the per-CRD limit.
fn over_cost(schema: &Value, place: &str) -> Vec<String> {
    let rules = estimate::rules(schema, &cel::checked);
    let mut errors = Vec::new();
    let mut total = 0u64;
    for rule in &rules {
        total = total.saturating_add(rule.cost);
        if rule.cost > estimate::PER_RULE_LIMIT {
            errors.push(format!(
                "{place}.{}: Forbidden: {} (rule {:?}: estimated cost {}, limit {}; the API server refuses this CRD)",
                rule.path,
                estimate::exceeds("estimated rule cost", rule.cost, estimate::PER_RULE_LIMIT),
                rule.rule,
                rule.cost,
                estimate::PER_RULE_LIMIT,
            ));
        }
    }
    if total > estimate::PER_CRD_LIMIT {
        errors.push(format!(
            "{place}.openAPIV3Schema: Forbidden: {} (estimated cost {total}, limit {}; the API server refuses this CRD)",
            estimate::exceeds(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                total,
                estimate::PER_CRD_LIMIT
            ),
            estimate::PER_CRD_LIMIT,
        ));
    }
    errors
}

/// `issue` of the resource `label`.
fn finding(label: &str, issue: Issue) -> Finding {
    Finding {
        resource: label.to_string(),
        path: if issue.path.is_empty() {
            "<root>".into()
        } else {
            issue.path
        },
        message: issue.message,
        rule: issue.rule,
    }
}

/// Whether `resource` is over the API server's request size, said in
/// `report` when it is.
fn too_large(resource: &Value, label: &str, report: &mut ResourceReport) -> bool {
    let bytes = json_bytes(resource);
    if bytes > MAX_REQUEST_BYTES {
        report.findings.push(Finding {
            resource: label.to_string(),
            path: "<root>".into(),
            message: format!(
                "Request entity too large: limit is {MAX_REQUEST_BYTES} (the resource is {bytes} bytes of JSON)"
            ),
            rule: "request size".into(),
        });
    }
    bytes > MAX_REQUEST_BYTES
}

/// An XRD as Crossplane's CLI reads it: every version of
/// `apiextensions.crossplane.io` (`v1alpha1` too) decoded as v1
/// (`PrepExtensions` matches the group and kind only).
fn xrd_as_crossplane_reads_it(extension: &Value) -> Value {
    let mut xrd = extension.clone();
    let api_version = get_str(extension, &["apiVersion"]).unwrap_or_default();
    if let Some(version) = api_version.strip_prefix("apiextensions.crossplane.io/") {
        if !matches!(version, "v1" | "v2") {
            xrd["apiVersion"] = Value::String("apiextensions.crossplane.io/v1".into());
        }
    }
    xrd
}

/// The largest request body the API server takes (`MaxRequestBodyBytes`):
/// a larger resource is refused before any validation.
const MAX_REQUEST_BYTES: u64 = 3 << 20;

/// The length of `value` as JSON, counted without building it.
fn json_bytes(value: &Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail; a `Value` always serializes.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// What a non-object document is, for an error.
fn structural_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
