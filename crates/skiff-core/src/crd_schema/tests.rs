//! Tests of structural schemas: expected causes as kube-apiserver words them.

use serde_json::{json, Value};

use super::Schema;

fn compile(s: Value) -> Schema {
    Schema::compile(&s, "spec.versions[0].schema.openAPIV3Schema").expect("schema compiles")
}

fn messages(causes: &[crate::Cause]) -> Vec<String> {
    causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect()
}

#[test]
fn a_string_where_an_integer_is_declared_is_a_type_error() {
    let s = compile(
        json!({"type": "object", "properties": {"spec": {"type": "object",
        "properties": {"replicas": {"type": "integer"}}}}}),
    );
    let causes = s.validate(&json!({"spec": {"replicas": "three"}}), None);
    assert_eq!(
        messages(&causes),
        vec![
            r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#
        ]
    );
}

const P: &str = "spec.versions[0].schema.openAPIV3Schema";

fn refused(s: Value) -> Vec<String> {
    messages(&Schema::compile(&s, P).expect_err("schema is refused"))
}

fn obj(props: Value) -> Value {
    json!({"type": "object", "properties": {"spec": {"type": "object", "properties": props}}})
}

#[test]
fn a_property_without_a_type_is_not_structural() {
    let got = refused(obj(json!({"foo": {"description": "x"}})));
    assert_eq!(
        got,
        vec![format!(
            "{P}.properties[spec].properties[foo].type: Required value: must not be empty for specified object fields"
        )]
    );
}

#[test]
fn array_items_and_the_root_need_types_too() {
    let got = refused(json!({"properties": {"l": {"type": "array", "items": {}}}}));
    assert!(
        got.contains(&format!(
        "{P}.properties[l].items.type: Required value: must not be empty for specified array items"
    )),
        "{got:?}"
    );
    assert!(
        got.contains(&format!(
            "{P}.type: Required value: must not be empty at the root"
        )),
        "{got:?}"
    );
    let got = refused(json!({"type": "object", "properties": {"l": {"type": "array"}}}));
    assert_eq!(
        got,
        vec![format!(
            "{P}.properties[l].items: Required value: must be specified"
        )]
    );
}

#[test]
fn keywords_kubernetes_does_not_support_are_forbidden() {
    let got = refused(obj(json!({
        "a": {"$ref": "#/definitions/x"},
        "b": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
        "c": {"type": "object", "patternProperties": {}},
        "d": {"type": "string", "additionalItems": false},
        "e": {"type": "null"},
        "f": {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": {"type": "string"}},
        "g": {"type": "strin"},
    })));
    let p = format!("{P}.properties[spec].properties");
    for want in [
        format!("{p}[a].$ref: Forbidden: $ref is not supported"),
        format!("{p}[b].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic"),
        format!("{p}[c].patternProperties: Forbidden: patternProperties is not supported"),
        format!("{p}[d].additionalItems: Forbidden: additionalItems is not supported"),
        format!("{p}[e].type: Forbidden: type cannot be set to null, use nullable as an alternative"),
        format!("{p}[f].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive"),
        format!(r#"{p}[g].type: Unsupported value: "strin": supported values: "array", "boolean", "integer", "number", "object", "string""#),
    ] {
        assert!(got.contains(&want), "missing {want}\nin {got:#?}");
    }
}

#[test]
fn value_validations_may_not_declare_types() {
    let got = refused(obj(
        json!({"a": {"type": "string", "anyOf": [{"type": "string"}, {"pattern": "x"}]}}),
    ));
    assert_eq!(
        got,
        vec![format!("{P}.properties[spec].properties[a].anyOf[0].type: Forbidden: must be empty to be structural")]
    );
    // Kubernetes' int-or-string pattern is allowed.
    compile(obj(json!({"port": {"x-kubernetes-int-or-string": true,
        "anyOf": [{"type": "integer"}, {"type": "string"}]}})));
}

#[test]
fn metadata_at_the_root_may_only_constrain_name() {
    let got = refused(
        json!({"type": "object", "properties": {"metadata": {"type": "object",
        "properties": {"labels": {"type": "object"}}}}}),
    );
    assert_eq!(
        got,
        vec![format!("{P}.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified")]
    );
    compile(
        json!({"type": "object", "properties": {"metadata": {"type": "object",
        "properties": {"name": {"type": "string", "maxLength": 10}}}}}),
    );
}

#[test]
fn list_types_are_checked_where_they_are_declared() {
    let got = refused(obj(json!({
        "m": {"type": "array", "x-kubernetes-list-type": "map",
              "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "k": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
              "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "t": {"type": "string", "x-kubernetes-list-type": "set"},
        "u": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "list"},
    })));
    let p = format!("{P}.properties[spec].properties");
    for want in [
        format!("{p}[m].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map"),
        format!("{p}[k].items.properties[name].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property"),
        format!(r#"{p}[t].type: Invalid value: "string": must be array if x-kubernetes-list-type is specified"#),
        format!(r#"{p}[u].x-kubernetes-list-type: Unsupported value: "list": supported values: "atomic", "set", "map""#),
    ] {
        assert!(got.contains(&want), "missing {want}\nin {got:#?}");
    }
}

#[test]
fn a_default_must_validate_and_must_not_be_pruned() {
    let got = refused(obj(json!({
        "replicas": {"type": "integer", "default": "one"},
        "tpl": {"type": "object", "properties": {"a": {"type": "string"}}, "default": {"a": "x", "b": "y"}},
        "size": {"type": "integer", "maximum": 5, "default": 10},
    })));
    let p = format!("{P}.properties[spec].properties");
    for want in [
        format!(
            r#"{p}[replicas].default: Invalid value: "string":  in body must be of type integer: "string""#
        ),
        format!(
            r#"{p}[tpl].default: Invalid value: {{"a":"x","b":"y"}}: must not have unknown fields"#
        ),
        format!("{p}[size].default: Invalid value: 10:  in body should be less than or equal to 5"),
    ] {
        assert!(got.contains(&want), "missing {want}\nin {got:#?}");
    }
}

#[test]
fn defaults_in_top_level_metadata_are_forbidden() {
    let got = refused(
        json!({"type": "object", "properties": {"metadata": {"type": "object",
        "properties": {"name": {"type": "string", "default": "x"}}}}}),
    );
    assert!(
        got.contains(&format!(
            "{P}.properties[metadata].properties[name].default: Forbidden: in top-level metadata"
        )),
        "{got:?}"
    );
}

fn spec_schema() -> Schema {
    compile(json!({
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["image"],
                "properties": {
                    "image": {"type": "string", "minLength": 1, "maxLength": 20, "pattern": "^[a-z:./0-9]+$"},
                    "replicas": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
                    "ratio": {"type": "number", "exclusiveMinimum": true, "minimum": 0, "multipleOf": 0.5},
                    "mode": {"type": "string", "enum": ["Fast", "Slow"]},
                    "port": {"x-kubernetes-int-or-string": true},
                    "tags": {"type": "array", "maxItems": 2, "minItems": 1, "items": {"type": "string"},
                             "x-kubernetes-list-type": "set"},
                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                              "x-kubernetes-list-map-keys": ["name"],
                              "items": {"type": "object", "required": ["name"], "properties": {
                                  "name": {"type": "string"},
                                  "protocol": {"type": "string", "default": "TCP"}}}},
                    "labels": {"type": "object", "maxProperties": 1,
                               "additionalProperties": {"type": "string", "default": "none", "nullable": false}},
                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                              "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}}},
                    "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                 "properties": {"spec": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
                    "note": {"type": "string", "nullable": true},
                    "email": {"type": "string", "format": "email"},
                    "when": {"type": "string", "format": "date-time"},
                    "id": {"type": "string", "format": "uuid"},
                }
            },
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
        }
    }))
}

#[test]
fn every_failing_field_is_reported_as_kubernetes_words_it() {
    let s = spec_schema();
    let obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"}, "spec": {
        "image": "BAD IMAGE NAME THAT IS LONG",
        "replicas": 11,
        "ratio": 0.7,
        "mode": "Medium",
        "port": true,
        "tags": ["a", "a", "b"],
        "ports": [{"name": "http"}, {"name": "http"}],
        "labels": {"a": "1", "b": "2"},
        "template": {"spec": {"x": 1}},
        "note": null,
        "email": "not-an-email",
        "when": "yesterday",
        "id": "123",
    }});
    let got = messages(&s.validate(&obj, None));
    for want in [
        "spec.image: Too long: may not be more than 20 bytes",
        r#"spec.image: Invalid value: "BAD IMAGE NAME THAT IS LONG": spec.image in body should match '^[a-z:./0-9]+$'"#,
        "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
        "spec.ratio: Invalid value: 0.7: spec.ratio in body should be a multiple of 0.5",
        r#"spec.mode: Unsupported value: "Medium": supported values: "Fast", "Slow""#,
        r#"spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean""#,
        "spec.tags: Too many: 3: must have at most 2 items",
        r#"spec.tags[1]: Duplicate value: "a""#,
        r#"spec.ports[1]: Duplicate value: {"name":"http"}"#,
        "spec.labels: Too many: 2: must have at most 1 item",
        "spec.template.apiVersion: Required value",
        "spec.template.kind: Required value",
        r#"spec.email: Invalid value: "not-an-email": spec.email in body must be of type email: "not-an-email""#,
        r#"spec.when: Invalid value: "yesterday": spec.when in body must be of type date-time: "yesterday""#,
        r#"spec.id: Invalid value: "123": spec.id in body must be of type uuid: "123""#,
    ] {
        assert!(got.contains(&want.to_string()), "missing {want}\nin {got:#?}");
    }
    assert_eq!(got.len(), 15, "{got:#?}");
}

