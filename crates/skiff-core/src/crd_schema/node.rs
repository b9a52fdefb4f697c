//! The compiled form of a structural schema: one `Node` per schema object,
//! built once at CRD creation so validation never re-reads the JSON schema.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::cel::Program;

/// A JSON type as OpenAPI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Type {
    Object,
    Array,
    String,
    Integer,
    Number,
    Boolean,
}

impl Type {
    pub(crate) fn parse(s: &str) -> Option<Type> {
        Some(match s {
            "object" => Type::Object,
            "array" => Type::Array,
            "string" => Type::String,
            "integer" => Type::Integer,
            "number" => Type::Number,
            "boolean" => Type::Boolean,
            _ => return None,
        })
    }
    pub(crate) fn name(self) -> &'static str {
        match self {
            Type::Object => "object",
            Type::Array => "array",
            Type::String => "string",
            Type::Integer => "integer",
            Type::Number => "number",
            Type::Boolean => "boolean",
        }
    }
}

/// `x-kubernetes-list-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListType {
    Atomic,
    Set,
    Map,
}

/// How CEL names a property of an object: as written, escaped
/// (`x-y` → `x__dash__y`), or not at all (names CEL cannot spell).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum CelKey {
    #[default]
    Same,
    Escaped(String),
    Hidden,
}

impl CelKey {
    pub(crate) fn of(name: &str) -> CelKey {
        match crate::cel::escape_property(name) {
            Some(e) if e == name => CelKey::Same,
            Some(e) => CelKey::Escaped(e),
            None => CelKey::Hidden,
        }
    }
}

/// One `x-kubernetes-validations` entry, compiled.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub(crate) rule: String,
    pub(crate) program: Program,
    pub(crate) message: Option<String>,
    pub(crate) message_expression: Option<Program>,
    pub(crate) reason: Option<String>,
    /// `fieldPath` normalised to Kubernetes' field path notation (`.spec.x` → `spec.x`).
    pub(crate) field_path: Option<String>,
    pub(crate) uses_old_self: bool,
    pub(crate) optional_old_self: bool,
    /// The estimated cost of one evaluation (rule and messageExpression),
    /// from the schema's bounds.
    pub(crate) cost: u64,
}

impl Rule {
    pub(crate) fn static_cost(&self) -> u64 {
        self.cost
    }
}

/// A compiled schema node. Value validations (`allOf`, `anyOf`, `oneOf`,
/// `not`) are nodes too, without a structural skeleton of their own.
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    pub(crate) ty: Option<Type>,
    pub(crate) nullable: bool,
    pub(crate) format: Option<String>,
    pub(crate) properties: BTreeMap<String, Node>,
    /// `additionalProperties` with a schema.
    pub(crate) additional: Option<Box<Node>>,
    /// `additionalProperties: true` (keep every field, validate nothing).
    pub(crate) additional_any: bool,
    pub(crate) items: Option<Box<Node>>,
    pub(crate) required: Vec<String>,
    pub(crate) enum_values: Option<Vec<Value>>,
    pub(crate) pattern: Option<(String, regex::Regex)>,
    pub(crate) maximum: Option<f64>,
    pub(crate) exclusive_maximum: bool,
    pub(crate) minimum: Option<f64>,
    pub(crate) exclusive_minimum: bool,
    pub(crate) multiple_of: Option<f64>,
    pub(crate) max_length: Option<u64>,
    pub(crate) min_length: Option<u64>,
    pub(crate) max_items: Option<u64>,
    pub(crate) min_items: Option<u64>,
    pub(crate) max_properties: Option<u64>,
    pub(crate) min_properties: Option<u64>,
    pub(crate) all_of: Vec<Node>,
    pub(crate) any_of: Vec<Node>,
    pub(crate) one_of: Vec<Node>,
    pub(crate) not: Option<Box<Node>>,
    pub(crate) default: Option<Value>,
    pub(crate) preserve_unknown: bool,
    pub(crate) int_or_string: bool,
    pub(crate) embedded: bool,
    pub(crate) list_type: Option<ListType>,
    pub(crate) list_map_keys: Vec<String>,
    /// `x-kubernetes-map-type: atomic`.
    pub(crate) map_atomic: bool,
    pub(crate) rules: Vec<Rule>,
    /// The fields of `self` (as CEL names them) the rules read, when they
    /// only ever select fields of it: only those are converted for CEL.
    /// `None` when a rule uses `self` whole.
    pub(crate) rule_fields: Option<std::collections::BTreeSet<String>>,
    /// Whether this node or anything below it carries CEL rules (so validation
    /// can skip whole subtrees without rules).
    pub(crate) has_rules_below: bool,
    /// For a property, the name CEL knows it by (computed once, not per
    /// evaluation).
    pub(crate) cel_key: CelKey,
}

