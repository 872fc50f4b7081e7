//! CEL values and their declared types, built from the structural schema as
//! the API server builds them (apiextensions-apiserver `schema/cel/model`),
//! not from the JSON alone: a `type: number` holding `1` is a `double`;
//! `format: byte|date|date-time|duration` strings are `bytes`, timestamps and
//! durations; a field set to `null` is absent (`has()` is false), a `null`
//! list item or map value stays `null`; property names are escaped
//! (`__namespace__`, `__dot__`, `__dash__`, `__slash__`, `__underscores__`)
//! and `additionalProperties` keys are not; a field whose type the schema
//! leaves unknown (`x-kubernetes-preserve-unknown-fields` without a type, a
//! list or map of such) is not declared, so a rule cannot name it.
//!
//! [`Ty`] is what the checker ([`super::check`]) knows of a value: a list's
//! `x-kubernetes-list-type` (equality by set, by key) is part of its type.
use std::collections::BTreeMap;
use std::sync::Arc;

use cel::objects::{Key, Map};
use serde_json::Value;

/// A declared CEL type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Ty {
    /// Known only at run time (`x-kubernetes-int-or-string`, `dyn()`, …).
    Dyn,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    /// A type value (`type(x)`, `int`).
    Type,
    List(Box<Ty>, ListKind),
    Map(Box<Ty>, Box<Ty>),
    /// An object of the schema: its declared fields, by escaped name.
    Object(Arc<BTreeMap<String, Ty>>),
}

/// `x-kubernetes-list-type`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum ListKind {
    Atomic,
    /// Equal as sets; `+` is a union.
    Set,
    /// Equal by the values of these keys (escaped); `+` merges by key.
    Map(Vec<String>),
}

impl Ty {
    /// The name cel-go gives the type in its errors.
    pub(super) fn name(&self) -> String {
        match self {
            Ty::Dyn => "dyn".into(),
            Ty::Null => "null".into(),
            Ty::Bool => "bool".into(),
            Ty::Int => "int".into(),
            Ty::Uint => "uint".into(),
            Ty::Double => "double".into(),
            Ty::String => "string".into(),
            Ty::Bytes => "bytes".into(),
            Ty::Duration => "google.protobuf.Duration".into(),
            Ty::Timestamp => "google.protobuf.Timestamp".into(),
            Ty::Type => "type".into(),
            Ty::List(item, _) => format!("list({})", item.name()),
            Ty::Map(key, value) => format!("map({}, {})", key.name(), value.name()),
            Ty::Object(_) => "object".into(),
        }
    }
}

/// The CEL reserved words a property name is escaped from (`__in__`).
pub(super) const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// A property name as a CEL field name, or `None` when it cannot be one
/// (it is then not declared: no rule can select it).
pub(super) fn escape(name: &str) -> Option<String> {
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "_.-/".contains(c));
    if !first_ok
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c))
    {
        return None;
    }
    Some(
        name.replace("__", "__underscores__")
            .replace('.', "__dot__")
            .replace('-', "__dash__")
            .replace('/', "__slash__"),
    )
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name).and_then(Value::as_bool) == Some(true)
}

fn is_map(schema: &Value) -> bool {
    schema
        .get("additionalProperties")
        .is_some_and(|a| a.is_object() || *a == Value::Bool(true))
}

/// The declared type of a schema node; `None` when the schema leaves it
/// unknown (the API server declares no field for it).
pub(super) fn declared(schema: &Value) -> Option<Ty> {
    if flag(schema, "x-kubernetes-int-or-string") {
        return Some(Ty::Dyn);
    }
    let format = schema.get("format").and_then(Value::as_str);
    Some(match schema.get("type").and_then(Value::as_str) {
        Some("boolean") => Ty::Bool,
        Some("integer") => Ty::Int,
        Some("number") => Ty::Double,
        Some("string") => match format {
            Some("byte") => Ty::Bytes,
            Some("date" | "date-time") => Ty::Timestamp,
            Some("duration") => Ty::Duration,
            _ => Ty::String,
        },
        Some("array") => {
            let item = declared(schema.get("items")?)?;
            let kind = match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("set") => ListKind::Set,
                Some("map") => ListKind::Map(
                    schema
                        .get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|keys| {
                            keys.iter()
                                .filter_map(Value::as_str)
                                .map(|k| escape(k).unwrap_or_else(|| k.to_string()))
                                .collect()
                        })
                        .unwrap_or_default(),
                ),
                _ => ListKind::Atomic,
            };
            Ty::List(Box::new(item), kind)
        }
        Some("object") if is_map(schema) => {
            let value = match schema.get("additionalProperties") {
                Some(Value::Object(_)) => declared(&schema["additionalProperties"])?,
                _ => Ty::Dyn,
            };
            Ty::Map(Box::new(Ty::String), Box::new(value))
        }
        Some("object") => Ty::Object(Arc::new(fields(schema, false))),
        _ => return None,
    })
}