#[test]
fn required_fields_and_nulls() {
    let s = spec_schema();
    let got = messages(&s.validate(&json!({"spec": {"replicas": null, "note": null}}), None));
    assert_eq!(
        got,
        vec![
            "spec.image: Required value".to_string(),
            r#"spec.replicas: Invalid value: "null": spec.replicas in body must be of type integer: "null""#.to_string(),
        ]
    );
    let got = messages(&s.validate(&json!({"metadata": {"name": "a"}}), None));
    assert_eq!(got, vec!["spec: Required value".to_string()]);
}

#[test]
fn a_valid_object_has_no_causes() {
    let s = spec_schema();
    let obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"}, "spec": {
        "image": "nginx:1.25", "replicas": 3, "ratio": 1.5, "mode": "Fast", "port": "http",
        "tags": ["a"], "ports": [{"name": "a"}, {"name": "b"}], "labels": {"a": "1"},
        "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": 1}},
        "note": null, "email": "a@example.com", "when": "2024-01-02T03:04:05Z",
        "id": "123e4567-e89b-12d3-a456-426614174000", "extra": {"anything": [1, 2]}}});
    assert_eq!(messages(&s.validate(&obj, None)), Vec::<String>::new());
    let whole = json!({"spec": {"image": "x", "replicas": 2.0}});
    assert!(
        s.validate(&whole, None).is_empty(),
        "2.0 is an integer in JSON"
    );
}

#[test]
fn pruning_drops_unknown_fields_and_keeps_what_kubernetes_keeps() {
    let s = spec_schema();
    let mut obj = json!({"apiVersion": "x/v1", "kind": "K",
        "metadata": {"name": "a", "labels": {"x": "y"}, "bogus": 1},
        "unknown": 1,
        "spec": {"image": "x", "junk": true,
                 "extra": {"anything": {"deep": 1}, "known": {"a": "x", "b": "dropped"}},
                 "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "zzz": 1},
                              "spec": {"x": 1, "y": 2}, "other": 3},
                 "ports": [{"name": "a", "junk": 1}],
                 "labels": {"k": "v"}},
        "status": {"ready": true, "junk": 1}});
    s.prune(&mut obj);
    assert_eq!(
        obj,
        json!({"apiVersion": "x/v1", "kind": "K",
        "metadata": {"name": "a", "labels": {"x": "y"}},
        "spec": {"image": "x",
                 "extra": {"anything": {"deep": 1}, "known": {"a": "x"}},
                 "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                              "spec": {"x": 1}},
                 "ports": [{"name": "a"}],
                 "labels": {"k": "v"}},
        "status": {"ready": true}})
    );
}

#[test]
fn pruning_and_defaulting_in_one_walk_give_what_the_two_passes_give() {
    let s = spec_schema();
    let objects = [
        json!({"apiVersion": "x/v1", "kind": "K",
            "metadata": {"name": "a", "labels": {"x": "y"}, "bogus": 1},
            "unknown": 1,
            "spec": {"image": "x", "junk": true, "replicas": null, "note": null,
                     "extra": {"anything": {"deep": 1}, "known": {"a": "x", "b": "dropped"}},
                     "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "zzz": 1},
                                  "spec": {"x": 1, "y": 2}, "other": 3},
                     "ports": [{"name": "a", "junk": 1}, {"name": "b", "protocol": null}, null],
                     "labels": {"k": "v", "n": null}},
            "status": {"ready": true, "junk": 1}}),
        json!({"spec": {"image": "x", "ports": [{"name": "a"}, {"name": "b", "protocol": "UDP"}],
            "labels": {"a": null}, "note": null}}),
        json!({"spec": null, "status": null, "metadata": null}),
        json!({"spec": {"ports": "not a list", "labels": [1, 2], "extra": 3}}),
        json!([1, 2]),
        json!({}),
    ];
    for o in objects {
        let mut two = o.clone();
        s.prune(&mut two);
        s.apply_defaults(&mut two);
        let mut one = o.clone();
        s.prune_and_default(&mut one);
        assert_eq!(one, two, "{o}");
    }
}

