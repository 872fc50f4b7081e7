//! Suite files in xprin's format (`xprin.yaml`, `*_xprin.yaml`): found
//! recursively under the paths given, read with their `{{ … }}` template
//! variables kept as placeholders (as xprin does, so a bare template is
//! still YAML), and each test merged with `common` the way xprin merges:
//! a field the test sets replaces common's whole; hooks and assertions are
//! replaced per list (`pre-test`, `post-test`; `xprin`, `diff`, `dyff`).
//! A suite file is bounded in size and nesting before it is parsed.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::beneath::Beneath;
use super::SuiteError;

/// Largest suite file read.
const MAX_SUITE_BYTES: u64 = 4 << 20;

/// A suite file, as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SuiteFile {
    /// Shared by every test.
    #[serde(default)]
    pub(crate) common: Common,
    /// The tests.
    #[serde(default)]
    pub(crate) tests: Vec<TestCase>,
}

/// `common`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Common {
    pub(crate) inputs: Inputs,
    pub(crate) patches: Patches,
    pub(crate) hooks: Hooks,
    pub(crate) assertions: Assertions,
}

/// One test case.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TestCase {
    /// Its name (`--run` matches it).
    pub(crate) name: String,
    /// Its id: later tests reach its outputs as `{{ .Tests.ID.Outputs.* }}`.
    #[serde(default)]
    pub(crate) id: Option<String>,
    #[serde(default)]
    pub(crate) inputs: Inputs,
    #[serde(default)]
    pub(crate) patches: Patches,
    #[serde(default)]
    pub(crate) hooks: Hooks,
    #[serde(default)]
    pub(crate) assertions: Assertions,
}

/// `inputs`: paths (relative to the suite file, or templates).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct Inputs {
    pub(crate) xr: Option<String>,
    pub(crate) claim: Option<String>,
    pub(crate) composition: Option<String>,
    pub(crate) functions: Option<String>,
    pub(crate) crds: Option<Vec<String>>,
    pub(crate) context_files: BTreeMap<String, String>,
    pub(crate) context_values: BTreeMap<String, Value>,
    pub(crate) observed_resources: Option<String>,
    pub(crate) extra_resources: Option<String>,
    pub(crate) function_credentials: Option<String>,
}

/// `patches`: what is done to the XR before it renders.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct Patches {
    /// The XRD whose schema defaults are applied.
    pub(crate) xrd: Option<String>,
    /// Set `spec.writeConnectionSecretToRef`.
    pub(crate) connection_secret: Option<bool>,
    pub(crate) connection_secret_name: Option<String>,
    pub(crate) connection_secret_namespace: Option<String>,
}

/// `hooks`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct Hooks {
    pub(crate) pre_test: Vec<Hook>,
    pub(crate) post_test: Vec<Hook>,
}

/// One hook: a shell command.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Hook {
    #[serde(default)]
    pub(crate) name: Option<String>,
    pub(crate) run: String,
}

/// `assertions`, by checker.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Assertions {
    pub(crate) xprin: Vec<XprinAssertion>,
    pub(crate) diff: Vec<GoldenAssertion>,
    pub(crate) dyff: Vec<GoldenAssertion>,
}

/// An assertion of the `xprin` checker.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct XprinAssertion {
    pub(crate) name: String,
    #[serde(rename = "type")]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) resource: Option<String>,
    #[serde(default)]
    pub(crate) field: Option<String>,
    #[serde(default)]
    pub(crate) operator: Option<String>,
    #[serde(default)]
    pub(crate) value: Option<Value>,
}

/// A golden-file assertion (`diff` or `dyff`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GoldenAssertion {
    pub(crate) name: String,
    pub(crate) expected: String,
    #[serde(default)]
    pub(crate) resource: Option<String>,
}

/// A suite read from its file.
#[derive(Debug, Clone)]
pub(crate) struct Suite {
    /// The file.
    pub(crate) path: PathBuf,
    /// Its tests, each merged with `common`.
    pub(crate) tests: Vec<TestCase>,
    /// The root its golden files are beneath (`--root`, or its directory).
    root: PathBuf,
    /// Its directory, relative to `root`.
    dir: PathBuf,
}

impl Suite {
    /// Reads `path`: its templates kept, its tests merged with `common`.
    pub(crate) fn read(path: &Path, root: Option<&Path>) -> Result<Self, SuiteError> {
        let read_error = |source| SuiteError::Read {
            path: path.to_path_buf(),
            source,
        };
        let (root, dir) = beneath_root(path, root)?;
        let size = std::fs::metadata(path).map_err(read_error)?.len();
        if size > MAX_SUITE_BYTES {
            return Err(SuiteError::Invalid {
                path: path.to_path_buf(),
                message: format!(
                    "{size} bytes, more than a suite file may hold ({MAX_SUITE_BYTES})"
                ),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_error)?;
        let text = super::template::to_placeholders(&text);
        crate::nesting::check(text.as_bytes()).map_err(|source| SuiteError::Invalid {
            path: path.to_path_buf(),
            message: crate::chain::Chain(&source).to_string(),
        })?;
        let file: SuiteFile = yaml_serde::from_str(&text).map_err(|source| SuiteError::Yaml {
            path: path.to_path_buf(),
            source,
        })?;
        check_tests(&file.tests).map_err(|message| SuiteError::Invalid {
            path: path.to_path_buf(),
            message,
        })?;
        let tests = file
            .tests
            .iter()
            .map(|test| merge(&file.common, test))
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            tests,
            root,
            dir,
        })
    }

