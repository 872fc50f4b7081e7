//! Each schema keyword and CEL rule, a passing and a failing case; the
//! failing ones show the message a user gets.
use serde_json::{json, Value};

use super::Validator;

/// A CRD of `example.org/v1` `Widget` whose `spec` has `spec_schema`.
fn crd(spec_schema: Value) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.org"},
        "spec": {"group": "example.org", "names": {"kind": "Widget", "plural": "widgets"},
            "scope": "Namespaced", "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "properties": {"spec": spec_schema}}}}]}})
}

fn widget(spec: Value) -> Value {
    json!({"apiVersion": "example.org/v1", "kind": "Widget",
        "metadata": {"name": "w", "namespace": "default", "labels": {"a": "b"}}, "spec": spec})
}

/// The errors of a Widget with `spec` against a `spec` of `spec_schema`.
fn errors(spec_schema: Value, spec: Value) -> Vec<String> {
    Validator::default().validate(&[crd(spec_schema)], &[widget(spec)])
}

/// `field`'s schema is `field_schema`: the errors of `{field: value}`.
fn field(field_schema: Value, value: Value) -> Vec<String> {
    errors(
        json!({"type": "object", "properties": {"f": field_schema}}),
        json!({"f": value}),
    )
}

/// Exactly one error, containing each of `parts`.
fn one_error(errors: Vec<String>, parts: &[&str]) {
    assert_eq!(errors.len(), 1, "{errors:#?}");
    for part in parts {
        assert!(errors[0].contains(part), "{:?} lacks {part:?}", errors[0]);
    }
}

const WIDGET: &str = "Widget/w (example.org/v1, document 1)";

#[test]
fn a_wrong_type_is_an_error_naming_resource_path_and_rule() {
    assert!(field(json!({"type": "integer"}), json!(3)).is_empty());
    assert!(field(json!({"type": "number"}), json!(3.5)).is_empty());
    assert!(field(json!({"type": "boolean"}), json!(true)).is_empty());
    one_error(
        field(json!({"type": "integer"}), json!("3")),
        &[
            WIDGET,
            ": spec.f: ",
            "must be of type integer, not string",
            "(rule: type)",
        ],
    );
    one_error(
        field(json!({"type": "integer"}), json!(3.5)),
        &["must be of type integer, not number"],
    );
    one_error(
        field(json!({"type": "array"}), json!({})),
        &["must be of type array, not object"],
    );
}

#[test]
fn required_fields_must_be_present() {
    let schema = json!({"type": "object", "required": ["size"], "properties": {"size": {"type": "integer"}}});
    assert!(errors(schema.clone(), json!({"size": 1})).is_empty());
    one_error(
        errors(schema, json!({})),
        &["spec.size: Required value", "(rule: required)"],
    );
}

#[test]
fn a_value_outside_the_enum_is_unsupported() {
    let schema = json!({"type": "string", "enum": ["small", "large"]});
    assert!(field(schema.clone(), json!("small")).is_empty());
    one_error(
        field(schema, json!("huge")),
        &[
            "spec.f: Unsupported value: \"huge\": supported values: \"small\", \"large\"",
            "(rule: enum)",
        ],
    );
}

#[test]
fn formats_the_api_server_checks_are_checked() {
    for (format, good, bad) in [
        ("date-time", "2024-02-29T10:00:00Z", "2023-02-29T10:00:00Z"),
        ("date", "2024-01-31", "2024-13-01"),
        ("byte", "aGVsbG8=", "not base64!"),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567"),
        (
            "uuid4",
            "123e4567-e89b-42d3-a456-426614174000",
            "123e4567-e89b-12d3-a456-426614174000",
        ),
        ("ipv4", "10.0.0.1", "10.0.0.256"),
        ("ipv6", "fd00::1", "fd00::g"),
        ("cidr", "10.0.0.0/8", "10.0.0.0/33"),
        ("hostname", "db.example.org", "-db.example.org"),
        ("email", "a@example.org", "a.example.org"),
        ("mac", "00:1a:2b:3c:4d:5e", "00:1a:2b"),
        ("uri", "https://example.org/x", "example org"),
        ("hexcolor", "#ff00aa", "#ff00a"),
        ("duration", "1h30m", "an hour"),
    ] {
        let schema = json!({"type": "string", "format": format});
        assert!(
            field(schema.clone(), json!(good)).is_empty(),
            "{format}: {good}"
        );
        one_error(
            field(schema, json!(bad)),
            &[
                &format!("spec.f: Invalid value: {bad:?}: must be a valid {format}"),
                "(rule: format)",
            ],
        );
    }
    // A format the API server does not check is not checked.
    assert!(field(json!({"type": "string", "format": "password"}), json!("x")).is_empty());
}

