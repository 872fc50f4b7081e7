//! One walk of an object against its structural schema, in the API server's
//! order: `nullable`, `type` (or `x-kubernetes-int-or-string`), value
//! validations (enum, format, pattern, lengths, bounds, counts, required,
//! list types, allOf/anyOf/oneOf/not), fields the schema does not know
//! (reported: the API server would prune them), the children, then the
//! node's CEL rules (only where the node's type is right, as the API
//! server). `metadata` of the root and of embedded resources is the API
//! server's own ObjectMeta: only its schema's value validations apply.
use serde_json::{Map, Value};

use super::Issue;

/// The walk's state: its errors, its notes, its CEL budget.
#[derive(Debug, Default)]
pub(super) struct Walk {
    pub(crate) issues: Vec<Issue>,
    pub(crate) notes: Vec<String>,
    cel: super::cel::Budget,
    /// Within a value equal to its old one: ratcheted, as the API server
    /// does on update (apiextensions-apiserver `validation/ratcheting.go`):
    /// no error of its schema, only its transition rules run.
    ratcheting: bool,
}

/// How much of the schema a (sub)walk applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Everything.
    Full,
    /// Value validations only (allOf/anyOf/oneOf/not branches, ObjectMeta):
    /// no unknown fields, no CEL.
    ValuesOnly,
}

impl Walk {
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Walks a whole object: `apiVersion`, `kind`, `metadata` are the API
    /// server's even where the schema does not list them.
    pub(super) fn root(&mut self, value: &Value, old: Option<&Value>, schema: &Value) {
        self.node(value, old, schema, "", Mode::Full, true);
    }

    fn issue(&mut self, path: &str, message: String, rule: &str) {
        if self.ratcheting {
            return;
        }
        self.issues.push(Issue {
            path: path.to_string(),
            message,
            rule: rule.to_string(),
        });
    }

    fn node(
        &mut self,
        value: &Value,
        old: Option<&Value>,
        schema: &Value,
        path: &str,
        mode: Mode,
        resource: bool,
    ) {
        let Some(s) = schema.as_object() else {
            return;
        };
        let outer = self.ratcheting;
        self.ratcheting = outer || old == Some(value);
        if self.typed(value, s, path) {
            self.within(value, old, schema, s, path, (mode, resource));
        }
        self.ratcheting = outer;
    }

    /// Whether `value` has the node's type (`null` only where nullable),
    /// said when it has not.
    fn typed(&mut self, value: &Value, s: &Map<String, Value>, path: &str) -> bool {
        let int_or_string = flag(s, "x-kubernetes-int-or-string");
        let ty = s.get("type").and_then(Value::as_str);
        if value.is_null() {
            if flag(s, "nullable") || (ty.is_none() && !int_or_string) {
                return false;
            }
            let expected = if int_or_string {
                "integer or string"
            } else {
                ty.unwrap_or("")
            };
            self.issue(
                path,
                format!(
                    "Invalid value: null: must be of type {expected} (the schema is not nullable)"
                ),
                "nullable",
            );
            return false;
        }
        if int_or_string {
            if !(is_integer(value) || value.is_string()) {
                self.issue(
                    path,
                    format!(
                        "Invalid value: {}: must be an integer or a string",
                        short(value)
                    ),
                    "x-kubernetes-int-or-string",
                );
                return false;
            }
        } else if let Some(ty) = ty {
            if !has_type(value, ty) {
                self.issue(
                    path,
                    format!(
                        "Invalid value: {}: must be of type {ty}, not {}",
                        short(value),
                        type_of(value)
                    ),
                    "type",
                );
                return false;
            }
        }
        true
    }