    /// Where golden assertion `a` reads and writes: its `expected`
    /// expanded, relative to the suite file, beneath the suite's root.
    pub(crate) fn golden(
        &self,
        a: &GoldenAssertion,
        vars: &super::template::Vars<'_>,
    ) -> Result<Beneath, String> {
        let expanded = vars.expand(&a.expected)?;
        Beneath::new(&self.root, &self.dir, Path::new(&expanded))
            .map_err(|e| format!("golden file {expanded}: {}", crate::chain::Chain(&e)))
    }

    /// Whether a test reaches another's outputs: then its tests run in order.
    pub(crate) fn is_chained(&self) -> bool {
        let text = format!("{:?}", self.tests);
        text.contains(".Tests")
    }
}

/// What xprin refuses of a suite's tests before any runs (its
/// `CheckValidTestSuiteFile`): an empty name, an id of other characters
/// than letters, digits, `_` and `-`, an id given twice. Every problem is
/// listed. A suite without tests is no error: it has nothing to run.
fn check_tests(tests: &[TestCase]) -> Result<(), String> {
    let mut problems = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for test in tests {
        if test.name.is_empty() {
            problems.push("test case has empty name".to_string());
        }
        let Some(id) = &test.id else { continue };
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if id.is_empty() || !id.chars().all(valid) {
            problems.push(format!(
                "test case ID {id:?} contains invalid characters (allowed: alphanumeric, underscore, hyphen)"
            ));
        }
        if !ids.insert(id.as_str()) {
            problems.push(format!("duplicate test case ID {id:?} found"));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "invalid testsuite file:\n- {}",
        problems.join("\n- ")
    ))
}

/// `test` with what it does not set taken from `common`.
fn merge(common: &Common, test: &TestCase) -> TestCase {
    let (c, t) = (&common.inputs, &test.inputs);
    let (xr, claim) = if t.xr.is_some() || t.claim.is_some() {
        (t.xr.clone(), t.claim.clone())
    } else {
        (c.xr.clone(), c.claim.clone())
    };
    let inputs = Inputs {
        xr,
        claim,
        composition: t.composition.clone().or(c.composition.clone()),
        functions: t.functions.clone().or(c.functions.clone()),
        crds: t.crds.clone().or(c.crds.clone()),
        context_files: or_common(&t.context_files, &c.context_files),
        context_values: or_common(&t.context_values, &c.context_values),
        observed_resources: t
            .observed_resources
            .clone()
            .or(c.observed_resources.clone()),
        extra_resources: t.extra_resources.clone().or(c.extra_resources.clone()),
        function_credentials: t
            .function_credentials
            .clone()
            .or(c.function_credentials.clone()),
    };
    let (cp, tp) = (&common.patches, &test.patches);
    let patches = Patches {
        xrd: tp.xrd.clone().or(cp.xrd.clone()),
        connection_secret: tp.connection_secret.or(cp.connection_secret),
        connection_secret_name: tp
            .connection_secret_name
            .clone()
            .or(cp.connection_secret_name.clone()),
        connection_secret_namespace: tp
            .connection_secret_namespace
            .clone()
            .or(cp.connection_secret_namespace.clone()),
    };
    let hooks = Hooks {
        pre_test: or_common(&test.hooks.pre_test, &common.hooks.pre_test),
        post_test: or_common(&test.hooks.post_test, &common.hooks.post_test),
    };
    let (ca, ta) = (&common.assertions, &test.assertions);
    let assertions = Assertions {
        xprin: or_common(&ta.xprin, &ca.xprin),
        diff: or_common(&ta.diff, &ca.diff),
        dyff: or_common(&ta.dyff, &ca.dyff),
    };
    TestCase {
        name: test.name.clone(),
        id: test.id.clone(),
        inputs,
        patches,
        hooks,
        assertions,
    }
}

/// A test's list or map, or `common`'s where the test's is empty.
fn or_common<C: Clone>(test: &C, common: &C) -> C
where
    for<'a> &'a C: IntoIterator,
{
    if test.into_iter().next().is_none() {
        common.clone()
    } else {
        test.clone()
    }
}