#[test]
fn a_string_must_match_the_pattern() {
    let schema = json!({"type": "string", "pattern": "^[a-z]+$"});
    assert!(field(schema.clone(), json!("abc")).is_empty());
    one_error(
        field(schema, json!("ABC")),
        &[
            "Invalid value: \"ABC\": must match the pattern \"^[a-z]+$\"",
            "(rule: pattern)",
        ],
    );
}

#[test]
fn lengths_are_counted_in_characters() {
    let schema = json!({"type": "string", "minLength": 2, "maxLength": 3});
    assert!(field(schema.clone(), json!("éé")).is_empty());
    one_error(
        field(schema.clone(), json!("a")),
        &["must be at least 2 characters long", "(rule: minLength)"],
    );
    one_error(
        field(schema, json!("abcd")),
        &[
            "Too long: may not be more than 3 characters",
            "(rule: maxLength)",
        ],
    );
}

#[test]
fn numbers_are_bounded_by_minimum_maximum_and_multiple_of() {
    let schema = json!({"type": "integer", "minimum": 1, "maximum": 10, "multipleOf": 2});
    assert!(field(schema.clone(), json!(4)).is_empty());
    one_error(
        field(schema.clone(), json!(0)),
        &[
            "Invalid value: 0: must be greater than or equal to 1",
            "(rule: minimum)",
        ],
    );
    one_error(
        field(schema.clone(), json!(12)),
        &[
            "Invalid value: 12: must be less than or equal to 10",
            "(rule: maximum)",
        ],
    );
    one_error(
        field(schema, json!(3)),
        &["must be a multiple of 2", "(rule: multipleOf)"],
    );
    let exclusive = json!({"type": "number", "minimum": 0, "exclusiveMinimum": true,
        "maximum": 1, "exclusiveMaximum": true});
    assert!(field(exclusive.clone(), json!(0.5)).is_empty());
    one_error(
        field(exclusive.clone(), json!(0)),
        &["must be greater than 0", "(rule: minimum)"],
    );
    one_error(
        field(exclusive, json!(1)),
        &["must be less than 1", "(rule: maximum)"],
    );
}

#[test]
fn lists_are_bounded_by_min_and_max_items_and_sets_refuse_duplicates() {
    let schema =
        json!({"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}});
    assert!(field(schema.clone(), json!(["a"])).is_empty());
    one_error(
        field(schema.clone(), json!([])),
        &["must have at least 1 items", "(rule: minItems)"],
    );
    one_error(
        field(schema.clone(), json!(["a", "b", "c"])),
        &["Too many: 3: must have at most 2 items", "(rule: maxItems)"],
    );
    one_error(
        field(schema, json!(["a", 1])),
        &["spec.f[1]: Invalid value: 1: must be of type string"],
    );
    let set =
        json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}});
    assert!(field(set.clone(), json!(["a", "b"])).is_empty());
    one_error(
        field(set, json!(["a", "a"])),
        &[
            "spec.f[1]: Duplicate value: \"a\"",
            "x-kubernetes-list-type: set",
        ],
    );
    let map = json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
        "items": {"type": "object", "properties": {"name": {"type": "string"}}}});
    assert!(field(map.clone(), json!([{"name": "a"}, {"name": "b"}])).is_empty());
    one_error(
        field(map, json!([{"name": "a"}, {"name": "a"}])),
        &["spec.f[1]: Duplicate value: {name=\"a\"}"],
    );
}

#[test]
fn every_repeat_in_a_set_or_list_map_is_found_with_its_index_and_value() {
    let set = json!({"type": "array", "uniqueItems": true,
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}});
    // Equal objects whatever their keys' order; `1` and `1.0` are not equal.
    assert_eq!(
        field(set, json!([{"a": 1, "b": [2]}, {"b": [2], "a": 1}, {"a": 1.0, "b": [2]}, {"a": 1, "b": [2]}])),
        [
            "Widget/w (example.org/v1, document 1): spec.f[1]: Duplicate value: \"object\" (rule: uniqueItems)",
            "Widget/w (example.org/v1, document 1): spec.f[3]: Duplicate value: \"object\" (rule: uniqueItems)",
        ]
    );
    let map = json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name", "port"],
        "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}, "x": {"type": "integer"}}}});
    // A missing key is null: two items without `port` share it.
    assert_eq!(
        field(map, json!([{"name": "a"}, {"name": "a", "port": 1}, {"name": "a", "x": 2}, {"name": "a", "port": 1, "x": 3}])),
        [
            "Widget/w (example.org/v1, document 1): spec.f[2]: Duplicate value: {name=\"a\", port=null} (rule: x-kubernetes-list-type: map)",
            "Widget/w (example.org/v1, document 1): spec.f[3]: Duplicate value: {name=\"a\", port=1} (rule: x-kubernetes-list-type: map)",
        ]
    );
}

