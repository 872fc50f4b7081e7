//! xprin's template variables, `{{ .Repositories.NAME }}`, `{{ .Inputs.X }}`,
//! `{{ .Outputs.X }}`, `{{ .Tests.ID.Outputs.X }}` and `{{ index …
//! "Kind/name" }}`: the forms xprin's suites use, not Go's whole template
//! language. A variable that is not there is an error naming it (never an
//! empty string a shell would then run with).
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

const OPEN: &str = "__OPEN__";
const CLOSE: &str = "__CLOSE__";

static TEMPLATE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\{\{\s*(.*?)\s*\}\}|__OPEN__(.*?)__CLOSE__").expect("a valid regex")
});

/// `(index .Tests "ID")`: how Go templates reach an id with a hyphen.
static INDEX_TESTS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"\(\s*index\s+\.Tests\s+"([A-Za-z0-9_-]*)"\s*\)"#).expect("a valid regex")
});

/// Whether `text` holds a template (as written or as a placeholder).
pub(crate) fn has_template(text: &str) -> bool {
    TEMPLATE.is_match(text)
}

/// `text` as the user wrote it: placeholders back as `{{ x }}`.
pub(crate) fn as_written(text: &str) -> String {
    TEMPLATE
        .replace_all(text, |c: &regex::Captures| match c.get(2) {
            Some(inner) => format!("{{{{ {} }}}}", inner.as_str()),
            None => c[0].to_string(),
        })
        .into_owned()
}

/// `text` with each `{{ x }}` as a placeholder that YAML reads as plain text.
pub(crate) fn to_placeholders(text: &str) -> String {
    TEMPLATE
        .replace_all(text, |c: &regex::Captures| match c.get(1) {
            Some(inner) => format!("{OPEN}{}{CLOSE}", inner.as_str().trim()),
            None => c[0].to_string(),
        })
        .into_owned()
}

/// What a test produced, as paths: `.Outputs` (and `.Tests.ID.Outputs`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Outputs {
    pub(crate) xr: Option<PathBuf>,
    pub(crate) render: Option<PathBuf>,
    pub(crate) validate: Option<PathBuf>,
    pub(crate) assertions: Option<PathBuf>,
    pub(crate) render_count: usize,
    /// Each rendered object's file by `Kind/name`.
    pub(crate) rendered: BTreeMap<String, PathBuf>,
}

impl Outputs {
    fn field(&self, name: &str) -> Result<String, String> {
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .ok_or_else(|| format!(".Outputs.{name} is not there (that phase did not run)"))
        };
        match name {
            "XR" => path(&self.xr),
            "Render" => path(&self.render),
            "Validate" => path(&self.validate),
            "Assertions" => path(&self.assertions),
            "RenderCount" => Ok(self.render_count.to_string()),
            other => Err(format!(
                "no output {other:?} (XR, Render, Validate, Assertions, RenderCount, Rendered)"
            )),
        }
    }

    fn rendered(&self, key: &str) -> Result<String, String> {
        self.rendered
            .get(key)
            .map(|p| p.display().to_string())
            .ok_or_else(|| {
                let known: Vec<&str> = self.rendered.keys().map(String::as_str).collect();
                format!(
                    "no rendered resource {key:?} (rendered: {})",
                    known.join(", ")
                )
            })
    }
}

/// The values templates are expanded with.
#[derive(Debug, Default)]
pub(crate) struct Vars<'a> {
    pub(crate) repositories: Option<&'a BTreeMap<String, String>>,
    /// `.Inputs.X` by X (`XR`, `Composition`, `ObservedResources`, …).
    pub(crate) inputs: Option<&'a BTreeMap<String, String>>,
    pub(crate) outputs: Option<&'a Outputs>,
    /// Earlier tests with an id: their outputs, or none when the test
    /// failed before it rendered.
    pub(crate) tests: Option<&'a HashMap<String, Option<Outputs>>>,
}