/// The declared type of a resource's root: its `apiVersion`, `kind` and
/// `metadata.name`/`generateName` are declared, as an embedded resource's.
pub(super) fn declared_resource(schema: &Value) -> Ty {
    Ty::Object(Arc::new(fields(schema, true)))
}

/// The declared fields of an object schema (a resource's, an embedded
/// resource's `apiVersion`, `kind` and `metadata.name`/`generateName`
/// always are).
fn fields(schema: &Value, resource: bool) -> BTreeMap<String, Ty> {
    let mut fields = BTreeMap::new();
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            if let (Some(escaped), Some(ty)) = (escape(name), declared(property)) {
                fields.insert(escaped, ty);
            }
        }
    }
    if resource || flag(schema, "x-kubernetes-embedded-resource") {
        fields.insert("apiVersion".into(), Ty::String);
        fields.insert("kind".into(), Ty::String);
        let meta: BTreeMap<String, Ty> = [("name", Ty::String), ("generateName", Ty::String)]
            .into_iter()
            .map(|(k, t)| (k.to_string(), t))
            .collect();
        fields.insert("metadata".into(), Ty::Object(Arc::new(meta)));
    }
    fields
}

/// `json` as a CEL value, typed by `schema`.
pub(super) fn value(json: &Value, schema: &Value) -> cel::Value {
    let format = schema.get("format").and_then(Value::as_str);
    let ty = schema.get("type").and_then(Value::as_str);
    match json {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) if ty == Some("number") => {
            cel::Value::Float(n.as_f64().unwrap_or(f64::NAN))
        }
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) if flag(schema, "x-kubernetes-int-or-string") || ty != Some("string") => {
            cel::Value::String(Arc::new(s.clone()))
        }
        Value::String(s) => typed_string(s, format),
        Value::Array(items) => {
            let item_schema = schema.get("items").unwrap_or(&Value::Null);
            cel::Value::List(Arc::new(
                items.iter().map(|i| value(i, item_schema)).collect(),
            ))
        }
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let escaped = !is_map(schema);
            let mut out = std::collections::HashMap::with_capacity(map.len());
            for (name, field) in map {
                // A field set to null is absent, as in the API server.
                if field.is_null() && escaped {
                    continue;
                }
                let field_schema = properties
                    .and_then(|p| p.get(name))
                    .or(additional)
                    .unwrap_or(&Value::Null);
                let key = if escaped {
                    escape(name).unwrap_or_else(|| name.clone())
                } else {
                    name.clone()
                };
                out.insert(Key::String(Arc::new(key)), value(field, field_schema));
            }
            cel::Value::Map(Map { map: Arc::new(out) })
        }
    }
}