#[test]
fn objects_are_bounded_by_min_and_max_properties() {
    let schema = json!({"type": "object", "minProperties": 1, "maxProperties": 1,
        "additionalProperties": {"type": "string"}});
    assert!(field(schema.clone(), json!({"a": "x"})).is_empty());
    one_error(
        field(schema.clone(), json!({})),
        &["must have at least 1", "(rule: minProperties)"],
    );
    one_error(
        field(schema, json!({"a": "x", "b": "y"})),
        &["must have at most 1 properties", "(rule: maxProperties)"],
    );
}

#[test]
fn null_is_refused_unless_the_schema_is_nullable() {
    assert!(field(json!({"type": "string", "nullable": true}), Value::Null).is_empty());
    one_error(
        field(json!({"type": "string"}), Value::Null),
        &[
            "spec.f: Invalid value: null: must be of type string (the schema is not nullable)",
            "(rule: nullable)",
        ],
    );
}

#[test]
fn additional_properties_validate_every_key_not_listed() {
    let schema = json!({"type": "object", "additionalProperties": {"type": "integer"}});
    assert!(field(schema.clone(), json!({"a": 1, "b": 2})).is_empty());
    one_error(
        field(schema, json!({"a": 1, "b": "two"})),
        &["spec.f[b]: Invalid value: \"two\": must be of type integer"],
    );
    let closed = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": false});
    one_error(
        field(closed, json!({"a": 1, "b": 2})),
        &["spec.f.b: Unknown field"],
    );
}

#[test]
fn an_unknown_field_is_reported_as_the_api_server_would_prune_it() {
    let schema = json!({"type": "object", "properties": {"size": {"type": "integer"}}});
    assert!(errors(schema.clone(), json!({"size": 1})).is_empty());
    one_error(
        errors(schema, json!({"size": 1, "sise": 2})),
        &[WIDGET, "spec.sise: Unknown field: \"sise\" is not in the schema (the API server would prune it)", "(rule: unknown field)"],
    );
    // Top level: status not in the schema is unknown too; metadata never.
    let errs = Validator::default().validate(
        &[crd(json!({"type": "object"}))],
        &[json!({"apiVersion": "example.org/v1", "kind": "Widget",
            "metadata": {"name": "w", "anything": 1}, "spec": {}, "status": {}})],
    );
    one_error(errs, &["status: Unknown field"]);
}

#[test]
fn preserve_unknown_fields_keeps_what_the_schema_does_not_list() {
    let schema = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
        "properties": {"size": {"type": "integer"}}});
    assert!(errors(schema.clone(), json!({"size": 1, "free": {"form": true}})).is_empty());
    // Listed fields are still validated.
    one_error(
        errors(schema, json!({"size": "one"})),
        &["spec.size", "must be of type integer"],
    );
}

#[test]
fn int_or_string_takes_either_and_nothing_else() {
    let schema = json!({"x-kubernetes-int-or-string": true});
    assert!(field(schema.clone(), json!(80)).is_empty());
    assert!(field(schema.clone(), json!("http")).is_empty());
    one_error(
        field(schema, json!(1.5)),
        &[
            "spec.f: Invalid value: 1.5: must be an integer or a string",
            "(rule: x-kubernetes-int-or-string)",
        ],
    );
}

#[test]
fn an_embedded_resource_needs_api_version_and_kind_and_keeps_its_metadata() {
    let schema = json!({"type": "object", "x-kubernetes-embedded-resource": true,
        "x-kubernetes-preserve-unknown-fields": true});
    assert!(field(
        schema.clone(),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
    )
    .is_empty());
    one_error(
        field(schema, json!({"apiVersion": "v1", "metadata": {}})),
        &[
            "spec.f.kind: Required value: must not be empty",
            "(rule: x-kubernetes-embedded-resource)",
        ],
    );
    let closed = json!({"type": "object", "x-kubernetes-embedded-resource": true,
        "properties": {"data": {"type": "object", "additionalProperties": {"type": "string"}}}});
    assert!(field(closed.clone(), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}})).is_empty());
    one_error(
        field(
            closed,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "extra": 1}),
        ),
        &["spec.f.extra: Unknown field"],
    );
}

#[test]
fn all_of_any_of_one_of_and_not_combine_value_validations() {
    let any = json!({"type": "string", "anyOf": [{"pattern": "^a"}, {"pattern": "^b"}]});
    assert!(field(any.clone(), json!("bee")).is_empty());
    one_error(
        field(any, json!("cee")),
        &["matches none of anyOf", "(rule: anyOf)"],
    );
    let one = json!({"type": "integer", "oneOf": [{"minimum": 5}, {"maximum": 7}]});
    assert!(field(one.clone(), json!(9)).is_empty());
    one_error(
        field(one, json!(6)),
        &[
            "must match exactly one of oneOf, matches 2",
            "(rule: oneOf)",
        ],
    );
    let all = json!({"type": "integer", "allOf": [{"minimum": 5}, {"maximum": 7}]});
    assert!(field(all.clone(), json!(6)).is_empty());
    one_error(
        field(all, json!(8)),
        &["must be less than or equal to 7", "(rule: maximum)"],
    );
    let not = json!({"type": "string", "not": {"enum": ["root"]}});
    assert!(field(not.clone(), json!("user")).is_empty());
    one_error(
        field(not, json!("root")),
        &["must not match the schema in not", "(rule: not)"],
    );
}

