//! The assertion checkers: `xprin` (Count, Exists, NotExists, FieldType,
//! FieldExists, FieldNotExists, FieldValue over `Kind/name` patterns, as
//! xprin's own), `diff` (the golden file byte for byte, a unified diff on
//! failure) and `dyff` (documents matched by kind and name, compared as
//! values: key order and formatting ignored). Every assertion runs even
//! when one fails; one that cannot be evaluated is an error, not a pass.
use std::path::Path;

use globset::GlobBuilder;
use serde_json::Value;

use super::beneath::{Beneath, BeneathError};
use super::spec::{GoldenAssertion, XprinAssertion};

/// How a check ended (`[✓]`, `[x]`, `[!]` as xprin prints them; `[w]` xfn's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Pass,
    Fail,
    Error,
    /// `--update` wrote the golden file: nothing was compared, so the
    /// check neither passed nor failed.
    Written,
}

impl Status {
    pub(crate) fn symbol(self) -> &'static str {
        match self {
            Status::Pass => "[✓]",
            Status::Fail => "[x]",
            Status::Error => "[!]",
            Status::Written => "[w]",
        }
    }
}

/// One check's outcome.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub(crate) status: Status,
    /// The assertion's (or phase's) name.
    pub(crate) name: String,
    /// What was found.
    pub(crate) message: String,
    /// A diff, for golden files.
    pub(crate) detail: Option<String>,
}

impl Check {
    pub(crate) fn new(status: Status, name: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            name: name.to_string(),
            message: message.into(),
            detail: None,
        }
    }
}

/// A rendered object by `Kind/name`.
pub(crate) type Resource = (String, Value);

/// `Kind/name` of an object.
pub(crate) fn identifier(object: &Value) -> String {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    format!("{kind}/{name}")
}

/// The resources `pattern` (`Kind`, `Kind/name`, shell globs in either)
/// matches, by identifier order.
fn find<'a>(resources: &'a [Resource], pattern: &str) -> Result<Vec<&'a Resource>, String> {
    let pattern = pattern.trim();
    if pattern.is_empty() {
        return Err("resource pattern cannot be empty".into());
    }
    let pattern = match pattern.matches('/').count() {
        0 => format!("{pattern}/*"),
        1 => pattern.to_string(),
        _ => return Err("the resource must be `Kind` or `Kind/name`".into()),
    };
    let glob = GlobBuilder::new(&pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("invalid resource pattern {pattern:?}: {e}"))?
        .compile_matcher();
    let mut found: Vec<&Resource> = resources
        .iter()
        .filter(|(id, _)| glob.is_match(id))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

fn identifiers(found: &[&Resource]) -> String {
    found
        .iter()
        .map(|(id, _)| id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The value at dot path `field`: `Ok(None)` when absent, an error when a
/// step on the way is not an object.
fn field_at<'a>(object: &'a Value, field: &str) -> Result<Option<&'a Value>, String> {
    let parts: Vec<&str> = field.split('.').collect();
    let mut current = object;
    for (i, part) in parts.iter().enumerate() {
        let Some(map) = current.as_object() else {
            return Err(format!("field {} is not an object", parts[..i].join(".")));
        };
        match map.get(*part) {
            Some(next) => current = next,
            None => return Ok(None),
        }
    }
    Ok(Some(current))
}

/// Why `field` is absent when a key on its way holds a dot (an
/// annotation's `example.com/x`): a dot path cannot address that key, as
/// xprin's cannot, so the field is not known to be absent.
fn unaddressable(object: &Value, field: &str) -> Option<String> {
    let parts: Vec<&str> = field.split('.').collect();
    let mut current = object;
    for (i, part) in parts.iter().enumerate() {
        let map = current.as_object()?;
        if let Some(next) = map.get(*part) {
            current = next;
            continue;
        }
        let key = map.keys().find(|k| {
            k.contains('.') && (i + 2..=parts.len()).any(|end| parts[i..end].join(".") == **k)
        })?;
        return Some(format!(
            "field {field} cannot be addressed: key {key:?} of {} holds a dot, which a dot path splits",
            if i == 0 { "the resource".to_string() } else { parts[..i].join(".") }
        ));
    }
    None
}

