//! `--xrd`: a CompositeResourceDefinition (`apiextensions.crossplane.io` v1
//! or v2) that tells the render which XR shape Crossplane uses (Legacy: a v1
//! XRD's default `LegacyCluster` scope, `spec.resourceRefs`; Modern:
//! everything else, `spec.crossplane.resourceRefs`) and whose schema
//! defaults are applied to the XR before the pipeline sees it, as the API
//! server would have applied them.
use std::path::Path;

use serde_json::{Map, Value};

use crate::compose::read::files::read_one;
use crate::compose::read::model::{group, Composite};
use crate::compose::ComposeError;
use crate::value::{get, get_str};

/// Where Crossplane keeps its own fields of an XR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum XrSchema {
    /// v2: `spec.crossplane.*` (namespaced, cluster, and v2 XRDs).
    #[default]
    Modern,
    /// v1 `LegacyCluster`: `spec.resourceRefs`, `spec.compositionRef`.
    Legacy,
}

impl XrSchema {
    /// The path of Crossplane's field `field` in the XR's spec.
    pub(crate) fn spec_path(self, field: &'static str) -> Vec<&'static str> {
        match self {
            XrSchema::Modern => vec!["spec", "crossplane", field],
            XrSchema::Legacy => vec!["spec", field],
        }
    }
}

/// A CompositeResourceDefinition read from a file.
#[derive(Debug, Clone)]
pub(crate) struct Xrd {
    /// The XR shape it implies.
    pub(crate) schema: XrSchema,
    /// The object.
    object: Value,
}

impl Xrd {
    /// Reads the XRD at `path` (whether it defines the XR is
    /// [`Xrd::check_defines`]'s: any served version, the XR may use one
    /// that is not referenceable).
    pub(crate) fn read(path: &Path) -> Result<Self, ComposeError> {
        let object = read_one(path)?;
        let found = format!(
            "{} {}",
            get_str(&object, &["apiVersion"]).unwrap_or_default(),
            get_str(&object, &["kind"]).unwrap_or_default()
        );
        Self::from_object(object).ok_or_else(|| ComposeError::WrongKind {
            path: path.to_path_buf(),
            expected: "apiextensions.crossplane.io/v1 or v2 CompositeResourceDefinition".into(),
            found,
        })
    }

    /// Refuses an XRD that does not define `xr`'s group and kind.
    pub(crate) fn check_defines(&self, path: &Path, xr: &Composite) -> Result<(), ComposeError> {
        let xrd_group = get_str(&self.object, &["spec", "group"]).unwrap_or_default();
        let xrd_kind = get_str(&self.object, &["spec", "names", "kind"]).unwrap_or_default();
        if xrd_group != group(xr.api_version()) || xrd_kind != xr.kind() {
            let name = get_str(&self.object, &["metadata", "name"]).unwrap_or_default();
            return Err(ComposeError::Invalid {
                path: path.to_path_buf(),
                message: format!(
                    "the CompositeResourceDefinition {name:?} defines group {xrd_group:?} kind \
                     {xrd_kind:?}, but the XR is {} {} {}",
                    crate::compose::article(xr.api_version()),
                    xr.api_version(),
                    xr.kind()
                ),
            });
        }
        Ok(())
    }

    /// An XRD object as it is (for `xfn validate`, which derives the XR's
    /// schema from it), or `None` when `object` is no v1 or v2
    /// CompositeResourceDefinition.
    pub(crate) fn from_object(object: Value) -> Option<Self> {
        let schema = match get_str(&object, &["apiVersion"]) {
            Some("apiextensions.crossplane.io/v1") => XrSchema::Legacy,
            Some("apiextensions.crossplane.io/v2") => XrSchema::Modern,
            _ => return None,
        };
        if get_str(&object, &["kind"]) != Some("CompositeResourceDefinition") {
            return None;
        }
        // A v1 XRD without a scope is LegacyCluster. A v2 XRD can say
        // LegacyCluster too (one posted as v1, read back as v2).
        let schema = match get_str(&object, &["spec", "scope"]) {
            Some("LegacyCluster") => XrSchema::Legacy,
            None => schema,
            _ => XrSchema::Modern,
        };
        Some(Self { schema, object })
    }

    /// The object read.
    pub(crate) fn object(&self) -> &Value {
        &self.object
    }

