//! `xfn validate` against a hostile CRD author (or a provider's generated
//! CRDs) and oversized inputs: each attack ends, within bounded memory, as
//! a refusal or a failure — never a pass — and what the API server accepts
//! still runs.
//!
//! Measured before the bounds (debug build): the 250-term concatenation on a
//! 1 MiB string passed after 55 s and 569 MiB; `map(x, self + self)` over
//! 400 items passed after 21 s; `map(x, x)` over 10,000 items took 15.8 s
//! (quadratic); 3,000 rules on an object of 100,000 items 103 s; a 60 MiB
//! input 75 s and 2.2 GiB.
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use xfn_testkit::child::{measure, output_within, Measured};
use xfn_testkit::program::{xfn_binary, xfn_command};

/// A CRD of `ex.org/v1` `Thing` whose `spec` has `spec_schema`.
fn crd(spec_schema: Value) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.ex.org"},
        "spec": {"group": "ex.org", "names": {"kind": "Thing", "plural": "things"},
            "scope": "Cluster", "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "properties": {"spec": spec_schema}}}}]}})
}

/// `crd.json` and `thing.json` (a `Thing` with `spec`) in `dir`.
fn inputs(dir: &Path, spec_schema: Value, spec: Value) -> [std::path::PathBuf; 2] {
    let thing = json!({"apiVersion": "ex.org/v1", "kind": "Thing",
        "metadata": {"name": "t"}, "spec": spec});
    let paths = [dir.join("crd.json"), dir.join("thing.json")];
    std::fs::write(&paths[0], crd(spec_schema).to_string()).unwrap();
    std::fs::write(&paths[1], thing.to_string()).unwrap();
    paths
}

/// `xfn validate` on a `Thing` with `spec`, measured.
fn validate(spec_schema: Value, spec: Value) -> Measured {
    let dir = tempfile::tempdir().unwrap();
    let [crd, thing] = inputs(dir.path(), spec_schema, spec);
    measure(
        xfn_command().arg("validate").arg(&crd).arg(&thing),
        &xfn_binary(),
    )
}

/// The field `f` of `spec` has `schema`.
fn field(schema: Value) -> Value {
    json!({"type": "object", "properties": {"f": schema}})
}

/// The validation failed (exit 1) with a line containing `cause`, peaking
/// under `peak_max` bytes.
fn assert_fails(measured: &Measured, cause: &str, peak_max: u64) {
    assert_eq!(
        measured.status.code(),
        Some(1),
        "must fail: {}{}",
        measured.stdout,
        measured.stderr
    );
    assert!(
        measured.stdout.contains(cause),
        "no {cause:?} in {}",
        measured.stdout
    );
    assert!(
        measured.peak_rss < peak_max,
        "peak memory {} MiB",
        measured.peak_rss >> 20
    );
}

const STOPPED: &str = "'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit";

#[test]
fn a_chain_of_concatenations_on_a_megabyte_string_is_refused_by_its_estimated_cost() {
    // Estimated at its node count (no comprehension), each `+` copied a
    // string one more MiB long: 250 of them built 31 GiB of copies.
    let rule = format!("size({}) > 0", vec!["self"; 250].join(" + "));
    let measured = validate(
        field(json!({"type": "string", "x-kubernetes-validations": [{"rule": rule}]})),
        json!({"f": "a".repeat(1 << 20)}),
    );
    assert_fails(
        &measured,
        "estimated rule cost exceeds budget by factor of 3289.8",
        128 << 20,
    );
}

#[test]
fn a_concatenation_in_a_loop_the_estimate_misses_is_stopped_by_the_runtime_budget() {
    // The estimate counts a loop variable as small; each of these is a
    // 100 KiB string, concatenated with itself ten times per item (20 of
    // them: the resource stays under the API server's 3 MiB).
    let rule = format!("self.all(s, size({}) > 0)", ["s"; 10].join(" + "));
    let measured = validate(
        field(json!({"type": "array", "items": {"type": "string"},
            "x-kubernetes-validations": [{"rule": rule}]})),
        json!({"f": vec!["a".repeat(100 << 10); 20]}),
    );
    assert_fails(&measured, STOPPED, 128 << 20);
}

#[test]
fn a_map_building_a_list_of_self_for_each_item_is_stopped_by_the_runtime_budget() {
    // Cubic in the crate's `map`: each of 600 steps copied the accumulated
    // lists of 1,200 items.
    let measured = validate(
        field(json!({"type": "array", "items": {"type": "integer"},
            "x-kubernetes-validations": [{"rule": "size(self.map(x, self + self)) > 0"}]})),
        json!({"f": (0..600).collect::<Vec<_>>()}),
    );
    assert_fails(&measured, STOPPED, 128 << 20);
}