/// Why `field` was not found on resource `id`: it cannot be addressed, or
/// it is not there.
fn not_found(object: &Value, field: &str, id: &str) -> String {
    let why = unaddressable(object, field).unwrap_or_else(|| format!("field {field} not found"));
    format!("{why} on resource {id}")
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Equal as xprin compares (`fmt.Sprintf("%v")` of both): numbers by
/// value, anything else by its text, so the string `"3"` equals the
/// number `3` and `"true"` equals `true`; `null` equals only `null`.
fn equal(actual: &Value, expected: &Value) -> bool {
    match (actual, expected) {
        (Value::Null, Value::Null) => true,
        (Value::Null, _) | (_, Value::Null) => false,
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => go_text(actual) == go_text(expected),
    }
}

/// A value as Go's `%v` prints the decoded YAML: a string bare, a list
/// `[a b]`, a map `map[k:v]` by sorted key.
fn go_text(value: &Value) -> String {
    match value {
        Value::Null => "<nil>".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(go_text).collect();
            format!("[{}]", items.join(" "))
        }
        Value::Object(map) => {
            let mut entries: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k}:{}", go_text(v)))
                .collect();
            entries.sort();
            format!("map[{}]", entries.join(" "))
        }
        other => other.to_string(),
    }
}

/// A value as a failure names it: its text and its type
/// (`"3" (string)`, `3 (number)`).
fn typed(value: &Value) -> String {
    let text = match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    format!("{text} ({})", type_name(value))
}

/// A Count assertion's value as a whole number: `4` or `4.0` (YAML's
/// float, as xprin truncates it), never negative.
fn count(value: Option<&Value>) -> Result<u64, String> {
    let Some(value) = value else {
        return Err("a Count assertion needs `value`, a number".into());
    };
    let Some(number) = value.as_f64() else {
        return Err(format!(
            "a Count assertion's value must be a number, got {}",
            typed(value)
        ));
    };
    if number < 0.0 {
        return Err(format!(
            "a Count assertion's value must not be negative, got {number}"
        ));
    }
    // As xprin's `int(float64)`: a fraction is dropped.
    Ok(value.as_u64().unwrap_or(number.trunc() as u64))
}

/// Runs one `xprin` assertion over the rendered `resources`.
pub(crate) fn xprin(assertion: &XprinAssertion, resources: &[Resource]) -> Vec<Check> {
    match xprin_checks(assertion, resources) {
        Ok(checks) => checks,
        Err(message) => vec![Check::new(Status::Error, &assertion.name, message)],
    }
}