#[test]
fn defaults_are_applied_before_validation() {
    // The default fills the absent field and is itself validated: an
    // invalid default shows up as an error on the field.
    let schema = json!({"type": "object", "properties": {
        "size": {"type": "integer", "default": 20, "maximum": 10}}});
    one_error(
        errors(schema.clone(), json!({})),
        &["spec.size: Invalid value: 20: must be less than or equal to 10"],
    );
    assert!(errors(schema, json!({"size": 5})).is_empty());
    // A defaulted field satisfies `required`.
    let required = json!({"type": "object", "required": ["region"], "properties": {
        "region": {"type": "string", "default": "eu-west-1"}}});
    assert!(errors(required, json!({})).is_empty());
}

fn cel(rules: Value, spec: Value) -> Vec<String> {
    errors(
        json!({"type": "object", "x-kubernetes-validations": rules,
            "properties": {"min": {"type": "integer"}, "max": {"type": "integer"},
                "names": {"type": "array", "maxItems": 600,
                    "items": {"type": "string", "maxLength": 16}}}}),
        spec,
    )
}

#[test]
fn a_cel_rule_that_holds_passes_and_one_that_fails_gives_its_message() {
    let rules = json!([{"rule": "self.min <= self.max", "message": "min must not exceed max"}]);
    assert!(cel(rules.clone(), json!({"min": 1, "max": 2})).is_empty());
    one_error(
        cel(rules, json!({"min": 3, "max": 2})),
        &[
            WIDGET,
            ": spec: Invalid value: \"object\": min must not exceed max",
            "(rule: x-kubernetes-validations rule \"self.min <= self.max\")",
        ],
    );
    // Without a message, the rule itself.
    one_error(
        cel(json!([{"rule": "self.min < 0"}]), json!({"min": 3})),
        &["failed rule: self.min < 0"],
    );
}

#[test]
fn a_cel_message_expression_builds_the_message() {
    let rules = json!([{"rule": "self.names.all(n, n.startsWith('app-'))",
        "messageExpression": "'names must start with app-, found ' + string(size(self.names)) + ' names'",
        "message": "unused"}]);
    assert!(cel(rules.clone(), json!({"names": ["app-a"]})).is_empty());
    one_error(
        cel(rules, json!({"names": ["app-a", "db"]})),
        &["names must start with app-, found 2 names"],
    );
}

#[test]
fn a_cel_rule_on_a_field_and_its_field_path_name_where_the_error_is() {
    let schema = json!({"type": "object", "properties": {"replicas": {"type": "integer",
        "x-kubernetes-validations": [{"rule": "self % 2 == 1", "message": "must be odd"}]}},
        "x-kubernetes-validations": [{"rule": "has(self.replicas)", "fieldPath": ".replicas",
            "message": "replicas is required"}]});
    assert_eq!(
        errors(schema.clone(), json!({"replicas": 3})),
        Vec::<String>::new()
    );
    one_error(
        errors(schema.clone(), json!({"replicas": 2})),
        &["spec.replicas: Invalid value: 2: must be odd"],
    );
    one_error(
        errors(schema, json!({})),
        &["spec.replicas: Invalid value: \"object\": replicas is required"],
    );
}

#[test]
fn a_transition_rule_is_skipped_and_said_so() {
    let validator = Validator::default();
    let schema = json!({"type": "object", "properties": {"min": {"type": "integer"}},
        "x-kubernetes-validations": [{"rule": "self.min >= oldSelf.min"}]});
    let report = validator.check(&[crd(schema)], &[widget(json!({"min": 1}))], &["w".into()]);
    assert!(report.errors(true).is_empty());
    let notes = &report.resources[0].notes;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("transition rule \"self.min >= oldSelf.min\" skipped"),
        "{notes:?}"
    );
}

/// The report on a Widget with `spec` validated as an update of one with
/// `old` (`None`: a create), against a `spec` of `spec_schema`.
fn update(spec_schema: Value, old: Option<Value>, spec: Value) -> super::ResourceReport {
    let validator = Validator {
        old_resources: old.into_iter().map(widget).collect(),
        ..Validator::default()
    };
    let mut report = validator.check(&[crd(spec_schema)], &[widget(spec)], &["w".into()]);
    assert!(report.extension_errors.is_empty(), "{report:#?}");
    report.resources.remove(0)
}

