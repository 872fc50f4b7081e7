//! Reading the render's files: YAML or JSON streams (a file, or a
//! directory of them), their nesting bounded before they are parsed, into
//! the objects of [`crate::compose::read::model`]. Every error names the file.
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::compose::read::model::{Composite, Composition, Function};
use crate::compose::ComposeError;

/// Reads every object of a YAML stream in `path` (a file, or a directory of
/// `.yaml`/`.yml`/`.json` files read in name order).
pub(crate) fn read_objects(path: &Path) -> Result<Vec<Value>, ComposeError> {
    let mut files = Vec::new();
    if path.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|source| ComposeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        for entry in entries.flatten() {
            let p = entry.path();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            if p.is_file() && matches!(ext, "yaml" | "yml" | "json") {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut objects = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|source| ComposeError::Read {
            path: file.clone(),
            source,
        })?;
        objects.extend(parse_stream(&file, &text)?);
    }
    Ok(objects)
}

/// Refuses `text` from `path` when it nests deeper than
/// [`crate::nesting::MAX_DEPTH`] or its aliases expand too far, before a
/// parser reads it.
fn check_nesting(path: &Path, text: &str) -> Result<(), ComposeError> {
    crate::nesting::check(text.as_bytes()).map_err(|source| ComposeError::OutOfBounds {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses one YAML (or JSON) value of any kind, its nesting bounded first.
pub(crate) fn parse_value(path: &Path, text: &str) -> Result<Value, ComposeError> {
    check_nesting(path, text)?;
    yaml_serde::from_str::<Value>(text).map_err(|source| ComposeError::Yaml {
        path: path.to_path_buf(),
        what: "not JSON or YAML",
        source,
    })
}

/// Parses a YAML stream; empty documents are skipped, anything but an
/// object is an error. Its nesting is bounded before it is parsed.
pub(crate) fn parse_stream(path: &Path, text: &str) -> Result<Vec<Value>, ComposeError> {
    check_nesting(path, text)?;
    let mut objects = Vec::new();
    for (index, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).map_err(|source| ComposeError::Yaml {
            path: path.to_path_buf(),
            what: "invalid YAML",
            source,
        })?;
        match value {
            Value::Null => continue,
            Value::Object(_) => objects.push(value),
            other => {
                return Err(ComposeError::Invalid {
                    path: path.to_path_buf(),
                    message: format!(
                        "document {}: expected a Kubernetes object, found {other}",
                        index + 1
                    ),
                })
            }
        }
    }
    Ok(objects)
}

/// Reads a file holding exactly one object.
pub(crate) fn read_one(path: &Path) -> Result<Value, ComposeError> {
    let mut objects = read_objects(path)?;
    match objects.len() {
        1 => Ok(objects.remove(0)),
        n => Err(ComposeError::Invalid {
            path: path.to_path_buf(),
            message: format!("expected one object, found {n}"),
        }),
    }
}

impl Composite {
    /// Reads and checks the XR at `path`.
    #[cfg(test)]
    pub(crate) fn read(path: &Path) -> Result<Self, ComposeError> {
        Self::from_object(path, read_one(path)?)
    }
}

impl Composition {
    /// Reads the Composition at `path` and checks it composes `xr`.
    #[cfg(test)]
    pub(crate) fn read(path: &Path, xr: &Composite) -> Result<Self, ComposeError> {
        Self::from_object(path, read_one(path)?, xr)
    }
}

/// Reads the Functions in `path` (a file or a directory), with
/// `overrides` applied to every Function's annotations.
pub(crate) fn read_functions(
    path: &Path,
    overrides: &[(String, String)],
) -> Result<Vec<Function>, ComposeError> {
    let mut functions = Vec::new();
    let objects = read_objects(path)?;
    let count = objects.len();
    for (index, mut object) in objects.into_iter().enumerate() {
        let annotations = crate::value::object_at(&mut object, &["metadata", "annotations"]);
        for (key, value) in overrides {
            annotations.insert(key.clone(), Value::String(value.clone()));
        }
        let function = Function::from_object(path, object.clone())
            .map_err(|e| e.in_document(path, index, count, &object))?;
        functions.push(function);
    }
    Ok(functions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    use crate::compose::read::model::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    const XR: &str = "apiVersion: example.org/v1\nkind: XBucket\nmetadata: {name: demo}\n";

    #[test]
    fn deep_files_are_refused_naming_the_file_before_parsing() {
        let dir = tempfile::tempdir().unwrap();
        let deep = format!("{XR}---\nspec: {}", "[".repeat(4 << 20));
        let err = read_objects(&write(dir.path(), "xr.yaml", &deep)).unwrap_err();
        let text = crate::chain::one_line(&err);
        assert!(text.contains("xr.yaml"), "{text}");
        assert!(
            text.contains("nested more than 64 levels deep (at line 5"),
            "{text}"
        );
        let err = parse_value(Path::new("ctx.json"), &"{\"a\":".repeat(100)).unwrap_err();
        let text = crate::chain::one_line(&err);
        assert!(text.contains("nested more than 64"), "{text}");
    }

    #[test]
    fn alias_bombs_in_files_and_values_are_refused_naming_them_before_parsing() {
        use crate::nesting::bombs;
        let dir = tempfile::tempdir().unwrap();
        for (name, bomb) in [
            ("wide", bombs::wide()),
            ("listed", bombs::listed()),
            ("laughs", bombs::laughs()),
        ] {
            let file = write(dir.path(), "xr.yaml", &format!("{XR}spec: {bomb}\n"));
            let text = crate::chain::one_line(&read_objects(&file).unwrap_err());
            assert!(
                text.contains("xr.yaml") && text.contains("its aliases expand too far"),
                "{name}: {text}"
            );
            let err = parse_value(Path::new("--context-values"), &bomb).unwrap_err();
            let text = crate::chain::one_line(&err);
            assert!(
                text.starts_with("--context-values: its aliases expand too far"),
                "{name}: {text}"
            );
        }
        // A few anchors, as people write them, still read.
        let file = write(
            dir.path(),
            "ok.yaml",
            &format!("{XR}spec: {{a: &a {{x: 1}}, b: *a, c: {{<<: *a, y: 2}}}}\n"),
        );
        assert_eq!(read_objects(&file).unwrap()[0]["spec"]["b"]["x"], 1);
    }

    #[test]
    fn functions_come_from_a_directory_with_their_runtimes() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "a.yaml",
            "apiVersion: pkg.crossplane.io/v1beta1\nkind: Function\nmetadata: {name: a}\nspec: {package: x/a:v1}\n---\n",
        );
        write(
            dir.path(),
            "b.yml",
            "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: b\n  annotations:\n    render.crossplane.io/runtime: Development\n---\napiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: c\n  annotations:\n    render.crossplane.io/runtime: Exec\n    render.crossplane.io/runtime-docker-pull-policy: Never\nspec: {package: x/c:v1}\n",
        );
        write(dir.path(), "notes.txt", "not yaml: [");
        let functions = read_functions(dir.path(), &[]).unwrap();
        let runtimes: Vec<_> = functions
            .iter()
            .map(|f| (f.name.as_str(), f.runtime.clone()))
            .collect();
        assert_eq!(
            runtimes,
            [
                ("a", RuntimeKind::Docker),
                (
                    "b",
                    RuntimeKind::Development {
                        target: "localhost:9443".into()
                    }
                ),
                ("c", RuntimeKind::Exec),
            ]
        );
        assert_eq!(functions[2].pull_policy.as_deref(), Some("Never"));

        let bad = write(
            dir.path(),
            "bad.yaml",
            "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: d\n  annotations: {render.crossplane.io/runtime: Podman}\n",
        );
        let err = read_functions(&bad, &[]).unwrap_err().to_string();
        assert!(err.contains("bad.yaml") && err.contains("Podman"), "{err}");
    }

    #[test]
    fn compositions_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let xr = Composite::read(&write(dir.path(), "xr.yaml", XR)).unwrap();
        let head = "apiVersion: apiextensions.crossplane.io/v1\nkind: Composition\nmetadata: {name: c}\nspec:\n  compositeTypeRef: {apiVersion: example.org/v1, kind: XBucket}\n";
        let alpha = write(
            dir.path(),
            "alpha.yaml",
            &format!("{head}  functions:\n  - name: f\n    type: Container\n    container: {{image: x/f:v1}}\n"),
        );
        assert!(matches!(
            Composition::read(&alpha, &xr).unwrap().pipeline,
            Pipeline::Alpha(f) if f.len() == 1
        ));
        let not_container = write(
            dir.path(),
            "other.yaml",
            &format!("{head}  functions:\n  - name: f\n    type: Wasm\n"),
        );
        let err = Composition::read(&not_container, &xr)
            .unwrap_err()
            .to_string();
        assert!(err.contains("only Container"), "{err}");
        let resources = write(dir.path(), "res.yaml", &format!("{head}  resources: []\n"));
        let err = Composition::read(&resources, &xr).unwrap_err().to_string();
        assert!(err.contains("mode: Pipeline"), "{err}");
        let no_steps = write(
            dir.path(),
            "empty.yaml",
            &format!("{head}  mode: Pipeline\n  pipeline: []\n"),
        );
        let err = Composition::read(&no_steps, &xr).unwrap_err().to_string();
        assert!(err.contains("spec.pipeline is empty"), "{err}");
    }

    #[test]
    fn docker_knobs_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let f = |annotations: &str| {
            write(
                dir.path(),
                "f.yaml",
                &format!("apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: kcl\n  annotations: {{{annotations}}}\nspec: {{package: x/kcl:v1}}\n"),
            )
        };
        let functions = read_functions(
            &f("render.crossplane.io/runtime-docker-env: 'A=1,bad,B=2', render.crossplane.io/runtime-docker-network: ci-job-network, render.crossplane.io/runtime-docker-cleanup: Orphan"),
            &[],
        )
        .unwrap();
        assert_eq!(functions[0].env, ["A=1", "B=2"]);
        assert!(functions[0].host_network, "a CI job's network name: egress");
        for (network, egress) in [("", true), ("host", true), ("none", false)] {
            let annotation = format!("render.crossplane.io/runtime-docker-network: '{network}'");
            let functions = read_functions(&f(&annotation), &[]).unwrap();
            assert_eq!(functions[0].host_network, egress, "{network:?}");
        }
        let plain = read_functions(&f(""), &[]).unwrap();
        assert!(plain[0].host_network, "egress by default, as upstream");
        assert_eq!(
            functions[0].keep.as_deref(),
            Some("kcl"),
            "named after the Function"
        );
        let overridden = read_functions(
            &f("render.crossplane.io/runtime-docker-cleanup: Orphan"),
            &[(
                "render.crossplane.io/runtime-docker-name".into(),
                "shared".into(),
            )],
        )
        .unwrap();
        assert_eq!(overridden[0].keep.as_deref(), Some("shared"));
        for bad in [
            "render.crossplane.io/runtime-docker-cleanup: Later",
            "render.crossplane.io/runtime-docker-cleanup: Orphan, render.crossplane.io/runtime-docker-name: Not_Valid",
        ] {
            assert!(read_functions(&f(bad), &[]).is_err(), "{bad}");
        }
    }

    #[test]
    fn streams_skip_empty_documents_and_refuse_non_objects() {
        let path = Path::new("s.yaml");
        assert_eq!(
            parse_stream(path, "---\n---\na: 1\n---\n").unwrap().len(),
            1
        );
        let err = parse_stream(path, "a: 1\n---\n- 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("s.yaml: document 2: expected a Kubernetes object"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let unnamed = write(dir.path(), "xr.yaml", "apiVersion: v1\nkind: X\n");
        let err = Composite::read(&unnamed).unwrap_err().to_string();
        assert!(err.contains("no metadata.name"), "{err}");
    }
}