#[test]
fn unknown_fields_are_the_fields_pruning_drops_with_their_paths() {
    let s = spec_schema();
    let obj = json!({"apiVersion": "x/v1", "kind": "K",
        "metadata": {"name": "a", "bogus": 1},
        "unknown": 1,
        "spec": {"image": "x", "junk": true,
                 "extra": {"anything": {"deep": 1}, "known": {"a": "x", "b": "dropped"}},
                 "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "zzz": 1},
                              "spec": {"x": 1, "y": 2}, "other": 3},
                 "ports": [{"name": "a"}, {"name": "b", "junk": 1}],
                 "labels": {"k": "v"}},
        "status": {"ready": true, "junk": 1}});
    let mut got = s.unknown_fields(&obj);
    got.sort();
    assert_eq!(
        got,
        vec![
            ".spec.extra.known.b",
            ".spec.junk",
            ".spec.ports[1].junk",
            ".spec.template.other",
            ".spec.template.spec.y",
            ".status.junk",
            ".unknown",
        ]
    );
    let mut pruned = obj.clone();
    s.prune(&mut pruned);
    assert!(s.unknown_fields(&pruned).is_empty());
}

#[test]
fn defaults_are_applied_nested_into_arrays_and_maps() {
    let s = spec_schema();
    let mut obj = json!({"spec": {"image": "x", "ports": [{"name": "a"}, {"name": "b", "protocol": "UDP"}],
        "labels": {"a": null}, "note": null}});
    s.apply_defaults(&mut obj);
    assert_eq!(
        obj,
        json!({"spec": {"image": "x", "replicas": 1,
        "ports": [{"name": "a", "protocol": "TCP"}, {"name": "b", "protocol": "UDP"}],
        "labels": {"a": "none"}, "note": null}})
    );
    let mut obj = json!({"spec": {"image": "x", "replicas": null}});
    s.apply_defaults(&mut obj);
    assert_eq!(
        obj["spec"]["replicas"],
        json!(1),
        "null of a non-nullable field is defaulted"
    );
    // no default below an absent parent
    let mut obj = json!({"metadata": {"name": "a"}});
    s.apply_defaults(&mut obj);
    assert_eq!(obj, json!({"metadata": {"name": "a"}}));
}

#[test]
fn an_object_default_is_itself_defaulted_and_nulls_without_defaults_are_dropped() {
    let s = compile(obj(json!({
        "res": {"type": "object", "default": {}, "properties": {"cpu": {"type": "string", "default": "1"}}},
        "opt": {"type": "string"},
    })));
    let mut o = json!({"spec": {"opt": null}});
    s.apply_defaults(&mut o);
    assert_eq!(o, json!({"spec": {"res": {"cpu": "1"}}}));
}

#[test]
fn unchanged_invalid_values_are_ratcheted_on_update() {
    let s = spec_schema();
    let old = json!({"spec": {"image": "BAD", "replicas": 50}});
    let new = json!({"spec": {"image": "BAD", "replicas": 5}});
    assert!(s.validate(&new, Some(&old)).is_empty());
    let new = json!({"spec": {"image": "ALSO BAD", "replicas": 5}});
    assert_eq!(
        messages(&s.validate(&new, Some(&old))),
        vec![
            r#"spec.image: Invalid value: "ALSO BAD": spec.image in body should match '^[a-z:./0-9]+$'"#
        ]
    );
}

#[test]
fn composition_keywords_report_as_kube_openapi() {
    let s = compile(obj(json!({
        "a": {"type": "string", "anyOf": [{"pattern": "^x"}, {"pattern": "^y"}]},
        "b": {"type": "integer", "oneOf": [{"minimum": 0}, {"maximum": 10}]},
        "c": {"type": "string", "not": {"enum": ["no"]}},
        "d": {"type": "string", "allOf": [{"minLength": 2}, {"maxLength": 3}]},
    })));
    let got = messages(&s.validate(
        &json!({"spec": {"a": "z", "b": 5, "c": "no", "d": "a"}}),
        None,
    ));
    for want in [
        r#": Invalid value: "": "spec.a" must validate at least one schema (anyOf)"#,
        r#"spec.a: Invalid value: "z": spec.a in body should match '^x'"#,
        r#": Invalid value: "": "spec.b" must validate one and only one schema (oneOf). Found 2 valid alternatives"#,
        r#": Invalid value: "": "spec.c" must not validate the schema (not)"#,
        r#"spec.d: Invalid value: "a": spec.d in body should be at least 2 chars long"#,
        r#": Invalid value: "": "spec.d" must validate all the schemas (allOf)"#,
    ] {
        assert!(
            got.contains(&want.to_string()),
            "missing {want}\nin {got:#?}"
        );
    }
}

fn rules_schema(rules: Value) -> Schema {
    compile(
        json!({"type": "object", "properties": {"spec": {"type": "object",
        "x-kubernetes-validations": rules,
        "properties": {
            "minReplicas": {"type": "integer"},
            "maxReplicas": {"type": "integer"},
            "name": {"type": "string", "maxLength": 64},
            "mode": {"type": "string", "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "mode is immutable"}]},
            "items": {"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 10}},
            "cpu": {"x-kubernetes-int-or-string": true},
        }}}}),
    )
}

#[test]
fn a_failing_rule_reports_its_message_or_the_rule() {
    let s = rules_schema(json!([
        {"rule": "self.minReplicas <= self.maxReplicas"},
        {"rule": "self.name.startsWith('a')", "message": "name must start with a"},
        {"rule": "self.items.all(i, i.size() < 4)", "messageExpression": "'item too long in ' + self.name"},
        {"rule": "!has(self.cpu) || quantity(string(self.cpu)).isLessThan(quantity('4'))",
         "message": "too many cpus", "fieldPath": ".cpu", "reason": "FieldValueForbidden"},
    ]));
    let got = messages(&s.validate(
        &json!({"spec": {"minReplicas": 5, "maxReplicas": 2,
        "name": "bob", "items": ["short", "x"], "cpu": "8"}}),
        None,
    ));
    assert_eq!(
        got,
        vec![
            "spec: Invalid value: failed rule: self.minReplicas <= self.maxReplicas",
            "spec: Invalid value: name must start with a",
            "spec: Invalid value: item too long in bob",
            "spec.cpu: Forbidden: too many cpus",
        ]
    );
    let ok = json!({"spec": {"minReplicas": 1, "maxReplicas": 2, "name": "al", "items": ["abc"], "cpu": 2}});
    assert!(
        s.validate(&ok, None).is_empty(),
        "{:?}",
        messages(&s.validate(&ok, None))
    );
}

#[test]
fn transition_rules_see_the_old_object_on_update_only() {
    let s = rules_schema(json!([]));
    let old = json!({"spec": {"mode": "a"}});
    assert!(s.validate(&json!({"spec": {"mode": "b"}}), None).is_empty());
    assert!(s.validate(&old, Some(&old)).is_empty());
    assert_eq!(
        messages(&s.validate(&json!({"spec": {"mode": "b"}}), Some(&old))),
        vec![r#"spec.mode: Invalid value: "b": mode is immutable"#]
    );
}

#[test]
fn a_rule_that_errors_says_so() {
    let s = rules_schema(json!([{"rule": "self.minReplicas > 0"}]));
    let got = messages(&s.validate(&json!({"spec": {"name": "x"}}), None));
    assert_eq!(got.len(), 1);
    assert!(
        got[0].starts_with(r#"spec: Invalid value: "object": "#),
        "{got:?}"
    );
    assert!(
        got[0].ends_with("evaluating rule: self.minReplicas > 0"),
        "{got:?}"
    );
}

#[test]
fn invalid_rules_are_refused_at_creation() {
    let p = format!("{P}.properties[spec].x-kubernetes-validations");
    let with_rules = |rules: Value| {
        refused(
            json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"a": {"type": "string"}}, "x-kubernetes-validations": rules}}}),
        )
    };
    let got = with_rules(json!([{"rule": "self.a ==="}, {"rule": "self.b == 'x'"}]));
    assert!(
        got.iter().any(|g| g.starts_with(&format!(
            "{p}[0].rule: Invalid value: {{\"rule\":\"self.a ===\"}}: compilation failed: "
        ))),
        "{got:#?}"
    );
    assert!(
        got.iter()
            .any(|g| g.starts_with(&format!("{p}[1].rule: Invalid value: "))
                && g.contains("undefined field 'b'")),
        "{got:#?}"
    );
    // Static mistakes are reported first, as Kubernetes skips compiling then.
    let got = with_rules(json!([{"rule": "self.a == 'x'", "reason": "Nope"}, {"rule": ""}]));
    assert_eq!(
        got,
        vec![
            format!(
                r#"{p}[0].reason: Unsupported value: "Nope": supported values: "FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired""#
            ),
            format!("{p}[1].rule: Required value: rule is not specified"),
        ]
    );
}