impl Vars<'_> {
    /// `text` with every template expanded; the first that cannot be, named.
    pub(crate) fn expand(&self, text: &str) -> Result<String, String> {
        let mut error = None;
        let expanded = TEMPLATE.replace_all(text, |c: &regex::Captures| {
            let inner = c.get(1).or(c.get(2)).map_or("", |m| m.as_str()).trim();
            match self.value(inner) {
                Ok(value) => value,
                Err(message) => {
                    error.get_or_insert_with(|| format!("{{{{ {inner} }}}}: {message}"));
                    String::new()
                }
            }
        });
        match error {
            Some(error) => Err(error),
            None => Ok(expanded.into_owned()),
        }
    }

    /// `value` with every string that holds a template expanded and read
    /// again as YAML, as xprin renders a test's YAML before reading it:
    /// `value: {{ .Tests.a.Outputs.RenderCount }}` is the number, quoted
    /// or not; text around a template keeps it a string.
    pub(crate) fn expand_value(&self, value: &Value) -> Result<Value, String> {
        Ok(match value {
            Value::String(text) if has_template(text) => {
                let expanded = self.expand(text)?;
                match yaml_serde::from_str::<Value>(&expanded) {
                    Ok(typed @ (Value::Bool(_) | Value::Number(_) | Value::String(_))) => typed,
                    _ => Value::String(expanded),
                }
            }
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|v| self.expand_value(v))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| Ok((k.clone(), self.expand_value(v)?)))
                    .collect::<Result<_, String>>()?,
            ),
            other => other.clone(),
        })
    }

    fn value(&self, expression: &str) -> Result<String, String> {
        let expression = INDEX_TESTS.replace_all(expression, ".Tests.$1");
        let expression = expression.as_ref();
        let (path, key) = match expression.strip_prefix("index ") {
            Some(rest) => {
                let rest = rest.trim();
                match rest.split_once(char::is_whitespace) {
                    Some((path, key)) => {
                        let key = key.trim();
                        let key = match key.strip_prefix('"').and_then(|k| k.strip_suffix('"')) {
                            Some(quoted) => quoted.to_string(),
                            // `index .Inputs.CRDs 0`: a list's item.
                            None if key.parse::<usize>().is_ok() => key.to_string(),
                            None => {
                                return Err(format!(
                                    "the key {key} must be a quoted string or an index"
                                ))
                            }
                        };
                        (path, Some(key))
                    }
                    None => (rest, None),
                }
            }
            None => (expression, None),
        };
        let parts: Vec<&str> = path.strip_prefix('.').unwrap_or(path).split('.').collect();
        let key = key.as_deref();
        let outputs_value = |outputs: &Outputs, rest: &[&str]| match (rest, key) {
            (["Rendered"], Some(key)) => outputs.rendered(key),
            (["Rendered"], None) => Err("use {{ index .Outputs.Rendered \"Kind/name\" }}".into()),
            ([name], None) => outputs.field(name),
            _ => Err("not a variable xfn test knows".into()),
        };
        match parts.as_slice() {
            ["Repositories", name] => self
                .repositories
                .and_then(|r| r.get(*name))
                .cloned()
                .ok_or_else(|| {
                    format!(
                        "no repository {name:?} in the configuration (repositories: in --config)"
                    )
                }),
            ["Inputs", name] => {
                let name = match key {
                    Some(index) => format!("{name}.{index}"),
                    None => name.to_string(),
                };
                self.inputs
                    .ok_or_else(|| "inputs are not known here".to_string())?
                    .get(&name)
                    .cloned()
                    .ok_or_else(|| format!("the test has no input {name}"))
            }
            ["Outputs", rest @ ..] => {
                let outputs = self
                    .outputs
                    .ok_or_else(|| ".Outputs are known in post-test hooks only".to_string())?;
                outputs_value(outputs, rest)
            }
            ["Tests", id, "Outputs", rest @ ..] => {
                let outputs = match self.tests.and_then(|t| t.get(*id)) {
                    Some(Some(outputs)) => outputs,
                    Some(None) => {
                        return Err(format!(
                            "test {id} failed before its outputs (it did not render)"
                        ))
                    }
                    None => return Err(format!(
                        "no earlier test has id {id:?} (a test's outputs are known after it ran, in the same suite)"
                    )),
                };
                outputs_value(outputs, rest)
            }
            _ => Err("not a variable xfn test knows".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_xprin_suites_use_expands() {
        let repos = BTreeMap::from([("repo".to_string(), "/r".to_string())]);
        let inputs = BTreeMap::from([("XR".to_string(), "/in/xr.yaml".to_string())]);
        let outputs = Outputs {
            render: Some("/out/rendered.yaml".into()),
            render_count: 3,
            rendered: BTreeMap::from([("Bucket/b".to_string(), "/out/b.yaml".into())]),
            ..Default::default()
        };
        let tests = HashMap::from([
            ("first".to_string(), Some(outputs.clone())),
            ("my-id".to_string(), Some(outputs.clone())),
            ("early".to_string(), None),
        ]);
        let vars = Vars {
            repositories: Some(&repos),
            inputs: Some(&inputs),
            outputs: Some(&outputs),
            tests: Some(&tests),
        };
        let text = "{{ .Repositories.repo }} {{.Inputs.XR}} {{ .Outputs.RenderCount }} \
                    {{ index .Outputs.Rendered \"Bucket/b\" }} {{ .Tests.first.Outputs.Render }} \
                    __OPEN__index .Tests.first.Outputs.Render__CLOSE__";
        assert_eq!(
            vars.expand(text).unwrap(),
            "/r /in/xr.yaml 3 /out/b.yaml /out/rendered.yaml /out/rendered.yaml"
        );
        assert_eq!(
            vars.expand("{{ (index .Tests \"my-id\").Outputs.Render }}")
                .unwrap(),
            "/out/rendered.yaml"
        );
        let err = vars.expand("{{ .Tests.early.Outputs.XR }}").unwrap_err();
        assert!(
            err.contains("test early failed before its outputs"),
            "{err}"
        );
    }

    #[test]
    fn a_template_as_a_value_is_read_again_as_yaml_as_xprin_reads_it() {
        let outputs = Outputs {
            render_count: 3,
            ..Default::default()
        };
        let tests = HashMap::from([("first".to_string(), Some(outputs))]);
        let vars = Vars {
            tests: Some(&tests),
            ..Default::default()
        };
        let placeholder = to_placeholders("{{ .Tests.first.Outputs.RenderCount }}");
        let expand = |v: Value| vars.expand_value(&v).unwrap();
        assert_eq!(
            expand(Value::String(placeholder.clone())),
            serde_json::json!(3)
        );
        assert_eq!(
            expand(Value::String(format!("n-{placeholder}"))),
            serde_json::json!("n-3")
        );
        assert_eq!(expand(serde_json::json!("3")), serde_json::json!("3"));
    }

    #[test]
    fn a_variable_that_is_not_there_is_an_error_naming_it() {
        let vars = Vars::default();
        let err = vars
            .expand("echo {{ .Tests.nope.Outputs.XR }}")
            .unwrap_err();
        assert!(
            err.contains(".Tests.nope.Outputs.XR") && err.contains("no earlier test has id"),
            "{err}"
        );
        let err = vars.expand("{{ .Outputs.XR }}").unwrap_err();
        assert!(err.contains("post-test hooks only"), "{err}");
    }
}
