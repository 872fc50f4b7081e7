//! `-s/--required-schemas DIR`: OpenAPI v3 documents (what `kubectl get
//! --raw /openapi/v3/<group-version>` prints) from which the schemas
//! functions ask for (`requirements.schemas`) are answered, as Crossplane
//! answers them from its API server: the component schema whose single
//! `x-kubernetes-group-version-kind` is the selector's, with its `$ref`s
//! inlined. An unknown kind gets an empty schema, as in Crossplane.
use std::path::Path;

use serde_json::Value;

use crate::compose::ComposeError;
use crate::value::{get, get_str};

const REF_PREFIX: &str = "#/components/schemas/";
/// `$ref`s inlined deeper than this are left as they are (a cycle).
const MAX_REF_DEPTH: usize = 32;

/// Reads every `.json` (or YAML) document in `dir`, in name order.
pub(crate) fn read_schema_documents(dir: &Path) -> Result<Vec<Value>, ComposeError> {
    if !dir.is_dir() {
        return Err(ComposeError::Invalid {
            path: dir.to_path_buf(),
            message: "--required-schemas must name a directory of OpenAPI v3 documents".into(),
        });
    }
    let documents = crate::compose::read::files::read_objects(dir)?;
    for document in &documents {
        if get(document, &["components", "schemas"]).is_none() {
            return Err(ComposeError::Invalid {
                path: dir.to_path_buf(),
                message: "a document has no components.schemas (not an OpenAPI v3 document)".into(),
            });
        }
    }
    Ok(documents)
}

/// The schema of `api_version` `kind` in `documents`, `$ref`s inlined, or
/// `None` when no document defines it.
pub(crate) fn find_schema(documents: &[Value], api_version: &str, kind: &str) -> Option<Value> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    for document in documents {
        let Some(schemas) = get(document, &["components", "schemas"]).and_then(Value::as_object)
        else {
            continue;
        };
        for schema in schemas.values() {
            let Some([gvk]) = schema
                .get("x-kubernetes-group-version-kind")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
            else {
                continue;
            };
            if get_str(gvk, &["group"]).unwrap_or_default() == group
                && get_str(gvk, &["version"]) == Some(version)
                && get_str(gvk, &["kind"]) == Some(kind)
            {
                return Some(inline_refs(schema, schemas, 0));
            }
        }
    }
    None
}

fn inline_refs(value: &Value, schemas: &serde_json::Map<String, Value>, depth: usize) -> Value {
    match value {
        Value::Object(map) => {
            if let Some(target) = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix(REF_PREFIX))
                .and_then(|name| schemas.get(name))
            {
                if depth < MAX_REF_DEPTH {
                    // Siblings of a $ref (descriptions, defaults) are kept.
                    let mut inlined = inline_refs(target, schemas, depth + 1);
                    if let Value::Object(inlined_map) = &mut inlined {
                        for (k, v) in map.iter().filter(|(k, _)| *k != "$ref") {
                            inlined_map.insert(k.clone(), inline_refs(v, schemas, depth + 1));
                        }
                    }
                    return inlined;
                }
            }
            Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), inline_refs(v, schemas, depth)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| inline_refs(v, schemas, depth))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemas_are_found_by_group_version_kind_with_refs_inlined() {
        let doc = json!({"openapi": "3.0.0", "components": {"schemas": {
            "io.k8s.api.core.v1.ConfigMap": {"type": "object",
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "ConfigMap"}],
                "properties": {"metadata": {"$ref": "#/components/schemas/Meta", "description": "m"}}},
            "Meta": {"type": "object", "properties": {"name": {"type": "string"}}}}}});
        let found = find_schema(std::slice::from_ref(&doc), "v1", "ConfigMap").unwrap();
        assert_eq!(
            found["properties"]["metadata"],
            json!({"type": "object", "description": "m", "properties": {"name": {"type": "string"}}})
        );
        assert!(find_schema(&[doc], "v1", "Secret").is_none());
    }
}