fn xprin_checks(a: &XprinAssertion, resources: &[Resource]) -> Result<Vec<Check>, String> {
    let name = &a.name;
    let need = |what: &str, v: &Option<String>| {
        v.clone()
            .ok_or_else(|| format!("a {} assertion needs `{what}`", a.kind))
    };
    let check = |pass: bool, ok: String, bad: String| {
        if pass {
            Check::new(Status::Pass, name, ok)
        } else {
            Check::new(Status::Fail, name, bad)
        }
    };
    let matched = |pattern: &str| -> Result<Vec<&Resource>, String> {
        let found = find(resources, pattern)?;
        if found.is_empty() {
            return Err(format!("no rendered resource matched {pattern}"));
        }
        Ok(found)
    };
    match a.kind.as_str() {
        "Count" => {
            let expected = count(a.value.as_ref())?;
            let found = match &a.resource {
                Some(pattern) => find(resources, pattern)?,
                None => resources.iter().collect(),
            };
            let actual = found.len() as u64;
            Ok(vec![check(
                actual == expected,
                format!("found {actual} resources (as expected)"),
                format!("expected {expected} resources, got {actual}: {}", identifiers(&found)),
            )])
        }
        "Exists" => {
            let pattern = need("resource", &a.resource)?;
            let found = find(resources, &pattern)?;
            Ok(vec![check(
                !found.is_empty(),
                format!("resources found: {}", identifiers(&found)),
                format!("resource {pattern} not found"),
            )])
        }
        "NotExists" => {
            let pattern = need("resource", &a.resource)?;
            let found = find(resources, &pattern)?;
            Ok(vec![check(
                found.is_empty(),
                format!("resource {pattern} not found (as expected)"),
                format!("resources found (should not exist): {}", identifiers(&found)),
            )])
        }
        "FieldType" => {
            let pattern = need("resource", &a.resource)?;
            let field = need("field", &a.field)?;
            let expected = a
                .value
                .as_ref()
                .and_then(Value::as_str)
                .ok_or("a FieldType assertion's value must be a type name: string, number, boolean, array, object or null")?;
            if !["string", "number", "boolean", "array", "object", "null"].contains(&expected) {
                return Err(format!("unknown type {expected:?} (string, number, boolean, array, object or null)"));
            }
            matched(&pattern)?
                .into_iter()
                .map(|(id, object)| {
                    Ok(match field_at(object, &field)? {
                        None => Check::new(Status::Error, name, not_found(object, &field, id)),
                        Some(value) => check(
                            type_name(value) == expected,
                            format!("field {field} has expected type {expected} on resource {id}"),
                            format!("field {field} has type {}, expected {expected} on resource {id}", type_name(value)),
                        ),
                    })
                })
                .collect()
        }
        "FieldExists" | "FieldNotExists" => {
            let pattern = need("resource", &a.resource)?;
            let field = need("field", &a.field)?;
            let want = a.kind == "FieldExists";
            matched(&pattern)?
                .into_iter()
                .map(|(id, object)| {
                    let exists = field_at(object, &field)?.is_some();
                    let absent = || {
                        unaddressable(object, &field).map_or_else(
                            || format!("field {field} does not exist on resource {id}"),
                            |why| format!("{why} on resource {id}"),
                        )
                    };
                    Ok(match (want, exists) {
                        (true, true) => Check::new(Status::Pass, name, format!("field {field} exists on resource {id}")),
                        (true, false) => Check::new(Status::Fail, name, absent()),
                        (false, false) => Check::new(Status::Pass, name, format!("field {field} does not exist (as expected) on resource {id}")),
                        (false, true) => Check::new(Status::Fail, name, format!("field {field} exists (should not exist) on resource {id}")),
                    })
                })
                .collect()
        }
        "FieldValue" => {
            let pattern = need("resource", &a.resource)?;
            let field = need("field", &a.field)?;
            let operator = need("operator", &a.operator)?;
            if operator != "==" && operator != "is" {
                return Err(format!("unsupported operator {operator:?} (== or is)"));
            }
            let expected = a
                .value
                .clone()
                .ok_or("a FieldValue assertion needs `value`")?;
            matched(&pattern)?
                .into_iter()
                .map(|(id, object)| {
                    Ok(match field_at(object, &field)? {
                        None => Check::new(Status::Error, name, not_found(object, &field, id)),
                        Some(value) => check(
                            equal(value, &expected),
                            format!("field {field} {operator} {} on resource {id}", go_text(&expected)),
                            format!("field {field} is {}, expected {operator} {} on resource {id}", typed(value), typed(&expected)),
                        ),
                    })
                })
                .collect()
        }
        other => Err(format!(
            "unsupported assertion type {other:?} (Count, Exists, NotExists, FieldType, FieldExists, FieldNotExists, FieldValue)"
        )),
    }
}

/// Which golden-file checker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Golden {
    /// Byte for byte, a unified diff.
    Diff,
    /// Structural: documents by kind and name, values compared.
    Dyff,
}