#[test]
fn a_transition_rule_runs_against_the_old_resource() {
    let schema = json!({"type": "object", "properties": {"min": {"type": "integer"}},
        "x-kubernetes-validations": [{"rule": "self.min >= oldSelf.min", "message": "min may not decrease"}]});
    let lower = update(schema.clone(), Some(json!({"min": 5})), json!({"min": 3}));
    assert_eq!(lower.findings.len(), 1, "{lower:#?}");
    assert_eq!(
        lower.findings[0].message,
        "Invalid value: \"object\": min may not decrease"
    );
    assert!(lower.notes.is_empty(), "{lower:#?}");
    let higher = update(schema.clone(), Some(json!({"min": 5})), json!({"min": 7}));
    assert!(
        higher.findings.is_empty() && higher.notes.is_empty(),
        "{higher:#?}"
    );
    // Another object's old version is not this one's.
    let validator = Validator {
        old_resources: vec![json!({"apiVersion": "example.org/v1", "kind": "Widget",
            "metadata": {"name": "other", "namespace": "default"}, "spec": {"min": 9}})],
        ..Validator::default()
    };
    let report = validator.check(&[crd(schema)], &[widget(json!({"min": 1}))], &["w".into()]);
    assert!(report.errors(true).is_empty(), "{report:#?}");
    assert!(report.resources[0].notes[0].contains("--old-resources"));
}

#[test]
fn an_unchanged_invalid_value_is_ratcheted_and_a_changed_one_is_not() {
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 3,
            "x-kubernetes-validations": [{"rule": "self.startsWith('a')"}]},
        "n": {"type": "integer"},
        "tags": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
            "items": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "string", "maxLength": 1}}}}}});
    let old = json!({"name": "toolong", "n": 1, "tags": [{"k": "a", "v": "long"}]});
    // The object changed (n), its invalid name and tag did not: no error.
    let unchanged = update(
        schema.clone(),
        Some(old.clone()),
        json!({"name": "toolong", "n": 2, "tags": [{"k": "b", "v": "x"}, {"k": "a", "v": "long"}]}),
    );
    assert!(unchanged.findings.is_empty(), "{unchanged:#?}");
    // A changed invalid value is an error; after a maxLength error the
    // API server runs no CEL rule, and says so.
    let changed = update(
        schema.clone(),
        Some(old),
        json!({"name": "toolong2", "n": 2, "tags": [{"k": "a", "v": "longer"}]}),
    );
    let rules: Vec<&str> = changed.findings.iter().map(|f| f.rule.as_str()).collect();
    assert_eq!(
        rules,
        ["maxLength", "maxLength", "x-kubernetes-validations"],
        "{changed:#?}"
    );
    // Without an old version, a create: both are errors.
    let created = update(schema, None, json!({"name": "toolong", "n": 2, "tags": []}));
    assert_eq!(created.findings.len(), 2, "{created:#?}");
}

#[test]
fn an_optional_old_self_rule_runs_with_and_without_an_old_resource() {
    let schema = json!({"type": "object", "properties": {"min": {"type": "integer"}},
        "x-kubernetes-validations": [
            {"rule": "!oldSelf.hasValue() || self.min >= oldSelf.value().min", "optionalOldSelf": true},
            {"rule": "oldSelf.hasValue()", "optionalOldSelf": true, "message": "only on update"}]});
    let created = update(schema.clone(), None, json!({"min": 3}));
    let messages: Vec<&str> = created
        .findings
        .iter()
        .map(|f| f.message.as_str())
        .collect();
    assert_eq!(
        messages,
        ["Invalid value: \"object\": only on update"],
        "{created:#?}"
    );
    assert!(created.notes.is_empty(), "{created:#?}");
    let lower = update(schema.clone(), Some(json!({"min": 5})), json!({"min": 3}));
    let messages: Vec<&str> = lower.findings.iter().map(|f| f.message.as_str()).collect();
    assert_eq!(
        messages,
        ["Invalid value: \"object\": failed rule: !oldSelf.hasValue() || self.min >= oldSelf.value().min"],
        "{lower:#?}"
    );
    assert!(update(schema, Some(json!({"min": 5})), json!({"min": 6}))
        .findings
        .is_empty());
}

#[test]
fn kubernetes_cel_library_functions_are_evaluated() {
    // Before kube-cel, each was an error: "the rule was not checked".
    for rule in [
        "self.names.isSorted()",
        "quantity('1Gi').isGreaterThan(quantity('1Mi'))",
        "self.names.indexOf('b') == 1 && 'a,b'.split(',') == ['a', 'b']",
        "sets.contains(self.names, ['a'])",
        "type(self.min) == int && base64.encode(b'a') == 'YQ=='",
    ] {
        assert_eq!(
            cel(
                json!([{"rule": rule}]),
                json!({"names": ["a", "b"], "min": 1})
            ),
            Vec::<String>::new(),
            "{rule}"
        );
    }
    one_error(
        cel(
            json!([{"rule": "self.names.isSorted()"}]),
            json!({"names": ["b", "a"]}),
        ),
        &["failed rule: self.names.isSorted()"],
    );
}

