//! Kubernetes' own CEL tables, held against `xfn validate`: every case of
//! tests/validate/cel/*.json (transcribed from kubernetes/kubernetes, each
//! file names its source) runs in one `xfn validate` call, one CRD and one
//! resource per group, its rules on the group's node. A case agrees when
//! xfn's verdict (pass, fail, skipped) and field path are the API
//! server's. Every disagreement must be listed in docs/validate.md's
//! "Exceptions to Kubernetes' tables" (with the reason), and every listed
//! one must still disagree: the test fails on either, and on any false
//! pass (a rule Kubernetes fails on a resource xfn passes), listed or
//! not. It
//! prints the agreement per library.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{json, Value};
use xfn_testkit::program::{repo_root, xfn_command};

/// What the API server (or xfn) says of one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Fail,
    Skipped,
}

/// One rule of one group.
struct Case {
    library: String,
    group: String,
    rule: String,
    expected: Verdict,
}

/// Every group of every table, in order, with the CRD kind it gets.
fn groups() -> Vec<Value> {
    let dir = repo_root().join("tests/validate/cel");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut groups = Vec::new();
    for file in files {
        let table: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        groups.extend(table["groups"].as_array().unwrap().iter().cloned());
    }
    groups
}

fn rules(group: &Value) -> Vec<(String, Verdict)> {
    let skipped = group["skipped"].as_bool().unwrap_or(false);
    let mut rules: Vec<(String, Verdict)> = group["valid"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let verdict = if skipped {
                Verdict::Skipped
            } else {
                Verdict::Pass
            };
            (r.as_str().unwrap().to_string(), verdict)
        })
        .collect();
    let mut errors: Vec<_> = group["errors"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    errors.sort();
    rules.extend(errors.into_iter().map(|r| (r, Verdict::Fail)));
    rules.dedup_by(|a, b| a.0 == b.0);
    rules
}

/// The CRD of group `n` (kind `CaseN`) and its resource.
fn crd_and_resource(n: usize, group: &Value) -> (Value, Value) {
    let validations: Vec<Value> = rules(group)
        .into_iter()
        .map(|(rule, _)| json!({ "rule": rule }))
        .collect();
    let mut node = group["schema"].clone();
    node["x-kubernetes-validations"] = Value::Array(validations);
    let root = group["root"].as_bool().unwrap_or(false);
    let (schema, mut resource) = if root {
        (node, group["object"].clone())
    } else {
        (
            json!({"type": "object", "properties": {"spec": node}}),
            json!({"metadata": {"name": format!("case{n}")}, "spec": group["object"]}),
        )
    };
    resource["apiVersion"] = json!("cases.k8s.test/v1");
    resource["kind"] = json!(format!("Case{n}"));
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("case{n}s.cases.k8s.test")},
        "spec": {"group": "cases.k8s.test", "scope": "Cluster",
            "names": {"kind": format!("Case{n}"), "plural": format!("case{n}s")},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": schema}}]}});
    (crd, resource)
}

/// `(group, rule)` of each exception docs/validate.md lists: the lines
/// ``- `RULE` in *GROUP* …`` of its "Exceptions to Kubernetes' tables".
fn listed_exceptions() -> BTreeSet<(String, String)> {
    let doc = std::fs::read_to_string(repo_root().join("docs/validate.md")).unwrap();
    let section = doc
        .split("### Exceptions to Kubernetes' tables")
        .nth(1)
        .expect("docs/validate.md has the exceptions section");
    let section = section.split("\n#").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("- `")?;
            let (rule, rest) = rest.split_once("` in *")?;
            let (group, _) = rest.split_once('*')?;
            Some((group.to_string(), rule.to_string()))
        })
        .collect()
}

fn write_stream(path: &Path, documents: &[Value]) {
    let text: Vec<String> = documents.iter().map(Value::to_string).collect();
    std::fs::write(path, text.join("\n---\n")).unwrap();
}