/// A string of a `format` the API server gives a CEL type; a string that
/// does not parse stays a string (the `format` check reports it).
fn typed_string(s: &str, format: Option<&str>) -> cel::Value {
    let parsed = match format {
        Some("byte") => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .ok()
                .map(|b| cel::Value::Bytes(Arc::new(b)))
        }
        Some("date") => chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
            .ok()
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|d| cel::Value::Timestamp(d.and_utc().fixed_offset())),
        Some("date-time") => chrono::DateTime::parse_from_rfc3339(s)
            .ok()
            .map(cel::Value::Timestamp),
        Some("duration") => go_duration(s).map(cel::Value::Duration),
        _ => None,
    };
    parsed.unwrap_or_else(|| cel::Value::String(Arc::new(s.to_string())))
}

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+`
/// or `0`.
pub(super) fn go_duration(text: &str) -> Option<chrono::Duration> {
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Some(chrono::Duration::zero());
    }
    if rest.is_empty() {
        return None;
    }
    let mut nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        nanos += number * unit;
    }
    if nanos > i64::MAX as f64 {
        return None;
    }
    let duration = chrono::Duration::nanoseconds(nanos.round() as i64);
    Some(if negative { -duration } else { duration })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(value: &cel::Value, name: &str) -> Option<cel::Value> {
        match value {
            cel::Value::Map(m) => m.map.get(&Key::String(Arc::new(name.into()))).cloned(),
            _ => None,
        }
    }

    #[test]
    fn a_number_field_holding_a_whole_number_is_a_double() {
        assert_eq!(
            value(&json!(1), &json!({"type": "number"})),
            cel::Value::Float(1.0)
        );
        assert_eq!(
            value(&json!(1), &json!({"type": "integer"})),
            cel::Value::Int(1)
        );
    }

    #[test]
    fn int_or_string_keeps_what_the_json_holds() {
        let schema = json!({"x-kubernetes-int-or-string": true, "format": "date"});
        assert_eq!(value(&json!(3), &schema), cel::Value::Int(3));
        assert_eq!(
            value(&json!("25%"), &schema),
            cel::Value::String(Arc::new("25%".into()))
        );
        assert_eq!(declared(&schema), Some(Ty::Dyn));
    }

    #[test]
    fn byte_date_date_time_and_duration_strings_are_their_cel_types() {
        let of = |format: &str, text: &str| {
            value(&json!(text), &json!({"type": "string", "format": format}))
        };
        assert_eq!(
            of("byte", "QUI="),
            cel::Value::Bytes(Arc::new(b"AB".to_vec()))
        );
        let cel::Value::Timestamp(date) = of("date", "1997-07-16") else {
            panic!("a date is a timestamp");
        };
        assert_eq!(date.to_rfc3339(), "1997-07-16T00:00:00+00:00");
        assert!(matches!(
            of("date-time", "2011-08-18T19:03:37.01+01:00"),
            cel::Value::Timestamp(_)
        ));
        assert_eq!(
            of("duration", "1h2m3s4ms"),
            cel::Value::Duration(chrono::Duration::milliseconds(3_723_004))
        );
        // A string that does not parse stays a string (`format` reports it).
        assert_eq!(
            of("date", "soon"),
            cel::Value::String(Arc::new("soon".into()))
        );
    }

    #[test]
    fn go_durations_parse_as_time_parse_duration_does() {
        assert_eq!(go_duration("0"), Some(chrono::Duration::zero()));
        assert_eq!(go_duration("-1.5h"), Some(-chrono::Duration::minutes(90)));
        assert_eq!(go_duration("1µs"), Some(chrono::Duration::microseconds(1)));
        for bad in ["", "1", "1d", "h", "1hr", "1wk"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn list_types_set_and_map_are_part_of_the_declared_type() {
        let set =
            json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}});
        assert_eq!(
            declared(&set),
            Some(Ty::List(Box::new(Ty::String), ListKind::Set))
        );
        let map = json!({"type": "array", "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["k.", "name"],
            "items": {"type": "object", "properties": {"k.": {"type": "string"}}}});
        let Some(Ty::List(_, ListKind::Map(keys))) = declared(&map) else {
            panic!("a map list");
        };
        assert_eq!(keys, ["k__dot__", "name"]);
    }

    #[test]
    fn a_null_field_is_absent_and_a_null_item_stays_null() {
        let schema = json!({"type": "object", "properties": {
            "s": {"type": "string", "nullable": true},
            "l": {"type": "array", "items": {"type": "string", "nullable": true}}}});
        let v = value(&json!({"s": null, "l": [null]}), &schema);
        assert_eq!(field(&v, "s"), None);
        assert_eq!(
            field(&v, "l"),
            Some(cel::Value::List(Arc::new(vec![cel::Value::Null])))
        );
    }

    #[test]
    fn property_names_are_escaped_and_map_keys_are_not() {
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(escape("dot.dot").as_deref(), Some("dot__dot__dot"));
        assert_eq!(escape("dash-dash").as_deref(), Some("dash__dash__dash"));
        assert_eq!(
            escape("slash/slash").as_deref(),
            Some("slash__slash__slash")
        );
        assert_eq!(escape("a__b").as_deref(), Some("a__underscores__b"));
        assert_eq!(escape("under_score").as_deref(), Some("under_score"));
        assert_eq!(escape("int").as_deref(), Some("int"));
        assert_eq!(escape("k!"), None);
        let schema = json!({"type": "object", "properties": {
            "m": {"type": "object", "additionalProperties": {"type": "integer"}},
            "in": {"type": "integer"}}});
        let v = value(&json!({"m": {"a.b": 1}, "in": 2}), &schema);
        assert_eq!(field(&v, "__in__"), Some(cel::Value::Int(2)));
        assert_eq!(
            field(&field(&v, "m").unwrap(), "a.b"),
            Some(cel::Value::Int(1))
        );
    }

    #[test]
    fn fields_of_unknown_type_are_not_declared() {
        let schema = json!({"type": "object", "properties": {
            "any": {"x-kubernetes-preserve-unknown-fields": true},
            "anyList": {"type": "array", "items": {"x-kubernetes-preserve-unknown-fields": true}},
            "known": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
        let Some(Ty::Object(fields)) = declared(&schema) else {
            panic!("an object");
        };
        assert_eq!(fields.keys().collect::<Vec<_>>(), ["known"]);
    }
}
