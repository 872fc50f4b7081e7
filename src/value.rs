//! Kubernetes objects as `serde_json::Value`: paths into them, a merge,
//! and conversions to and from protobuf `google.protobuf.Struct`, which
//! carries them over gRPC. Below the composition core, the schema checks
//! and the protocol code alike ([`crate::proto`] re-exports the
//! conversions), so none of them reaches up into another for them.
use std::collections::BTreeMap;

use prost_types::value::Kind;
use serde_json::{Map, Number, Value};

/// A JSON object as a protobuf `Struct`; `None` when `value` is not an object.
pub fn to_struct(value: &Value) -> Option<prost_types::Struct> {
    match value {
        Value::Object(map) => Some(map_to_struct(map)),
        _ => None,
    }
}

fn map_to_struct(map: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), to_proto_value(v)))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn to_proto_value(value: &Value) -> prost_types::Value {
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        // Struct numbers are doubles: that is the wire format, as in Go.
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(to_proto_value).collect(),
        }),
        Value::Object(map) => Kind::StructValue(map_to_struct(map)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A protobuf `Struct` as a JSON object.
pub fn from_struct(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), from_proto_value(v)))
            .collect(),
    )
}

fn from_proto_value(value: &prost_types::Value) -> Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) => number(*n),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(list)) => {
            Value::Array(list.values.iter().map(from_proto_value).collect())
        }
        Some(Kind::StructValue(s)) => from_struct(s),
    }
}

/// Integral doubles come back as integers (`replicas: 3`, not `3.0`), as
/// Kubernetes' own JSON decoding of a Struct does.
fn number(n: f64) -> Value {
    const MAX_EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if n.fract() == 0.0 && n.abs() <= MAX_EXACT {
        Value::Number(Number::from(n as i64))
    } else {
        Number::from_f64(n).map_or(Value::Null, Value::Number)
    }
}

/// Deep-merges `patch` into `base`: objects merge key by key, anything else
/// is replaced.
pub(crate) fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (k, v) in patch {
                merge(base.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (base, patch) => *base = patch.clone(),
    }
}

/// `value.a.b.c` for a path of keys, when every step is an object.
pub(crate) fn get<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, key| v.get(key))
}

/// `value.a.b.c` as a string.
pub(crate) fn get_str<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    get(value, path).and_then(Value::as_str)
}

/// `value.a.b.c` as a mutable object, created (and non-objects replaced)
/// along the way.
pub(crate) fn object_at<'a>(value: &'a mut Value, path: &[&str]) -> &'a mut Map<String, Value> {
    let mut current = value;
    for key in path {
        if !current.is_object() {
            *current = Value::Object(Map::new());
        }
        current = match current {
            Value::Object(map) => map.entry(key.to_string()).or_insert(Value::Null),
            _ => unreachable!("made an object above"),
        };
    }
    if !current.is_object() {
        *current = Value::Object(Map::new());
    }
    match current {
        Value::Object(map) => map,
        _ => unreachable!("made an object above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_objects_and_keeps_integers_integral() {
        let v = json!({"a": 1, "b": 1.5, "c": [true, null, "x"], "d": {"e": {}}});
        assert_eq!(from_struct(&to_struct(&v).unwrap()), v);
        assert!(to_struct(&json!([1])).is_none());
    }

    #[test]
    fn merges_deeply() {
        let mut base = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        merge(&mut base, &json!({"a": {"c": 3}, "d": [2], "e": "x"}));
        assert_eq!(base, json!({"a": {"b": 1, "c": 3}, "d": [2], "e": "x"}));
    }

    #[test]
    fn object_at_creates_the_path() {
        let mut v = json!({"metadata": {"name": "x"}});
        object_at(&mut v, &["metadata", "labels"]).insert("a".into(), json!("b"));
        assert_eq!(v, json!({"metadata": {"name": "x", "labels": {"a": "b"}}}));
    }
}