#[test]
fn a_cel_rule_that_does_not_compile_or_errs_is_an_error() {
    one_error(
        cel(json!([{"rule": "self.min <"}]), json!({"min": 1})),
        &["the rule does not compile"],
    );
    one_error(
        cel(json!([{"rule": "self.nope == 1"}]), json!({"min": 1})),
        &["the rule does not compile: undefined field 'nope'"],
    );
    one_error(
        cel(
            json!([{"rule": "self.names[5] == 'a'"}]),
            json!({"names": []}),
        ),
        &["the rule could not be evaluated"],
    );
}

#[test]
fn a_cel_rule_past_the_cost_limit_is_not_run_and_says_why() {
    let names: Vec<String> = (0..2000).map(|i| format!("n{i}")).collect();
    let rules = json!([{"rule": "self.names.all(a, self.names.all(b, a == b || a != b))"}]);
    // The API server refuses the CRD (its estimate on 2,000 names of 64
    // characters), and the rule is not run on these 2,000.
    let errors = errors(
        json!({"type": "object", "x-kubernetes-validations": rules,
            "properties": {"names": {"type": "array", "maxItems": 2000,
                "items": {"type": "string", "maxLength": 64}}}}),
        json!({"names": names}),
    );
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(errors[0].contains("x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of 23.6x"), "{}", errors[0]);
    assert!(errors[1].contains("openAPIV3Schema: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of 2.4x"), "{}", errors[1]);
    for part in [
        "the rule was not evaluated: estimated rule cost exceeds budget by factor of 44.1",
        "over the per-call limit 1000000",
    ] {
        assert!(errors[2].contains(part), "{:?} lacks {part:?}", errors[2]);
    }
    let deep = format!("{}1{}", "(".repeat(40), ")".repeat(40));
    one_error(
        cel(json!([{"rule": deep}]), json!({})),
        &["nests brackets more than 32 deep"],
    );
}

#[test]
fn a_resource_of_an_unserved_version_is_an_error_and_one_without_schema_a_warning() {
    let mut definition = crd(json!({"type": "object"}));
    definition["spec"]["versions"][0]["served"] = json!(false);
    one_error(
        Validator::default().validate(&[definition], &[widget(json!({}))]),
        &["version \"v1\" is not served by the CustomResourceDefinition widgets.example.org"],
    );
    let other =
        json!({"apiVersion": "example.org/v2", "kind": "Widget", "metadata": {"name": "x"}});
    assert!(Validator::default()
        .validate(&[crd(json!({}))], std::slice::from_ref(&other))
        .is_empty());
    let strict = Validator {
        error_on_missing_schemas: true,
        ..Validator::default()
    };
    one_error(strict.validate(&[crd(json!({}))], &[other]), &["Widget/x (example.org/v2, document 1): no CRD or XRD given defines this kind and version"]);
}

fn xrd(api_version: &str, scope: Option<&str>) -> Value {
    let mut xrd = json!({"apiVersion": api_version, "kind": "CompositeResourceDefinition",
        "metadata": {"name": "xbuckets.example.org"},
        "spec": {"group": "example.org", "names": {"kind": "XBucket", "plural": "xbuckets"},
            "claimNames": {"kind": "Bucket", "plural": "buckets"},
            "versions": [{"name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "required": ["region"], "properties": {
                        "region": {"type": "string", "enum": ["eu", "us"]},
                        "size": {"type": "integer", "default": 10, "maximum": 100}}},
                    "status": {"type": "object", "properties": {"url": {"type": "string"}}}}}}}]}});
    if let Some(scope) = scope {
        xrd["spec"]["scope"] = json!(scope);
    }
    xrd
}