/// The root a suite's golden files are beneath (`root`, or the suite's
/// directory), and the suite's directory relative to it: both resolved,
/// the suite refused where it is not beneath the root.
fn beneath_root(path: &Path, root: Option<&Path>) -> Result<(PathBuf, PathBuf), SuiteError> {
    let read_error = |path: &Path, source| SuiteError::Read {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let dir = std::fs::canonicalize(dir).map_err(|e| read_error(dir, e))?;
    let Some(root) = root else {
        return Ok((dir, PathBuf::new()));
    };
    let root = std::fs::canonicalize(root).map_err(|e| read_error(root, e))?;
    match dir.strip_prefix(&root) {
        Ok(within) => Ok((root.clone(), within.to_path_buf())),
        Err(_) => Err(SuiteError::Invalid {
            path: path.to_path_buf(),
            message: format!("not beneath --root {}", root.display()),
        }),
    }
}

/// Whether `path` names a suite file.
fn is_suite_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "xprin.yaml" || n.ends_with("_xprin.yaml"))
}

/// The suite files under `paths`: a file as given, a directory searched
/// recursively (`DIR/...` as xprin writes it means the same), sorted.
pub(crate) fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>, SuiteError> {
    let mut found = Vec::new();
    for path in paths {
        let path = match path.to_str().and_then(|p| p.strip_suffix("/...")) {
            Some(dir) => PathBuf::from(if dir.is_empty() { "." } else { dir }),
            None => path.clone(),
        };
        if path.is_file() {
            found.push(path);
            continue;
        }
        if !path.is_dir() {
            return Err(SuiteError::Read {
                path: path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such file or directory",
                ),
            });
        }
        let mut here = Vec::new();
        for entry in walkdir::WalkDir::new(&path).follow_links(false) {
            let entry = entry.map_err(|e| SuiteError::Read {
                path: e
                    .path()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| path.clone()),
                source: e.into(),
            })?;
            if entry.file_type().is_file() && is_suite_file(entry.path()) {
                here.push(entry.into_path());
            }
        }
        here.sort();
        found.extend(here);
    }
    found.dedup();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suite(text: &str) -> Suite {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xprin.yaml");
        std::fs::write(&path, text).unwrap();
        Suite::read(&path, None).unwrap()
    }

    #[test]
    fn a_test_field_replaces_commons_and_lists_are_replaced_per_kind() {
        let suite = suite(
            r#"
common:
  inputs: {xr: a.yaml, composition: c.yaml, functions: f.yaml, context-values: {k: v}}
  hooks: {pre-test: [{run: common-pre}], post-test: [{run: common-post}]}
  assertions:
    xprin: [{name: n, type: Count, value: 1}]
    diff: [{name: d, expected: g.yaml}]
tests:
- name: one
  inputs: {claim: claim.yaml, context-values: {other: x}}
  hooks: {pre-test: [{run: own-pre}]}
  assertions:
    xprin: [{name: m, type: Count, value: 2}]
"#,
        );
        let test = &suite.tests[0];
        assert_eq!(test.inputs.xr, None);
        assert_eq!(test.inputs.claim.as_deref(), Some("claim.yaml"));
        assert_eq!(test.inputs.composition.as_deref(), Some("c.yaml"));
        assert_eq!(
            test.inputs.context_values.keys().collect::<Vec<_>>(),
            ["other"]
        );
        assert_eq!(test.hooks.pre_test[0].run, "own-pre");
        assert_eq!(test.hooks.post_test[0].run, "common-post");
        assert_eq!(test.assertions.xprin[0].name, "m");
        assert_eq!(test.assertions.diff[0].name, "d");
    }

    #[test]
    fn a_bare_template_is_read_as_yaml_and_kept() {
        let suite = suite("tests:\n- name: t\n  inputs:\n    xr: {{ .Tests.a.Outputs.XR }}\n");
        let xr = suite.tests[0].inputs.xr.clone().unwrap();
        assert_eq!(
            super::super::template::as_written(&xr),
            "{{ .Tests.a.Outputs.XR }}"
        );
        assert!(suite.is_chained());
    }

    #[test]
    fn a_suite_with_an_unknown_field_a_duplicate_or_a_bad_id_is_refused_one_without_tests_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xprin.yaml");
        std::fs::write(&path, "common: {}\ntests: []\n").unwrap();
        assert!(Suite::read(&path, None).unwrap().tests.is_empty());
        std::fs::write(
            &path,
            "tests:\n- {name: a, id: twice}\n- {name: b, id: twice}\n- {name: c, id: 'a b'}\n- {name: '', id: ok}\n",
        )
        .unwrap();
        let err = Suite::read(&path, None).unwrap_err().to_string();
        assert!(
            err.contains("duplicate test case ID \"twice\" found")
                && err.contains("test case ID \"a b\" contains invalid characters")
                && err.contains("test case has empty name"),
            "{err}"
        );
        std::fs::write(&path, "tests:\n- name: t\n  input: {}\n").unwrap();
        assert!(crate::chain::Chain(&Suite::read(&path, None).unwrap_err())
            .to_string()
            .contains("unknown field `input`"));
    }
}