fn f64_of(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
}

fn u64_of(v: Option<&Value>) -> Option<u64> {
    v.and_then(|v| v.as_u64().or_else(|| v.as_f64().map(|f| f.max(0.0) as u64)))
}

impl Node {
    /// Builds a node from a schema that already passed the structural checks
    /// (rules are attached by the caller, which compiles them).
    pub(crate) fn build(s: &Value) -> Node {
        let Some(m) = s.as_object() else {
            return Node::default();
        };
        let get = |k: &str| m.get(k);
        let flag = |k: &str| get(k).and_then(Value::as_bool).unwrap_or(false);
        let sub_list = |k: &str| -> Vec<Node> {
            get(k)
                .and_then(Value::as_array)
                .map(|a| a.iter().map(Node::build).collect())
                .unwrap_or_default()
        };
        let mut n = Node {
            ty: get("type").and_then(Value::as_str).and_then(Type::parse),
            nullable: flag("nullable"),
            format: get("format")
                .and_then(Value::as_str)
                .filter(|f| !f.is_empty())
                .map(str::to_string),
            required: get("required")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            enum_values: get("enum").and_then(Value::as_array).cloned(),
            pattern: get("pattern")
                .and_then(Value::as_str)
                .and_then(|p| regex::Regex::new(p).ok().map(|r| (p.to_string(), r))),
            maximum: f64_of(get("maximum")),
            exclusive_maximum: flag("exclusiveMaximum"),
            minimum: f64_of(get("minimum")),
            exclusive_minimum: flag("exclusiveMinimum"),
            multiple_of: f64_of(get("multipleOf")),
            max_length: u64_of(get("maxLength")),
            min_length: u64_of(get("minLength")),
            max_items: u64_of(get("maxItems")),
            min_items: u64_of(get("minItems")),
            max_properties: u64_of(get("maxProperties")),
            min_properties: u64_of(get("minProperties")),
            all_of: sub_list("allOf"),
            any_of: sub_list("anyOf"),
            one_of: sub_list("oneOf"),
            not: get("not").map(|n| Box::new(Node::build(n))),
            default: get("default").cloned(),
            preserve_unknown: flag("x-kubernetes-preserve-unknown-fields"),
            int_or_string: flag("x-kubernetes-int-or-string"),
            embedded: flag("x-kubernetes-embedded-resource"),
            list_type: match get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("atomic") => Some(ListType::Atomic),
                Some("set") => Some(ListType::Set),
                Some("map") => Some(ListType::Map),
                _ => None,
            },
            list_map_keys: get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            map_atomic: get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic"),
            ..Node::default()
        };
        if let Some(props) = get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                let mut p = Node::build(v);
                p.cel_key = CelKey::of(k);
                n.properties.insert(k.clone(), p);
            }
        }
        match get("additionalProperties") {
            Some(Value::Bool(true)) => n.additional_any = true,
            Some(v @ Value::Object(_)) => n.additional = Some(Box::new(Node::build(v))),
            _ => {}
        }
        if let Some(items) = get("items").filter(|i| i.is_object()) {
            n.items = Some(Box::new(Node::build(items)));
        }
        n
    }

    /// Recomputes `has_rules_below` for this subtree.
    pub(crate) fn mark_rules(&mut self) -> bool {
        let mut any = !self.rules.is_empty();
        for p in self.properties.values_mut() {
            any |= p.mark_rules();
        }
        if let Some(a) = self.additional.as_mut() {
            any |= a.mark_rules();
        }
        if let Some(i) = self.items.as_mut() {
            any |= i.mark_rules();
        }
        self.has_rules_below = any;
        any
    }

    /// The type CEL and Kubernetes' messages name for this node (`object`,
    /// `array`, ...; empty for untyped, int-or-string nodes).
    pub(crate) fn type_name(&self) -> &'static str {
        self.ty.map(Type::name).unwrap_or("")
    }
}