#[test]
fn compile_errors_and_old_self_misuse_are_reported() {
    let p = format!("{P}.properties[spec]");
    let got = refused(
        json!({"type": "object", "properties": {"spec": {"type": "object",
        "properties": {
            "a": {"type": "string", "x-kubernetes-validations": [{"rule": "size(foo) > 1"}]},
            "l": {"type": "array", "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}},
            "o": {"type": "string", "x-kubernetes-validations": [{"rule": "self == 'x'", "optionalOldSelf": true}]},
        }}}}),
    );
    assert!(
        got.iter().any(|g| g.starts_with(&format!(
            "{p}.properties[a].x-kubernetes-validations[0].rule: Invalid value: "
        )) && g.contains("undeclared reference to 'foo'")),
        "{got:#?}"
    );
    assert!(
        got.iter().any(|g| g.starts_with(&format!(
            "{p}.properties[l].items.x-kubernetes-validations[0].rule: Invalid value: "
        )) && g
            .contains("oldSelf cannot be used on the uncorrelatable portion of the schema")),
        "{got:#?}"
    );
    assert!(got.contains(&format!("{p}.properties[o].x-kubernetes-validations[0].optionalOldSelf: Invalid value: true: may not be set if oldSelf is not used in rule")), "{got:#?}");
}

#[test]
fn nested_macros_over_unbounded_lists_exceed_the_estimated_budget() {
    let unbounded = json!({"type": "object", "properties": {"spec": {"type": "object",
    "x-kubernetes-validations": [{"rule": "self.a.all(x, self.b.all(y, x != y))"}],
    "properties": {
        "a": {"type": "array", "items": {"type": "string"}},
        "b": {"type": "array", "items": {"type": "string"}},
    }}}});
    let got = refused(unbounded.clone());
    assert!(got.iter().any(|g| g.starts_with(&format!(
        "{P}.properties[spec].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of"))
        && g.ends_with("(try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)")),
        "{got:#?}");
    let mut bounded = unbounded;
    for l in ["a", "b"] {
        let p = &mut bounded["properties"]["spec"]["properties"][l];
        p["maxItems"] = json!(100);
        p["items"]["maxLength"] = json!(64);
    }
    let s = compile(bounded);
    assert!(s
        .validate(&json!({"spec": {"a": ["x"], "b": ["y"]}}), None)
        .is_empty());
    assert_eq!(
        s.validate(&json!({"spec": {"a": ["x"], "b": ["x"]}}), None)
            .len(),
        1
    );
}

#[test]
fn rules_inside_lists_run_for_each_element_with_its_path() {
    let s = compile(obj(json!({"ports": {"type": "array", "maxItems": 5,
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
        "items": {"type": "object", "required": ["name"],
            "x-kubernetes-validations": [{"rule": "self.port > 0 && self.port < 65536", "message": "bad port"},
                                         {"rule": "!has(oldSelf.port) || self.port == oldSelf.port", "message": "port is immutable"}],
            "properties": {"name": {"type": "string", "maxLength": 10}, "port": {"type": "integer"}}}}})));
    let old = json!({"spec": {"ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}]}});
    let new = json!({"spec": {"ports": [{"name": "b", "port": 82}, {"name": "a", "port": 80}, {"name": "c", "port": 0}]}});
    assert_eq!(
        messages(&s.validate(&new, Some(&old))),
        vec![
            "spec.ports[0]: Invalid value: port is immutable",
            "spec.ports[2]: Invalid value: bad port",
        ]
    );
}

#[test]
fn property_names_are_escaped_for_cel() {
    let s = compile(obj(json!({"x-y": {"type": "string"}, "in": {"type": "integer"}, "a.b": {"type": "string"}})
        ).pointer("").cloned().map(|mut v| {
            v["properties"]["spec"]["x-kubernetes-validations"] =
                json!([{"rule": "self.x__dash__y == 'ok' && self.__in__ == 1 && self.a__dot__b == 'z'"}]);
            v
        }).unwrap());
    assert!(s
        .validate(&json!({"spec": {"x-y": "ok", "in": 1, "a.b": "z"}}), None)
        .is_empty());
    assert_eq!(
        s.validate(&json!({"spec": {"x-y": "no", "in": 1, "a.b": "z"}}), None)
            .len(),
        1
    );
}

#[test]
fn numbers_are_doubles_and_date_times_timestamps_in_rules() {
    let s = compile(
        json!({"type": "object", "properties": {"spec": {"type": "object",
        "x-kubernetes-validations": [
            {"rule": "self.ratio > 0.5 && self.ratio == 2.0"},
            {"rule": "self.start < self.end"},
            {"rule": "self.timeout > duration('1s')"}],
        "properties": {"ratio": {"type": "number"},
            "start": {"type": "string", "format": "date-time"},
            "end": {"type": "string", "format": "date-time"},
            "timeout": {"type": "string", "format": "duration"}}}}}),
    );
    let ok = json!({"spec": {"ratio": 2, "start": "2024-01-01T00:00:00Z", "end": "2024-06-01T00:00:00Z", "timeout": "1m"}});
    assert!(
        s.validate(&ok, None).is_empty(),
        "{:?}",
        messages(&s.validate(&ok, None))
    );
}

#[test]
fn root_rules_see_metadata_name() {
    let s = compile(json!({"type": "object",
        "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('x-')", "message": "name needs x-"}],
        "properties": {"spec": {"type": "object"}}}));
    assert!(s
        .validate(&json!({"metadata": {"name": "x-a"}, "spec": {}}), None)
        .is_empty());
    assert_eq!(
        messages(&s.validate(&json!({"metadata": {"name": "a"}, "spec": {}}), None)),
        vec![": Invalid value: name needs x-"]
    );
}

/// A tiny deterministic generator, so the fuzz test needs no extra crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A mostly structural schema with random keywords.
    fn schema(&mut self, depth: u32) -> Value {
        let types = ["object", "array", "string", "integer", "number", "boolean"];
        let ty = types[self.below(if depth > 3 { 4 } else { 6 }) as usize % 6];
        let ty = if depth > 3 {
            ["string", "integer", "number", "boolean"][self.below(4) as usize]
        } else {
            ty
        };
        let mut m = serde_json::Map::new();
        m.insert("type".into(), json!(ty));
        match ty {
            "object" => {
                if self.below(4) == 0 {
                    m.insert("additionalProperties".into(), self.schema(depth + 1));
                } else {
                    let mut props = serde_json::Map::new();
                    for k in ["a", "b", "c"].iter().take(self.below(4) as usize) {
                        props.insert(k.to_string(), self.schema(depth + 1));
                    }
                    m.insert("properties".into(), Value::Object(props));
                    if self.below(3) == 0 {
                        m.insert("required".into(), json!(["a"]));
                    }
                }
                if self.below(5) == 0 {
                    m.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
                }
            }
            "array" => {
                m.insert("items".into(), self.schema(depth + 1));
                if self.below(2) == 0 {
                    m.insert("maxItems".into(), json!(self.below(5)));
                }
                if self.below(4) == 0 {
                    m.insert("x-kubernetes-list-type".into(), json!("atomic"));
                }
            }
            "string" => {
                if self.below(3) == 0 {
                    m.insert("maxLength".into(), json!(self.below(8)));
                }
                if self.below(4) == 0 {
                    m.insert(
                        "pattern".into(),
                        json!(["^a", "[", "b$", "^(x|y)*$"][self.below(4) as usize]),
                    );
                }
                if self.below(4) == 0 {
                    m.insert(
                        "format".into(),
                        json!(
                            ["date-time", "uuid", "email", "byte", "duration"]
                                [self.below(5) as usize]
                        ),
                    );
                }
                if self.below(4) == 0 {
                    m.insert("enum".into(), json!(["a", "b"]));
                }
            }
            "integer" | "number" => {
                if self.below(3) == 0 {
                    m.insert("minimum".into(), json!(self.below(10) as i64 - 5));
                }
                if self.below(4) == 0 {
                    m.insert(
                        "multipleOf".into(),
                        json!([0.5, 2.0, 3.0][self.below(3) as usize]),
                    );
                }
            }
            _ => {}
        }
        if self.below(4) == 0 {
            m.insert("nullable".into(), json!(true));
        }
        if self.below(4) == 0 {
            m.insert("default".into(), self.value(3));
        }
        if self.below(5) == 0 {
            let rules = [
                "self == oldSelf",
                "size(self) > 0",
                "self.all(x, x != null)",
                "has(self.a)",
                "self.a.b",
                "self > 1",
                "self.matches('^a')",
                "quantity(self).sign() > 0",
                "1/0 == 1",
                "[1,2].map(x, x * 2).sum() == 6",
                "self.size() < 3 ? true : false",
            ];
            m.insert(
                "x-kubernetes-validations".into(),
                json!([{"rule": rules[self.below(rules.len() as u64) as usize]}]),
            );
        }
        if self.below(6) == 0 {
            m.insert("anyOf".into(), json!([{"minimum": 1}, {"maxLength": 2}]));
        }
        Value::Object(m)
    }

    fn value(&mut self, depth: u32) -> Value {
        let keys = [
            "spec",
            "type",
            "properties",
            "items",
            "a",
            "b",
            "default",
            "enum",
            "required",
            "x-kubernetes-validations",
            "rule",
            "x-kubernetes-list-type",
            "x-kubernetes-list-map-keys",
            "additionalProperties",
            "nullable",
            "anyOf",
            "allOf",
            "not",
            "pattern",
            "maxItems",
            "x-kubernetes-int-or-string",
            "x-kubernetes-preserve-unknown-fields",
            "format",
            "x-kubernetes-embedded-resource",
            "minimum",
            "multipleOf",
            "metadata",
            "name",
        ];
        let strings = [
            "object",
            "array",
            "string",
            "integer",
            "number",
            "boolean",
            "map",
            "set",
            "self.a > 1",
            "self == oldSelf",
            "self.all(x, x > 0)",
            "[",
            "(a",
            "date-time",
            "",
            "a",
            "\u{0}",
        ];
        match if depth > 4 {
            self.below(5)
        } else {
            self.below(8)
        } {
            0 => Value::Null,
            1 => Value::Bool(self.below(2) == 0),
            2 => json!(self.next() as i64 % 100 - 50),
            3 => json!((self.next() % 1000) as f64 / 7.0),
            4 => Value::String(strings[self.below(strings.len() as u64) as usize].to_string()),
            5 | 6 => {
                let mut m = serde_json::Map::new();
                for _ in 0..self.below(5) {
                    m.insert(
                        keys[self.below(keys.len() as u64) as usize].to_string(),
                        self.value(depth + 1),
                    );
                }
                Value::Object(m)
            }
            _ => Value::Array((0..self.below(4)).map(|_| self.value(depth + 1)).collect()),
        }
    }
}

#[test]
fn random_schemas_and_objects_never_panic() {
    let mut rng = Rng(0x2545F4914F6CDD1D);
    let mut compiled = 0;
    for _ in 0..3000 {
        let mut schema = if rng.below(4) == 0 {
            rng.value(0)
        } else {
            rng.schema(0)
        };
        if rng.below(2) == 0 {
            schema = json!({"type": "object", "properties": {"spec": schema}});
        }
        if let Ok(s) = Schema::compile(&schema, "s") {
            compiled += 1;
            for _ in 0..5 {
                let v = rng.value(1);
                let mut o = json!({"spec": v});
                let old = if rng.below(2) == 0 {
                    o.clone()
                } else {
                    json!({"spec": rng.value(1)})
                };
                s.prune(&mut o);
                s.apply_defaults(&mut o);
                let _ = s.validate(&o, Some(&old));
                let _ = s.validate(&o, None);
            }
        }
    }
    assert!(
        compiled > 300,
        "the generator should produce some valid schemas ({compiled})"
    );
}

#[test]
fn optional_old_self_lets_a_transition_rule_run_on_create() {
    let s = compile(obj(
        json!({"size": {"type": "integer", "x-kubernetes-validations": [
        {"rule": "!oldSelf.hasValue() || self >= oldSelf.value()", "optionalOldSelf": true,
         "message": "size may only grow"},
        {"rule": "oldSelf.hasValue() || self < 100", "optionalOldSelf": true, "message": "start small"}]}}),
    ));
    assert!(s.validate(&json!({"spec": {"size": 5}}), None).is_empty());
    assert_eq!(
        messages(&s.validate(&json!({"spec": {"size": 500}}), None)),
        vec!["spec.size: Invalid value: 500: start small"]
    );
    let old = json!({"spec": {"size": 5}});
    assert_eq!(
        messages(&s.validate(&json!({"spec": {"size": 4}}), Some(&old))),
        vec!["spec.size: Invalid value: 4: size may only grow"]
    );
    assert!(s
        .validate(&json!({"spec": {"size": 500}}), Some(&old))
        .is_empty());
}

#[test]
fn a_missing_field_in_a_rule_reads_as_cel_go_says_it() {
    let s = rules_schema(json!([{"rule": "self.minReplicas > 0"}]));
    assert_eq!(
        messages(&s.validate(&json!({"spec": {"name": "x"}}), None)),
        vec![
            r#"spec: Invalid value: "object": no such key: minReplicas evaluating rule: self.minReplicas > 0"#
        ]
    );
}

#[test]
fn the_schema_wide_estimated_cost_is_bounded() {
    // Each rule is cheap alone but runs once per element of two unbounded
    // nested lists: the total for the schema is over Kubernetes' limit.
    let got = refused(obj(
        json!({"outer": {"type": "array", "items": {"type": "array",
        "items": {"type": "string", "x-kubernetes-validations": [
            {"rule": "self.lowerAscii().startsWith('a') && self.upperAscii().endsWith('Z')"}]}}}}),
    ));
    assert!(got.iter().any(|g| g.starts_with(&format!(
        "{P}: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of"))),
        "{got:#?}");
    assert!(got.iter().any(|g| g.ends_with("Forbidden: contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema")),
        "{got:#?}");
}

#[test]
fn the_runtime_budget_stops_further_rules() {
    // Within the static limits (lists bounded), but over the per-call limit
    // once a real object fills them.
    let s = compile(
        obj(json!({"a": {"type": "array", "maxItems": 500, "items": {"type": "integer"}}}))
            .pointer("")
            .cloned()
            .map(|mut v| {
                v["properties"]["spec"]["x-kubernetes-validations"] =
                    json!([{"rule": "self.a.all(x, self.a.all(y, x == y || x != y))"}]);
                v
            })
            .unwrap(),
    );
    assert!(s
        .validate(&json!({"spec": {"a": [1, 2, 3]}}), None)
        .is_empty());
    let big: Vec<i64> = (0..500).collect();
    let got = messages(&s.validate(&json!({"spec": {"a": big}}), None));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with(r#"spec: Invalid value: "object": 'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: "#), "{got:?}");
}

/// A real CRD from a file (`SKIFF_CRD_JSON=path`, a CRD as JSON): every
/// version compiles, and a sample object validates quickly. Ignored by
/// default: it needs a file the test does not ship.
#[test]
#[ignore]
fn a_real_crd_from_a_file_compiles_and_validates_fast() {
    let Ok(path) = std::env::var("SKIFF_CRD_JSON") else {
        return;
    };
    let crd: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let versions = crd["spec"]["versions"].as_array().unwrap();
    for (i, v) in versions.iter().enumerate() {
        let schema = &v["schema"]["openAPIV3Schema"];
        let t = std::time::Instant::now();
        let s = match Schema::compile(
            schema,
            &format!("spec.versions[{i}].schema.openAPIV3Schema"),
        ) {
            Ok(s) => s,
            Err(e) => panic!("{:#?}", messages(&e)),
        };
        eprintln!("compiled {} in {:?}", v["name"], t.elapsed());
        let obj = json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
            "metadata": {"name": "k8s", "namespace": "monitoring", "labels": {"a": "b"}},
            "spec": {"replicas": 2, "version": "v2.45.0", "serviceAccountName": "prometheus-k8s",
                "serviceMonitorSelector": {"matchLabels": {"team": "frontend"}},
                "podMonitorSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}]},
                "resources": {"requests": {"memory": "400Mi", "cpu": "500m"}},
                "retention": "10d", "enableAdminAPI": false,
                "securityContext": {"runAsUser": 1000, "fsGroup": 2000, "runAsNonRoot": true},
                "alerting": {"alertmanagers": [{"namespace": "monitoring", "name": "alertmanager-main", "port": "web"}]},
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "sidecar", "image": "busybox", "args": ["sleep", "3600"],
                    "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}],
                "storage": {"volumeClaimTemplate": {"spec": {"storageClassName": "ssd",
                    "resources": {"requests": {"storage": "40Gi"}}}}},
                "unknownField": {"dropped": true}}});
        let n = 2000;
        let t = std::time::Instant::now();
        for _ in 0..n {
            let mut o = obj.clone();
            s.prune(&mut o);
            s.apply_defaults(&mut o);
            let causes = s.validate(&o, None);
            assert!(causes.is_empty(), "{:#?}", messages(&causes));
        }
        eprintln!(
            "prune+default+validate: {:?} per object ({} bytes)",
            t.elapsed() / n,
            serde_json::to_vec(&obj).unwrap().len()
        );
        let mut o = obj.clone();
        s.prune(&mut o);
        s.apply_defaults(&mut o);
        let t = std::time::Instant::now();
        for _ in 0..n {
            let mut x = obj.clone();
            s.prune(&mut x);
        }
        eprintln!("clone+prune: {:?}", t.elapsed() / n);
        let t = std::time::Instant::now();
        for _ in 0..n {
            s.validate(&o, None);
        }
        eprintln!("validate: {:?}", t.elapsed() / n);
        fn strip(v: &mut Value) {
            match v {
                Value::Object(m) => {
                    m.remove("x-kubernetes-validations");
                    m.values_mut().for_each(strip);
                }
                Value::Array(a) => a.iter_mut().for_each(strip),
                _ => {}
            }
        }
        let mut plain = schema.clone();
        strip(&mut plain);
        let s2 = Schema::compile(&plain, "x").unwrap();
        let t = std::time::Instant::now();
        for _ in 0..n {
            s2.validate(&o, None);
        }
        eprintln!("validate without CEL rules: {:?}", t.elapsed() / n);
    }
}

