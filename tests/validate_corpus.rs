//! The validate corpus: sets of extensions and resources in tests/validate/
//! (formats as kube-openapi checks them, Crossplane CLI's file handling,
//! function-patch-and-transform's rendered example, the original
//! valid/invalid pair), and `xfn validate`'s verdict on each resource, in
//! the shape of `crossplane resource validate -o json`'s, so the two can be
//! held side by side (peers.rs) and against each case's `expect`
//! annotation (here).
use std::path::{Path, PathBuf};

use serde_json::Value;
use xfn_testkit::peers::Verdict;
use xfn_testkit::xfn_command;

/// `tests/validate/NAME`.
pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/validate")
        .join(name)
}

/// `(extensions, resources)` of every set: each directory's `extensions/`
/// and its `cases.yaml` or `rendered.yaml`, and the original pair.
pub fn sets() -> Vec<(PathBuf, PathBuf)> {
    let mut sets = vec![
        (data("extensions"), data("valid.yaml")),
        (data("extensions"), data("invalid.yaml")),
    ];
    for (dir, resources) in [
        ("formats", "cases.yaml"),
        ("files", "cases.yaml"),
        ("pat", "rendered.yaml"),
    ] {
        sets.push((data(dir).join("extensions"), data(dir).join(resources)));
    }
    sets
}

/// `xfn validate`'s exit code, stdout, and verdicts (one per resource, in
/// order: `valid`, `invalid` or `missingSchema`, named as the CLI names
/// them: a composed resource without a name by its
/// `crossplane.io/composition-resource-name`).
pub fn xfn_validate(
    extensions: &Path,
    resources: &Path,
    flags: &[&str],
) -> (Option<i32>, String, Vec<Verdict>) {
    let out = xfn_command()
        .arg("validate")
        .args(flags)
        .arg(extensions)
        .arg(resources)
        .output()
        .expect("run xfn validate");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut verdicts: Vec<(String, Verdict)> = Vec::new();
    for line in stdout.lines() {
        let (status, rest) = if let Some(rest) = line.strip_prefix("[x] ") {
            ("invalid", rest)
        } else if let Some(rest) = line.strip_prefix("[✓] ") {
            ("valid", rest)
        } else if let Some(rest) = line.strip_prefix("[!] could not find a CRD or XRD for ") {
            ("missingSchema", rest)
        } else {
            continue;
        };
        // `Kind/name (apiVersion, FILE, document N)…`
        let Some((resource, place)) = rest.split_once(" (") else {
            continue;
        };
        let Some((api_version, place)) = place.split_once(", ") else {
            continue;
        };
        let Some(document) = place.split(')').next().filter(|p| p.contains("document")) else {
            continue; // an extension's error, not a resource's
        };
        let (kind, name) = resource.split_once('/').unwrap_or((resource, ""));
        let name = name
            .strip_prefix("(composition-resource-name ")
            .and_then(|n| n.strip_suffix(')'))
            .unwrap_or(name);
        let verdict = (api_version.into(), kind.into(), name.into(), status.into());
        if verdicts.last().map(|(d, _)| d.as_str()) != Some(document) {
            verdicts.push((document.to_string(), verdict));
        }
    }
    (
        out.status.code(),
        stdout,
        verdicts.into_iter().map(|(_, v)| v).collect(),
    )
}

/// Each resource's `expect` annotation in `cases`, in order.
fn expectations(cases: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(cases).expect("read the cases");
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let case: Value = serde_json::from_str(l).expect("a case is one JSON line");
            let meta = &case["metadata"];
            (
                meta["name"].as_str().unwrap_or_default().to_string(),
                meta["annotations"]["expect"]
                    .as_str()
                    .unwrap_or_default()
                    .replace("missing", "missingSchema"),
            )
        })
        .collect()
}

#[test]
fn every_format_and_file_handling_case_gets_the_verdict_its_expect_annotation_names() {
    for dir in ["formats", "files"] {
        let cases = data(dir).join("cases.yaml");
        let expected = expectations(&cases);
        assert!(expected.len() > 30, "{dir}: {} cases", expected.len());
        let (code, stdout, verdicts) = xfn_validate(&data(dir).join("extensions"), &cases, &[]);
        assert_eq!(code, Some(1), "{dir}: some cases are invalid\n{stdout}");
        let got: Vec<(String, String)> = verdicts.into_iter().map(|v| (v.2, v.3)).collect();
        let wrong: Vec<String> = expected
            .iter()
            .zip(&got)
            .filter(|(e, g)| e != g)
            .map(|(e, g)| format!("{}: expected {}, got {}", e.0, e.1, g.1))
            .collect();
        assert_eq!(got.len(), expected.len(), "{dir}\n{stdout}");
        assert!(wrong.is_empty(), "{dir}:\n{}\n{stdout}", wrong.join("\n"));
    }
}