#[test]
fn the_per_object_budget_stops_the_rules_of_a_resource_once_spent() {
    // Each rule copies the 100,000-item list (its cost about 100,000), under
    // the per-call limit; 100 of them spend the resource's 10,000,000.
    let rules: Vec<Value> = (0..300)
        .map(|i| json!({"rule": format!("size(self.items) != {i}")}))
        .collect();
    let measured = validate(
        json!({"type": "object", "x-kubernetes-validations": rules,
            "properties": {"items": {"type": "array", "items": {"type": "integer"}}}}),
        json!({"items": (0..100_000).collect::<Vec<_>>()}),
    );
    assert_fails(
        &measured,
        "validation failed due to running out of cost budget, no further validation rules will be run",
        256 << 20,
    );
    assert_eq!(
        measured.stdout.matches("[x]").count(),
        1,
        "{}",
        measured.stdout
    );
}

/// Runs `xfn validate` on a `Thing` with `spec` to its end, failing the
/// test past `limit`.
fn validate_within(spec_schema: Value, spec: Value, limit: Duration) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let [crd, thing] = inputs(dir.path(), spec_schema, spec);
    let out = output_within(
        xfn_command().arg("validate").arg(&crd).arg(&thing),
        "xfn validate",
        limit,
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn a_map_over_fifty_thousand_items_is_linear_and_passes() {
    // The crate's `map` copies its accumulated list at every item: 50,000
    // items took ~6 minutes (10,000 took 15.8 s, quadratic); linear, it
    // takes under a second. The deadline only turns "never" into a failure.
    let (code, stdout) = validate_within(
        // maxItems: unbounded, the API server refuses the rule's estimate.
        field(
            json!({"type": "array", "items": {"type": "integer"}, "maxItems": 50_000,
            "x-kubernetes-validations": [{"rule": "self.map(x, x * 2).filter(y, y % 4 == 0).size() == 25000"}]}),
        ),
        json!({"f": (0..50_000).collect::<Vec<_>>()}),
        Duration::from_secs(120),
    );
    assert_eq!(code, Some(0), "{stdout}");
}

#[test]
fn three_thousand_rules_on_an_object_of_a_hundred_thousand_items_convert_it_once() {
    // Each rule converted and sized the whole object: 103 s; once per
    // node, about a second. The deadline only turns "never" into a failure.
    let rules: Vec<Value> = (0..3000)
        .map(|i| json!({"rule": format!("self.n != {i}")}))
        .collect();
    let (code, stdout) = validate_within(
        json!({"type": "object", "x-kubernetes-validations": rules,
            "properties": {"n": {"type": "integer"},
                "items": {"type": "array", "items": {"type": "integer"}}}}),
        json!({"n": -1, "items": (0..100_000).collect::<Vec<_>>()}),
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "{stdout}");
}

#[test]
fn a_pattern_has_go_semantics_so_w_is_ascii_and_its_size_is_go_s() {
    let word = field(json!({"type": "string", "pattern": r"^\w+$"}));
    let measured = validate(word.clone(), json!({"f": "café"}));
    assert_fails(&measured, "must match the pattern", 128 << 20);
    assert!(validate(word, json!({"f": "cafe_1"})).status.success());
    // Unicode `\w` compiled this over 1 MiB; Go's ASCII one is small.
    let dotted = field(json!({"type": "string", "pattern": r"^(\w{1,30}\.){0,8}\w{1,30}$"}));
    let measured = validate(dotted.clone(), json!({"f": "a.b.c"}));
    assert!(measured.status.success(), "{}", measured.stdout);
    assert_fails(
        &validate(dotted, json!({"f": "é.b"})),
        "must match the pattern",
        128 << 20,
    );
}

#[test]
fn an_input_file_over_max_input_bytes_is_refused_before_it_is_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let [crd, _] = inputs(
        dir.path(),
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        json!({}),
    );
    let big = dir.path().join("big.yaml");
    // Resources of ~30 KiB each (the API server takes up to 3 MiB), 9 MiB.
    let mut text = String::new();
    let mut i = 0;
    while text.len() <= 9 << 20 {
        if i % 1000 == 0 {
            text.push_str(&format!(
                "---\napiVersion: ex.org/v1\nkind: Thing\nmetadata: {{name: t{i}}}\nspec:\n  items:\n"
            ));
        }
        text.push_str(&format!("  - {{name: item{i}, value: {i}}}\n"));
        i += 1;
    }
    std::fs::write(&big, &text).unwrap();
    let measured = measure(
        xfn_command().arg("validate").arg(&crd).arg(&big),
        &xfn_binary(),
    );
    assert!(!measured.status.success(), "{}", measured.stdout);
    assert!(
        measured
            .stderr
            .contains("is larger than 8388608 bytes (--max-input-bytes)"),
        "{}",
        measured.stderr
    );
    // Refused before parsing: the file is not held ~40 times over.
    assert!(
        measured.peak_rss < 96 << 20,
        "peak {} MiB",
        measured.peak_rss >> 20
    );
    // Raised, it is read.
    let measured = measure(
        xfn_command()
            .args(["validate", "--max-input-bytes", "10Mi"])
            .arg(&crd)
            .arg(&big),
        &xfn_binary(),
    );
    assert!(
        measured.status.success(),
        "{}{}",
        measured.stdout,
        measured.stderr
    );
}