/// Every CRD (as JSON) in `SKIFF_CRD_DIR` compiles, every version. Ignored
/// by default: real operators' CRDs are not shipped with the tests.
#[test]
#[ignore]
fn real_crds_in_a_directory_compile() {
    let Ok(dir) = std::env::var("SKIFF_CRD_DIR") else {
        return;
    };
    let mut failures = Vec::new();
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let crd: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for (i, v) in crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let Some(schema) = v["schema"].get("openAPIV3Schema") else {
                continue;
            };
            count += 1;
            if let Err(e) = Schema::compile(
                schema,
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
            ) {
                failures.push(format!("{}: {:#?}", path.display(), messages(&e)));
            }
        }
    }
    eprintln!("{count} schemas");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every example object (as JSON) in `SKIFF_CRD_EXAMPLES` is accepted by
/// the matching CRD's schema from `SKIFF_CRD_DIR`. Ignored by default.
#[test]
#[ignore]
fn documented_examples_validate_against_real_crds() {
    let (Ok(dir), Ok(examples)) = (
        std::env::var("SKIFF_CRD_DIR"),
        std::env::var("SKIFF_CRD_EXAMPLES"),
    ) else {
        return;
    };
    let mut schemas = std::collections::HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let crd: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let group = crd["spec"]["group"].as_str().unwrap_or("").to_string();
        let kind = crd["spec"]["names"]["kind"]
            .as_str()
            .unwrap_or("")
            .to_string();
        for v in crd["spec"]["versions"].as_array().into_iter().flatten() {
            if let Some(schema) = v["schema"].get("openAPIV3Schema") {
                let s = Schema::compile(schema, "s").expect("compiles");
                let av = format!("{group}/{}", v["name"].as_str().unwrap_or(""));
                schemas.insert((av, kind.clone()), s);
            }
        }
    }
    let mut failures = Vec::new();
    let mut count = 0;
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let mut obj: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let key = (
            obj["apiVersion"].as_str().unwrap_or("").to_string(),
            obj["kind"].as_str().unwrap_or("").to_string(),
        );
        let Some(s) = schemas.get(&key) else { continue };
        count += 1;
        s.prune(&mut obj);
        s.apply_defaults(&mut obj);
        let causes = s.validate(&obj, None);
        if !causes.is_empty() {
            failures.push(format!("{}: {:#?}", path.display(), messages(&causes)));
        }
    }
    eprintln!("{count} examples");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_schema_and_object_as_deep_as_json_allows_fit_a_server_threads_stack() {
    // serde_json refuses documents nested deeper than 128 levels; build the
    // deepest schema and object a request can carry and run everything on a
    // 2 MiB stack, as a server thread has.
    let depth = 60; // a property level is two JSON levels in the schema
    let mut schema = json!({"type": "string", "default": "x", "x-kubernetes-validations": [{"rule": "self != ''"}]});
    let mut object = json!("v");
    for _ in 0..depth {
        schema = json!({"type": "object", "properties": {"a": schema}});
        object = json!({"a": object});
    }
    let text = serde_json::to_string(&schema).unwrap();
    let out = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || {
            let schema: Value = serde_json::from_str(&text).unwrap();
            let s = Schema::compile(&schema, "s").unwrap();
            let mut o = object;
            s.prune(&mut o);
            s.apply_defaults(&mut o);
            s.validate(&o, Some(&json!({})))
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(out.is_empty(), "{:?}", messages(&out));
}

#[test]
fn a_rules_field_path_must_name_a_field() {
    let got = refused(obj(
        json!({"a": {"type": "object", "properties": {"b": {"type": "string"}},
        "x-kubernetes-validations": [
            {"rule": "true", "fieldPath": ".c"},
            {"rule": "true", "fieldPath": ".b[0]"},
            {"rule": "true", "fieldPath": "b"},
        ]}}),
    ));
    let p = format!("{P}.properties[spec].properties[a].x-kubernetes-validations");
    assert_eq!(
        got,
        vec![
            format!(r#"{p}[0].fieldPath: Invalid value: ".c": must be a valid path"#),
            format!(r#"{p}[1].fieldPath: Invalid value: ".b[0]": must be a valid path"#),
            format!(r#"{p}[2].fieldPath: Invalid value: "b": must be a valid path"#),
        ]
    );
    compile(obj(
        json!({"a": {"type": "object", "properties": {"b": {"type": "object",
        "properties": {"c-d": {"type": "string"}}}},
        "x-kubernetes-validations": [{"rule": "true", "fieldPath": ".b['c-d']"}]}}),
    ));
}

#[test]
fn embedded_resources_are_checked_as_kubernetes_checks_them() {
    let s = spec_schema();
    let got = messages(&s.validate(&json!({"spec": {"image": "x", "template": {
        "apiVersion": "a/b/c", "kind": "Not_A_Kind", "metadata": {"name": "a/b", "labels": {"x": 1}}}}}), None));
    assert_eq!(
        got,
        vec![
            r#"spec.template.apiVersion: Invalid value: "a/b/c": unexpected GroupVersion string: a/b/c"#,
            r#"spec.template.kind: Invalid value: "Not_A_Kind": may have mixed case, but should otherwise match: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"#,
            r#"spec.template.metadata.name: Invalid value: "a/b": may not contain '/'"#,
            r#"spec.template.metadata.labels: Invalid value: {"x":1}: must be a map of strings"#,
        ]
    );
    let ok = json!({"spec": {"image": "x", "template": {"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}}}}});
    assert!(s.validate(&ok, None).is_empty());
}

#[test]
fn rules_whose_operand_types_cannot_match_are_refused() {
    let p = format!("{P}.properties[spec].x-kubernetes-validations[0].rule");
    let with_rule = |rule: &str| {
        Schema::compile(
            &json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": rule}],
            "properties": {"replicas": {"type": "integer"}, "name": {"type": "string"},
                "ratio": {"type": "number"}, "on": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "port": {"x-kubernetes-int-or-string": true},
                "timeout": {"type": "string", "format": "duration"}}}}}),
            P,
        )
    };
    let refused_with = |rule: &str| -> String {
        let e = with_rule(rule).expect_err(rule);
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].field, p);
        e[0].message.clone()
    };
    let m = refused_with("self.replicas > 'abc'");
    assert!(m.ends_with("compilation failed: ERROR: <input>:1:15: found no matching overload for '_>_' applied to '(int, string)'"), "{m}");
    assert!(refused_with("self.name + 1 == 'x1'")
        .contains("found no matching overload for '_+_' applied to '(string, int)'"));
    assert!(refused_with("!self.replicas")
        .contains("found no matching overload for '!_' applied to '(int)'"));
    assert!(refused_with("self.on == 'true'").contains("applied to '(bool, string)'"));
    assert!(refused_with("self.tags[0] > 1").contains("applied to '(string, int)'"));
    for ok in [
        "self.replicas > 1 && self.ratio > 0.5 && self.ratio >= self.replicas",
        "self.port == 80 || self.port == 'http'",
        "self.name + '-x' != 'y' && size(self.tags) < 3 && self.tags.all(t, t != 'a')",
        "self.timeout > duration('1s') && !self.on",
        "has(self.name) == true",
    ] {
        assert!(with_rule(ok).is_ok(), "{ok}: {:?}", with_rule(ok).err());
    }
}

#[test]
fn value_validations_may_only_constrain_fields_the_schema_specifies() {
    let got = refused(obj(
        json!({"a": {"type": "object", "properties": {"b": {"type": "string"}},
        "anyOf": [{"properties": {"b": {"minLength": 1}}}, {"properties": {"c": {"minLength": 1}}}],
        "oneOf": [{"properties": {"metadata": {"minProperties": 1}}}]}}),
    ));
    let p = format!("{P}.properties[spec].properties[a]");
    assert_eq!(got, vec![
        format!("{p}.oneOf[0].properties[metadata]: Forbidden: must not be specified in a nested context"),
        format!("{p}.properties[c]: Required value: because it is defined in {p}.anyOf[1].properties[c]"),
        format!("{p}.properties[metadata]: Required value: because it is defined in {p}.oneOf[0].properties[metadata]"),
    ]);
}

#[test]
fn compiled_schemas_and_programs_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync + Clone + 'static>() {}
    assert_send_sync::<Schema>();
    assert_send_sync::<crate::cel::Program>();
    let s = rules_schema(json!([{"rule": "self.minReplicas <= self.maxReplicas"}]));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                s.validate(&json!({"spec": {"minReplicas": i, "maxReplicas": 2}}), None)
                    .len()
            })
        })
        .collect();
    let counts: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(counts, vec![0, 0, 0, 1]);
}