    /// A node of the right type: its value validations, children, rules.
    fn within(
        &mut self,
        value: &Value,
        old: Option<&Value>,
        schema: &Value,
        s: &Map<String, Value>,
        path: &str,
        (mode, resource): (Mode, bool),
    ) {
        self.values(value, s, path);
        if mode == Mode::Full {
            self.rules_in_junctors(s, path);
        }
        for (keyword, all) in [("allOf", true), ("anyOf", false), ("oneOf", false)] {
            let Some(branches) = s.get(keyword).and_then(Value::as_array) else {
                continue;
            };
            let mut passing = 0;
            let mut first_failure = None;
            for branch in branches {
                let mut sub = Walk::new();
                sub.node(value, None, branch, path, Mode::ValuesOnly, false);
                if sub.issues.is_empty() {
                    passing += 1;
                } else if all {
                    for issue in sub.issues {
                        self.issue(&issue.path, issue.message, &issue.rule);
                    }
                } else if first_failure.is_none() {
                    first_failure = sub.issues.into_iter().next();
                }
            }
            let detail = first_failure
                .map(|i| format!(" (first: {}: {})", display_path(&i.path), i.message))
                .unwrap_or_default();
            match keyword {
                "anyOf" if passing == 0 && !branches.is_empty() => self.issue(
                    path,
                    format!("Invalid value: {}: matches none of anyOf{detail}", short(value)),
                    "anyOf",
                ),
                "oneOf" if passing != 1 => self.issue(
                    path,
                    format!(
                        "Invalid value: {}: must match exactly one of oneOf, matches {passing}{detail}",
                        short(value)
                    ),
                    "oneOf",
                ),
                _ => {}
            }
        }
        if let Some(not) = s.get("not") {
            let mut sub = Walk::new();
            sub.node(value, None, not, path, Mode::ValuesOnly, false);
            if sub.issues.is_empty() {
                self.issue(
                    path,
                    format!(
                        "Invalid value: {}: must not match the schema in not",
                        short(value)
                    ),
                    "not",
                );
            }
        }
        match value {
            Value::Object(map) => self.object(map, old, s, path, mode, resource),
            Value::Array(items) => {
                if let Some(item_schema) = s.get("items") {
                    let olds = OldItems::new(old, s);
                    for (i, item) in items.iter().enumerate() {
                        let old = olds.of(item);
                        self.node(item, old, item_schema, &format!("{path}[{i}]"), mode, false);
                    }
                }
            }
            _ => {}
        }
        if mode == Mode::Full {
            if let Some(rules) = s.get("x-kubernetes-validations").and_then(Value::as_array) {
                let (issues, notes) =
                    self.cel
                        .check(value, old, schema, rules, path, self.ratcheting);
                self.issues.extend(issues);
                self.notes.extend(notes);
            }
        }
    }

    /// CEL rules under `allOf`/`anyOf`/`oneOf`/`not`: the API server
    /// refuses such a CRD (not structural), so its rules are never passed.
    fn rules_in_junctors(&mut self, s: &Map<String, Value>, path: &str) {
        fn has_rules(schema: &Value) -> bool {
            match schema {
                Value::Object(map) => map.iter().any(|(k, v)| {
                    k == "x-kubernetes-validations"
                        || (k != "default" && k != "enum" && has_rules(v))
                }),
                Value::Array(items) => items.iter().any(has_rules),
                _ => false,
            }
        }
        for keyword in ["allOf", "anyOf", "oneOf", "not"] {
            if s.get(keyword).is_some_and(has_rules) {
                self.issue(
                    path,
                    format!("Forbidden: x-kubernetes-validations under {keyword} must be empty to be structural (the API server refuses this CRD)"),
                    keyword,
                );
            }
        }
    }

