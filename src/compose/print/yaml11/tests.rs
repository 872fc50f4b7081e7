//! go-yaml v2's quoting, and a YAML 1.1 reader (PyYAML) reading it back.
use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::json;

use super::*;

/// Strings go-yaml v2 reads back as another type: each one quoted.
const NOT_STRINGS: &[&str] = &[
    "2023-11-03T09:07:31Z",
    "2024-01-01",
    "20240101",
    "2024-1-2 3:04:05.5",
    "2001-12-14t21:59:43.10-05:00",
    "yes",
    "No",
    "on",
    "OFF",
    "y",
    "n",
    "~",
    "null",
    "",
    "true",
    "0x1F",
    "1e3",
    "0777",
    "0o17",
    "0b101",
    "-0b1",
    "1_000",
    "089",
    "+12",
    "-3.5",
    ".5",
    ".inf",
    "-.Inf",
    ".NaN",
    "1:20",
    "190:20:30.15",
    "99999999999999999999999",
];

/// Of [`STRINGS`], those PyYAML would misread plain: quoted beyond go-yaml.
const PYYAML_ONLY: &[&str] = &[
    "2023-02-29",
    "2024-13-01",
    "2024-01-01T25:00:00Z",
    "<<",
    "=",
    "._5",
];

/// Strings go-yaml v2 leaves plain.
const STRINGS: &[&str] = &[
    "=",
    "._5",
    "<<",
    "2024-13-01",
    "2023-02-29",
    "2024-01-01T25:00:00Z",
    "yess",
    "On-call",
    "0x",
    "1e",
    "1.2.3",
    "1:60",
    "v1",
    "eu-west-1",
    "bucket-1",
];

#[test]
fn strings_go_yaml_reads_as_other_types_are_double_quoted_and_no_others() {
    for s in NOT_STRINGS {
        assert!(quotes(s), "quoted: {s:?}");
        let text = to_string(&json!({ "k": s })).unwrap();
        assert_eq!(text, format!("k: \"{s}\"\n"), "{s:?}");
    }
    for s in STRINGS {
        assert!(!go_yaml_quotes(s), "go-yaml leaves {s:?} plain");
        assert_eq!(quotes(s), PYYAML_ONLY.contains(s), "{s:?}");
    }
}

#[test]
fn keys_are_quoted_too_and_keep_their_order() {
    let text = to_string(&json!({"a": 1, "on": "off", "z": ["yes", "x"]})).unwrap();
    assert_eq!(text, "a: 1\n\"on\": \"off\"\nz:\n- \"yes\"\n- x\n");
}

/// Reads `text` with PyYAML's safe_load_all (a YAML 1.1 reader, as go-yaml
/// v2 and Python's Kubernetes tooling) and prints it as JSON, a non-JSON
/// value (a datetime, say) as `<type value>`.
fn pyyaml(text: &str) -> serde_json::Value {
    let python = std::env::var("XFN_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(&python)
        .args([
            "-c",
            "import json, sys, yaml\n\
             docs = list(yaml.safe_load_all(sys.stdin))\n\
             print(json.dumps(docs, default=lambda o: f'<{type(o).__name__} {o}>'))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{python} (with PyYAML: scripts/setup.sh) cannot run: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{python} -c 'import yaml' failed (PyYAML: scripts/setup.sh installs python3-yaml)"
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_yaml_1_1_reader_reads_every_string_of_the_render_output_back_as_that_string() {
    let mut object = serde_json::Map::new();
    for (i, s) in NOT_STRINGS.iter().chain(STRINGS).enumerate() {
        object.insert(format!("v{i:02}"), json!(s));
        object.insert(s.to_string(), json!(i));
    }
    let object = json!({
        "status": {"conditions": [{"type": "Ready", "lastTransitionTime": "2023-11-03T09:07:31Z"}]},
        "data": object,
    });
    let stream =
        crate::compose::print::output::to_yaml_stream(std::slice::from_ref(&object)).unwrap();
    assert_eq!(pyyaml(&stream), json!([object]), "{stream}");
}

#[test]
fn map_keys_are_written_in_go_yaml_v2s_order() {
    // As sigs.k8s.io/yaml v1.4.0's JSONToYAML printed these keys (go
    // 1.26, its goyaml.v2 sorter), function-pythonic's context hashes among
    // them.
    let keys = [
        "",
        "-y",
        "_x",
        "1",
        "9",
        "09",
        "10",
        "572124335820673165",
        "3209049587904145910",
        "99999999999999999999",
        "B",
        "a",
        "a1b",
        "a01",
        "a9",
        "a09",
        "a009",
        "a10",
        "x-1",
        "x.1",
        "x_1",
        "z",
        "é",
    ];
    let mut object = serde_json::Map::new();
    for key in keys.iter().rev() {
        object.insert(key.to_string(), json!(1));
    }
    let text = to_string(&Value::Object(object)).unwrap();
    let printed: Vec<String> = text
        .lines()
        .map(|line| {
            line.rsplit_once(": ")
                .unwrap()
                .0
                .trim_matches('"')
                .to_string()
        })
        .collect();
    assert_eq!(printed, keys);
}