#[test]
fn the_equality_of_two_large_sets_is_stopped_by_the_runtime_budget() {
    // Set equality compares every pair of items: 20,000 × 20,000 is charged
    // 400,000,000, past the per-call limit, and stops at once.
    let items: Vec<String> = (0..20_000).map(|i| format!("i{i}")).collect();
    let set =
        json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}});
    let measured = validate(
        json!({"type": "object", "properties": {"a": set.clone(), "b": set},
            "x-kubernetes-validations": [{"rule": "self.a == self.b"}]}),
        json!({"a": items.clone(), "b": items}),
    );
    assert_fails(&measured, STOPPED, 128 << 20);
}

#[test]
fn a_set_and_a_list_map_as_large_as_a_request_allows_are_checked_in_linear_time() {
    // 400,000 integers (2.6 MiB, under the API server's 3 MiB request),
    // 200,000 list-map items (2.4 MiB), each item compared with every
    // earlier one: 100,000 of either took 161 s and over 300 s (debug
    // build); hashed, about a second. The deadline only turns "never" into
    // a failure; the repeat at the end is still found.
    let set =
        json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "integer"}});
    let mut items: Vec<Value> = (0..400_000).map(|n| json!(n)).collect();
    items.push(json!(7));
    let (code, stdout) = validate_within(field(set), json!({"f": items}), Duration::from_secs(120));
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("spec.f[400000]: Duplicate value: 7"),
        "{stdout}"
    );
    let map = json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
        "items": {"type": "object", "properties": {"k": {"type": "integer"}}}});
    let mut items: Vec<Value> = (0..200_000).map(|k| json!({"k": k})).collect();
    items.push(json!({"k": 9}));
    let (code, stdout) = validate_within(field(map), json!({"f": items}), Duration::from_secs(120));
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("spec.f[200000]: Duplicate value: {k=9}"),
        "{stdout}"
    );
}

#[test]
fn a_rule_whose_estimated_cost_the_schema_leaves_unbounded_refuses_the_crd() {
    // Without maxItems and maxLength the API server estimates a 3 MiB
    // list of 3 MiB strings: over 100 times the per-rule limit; bounded,
    // the same rule is admitted. Before: no refusal, the resource passed.
    let rule = json!([{"rule": "self.all(x, x.matches('^[a-z]*$'))"}]);
    let measured = validate(
        field(
            json!({"type": "array", "items": {"type": "string"}, "x-kubernetes-validations": rule}),
        ),
        json!({"f": ["abc"]}),
    );
    assert_fails(
        &measured,
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[f].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)",
        128 << 20,
    );
    let bounded = validate(
        field(
            json!({"type": "array", "maxItems": 10, "x-kubernetes-validations": rule,
            "items": {"type": "string", "maxLength": 64}}),
        ),
        json!({"f": ["abc"]}),
    );
    assert!(bounded.status.success(), "{}", bounded.stdout);
}

#[test]
fn rules_whose_estimated_costs_add_up_past_the_crd_limit_refuse_the_crd() {
    // Each rule about 6,000,000 (under the per-rule 10,000,000); 20 of
    // them 120,000,000, over the per-CRD 100,000,000.
    let rules: Vec<Value> = (0..20)
        .map(|i| json!({"rule": format!("self.all(x, x.startsWith('{i}'))")}))
        .collect();
    let measured = validate(
        field(
            json!({"type": "array", "maxItems": 1_200_000, "x-kubernetes-validations": rules,
            "items": {"type": "string", "maxLength": 1}}),
        ),
        json!({"f": []}),
    );
    assert_fails(
        &measured,
        "spec.versions[0].schema.openAPIV3Schema: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of 1.200000x",
        128 << 20,
    );
    assert!(
        !measured.stdout.contains("estimated rule cost exceeds"),
        "{}",
        measured.stdout
    );
}