    fn object(
        &mut self,
        map: &Map<String, Value>,
        old: Option<&Value>,
        s: &Map<String, Value>,
        path: &str,
        mode: Mode,
        resource: bool,
    ) {
        let properties = s.get("properties").and_then(Value::as_object);
        let additional = s.get("additionalProperties");
        let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");
        let resource = resource || flag(s, "x-kubernetes-embedded-resource");
        if resource && flag(s, "x-kubernetes-embedded-resource") {
            for field in ["apiVersion", "kind"] {
                if map
                    .get(field)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    self.issue(
                        &child(path, field),
                        "Required value: must not be empty (an embedded resource)".into(),
                        "x-kubernetes-embedded-resource",
                    );
                }
            }
        }
        for (key, child_value) in map {
            let child_path = child(path, key);
            let old = old.and_then(|old| old.get(key));
            if resource && key == "metadata" {
                // The API server's ObjectMeta: only value validations apply.
                if let Some(meta) = properties.and_then(|p| p.get("metadata")) {
                    self.node(child_value, old, meta, &child_path, Mode::ValuesOnly, false);
                }
                continue;
            }
            if let Some(property) = properties.and_then(|p| p.get(key)) {
                self.node(child_value, old, property, &child_path, mode, false);
                continue;
            }
            match additional {
                Some(Value::Object(additional)) => {
                    let additional = Value::Object(additional.clone());
                    self.node(
                        child_value,
                        old,
                        &additional,
                        &format!("{path}[{key}]"),
                        mode,
                        false,
                    );
                    continue;
                }
                Some(Value::Bool(true)) => continue,
                _ => {}
            }
            if preserve
                || mode != Mode::Full
                || (resource && matches!(key.as_str(), "apiVersion" | "kind"))
            {
                continue;
            }
            self.issue(
                &child_path,
                format!(
                    "Unknown field: {key:?} is not in the schema (the API server would prune it)"
                ),
                "unknown field",
            );
        }
    }

    /// The value validations of one node (its type already right).
    fn values(&mut self, value: &Value, s: &Map<String, Value>, path: &str) {
        if let Some(allowed) = s.get("enum").and_then(Value::as_array) {
            if !allowed.contains(value) {
                let list: Vec<String> = allowed.iter().map(short).collect();
                self.issue(
                    path,
                    format!(
                        "Unsupported value: {}: supported values: {}",
                        short(value),
                        list.join(", ")
                    ),
                    "enum",
                );
            }
        }
        match value {
            Value::String(text) => self.string(text, s, path),
            Value::Number(_) => self.number(value, s, path),
            Value::Array(items) => self.array(items, s, path),
            Value::Object(map) => {
                let count = map.len() as u64;
                if let Some(min) = s.get("minProperties").and_then(Value::as_u64) {
                    if count < min {
                        self.issue(
                            path,
                            format!("Invalid value: {count} properties: must have at least {min}"),
                            "minProperties",
                        );
                    }
                }
                if let Some(max) = s.get("maxProperties").and_then(Value::as_u64) {
                    if count > max {
                        self.issue(
                            path,
                            format!("Too many: {count}: must have at most {max} properties"),
                            "maxProperties",
                        );
                    }
                }
                if let Some(required) = s.get("required").and_then(Value::as_array) {
                    for field in required.iter().filter_map(Value::as_str) {
                        if !map.contains_key(field) {
                            self.issue(&child(path, field), "Required value".into(), "required");
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn string(&mut self, text: &str, s: &Map<String, Value>, path: &str) {
        let length = text.chars().count() as u64;
        if let Some(min) = s.get("minLength").and_then(Value::as_u64) {
            if length < min {
                self.issue(
                    path,
                    format!(
                        "Invalid value: {}: must be at least {min} characters long",
                        short_str(text)
                    ),
                    "minLength",
                );
            }
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
            if length > max {
                self.issue(
                    path,
                    format!("Too long: may not be more than {max} characters (it has {length})"),
                    "maxLength",
                );
            }
        }
        if let Some(pattern) = s.get("pattern").and_then(Value::as_str) {
            let compiled = super::pattern::compiled(pattern);
            match compiled {
                Ok(re) if !re.is_match(text) => self.issue(
                    path,
                    format!(
                        "Invalid value: {}: must match the pattern {pattern:?}",
                        short_str(text)
                    ),
                    "pattern",
                ),
                Ok(_) => {}
                Err(error) => self.issue(
                    path,
                    format!("the schema's pattern {pattern:?} cannot be used: {error}"),
                    "pattern",
                ),
            }
        }
        if let Some(format) = s.get("format").and_then(Value::as_str) {
            if let Some(false) = super::format::check(format, text) {
                self.issue(
                    path,
                    format!(
                        "Invalid value: {}: must be a valid {format}",
                        short_str(text)
                    ),
                    "format",
                );
            }
        }
    }

    fn number(&mut self, value: &Value, s: &Map<String, Value>, path: &str) {
        let Some(n) = value.as_f64() else { return };
        let shown = short(value);
        if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
            let exclusive = flag(s, "exclusiveMinimum");
            if n < min || (exclusive && n == min) {
                let how = if exclusive {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                self.issue(
                    path,
                    format!(
                        "Invalid value: {shown}: must be {how} {}",
                        short(&s["minimum"])
                    ),
                    "minimum",
                );
            }
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
            let exclusive = flag(s, "exclusiveMaximum");
            if n > max || (exclusive && n == max) {
                let how = if exclusive {
                    "less than"
                } else {
                    "less than or equal to"
                };
                self.issue(
                    path,
                    format!(
                        "Invalid value: {shown}: must be {how} {}",
                        short(&s["maximum"])
                    ),
                    "maximum",
                );
            }
        }
        if let Some(step) = s.get("multipleOf").and_then(Value::as_f64) {
            if step > 0.0 && (n / step).fract() != 0.0 {
                self.issue(
                    path,
                    format!(
                        "Invalid value: {shown}: must be a multiple of {}",
                        short(&s["multipleOf"])
                    ),
                    "multipleOf",
                );
            }
        }
    }

    fn array(&mut self, items: &[Value], s: &Map<String, Value>, path: &str) {
        let count = items.len() as u64;
        if let Some(min) = s.get("minItems").and_then(Value::as_u64) {
            if count < min {
                self.issue(
                    path,
                    format!("Invalid value: {count} items: must have at least {min} items"),
                    "minItems",
                );
            }
        }
        if let Some(max) = s.get("maxItems").and_then(Value::as_u64) {
            if count > max {
                self.issue(
                    path,
                    format!("Too many: {count}: must have at most {max} items"),
                    "maxItems",
                );
            }
        }
        let list_type = s.get("x-kubernetes-list-type").and_then(Value::as_str);
        let unique = flag(s, "uniqueItems") || list_type == Some("set");
        if unique {
            let rule = if list_type == Some("set") {
                "x-kubernetes-list-type: set"
            } else {
                "uniqueItems"
            };
            for (i, item) in repeated(items.iter()) {
                self.issue(
                    &format!("{path}[{i}]"),
                    format!("Duplicate value: {}", short(item)),
                    rule,
                );
            }
        }
        if list_type == Some("map") {
            let keys: Vec<&str> = s
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (i, key) in repeated(items.iter().map(|item| key_of(&keys, item))) {
                let shown: Vec<String> = keys
                    .iter()
                    .zip(&key)
                    .map(|(k, v)| format!("{k}={}", short(v)))
                    .collect();
                self.issue(
                    &format!("{path}[{i}]"),
                    format!("Duplicate value: {{{}}}", shown.join(", ")),
                    "x-kubernetes-list-type: map",
                );
            }
        }
    }
}

/// The old items a list's items are correlated with, as the API server's
/// ratcheting correlates them: by their keys in a `map` list, by value in
/// a `set`; items of an atomic list are not correlated. Hashed: a lookup
/// per item.
enum OldItems<'a> {
    None,
    Set(std::collections::HashSet<&'a Value>),
    Map(
        Vec<&'a str>,
        std::collections::HashMap<Vec<&'a Value>, &'a Value>,
    ),
}

impl<'a> OldItems<'a> {
    fn new(old: Option<&'a Value>, s: &'a Map<String, Value>) -> Self {
        let Some(olds) = old.and_then(Value::as_array) else {
            return Self::None;
        };
        match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => Self::Set(olds.iter().collect()),
            Some("map") => {
                let keys: Vec<&str> = s
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|k| k.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let by_key = olds.iter().map(|o| (key_of(&keys, o), o)).collect();
                Self::Map(keys, by_key)
            }
            _ => Self::None,
        }
    }

    fn of(&self, item: &Value) -> Option<&'a Value> {
        match self {
            Self::None => None,
            Self::Set(olds) => olds.get(item).copied(),
            Self::Map(keys, olds) => olds.get(&key_of(keys, item)).copied(),
        }
    }
}

/// A list-map item's keys (`null` where one is missing).
fn key_of<'a>(keys: &[&str], item: &'a Value) -> Vec<&'a Value> {
    keys.iter().map(|k| item.get(*k).unwrap_or(&NULL)).collect()
}

/// A list-map item's missing key.
static NULL: Value = Value::Null;

/// Each key equal to an earlier one, with its index, in order. Hashed
/// (`Value`'s `Hash` agrees with its `==`), so linear in the items:
/// compared pairwise, a set of 100,000 integers took 161 s (debug build).
fn repeated<K: std::hash::Hash + Eq>(keys: impl Iterator<Item = K>) -> Vec<(usize, K)> {
    let mut seen = std::collections::HashSet::new();
    let mut repeated = Vec::new();
    for (i, key) in keys.enumerate() {
        if seen.contains(&key) {
            repeated.push((i, key));
        } else {
            seen.insert(key);
        }
    }
    repeated
}

fn flag(s: &Map<String, Value>, key: &str) -> bool {
    s.get(key) == Some(&Value::Bool(true))
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn display_path(path: &str) -> &str {
    if path.is_empty() {
        "<root>"
    } else {
        path
    }
}

fn is_integer(value: &Value) -> bool {
    value.is_i64() || value.is_u64()
}

fn has_type(value: &Value, ty: &str) -> bool {
    match ty {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => is_integer(value),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        _ => true,
    }
}

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) if is_integer(value) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A value as an error shows it: scalars as JSON, collections by kind.
pub(super) fn short(value: &Value) -> String {
    match value {
        Value::String(s) => short_str(s),
        Value::Array(_) => "\"array\"".into(),
        Value::Object(_) => "\"object\"".into(),
        other => other.to_string(),
    }
}

/// A string as an error shows it: quoted, cut after 64 characters.
fn short_str(text: &str) -> String {
    const SHOWN: usize = 64;
    if text.chars().count() > SHOWN {
        let cut: String = text.chars().take(SHOWN).collect();
        format!("{cut:?}…")
    } else {
        format!("{text:?}")
    }
}