    /// The kind of the XRD's claims (`spec.claimNames.kind`), if it offers them.
    pub(crate) fn claim_kind(&self) -> Option<&str> {
        get_str(&self.object, &["spec", "claimNames", "kind"]).filter(|k| !k.is_empty())
    }

    /// The scope the XRD gives its XRs (`Namespaced`, `Cluster` or
    /// `LegacyCluster`).
    pub(crate) fn scope(&self) -> &str {
        match get_str(&self.object, &["spec", "scope"]) {
            Some(scope) => scope,
            None if self.schema == XrSchema::Legacy => "LegacyCluster",
            None => "Namespaced",
        }
    }

    /// Applies the defaults of the schema of `api_version` (the XR's
    /// version) to `xr`, and Crossplane's own default composition update
    /// policy, as the API server would on create.
    pub(crate) fn apply_defaults(&self, xr: &mut Value, path: &Path) -> Result<(), ComposeError> {
        let version = api_version_name(xr);
        let versions = get(&self.object, &["spec", "versions"])
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let Some(schema) = versions
            .iter()
            .find(|v| get_str(v, &["name"]) == Some(version.as_str()))
            .map(|v| {
                get(v, &["schema", "openAPIV3Schema"])
                    .cloned()
                    .unwrap_or(Value::Null)
            })
        else {
            return Err(ComposeError::Invalid {
                path: path.to_path_buf(),
                message: format!("the XRD has no version {version:?} (the XR's apiVersion)"),
            });
        };
        apply_schema_defaults(xr, &schema);
        let policy = get_str(&self.object, &["spec", "defaultCompositionUpdatePolicy"])
            .unwrap_or("Automatic");
        let field = self.schema.spec_path("compositionUpdatePolicy");
        let spec = crate::value::object_at(xr, &field[..field.len() - 1]);
        spec.entry("compositionUpdatePolicy")
            .or_insert_with(|| Value::String(policy.to_string()));
        Ok(())
    }
}

fn api_version_name(xr: &Value) -> String {
    let api_version = get_str(xr, &["apiVersion"]).unwrap_or_default();
    api_version
        .rsplit_once('/')
        .map_or(api_version, |(_, v)| v)
        .to_string()
}

/// Kubernetes' structural defaulting: every absent property with a
/// `default` gets it, then every present property (defaulted ones
/// included) is defaulted by its own schema; `additionalProperties` and
/// array `items` likewise.
pub(crate) fn apply_schema_defaults(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(map) => {
            let properties = get(schema, &["properties"]).and_then(Value::as_object);
            if let Some(properties) = properties {
                for (key, property) in properties {
                    if let Some(default) = property.get("default") {
                        let absent = map.get(key).is_none_or(|v| {
                            v.is_null() && property.get("nullable") != Some(&Value::Bool(true))
                        });
                        if absent {
                            map.insert(key.clone(), default.clone());
                        }
                    }
                }
            }
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let empty = Map::new();
            let properties = properties.unwrap_or(&empty);
            for (key, child) in map.iter_mut() {
                if let Some(property) = properties.get(key) {
                    apply_schema_defaults(child, property);
                } else if let Some(additional) = additional {
                    apply_schema_defaults(child, additional);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    apply_schema_defaults(item, item_schema);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_fill_absent_fields_then_recurse() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "default": {},
            "properties": {
                "region": {"type": "string", "default": "eu-west-1"},
                "size": {"type": "object", "default": {}, "properties": {
                    "gb": {"type": "integer", "default": 10}}},
                "tags": {"type": "object", "additionalProperties": {"type": "object",
                    "properties": {"kept": {"type": "boolean", "default": true}}}},
                "disks": {"type": "array", "items": {"type": "object", "properties": {
                    "kind": {"type": "string", "default": "ssd"}}}}}}}});
        let mut xr = json!({"spec": {"region": "us-east-1", "tags": {"a": {}},
            "disks": [{}, {"kind": "hdd"}]}});
        apply_schema_defaults(&mut xr, &schema);
        assert_eq!(
            xr,
            json!({"spec": {"region": "us-east-1", "size": {"gb": 10},
                "tags": {"a": {"kept": true}}, "disks": [{"kind": "ssd"}, {"kind": "hdd"}]}})
        );
        let mut empty = json!({});
        apply_schema_defaults(&mut empty, &schema);
        assert_eq!(
            empty,
            json!({"spec": {"region": "eu-west-1", "size": {"gb": 10}}})
        );
    }
}