#[test]
fn an_xr_is_validated_against_its_xrd_with_the_fields_crossplane_adds() {
    let modern = xrd("apiextensions.crossplane.io/v2", Some("Namespaced"));
    let xr = json!({"apiVersion": "example.org/v1", "kind": "XBucket",
        "metadata": {"name": "b", "namespace": "team"},
        "spec": {"region": "eu", "crossplane": {"compositionRef": {"name": "c"},
            "resourceRefs": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x"}]}},
        "status": {"url": "u", "conditions": [{"type": "Ready", "status": "True",
            "reason": "Available", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}});
    assert_eq!(
        Validator::default().validate(std::slice::from_ref(&modern), std::slice::from_ref(&xr)),
        Vec::<String>::new()
    );
    let mut bad = xr.clone();
    bad["spec"]["region"] = json!("mars");
    bad["spec"]["size"] = json!(500);
    bad["spec"]["crossplane"]["compositionUpdatePolicy"] = json!("Sometimes");
    bad["spec"]["compositionRef"] = json!({"name": "legacy-place"});
    let errs = Validator::default().validate(&[modern], &[bad]);
    assert_eq!(errs.len(), 4, "{errs:#?}");
    let all = errs.join("\n");
    for part in [
        "XBucket/b (example.org/v1, document 1): spec.region: Unsupported value: \"mars\"",
        "spec.size: Invalid value: 500",
        "spec.crossplane.compositionUpdatePolicy: Unsupported value",
        "spec.compositionRef: Unknown field",
    ] {
        assert!(all.contains(part), "{all} lacks {part}");
    }
    // A v1 XRD is LegacyCluster: Crossplane's fields directly in spec, and claims.
    let legacy = xrd("apiextensions.crossplane.io/v1", None);
    let legacy_xr = json!({"apiVersion": "example.org/v1", "kind": "XBucket", "metadata": {"name": "b"},
        "spec": {"region": "us", "compositionRef": {"name": "c"},
            "claimRef": {"apiVersion": "example.org/v1", "kind": "Bucket", "namespace": "n", "name": "b"},
            "writeConnectionSecretToRef": {"name": "s", "namespace": "n"}}});
    assert_eq!(
        Validator::default().validate(std::slice::from_ref(&legacy), &[legacy_xr]),
        Vec::<String>::new()
    );
    let claim = json!({"apiVersion": "example.org/v1", "kind": "Bucket", "metadata": {"name": "b", "namespace": "n"},
        "spec": {"compositeDeletePolicy": "Never"}});
    let errs = Validator::default().validate(&[legacy], &[claim]);
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert!(
        errs.iter()
            .any(|e| e
                .contains("Bucket/b (example.org/v1, document 1): spec.region: Required value")),
        "{errs:#?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("spec.compositeDeletePolicy: Unsupported value: \"Never\"")),
        "{errs:#?}"
    );
}

#[test]
fn a_document_that_is_no_crd_or_xrd_is_skipped_and_named() {
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
    let report = Validator::default().check(&[config_map], &[], &[]);
    assert!(report.extension_errors.is_empty(), "{report:#?}");
    assert_eq!(report.skipped_extensions, ["ConfigMap/c (v1, extension 1)"]);
}

#[test]
fn the_longest_operator_chain_allowed_runs_and_a_longer_one_is_refused() {
    // `1 + 1 + …`: the parser's and the interpreter's recursion is as
    // deep as the chain is long.
    let chain = |n: usize| format!("{} == {n}", vec!["1"; n].join("+"));
    assert!(cel(json!([{"rule": chain(240)}]), json!({})).is_empty());
    one_error(
        cel(json!([{"rule": chain(2000)}]), json!({})),
        &["it has more than 250 operators"],
    );
}

#[test]
fn a_constant_matches_pattern_is_compiled_once_for_every_item() {
    // It was compiled on every call, up to regex's 10 MiB each.
    let pattern = "^([a-z]{1,30}[.]){0,20}[a-z]{1,29}$";
    let schema = json!({"type": "object", "properties": {"l": {"type": "array", "maxItems": 200,
        "items": {"type": "string", "maxLength": 64, "x-kubernetes-validations": [
            {"rule": format!("self.matches('{pattern}')")}]}}}});
    assert!(errors(schema, json!({"l": vec!["abc.def"; 200]})).is_empty());
    assert_eq!(super::pattern::compilations(pattern), 1);
}

#[test]
fn a_pattern_in_any_of_branches_is_compiled_once_for_every_item() {
    // Each branch's walk started an empty cache: compiled twice per item.
    let pattern = "^([a-z]{1,30}[.]){0,20}[a-z]{1,28}$";
    let schema = json!({"type": "object", "properties": {"l": {"type": "array",
        "items": {"type": "string", "anyOf": [{"pattern": pattern}, {"maxLength": 1}],
            "oneOf": [{"pattern": pattern}], "allOf": [{"pattern": pattern}]}}}});
    assert!(errors(schema, json!({"l": vec!["abc.def"; 200]})).is_empty());
    assert_eq!(super::pattern::compilations(pattern), 1);
}

#[test]
fn matches_and_pattern_take_go_s_ascii_classes() {
    one_error(
        cel(
            json!([{"rule": "self.names.all(n, n.matches('^\\\\w+$'))"}]),
            json!({"names": ["café"]}),
        ),
        &["failed rule"],
    );
    assert!(cel(
        json!([{"rule": "self.names.all(n, n.matches('^\\\\w+$'))"}]),
        json!({"names": ["cafe_1"]})
    )
    .is_empty());
}

#[test]
fn a_rule_stopped_by_the_runtime_budget_is_a_failure_even_when_an_or_would_absorb_it() {
    // `stopped || true` is `true` to CEL; spent is spent all the same.
    let names: Vec<String> = (0..600).map(|i| format!("n{i}")).collect();
    one_error(
        cel(
            json!([{"rule": "size(self.names.map(x, self.names + self.names)) > 0 || true"},
                {"rule": "self.min == 1"}]),
            json!({"names": names, "min": 2}),
        ),
        &["'operation cancelled: actual cost limit exceeded': no further validation rules will be run"],
    );
}

#[test]
fn rules_keep_their_meaning_under_the_runtime_meter() {
    let spec = json!({"names": ["a", "b", "cc"], "min": 1, "max": 3});
    for rule in [
        "self.names.filter(n, n.startsWith('c')) == ['cc']",
        "self.names.map(n, size(n) > 1, n + '!') == ['cc!']",
        "self.names.map(n, size(n)) == [1, 1, 2]",
        "{'k': 1, 'l': 2}.map(k, k).size() == 2",
        "self.names.exists_one(n, n == 'b')",
        "self.names.all(n, self.names.exists(m, m == n))",
        "'b' in self.names && !('z' in self.names)",
        "self.names[2] == 'cc' && self.names.size() == 3",
        "has(self.min) && has(self.max)",
        "self.min < self.max ? self.names + ['d'] == ['a', 'b', 'cc', 'd'] : false",
        "self.names.map(a, self.names.map(b, a + b)).size() == 3",
        "'abc'.matches('^a') && !'xabc'.matches('^a')",
    ] {
        assert_eq!(
            cel(json!([{"rule": rule}]), spec.clone()),
            Vec::<String>::new(),
            "{rule}"
        );
    }
    one_error(
        cel(
            json!([{"rule": "self.names.map(n, n + 1).size() == 3"}]),
            spec,
        ),
        &["the rule could not be evaluated"],
    );
}

#[test]
fn a_resource_over_the_api_server_s_request_limit_is_refused_as_too_large() {
    let schema = json!({"type": "object", "properties": {"s": {"type": "string"}}});
    assert!(errors(schema.clone(), json!({"s": "a".repeat((3 << 20) - 1024)})).is_empty());
    one_error(
        errors(schema, json!({"s": "a".repeat(3 << 20)})),
        &[
            "<root>: Request entity too large: limit is 3145728",
            "(rule: request size)",
        ],
    );
}

#[test]
fn each_former_false_pass_now_fails() {
    // Each passed before the checker, the typed values and kube-cel.
    let objs = json!({"type": "array", "items": {"type": "object",
        "properties": {"f1": {"type": "string"}, "f2": {"type": "string"}}}});
    let with_rule = |schema: Value, rule: &str| {
        let mut schema = schema;
        schema["x-kubernetes-validations"] = json!([{ "rule": rule }]);
        schema
    };
    one_error(
        field(
            with_rule(objs.clone(), "self[0] == {'f1': 'a', 'f2': 'b'}"),
            json!([{"f1": "a", "f2": "b"}]),
        ),
        &["the rule does not compile: found no matching overload for '_==_'"],
    );
    one_error(
        field(
            with_rule(json!({"type": "string"}), "self != null"),
            json!("v"),
        ),
        &["applied to '(string, null)'"],
    );
    one_error(
        field(
            json!({"type": "string", "allOf": [{"x-kubernetes-validations": [{"rule": "self == 'x'"}]}]}),
            json!("v"),
        ),
        &[
            "x-kubernetes-validations under allOf must be empty",
            "(rule: allOf)",
        ],
    );
    // Code points, not bytes: 3, not 12.
    one_error(
        field(
            with_rule(json!({"type": "string"}), "size(self) > 3"),
            json!("👑👑👑"),
        ),
        &["failed rule: size(self) > 3"],
    );
    one_error(
        field(
            with_rule(
                json!({"type": "array", "items": {"type": "integer"}}),
                "self.max() == 2",
            ),
            json!([1, 3, 2]),
        ),
        &["failed rule: self.max() == 2"],
    );
    // A number field holding 1 is a double: `self == 1` does not compile.
    one_error(
        field(with_rule(json!({"type": "number"}), "self == 1"), json!(1)),
        &["applied to '(double, int)'"],
    );
    // kube-cel's quantity: `1000m` an integer, ` 1` a quantity; apimachinery
    // holds `1000m` at scale -3 (not an int64) and refuses the space.
    let string = json!({"type": "string"});
    for (rule, value) in [
        ("quantity(self).isInteger()", "1000m"),
        ("quantity(self).asInteger() == 1", "1000m"),
        ("isQuantity(self)", " 1"),
        // kube-cel's URL: the path of `https://example.com` was `/`.
        ("url(self).getEscapedPath() == '/'", "https://example.com"),
    ] {
        let errors = field(with_rule(string.clone(), rule), json!(value));
        assert_eq!(errors.len(), 1, "{rule} on {value:?}: {errors:#?}");
    }
}
