//! `xfn validate`: exit codes, the report's lines, stdin, and the bounds on
//! what it reads.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use xfn_testkit::xfn_command;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/validate")
        .join(name)
}

fn validate(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out: Output = xfn_command().arg("validate").args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn rendered_output_that_fits_its_crds_and_xrd_passes_with_exit_0() {
    let (code, stdout, stderr) = validate(&[
        data("extensions").as_os_str(),
        data("valid.yaml").as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("[✓] XStore/shop (example.org/v1, "),
        "{stdout}"
    );
    assert!(
        stdout.contains("valid.yaml, document 1) validated successfully"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[✓] Bucket/shop-data (storage.example.org/v1beta1, "),
        "{stdout}"
    );
    assert!(
        stdout
            .ends_with("Total 2 resources: 0 missing schemas, 2 success cases, 0 failure cases\n"),
        "{stdout}"
    );
}

#[test]
fn each_error_names_the_resource_its_document_the_field_and_the_rule_and_exits_1() {
    let (code, stdout, stderr) = validate(&[
        data("extensions").as_os_str(),
        data("invalid.yaml").as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    let file = data("invalid.yaml").display().to_string();
    for line in [
        format!("[x] XStore/shop (example.org/v1, {file}, document 1): spec.buckets: Invalid value: 9: must be less than or equal to 5 (rule: maximum)"),
        format!("[x] Bucket/(composition-resource-name data) (storage.example.org/v1beta1, {file}, document 2): spec.forProvider: Invalid value: \"object\": objectLock needs versioning (rule: x-kubernetes-validations rule \"!has(self.versioning) || self.versioning || !has(self.objectLock)\")"),
        format!("[x] Bucket/logs (storage.example.org/v1beta1, {file}, document 3): spec.forProvider.region: Unsupported value: \"mars-1\": supported values: \"eu-west-1\", \"us-east-1\" (rule: enum)"),
        format!("[x] Bucket/logs (storage.example.org/v1beta1, {file}, document 3): spec.forProvider.tag: Unknown field: \"tag\" is not in the schema (the API server would prune it) (rule: unknown field)"),
        format!("[!] could not find a CRD or XRD for Dashboard/no-schema (monitoring.example.org/v1, {file}, document 4)"),
        "Total 4 resources: 1 missing schemas, 0 success cases, 3 failure cases".to_string(),
    ] {
        assert!(stdout.contains(&line), "no line\n{line}\nin\n{stdout}");
    }
}

#[test]
fn a_missing_schema_is_a_warning_unless_error_on_missing_schemas_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let resource = dir.path().join("dashboard.yaml");
    std::fs::write(
        &resource,
        "apiVersion: monitoring.example.org/v1\nkind: Dashboard\nmetadata: {name: d}\n",
    )
    .unwrap();
    let extensions = data("extensions");
    let (code, stdout, _) = validate(&[extensions.as_os_str(), resource.as_os_str()]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("1 missing schemas"), "{stdout}");
    let (code, stdout, _) = validate(&[
        "--error-on-missing-schemas".as_ref(),
        extensions.as_os_str(),
        resource.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{stdout}");
}

#[test]
fn resources_are_read_from_stdin_and_extensions_from_a_comma_separated_list() {
    let extensions = format!(
        "{},{}",
        data("extensions/crd.yaml").display(),
        data("extensions/xrd.yaml").display()
    );
    let mut child = xfn_command()
        .args(["validate", &extensions, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let text = std::fs::read(data("valid.yaml")).unwrap();
    child.stdin.take().unwrap().write_all(&text).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("(example.org/v1, -, document 1) validated successfully"),
        "{stdout}"
    );
}

/// As Crossplane's CLI (kong, cmd/crossplane/validate/cmd.go:75–89):
/// resources are a comma-separated list too, a flag given twice is no
/// error, and a third argument is.
#[test]
fn flags_repeat_and_both_arguments_are_comma_separated_lists_as_the_cli_takes_them() {
    let valid = data("valid.yaml").display().to_string();
    let (code, stdout, stderr) = validate(&[
        "--skip-success-results".as_ref(),
        "--skip-success-results".as_ref(),
        "--error-on-missing-schemas".as_ref(),
        "--error-on-missing-schemas".as_ref(),
        "-v".as_ref(),
        "--verbose".as_ref(),
        "--max-input-bytes=1Ki".as_ref(),
        "--max-input-bytes=8Mi".as_ref(),
        format!(
            "{},{}",
            data("extensions/crd.yaml").display(),
            data("extensions/xrd.yaml").display()
        )
        .as_ref(),
        format!("{valid},{valid}").as_ref(),
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(!stdout.contains("[✓]"), "{stdout}");
    assert!(
        stdout
            .ends_with("Total 4 resources: 0 missing schemas, 4 success cases, 0 failure cases\n"),
        "the last --max-input-bytes wins, and both files are read: {stdout}{stderr}"
    );

    let (code, _, stderr) = validate(&[
        data("extensions").as_os_str(),
        valid.as_ref(),
        valid.as_ref(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unexpected argument"), "{stderr}");
}

#[test]
fn stdin_named_twice_is_refused_as_the_cli_refuses_it() {
    let (code, stdout, stderr) = validate(&["-".as_ref(), "-".as_ref()]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("cannot use stdin for both extensions and resources"),
        "{stderr}"
    );
}

#[test]
fn a_resource_file_nested_past_the_bound_is_refused_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let resource = dir.path().join("deep.yaml");
    std::fs::write(&resource, format!("a: {}", "[".repeat(100_000))).unwrap();
    let (code, stdout, stderr) = validate(&[data("extensions").as_os_str(), resource.as_os_str()]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("cannot read the resources in"), "{stderr}");
    assert!(
        stderr.contains("nested more than 64 levels deep"),
        "{stderr}"
    );
}

#[test]
fn a_composition_among_the_extensions_is_skipped_and_verbose_says_so() {
    let extensions = data("files/extensions");
    let resource = data("files/cases.yaml");
    let (_, stdout, _) = validate(&[extensions.as_os_str(), resource.as_os_str()]);
    assert!(!stdout.contains("Composition"), "{stdout}");
    let (_, stdout, _) = validate(&["-v".as_ref(), extensions.as_os_str(), resource.as_os_str()]);
    assert!(
        stdout.contains(&format!(
            "[!] skipped 1 documents among the extensions that are neither CRDs nor XRDs: \
             Composition/xnameds (apiextensions.crossplane.io/v1, \
             {}/composition.yaml, document 1)",
            extensions.display()
        )),
        "{stdout}"
    );
}

#[test]
fn a_composition_beside_its_xrd_exits_0_when_the_resources_are_valid() {
    let (code, stdout, stderr) = validate(&[
        data("pat/extensions").as_os_str(),
        data("pat/rendered.yaml").as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout
            .ends_with("Total 3 resources: 1 missing schemas, 2 success cases, 0 failure cases\n"),
        "{stdout}"
    );
}

#[test]
fn a_built_in_kind_is_decoded_strictly_against_kubernetes_published_schema() {
    let dir = tempfile::tempdir().unwrap();
    let resource = dir.path().join("secret.yaml");
    std::fs::write(
        &resource,
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {password: not base64!}\n",
    )
    .unwrap();
    let (code, stdout, _) = validate(&[data("extensions").as_os_str(), resource.as_os_str()]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains(
            "data[password]: Invalid value: \"not base64!\": cannot be decoded into the \
             built-in type's base64 []byte field (rule: built-in schema)"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("0 missing schemas"), "{stdout}");
}

#[test]
fn old_resources_make_transition_rules_run_and_ratchet_what_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let crd = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
      "metadata": {"name": "things.ex.org"},
      "spec": {"group": "ex.org", "names": {"kind": "Thing", "plural": "things"}, "scope": "Namespaced",
        "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
          "type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": "self.replicas >= oldSelf.replicas", "message": "replicas may not decrease"}],
            "properties": {"replicas": {"type": "integer"}, "zone": {"type": "string", "maxLength": 2}}}}}}}]}}"#;
    let thing = |replicas: i64, zone: &str| {
        format!(
            r#"{{"apiVersion": "ex.org/v1", "kind": "Thing", "metadata": {{"name": "t", "namespace": "n"}},
              "spec": {{"replicas": {replicas}, "zone": "{zone}"}}}}"#
        )
    };
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let crd = write("crd.json", crd);
    let old = write("old.json", &thing(3, "eu-west"));
    // A create: the transition rule is skipped; with the long zone, an
    // error after which the API server runs no rule.
    let short = write("short.json", &thing(2, "eu"));
    let (code, stdout, _) = validate(&[crd.as_os_str(), short.as_os_str()]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("transition rule \"self.replicas >= oldSelf.replicas\" skipped"),
        "{stdout}"
    );
    let lower = write("lower.json", &thing(2, "eu-west"));
    let (code, stdout, _) = validate(&[crd.as_os_str(), lower.as_os_str()]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("spec.zone: Too long"), "{stdout}");
    assert!(
        stdout.contains("some validation rules were not checked because the object was invalid"),
        "{stdout}"
    );
    // An update of old.json: the rule runs; the unchanged zone is ratcheted.
    let flag = std::ffi::OsStr::new("--old-resources");
    let (code, stdout, _) = validate(&[flag, old.as_os_str(), crd.as_os_str(), lower.as_os_str()]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("spec: Invalid value: \"object\": replicas may not decrease"),
        "{stdout}"
    );
    assert!(!stdout.contains("Too long"), "{stdout}");
    let higher = write("higher.json", &thing(4, "eu-west"));
    let (code, stdout, _) = validate(&[flag, old.as_os_str(), crd.as_os_str(), higher.as_os_str()]);
    assert_eq!(code, Some(0), "{stdout}");
}