/// Compares `actual` (the full render, or one resource's file) with the
/// golden file `expected`; with `update` (`--update`), writes `actual`
/// there through it instead.
pub(crate) fn golden(
    checker: Golden,
    assertion: &GoldenAssertion,
    expected: &Beneath,
    actual: &str,
    update: Option<&super::writes::Opened>,
) -> Check {
    let name = &super::template::as_written(&assertion.name);
    if let Some(writes) = update {
        return match writes.write(expected, actual) {
            Ok(()) => Check::new(
                Status::Written,
                name,
                format!("written {}", expected.path().display()),
            ),
            Err(e) => Check::new(Status::Error, name, crate::chain::Chain(&e).to_string()),
        };
    }
    let golden = match expected.read(MAX_GOLDEN_BYTES) {
        Ok(text) => text,
        Err(e) => {
            let missing =
                matches!(&e, BeneathError::Io(e) if e.kind() == std::io::ErrorKind::NotFound);
            return Check::new(
                Status::Error,
                name,
                format!(
                    "cannot read golden file {}: {}{}",
                    expected.path().display(),
                    crate::chain::Chain(&e),
                    if missing { " (--update writes it)" } else { "" }
                ),
            );
        }
    };
    let expected = expected.path();
    match checker {
        Golden::Diff => {
            if golden == actual {
                return Check::new(
                    Status::Pass,
                    name,
                    format!("matches {}", expected.display()),
                );
            }
            let diff = similar::TextDiff::from_lines(golden.as_str(), actual)
                .unified_diff()
                .context_radius(3)
                .header(&expected.display().to_string(), "rendered")
                .to_string();
            Check {
                detail: Some(diff),
                ..Check::new(
                    Status::Fail,
                    name,
                    format!("differs from {} (--update rewrites it)", expected.display()),
                )
            }
        }
        Golden::Dyff => {
            let parse = |what: &str, text: &str| {
                crate::compose::parse_stream(Path::new(what), text)
                    .map_err(|e| crate::chain::Chain(&e).to_string())
            };
            let (want, got) = match (
                parse(&expected.display().to_string(), &golden),
                parse("the render", actual),
            ) {
                (Ok(w), Ok(g)) => (w, g),
                (Err(e), _) | (_, Err(e)) => return Check::new(Status::Error, name, e),
            };
            let differences = structural_diff(&want, &got);
            if differences.is_empty() {
                Check::new(
                    Status::Pass,
                    name,
                    format!("matches {} (structurally)", expected.display()),
                )
            } else {
                Check {
                    detail: Some(differences.join("\n")),
                    ..Check::new(
                        Status::Fail,
                        name,
                        format!(
                            "{} differences from {} (--update rewrites it)",
                            differences.len(),
                            expected.display()
                        ),
                    )
                }
            }
        }
    }
}

/// Largest golden file read.
const MAX_GOLDEN_BYTES: u64 = 16 << 20;

/// Documents matched by `apiVersion`, kind and name; each difference a
/// line: `Kind/name: path: expected X, got Y`, or a document missing.
fn structural_diff(want: &[Value], got: &[Value]) -> Vec<String> {
    let key = |v: &Value| {
        format!(
            "{} {}",
            v.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
            identifier(v)
        )
    };
    let mut lines = Vec::new();
    let mut unmatched: Vec<&Value> = got.iter().collect();
    for w in want {
        match unmatched.iter().position(|g| key(g) == key(w)) {
            Some(i) => {
                let g = unmatched.remove(i);
                compare(&identifier(w), "", w, g, &mut lines);
            }
            None => lines.push(format!(
                "- {}: in the golden file, not rendered",
                identifier(w)
            )),
        }
    }
    for g in unmatched {
        lines.push(format!(
            "+ {}: rendered, not in the golden file",
            identifier(g)
        ));
    }
    lines
}

fn compare(doc: &str, path: &str, want: &Value, got: &Value, lines: &mut Vec<String>) {
    const MAX_LINES: usize = 200;
    if lines.len() >= MAX_LINES {
        return;
    }
    let at = |p: &str| {
        if p.is_empty() {
            "(root)".to_string()
        } else {
            p.to_string()
        }
    };
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match g.get(k) {
                    Some(gv) => compare(doc, &p, wv, gv, lines),
                    None => lines.push(format!("{doc}: {p}: expected {}, missing", compact(wv))),
                }
            }
            for (k, gv) in g {
                if !w.contains_key(k) {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    lines.push(format!("{doc}: {p}: not expected, got {}", compact(gv)));
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                compare(doc, &format!("{path}[{i}]"), wv, gv, lines);
            }
        }
        (w, g) if equal(g, w) && type_name(g) == type_name(w) => {}
        (w, g) => lines.push(format!(
            "{doc}: {}: expected {}, got {}",
            at(path),
            compact(w),
            compact(g)
        )),
    }
}