#[test]
fn kubernetes_cel_tables_agree_or_are_listed_as_exceptions() {
    let groups = groups();
    let mut crds = Vec::new();
    let mut resources = Vec::new();
    // A group with an old object (transition rules) is an update of it.
    let mut olds = Vec::new();
    let mut cases: Vec<(usize, Case)> = Vec::new();
    for (n, group) in groups.iter().enumerate() {
        let (crd, resource) = crd_and_resource(n, group);
        if let Some(old) = group.get("old") {
            let mut old_resource = resource.clone();
            let root = group["root"].as_bool().unwrap_or(false);
            if root {
                old_resource = old.clone();
                old_resource["apiVersion"] = resource["apiVersion"].clone();
                old_resource["kind"] = resource["kind"].clone();
            } else {
                old_resource["spec"] = old.clone();
            }
            olds.push(old_resource);
        }
        crds.push(crd);
        resources.push(resource);
        for (rule, expected) in rules(group) {
            cases.push((
                n,
                Case {
                    library: group["library"].as_str().unwrap().to_string(),
                    group: group["name"].as_str().unwrap().to_string(),
                    rule,
                    expected,
                },
            ));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    write_stream(&dir.path().join("crds.yaml"), &crds);
    write_stream(&dir.path().join("resources.yaml"), &resources);
    write_stream(&dir.path().join("old.yaml"), &olds);
    let out = xfn_command()
        .arg("validate")
        .arg("--old-resources")
        .arg(dir.path().join("old.yaml"))
        .arg(dir.path().join("crds.yaml"))
        .arg(dir.path().join("resources.yaml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The tables run rules without the API server's CRD checks; of those,
    // only the estimated cost refuses some (listed in docs/validate.md):
    // each such rule still gets its verdict, compared below.
    let refusals: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("[x] CustomResourceDefinition/"))
        .collect();
    assert!(
        refusals
            .iter()
            .all(|l| l.contains("exceeds budget by factor of")),
        "a CRD was refused: {stdout}"
    );
    for refusal in &refusals {
        eprintln!("{refusal}");
    }

    let listed = listed_exceptions();
    let mut agreement: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut unlisted = Vec::new();
    let mut false_passes = Vec::new();
    let mut disagreeing = BTreeSet::new();
    for (n, case) in &cases {
        let root = groups[*n]["root"].as_bool().unwrap_or(false);
        let expected_path = if root { "<root>" } else { "spec" };
        let rule_tag = format!("(rule: x-kubernetes-validations rule {:?})", case.rule);
        let failures: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with(&format!("[x] Case{n}/")) && l.ends_with(&rule_tag))
            .collect();
        let skipped = stdout.lines().any(|l| {
            l.starts_with(&format!("[!] Case{n}/"))
                && l.contains(&format!("transition rule {:?} skipped", case.rule))
        });
        let verdict = match (failures.is_empty(), skipped) {
            (false, _) => Verdict::Fail,
            (true, true) => Verdict::Skipped,
            (true, false) => Verdict::Pass,
        };
        let path_ok = failures
            .iter()
            .all(|l| l.contains(&format!(": {expected_path}: ")));
        let agrees = verdict == case.expected && path_ok;
        let entry = agreement.entry(case.library.clone()).or_default();
        entry.1 += 1;
        let key = (case.group.clone(), case.rule.clone());
        if agrees {
            entry.0 += 1;
        } else {
            // A rule the API server fails on a resource xfn passes whole:
            // never, listed or not. (A resource xfn refuses for a blocking
            // schema error runs no rule: no false pass.)
            let refused = stdout
                .lines()
                .any(|l| l.starts_with(&format!("[x] Case{n}/")));
            if case.expected == Verdict::Fail && verdict == Verdict::Pass && !refused {
                false_passes.push(format!("`{}` in *{}*", case.rule, case.group));
            }
            disagreeing.insert(key.clone());
            if !listed.contains(&key) {
                unlisted.push(format!(
                    "- `{}` in *{}*: Kubernetes {:?}, xfn {verdict:?}{}",
                    case.rule,
                    case.group,
                    case.expected,
                    failures
                        .first()
                        .map(|l| format!(" ({l})"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    let mut table = String::from("| library | agree | cases |\n|---|---|---|\n");
    let (mut agree_all, mut all) = (0, 0);
    for (library, (agree, total)) in &agreement {
        table.push_str(&format!("| {library} | {agree} | {total} |\n"));
        agree_all += agree;
        all += total;
    }
    table.push_str(&format!("| all | {agree_all} | {all} |\n"));
    eprintln!("{table}");
    assert!(
        false_passes.is_empty(),
        "false passes (Kubernetes fails, xfn passes): {false_passes:?}"
    );
    let stale: Vec<_> = listed.difference(&disagreeing).collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "{} disagreements not listed in docs/validate.md:\n{}\nlisted but agreeing now: {stale:?}",
        unlisted.len(),
        unlisted.join("\n")
    );
}