#[test]
fn a_refused_rule_is_shown_as_kubernetes_marshals_it() {
    let got = refused(
        json!({"type": "object", "properties": {"spec": {"type": "object",
        "x-kubernetes-validations": [{"message": "m", "rule": "self.x"}]}}}),
    );
    assert!(got[0].starts_with(&format!(
        r#"{P}.properties[spec].x-kubernetes-validations[0].rule: Invalid value: {{"rule":"self.x","message":"m"}}: compilation failed: "#
    )), "{got:?}");
}

#[test]
fn a_default_must_satisfy_the_rules_too() {
    let got = refused(obj(
        json!({"range": {"type": "object", "default": {"min": 5, "max": 1},
        "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min must not exceed max"}],
        "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}}}}),
    ));
    assert_eq!(
        got,
        vec![format!(
        "{P}.properties[spec].properties[range].default: Invalid value: min must not exceed max"
    )]
    );
}

#[test]
fn patterns_real_crds_use_compile_as_go_compiles_them() {
    for p in [
        r"^(\/[^\/]+)+$",
        r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        r"^[\-a-z0-9\_\.]+$",
        r"^([0-9]{1,5}(h|m|s|ms)){1,4}$",
        r"^(([0-9]+(\.[0-9]+)?(ms|s|m|h))+)$",
        r"^\s*\S+\s*$",
        r"^[[:alnum:]]+\z",
        r"^\d+[KMGTPE]i?$",
        r"^\p{L}+$",
    ] {
        compile(obj(json!({"a": {"type": "string", "pattern": p}})));
    }
}

#[test]
fn rules_are_checked_inside_macros_too() {
    let with_rule = |rule: &str| {
        Schema::compile(
            &obj(
                json!({"ports": {"type": "array", "items": {"type": "object",
            "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}}),
            )
            .pointer("")
            .cloned()
            .map(|mut v| {
                v["properties"]["spec"]["x-kubernetes-validations"] = json!([{"rule": rule}]);
                v
            })
            .unwrap(),
            P,
        )
    };
    let e = with_rule("self.ports.all(p, p.nmae != '')").unwrap_err();
    assert!(e[0].message.ends_with("undefined field 'nmae'"), "{e:?}");
    let e = with_rule("self.ports.exists(p, p.port == 'http')").unwrap_err();
    assert!(
        e[0].message
            .contains("found no matching overload for '_==_' applied to '(int, string)'"),
        "{e:?}"
    );
    for ok in [
        "self.ports.all(p, p.name != '' && p.port > 0)",
        "self.labels.all(k, k.startsWith('x') && self.labels[k] != '')",
        "self.ports.exists_one(p, p.port == 80)",
        "self.ports.all(self, has(self.name))",
    ] {
        assert!(with_rule(ok).is_ok(), "{ok}: {:?}", with_rule(ok).err());
    }
}

#[test]
fn rules_calling_undeclared_functions_or_not_yielding_a_bool_are_refused_at_creation() {
    let p = format!("{P}.properties[spec].x-kubernetes-validations");
    let with_rules = |rules: Value| {
        refused(
            json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"a": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
            "x-kubernetes-validations": rules}}}),
        )
    };
    let got = with_rules(json!([
        {"rule": "self.a.foo()"},
        {"rule": "foo(self.a)"},
        {"rule": "self.n + 1"},
        {"rule": "self.a == 'x'", "messageExpression": "nope(self.a)"},
    ]));
    assert_eq!(
        got,
        vec![
            format!(
                r#"{p}[0].rule: Invalid value: {{"rule":"self.a.foo()"}}: compilation failed: ERROR: <input>:1:11: undeclared reference to 'foo' (in container '')"#
            ),
            format!(
                r#"{p}[1].rule: Invalid value: {{"rule":"foo(self.a)"}}: compilation failed: ERROR: <input>:1:4: undeclared reference to 'foo' (in container '')"#
            ),
            format!(
                r#"{p}[2].rule: Invalid value: {{"rule":"self.n + 1"}}: cel expression must evaluate to a bool"#
            ),
            format!(
                r#"{p}[3].messageExpression: Invalid value: {{"rule":"self.a == 'x'","messageExpression":"nope(self.a)"}}: messageExpression compilation failed: ERROR: <input>:1:5: undeclared reference to 'nope' (in container '')"#
            ),
        ]
    );
}

#[test]
fn two_variable_comprehensions_validate_and_are_costed() {
    let schema = |max: Option<u64>| {
        let mut labels =
            json!({"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}});
        if let Some(m) = max {
            labels["maxProperties"] = json!(m);
        }
        json!({"type": "object", "properties": {"spec": {"type": "object",
        "properties": {"labels": labels, "ports": {"type": "array", "maxItems": 8,
            "items": {"type": "integer"}}},
        "x-kubernetes-validations": [
            {"rule": "self.labels.all(k, v, k.size() + v.size() < 20)", "message": "short labels"},
            {"rule": "!has(self.ports) || self.ports.all(i, p, i == 0 || p > self.ports[i - 1])",
             "message": "ports ascend"},
            {"rule": "self.labels.transformMap(k, v, v.size()).all(k, n, n <= self.labels.size() * 20)"}
        ]}}})
    };
    // Unbounded labels: a nested comprehension over them iterates the
    // square of what a request can hold.
    let mut nested = schema(None);
    nested["properties"]["spec"]["x-kubernetes-validations"][0]["rule"] =
        json!("self.labels.all(k, v, self.labels.exists(k2, v2, v2 != k))");
    let got = refused(nested);
    assert!(
        got.iter()
            .any(|g| g.contains("estimated rule cost exceeds budget by factor of")),
        "{got:#?}"
    );
    let s = compile(schema(Some(16)));
    let ok = json!({"spec": {"labels": {"a": "b", "c": "d"}, "ports": [1, 5, 9]}});
    assert!(s.validate(&ok, None).is_empty());
    let bad = json!({"spec": {"labels": {"a": "bbbbbbbbbbbbbbbbbbbbbbbb"}, "ports": [5, 1]}});
    assert_eq!(
        messages(&s.validate(&bad, None)),
        vec![
            "spec: Invalid value: short labels",
            "spec: Invalid value: ports ascend",
            "spec: Invalid value: failed rule: self.labels.transformMap(k, v, v.size()).all(k, n, n <= self.labels.size() * 20)"
        ]
    );
}