fn compact(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resources() -> Vec<Resource> {
        [
            json!({"kind": "XBucket", "metadata": {"name": "x"}}),
            json!({"kind": "Bucket", "metadata": {"name": "group-a", "labels": {"team": "t"}}, "spec": {"replicas": 3, "region": "eu", "on": true, "tags": [], "none": null}}),
            json!({"kind": "Bucket", "metadata": {"name": "group-b"}, "spec": {"replicas": 3.0, "region": "us"}}),
        ]
        .into_iter()
        .map(|o| (identifier(&o), o))
        .collect()
    }

    fn run(yaml: &str) -> Vec<(Status, String)> {
        let a: XprinAssertion = yaml_serde::from_str(yaml).unwrap();
        xprin(&a, &resources())
            .into_iter()
            .map(|c| (c.status, c.message))
            .collect()
    }

    #[test]
    fn count_counts_all_or_what_a_pattern_matches() {
        assert_eq!(run("{name: n, type: Count, value: 3}")[0].0, Status::Pass);
        assert_eq!(
            run("{name: n, type: Count, value: 2, resource: Bucket}")[0].0,
            Status::Pass
        );
        let failed = run("{name: n, type: Count, value: 1, resource: 'Bucket/group-*'}");
        assert_eq!(
            failed[0],
            (
                Status::Fail,
                "expected 1 resources, got 2: Bucket/group-a, Bucket/group-b".into()
            )
        );
    }

    #[test]
    fn exists_and_not_exists_take_kinds_names_and_globs() {
        assert_eq!(
            run("{name: n, type: Exists, resource: 'Bucket/*-b'}")[0].0,
            Status::Pass
        );
        assert_eq!(
            run("{name: n, type: NotExists, resource: Pod}")[0].0,
            Status::Pass
        );
        assert_eq!(
            run("{name: n, type: NotExists, resource: Bucket}")[0],
            (
                Status::Fail,
                "resources found (should not exist): Bucket/group-a, Bucket/group-b".into()
            )
        );
        assert_eq!(
            run("{name: n, type: Exists, resource: Bucket/c}")[0],
            (Status::Fail, "resource Bucket/c not found".into())
        );
        assert_eq!(
            run("{name: n, type: Exists, resource: a/b/c}")[0].0,
            Status::Error
        );
    }

    #[test]
    fn field_checks_apply_to_every_matched_resource() {
        let checks = run("{name: n, type: FieldValue, resource: Bucket, field: spec.replicas, operator: '==', value: 3}");
        assert!(checks.iter().all(|c| c.0 == Status::Pass), "{checks:?}");
        let checks = run("{name: n, type: FieldValue, resource: Bucket, field: spec.region, operator: is, value: eu}");
        assert_eq!(
            checks[1],
            (
                Status::Fail,
                "field spec.region is \"us\" (string), expected is \"eu\" (string) on resource Bucket/group-b".into()
            )
        );
        for (ty, field) in [
            ("number", "spec.replicas"),
            ("string", "spec.region"),
            ("boolean", "spec.on"),
            ("array", "spec.tags"),
            ("object", "metadata.labels"),
            ("null", "spec.none"),
        ] {
            let checks = run(&format!("{{name: n, type: FieldType, resource: Bucket/group-a, field: {field}, value: '{ty}'}}"));
            assert_eq!(checks[0].0, Status::Pass, "{checks:?}");
        }
        assert_eq!(
            run("{name: n, type: FieldExists, resource: Bucket, field: metadata.labels.team}")[1],
            (
                Status::Fail,
                "field metadata.labels.team does not exist on resource Bucket/group-b".into()
            )
        );
        assert_eq!(
            run(
                "{name: n, type: FieldNotExists, resource: Bucket/group-b, field: spec.deprecated}"
            )[0]
            .0,
            Status::Pass
        );
        assert_eq!(
            run("{name: n, type: FieldExists, resource: Pod, field: a}")[0],
            (Status::Error, "no rendered resource matched Pod".into())
        );
        assert_eq!(run("{name: n, type: Bogus}")[0].0, Status::Error);
    }

    #[test]
    fn a_count_of_4_0_is_4_and_a_bad_count_names_its_type_not_rust_s_debug() {
        assert_eq!(run("{name: n, type: Count, value: 3.0}")[0].0, Status::Pass);
        let bad = run("{name: n, type: Count, value: 'three'}");
        assert_eq!(
            bad[0],
            (
                Status::Error,
                "a Count assertion's value must be a number, got \"three\" (string)".into()
            )
        );
        let none = run("{name: n, type: Count}");
        assert!(
            !none[0].1.contains("None") && !none[0].1.contains("Some("),
            "{none:?}"
        );
    }

    #[test]
    fn equality_is_xprin_s_text_of_both_and_a_failure_names_both_types() {
        // As xprin's `fmt.Sprintf("%v")`: "3" equals 3, "true" equals true.
        for value in ["'3'", "3", "3.0"] {
            let checks = run(&format!("{{name: n, type: FieldValue, resource: Bucket/group-a, field: spec.replicas, operator: '==', value: {value}}}"));
            assert_eq!(checks[0].0, Status::Pass, "{value}: {checks:?}");
        }
        assert_eq!(
            run("{name: n, type: FieldValue, resource: Bucket/group-a, field: spec.on, operator: '==', value: 'true'}")[0].0,
            Status::Pass
        );
        let failed = run("{name: n, type: FieldValue, resource: Bucket/group-a, field: spec.region, operator: '==', value: 3}");
        assert_eq!(
            failed[0].1,
            "field spec.region is \"eu\" (string), expected == 3 (number) on resource Bucket/group-a"
        );
        let null = run("{name: n, type: FieldValue, resource: Bucket/group-a, field: spec.none, operator: '==', value: '<nil>'}");
        assert_eq!(null[0].0, Status::Fail, "{null:?}");
    }

    #[test]
    fn a_dotted_key_is_said_to_be_unaddressable_not_absent() {
        let object = json!({"kind": "Bucket", "metadata": {"name": "a", "annotations": {"example.com/x": "1"}}});
        let a: XprinAssertion = yaml_serde::from_str(
            "{name: n, type: FieldExists, resource: Bucket, field: metadata.annotations.example.com/x}",
        )
        .unwrap();
        let checks = xprin(&a, &[(identifier(&object), object.clone())]);
        assert_eq!(checks[0].status, Status::Fail);
        assert!(
            checks[0].message.contains("cannot be addressed")
                && checks[0].message.contains("\"example.com/x\"")
                && !checks[0].message.contains("does not exist"),
            "{}",
            checks[0].message
        );
        let a: XprinAssertion = yaml_serde::from_str(
            "{name: n, type: FieldValue, resource: Bucket, field: metadata.annotations.example.com/x, operator: '==', value: '1'}",
        )
        .unwrap();
        let checks = xprin(&a, &[(identifier(&object), object)]);
        assert_eq!(checks[0].status, Status::Error);
        assert!(
            checks[0].message.contains("cannot be addressed"),
            "{}",
            checks[0].message
        );
    }

    #[test]
    fn dyff_ignores_key_order_and_names_each_difference() {
        let want = vec![
            json!({"apiVersion": "v1", "kind": "A", "metadata": {"name": "a"}, "spec": {"x": 1, "y": [1, 2]}}),
        ];
        let same = vec![
            json!({"spec": {"y": [1, 2], "x": 1}, "metadata": {"name": "a"}, "kind": "A", "apiVersion": "v1"}),
        ];
        assert!(structural_diff(&want, &same).is_empty());
        let other = vec![
            json!({"apiVersion": "v1", "kind": "A", "metadata": {"name": "a"}, "spec": {"x": 2, "y": [1, 2]}}),
            json!({"kind": "B", "metadata": {"name": "b"}}),
        ];
        assert_eq!(
            structural_diff(&want, &other),
            [
                "A/a: spec.x: expected 1, got 2",
                "+ B/b: rendered, not in the golden file"
            ]
        );
    }
}
