//! Structural schemas of CustomResourceDefinitions, as kube-apiserver
//! applies them: the checks at CRD creation (`Schema::compile`), defaulting,
//! pruning of unknown fields, and validation of custom resources (OpenAPI v3
//! keywords, `x-kubernetes-*` extensions and CEL rules), with Kubernetes'
//! field paths and messages.
//!
//! A `Schema` is compiled once per CRD version (regular expressions, CEL
//! programs and cost estimates included) and shared: cloning is cheap.
//! The order the API server applies them in is Kubernetes': `prune`, then
//! `apply_defaults`, then `validate`.

mod check;
mod formats;
mod node;
mod rules;
mod validate;

use std::sync::Arc;

use serde_json::Value;

use crate::cel::cost::{
    Shape, MAX_REQUEST_BYTES, STATIC_ESTIMATED_COST_LIMIT, STATIC_ESTIMATED_CRD_COST_LIMIT,
};
use crate::Cause;
use node::{ListType, Node, Rule, Type};

/// A compiled structural schema: `Send + Sync`, cheap to clone.
#[derive(Clone, Debug)]
pub struct Schema {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    raw: Value,
    root: Node,
}

/// Whether `s` is valid for the OpenAPI string `format` (unknown formats
/// accept anything, as in Kubernetes).
pub fn format_valid(format: &str, s: &str) -> bool {
    formats::valid(format, s)
}

/// ObjectMeta's fields: what pruning keeps of `metadata`.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

impl Schema {
    /// Checks and compiles one version's `openAPIV3Schema`. `path` prefixes
    /// causes, e.g. `spec.versions[0].schema.openAPIV3Schema`.
    pub fn compile(schema: &Value, path: &str) -> Result<Schema, Vec<Cause>> {
        let mut causes = check::check(schema, path);
        if !causes.is_empty() {
            return Err(causes);
        }
        let mut root = Node::build(schema);
        let mut cost = CostTotal::default();
        compile_rules(
            &mut root,
            schema,
            path,
            true,
            true,
            None,
            Some(1),
            &mut cost,
            &mut causes,
        );
        root.mark_rules();
        if causes.is_empty() {
            check_defaults(&root, schema, path, &mut causes);
        }
        if cost.total > STATIC_ESTIMATED_CRD_COST_LIMIT {
            let mut expensive = cost.rules.clone();
            expensive.sort_by_key(|e| std::cmp::Reverse(e.1));
            for (p, _) in expensive.iter().take(4) {
                causes.push(Cause::forbidden(
                    p.clone(),
                    "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
                ));
            }
            causes.push(Cause::forbidden(
                path,
                &cost_error_message(
                    "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                    cost.total,
                    STATIC_ESTIMATED_CRD_COST_LIMIT,
                ),
            ));
        }
        if !causes.is_empty() {
            return Err(causes);
        }
        root.mark_rules();
        Ok(Schema {
            inner: Arc::new(Inner {
                raw: schema.clone(),
                root,
            }),
        })
    }

    /// Kubernetes' defaulting: missing properties (and nulls of non-nullable
    /// properties) get their schema's default, nested, into arrays and maps.
    pub fn apply_defaults(&self, obj: &mut Value) {
        default_node(&self.inner.root, obj);
    }

    /// Kubernetes' pruning: fields the schema does not specify are dropped,
    /// except under `x-kubernetes-preserve-unknown-fields`; at the root and
    /// in embedded resources `apiVersion`, `kind` and `metadata` are kept
    /// (metadata reduced to ObjectMeta's fields).
    pub fn prune(&self, obj: &mut Value) {
        prune_node(&self.inner.root, obj, true);
    }

    /// `prune` then `apply_defaults`, in one walk of the object: what the
    /// API server runs on every write.
    pub fn prune_and_default(&self, obj: &mut Value) {
        prune_default_node(&self.inner.root, obj, true);
    }

    /// The fields `prune` would drop, as paths with a leading dot
    /// (`.spec.foo`, `.spec.list[0].bar`): what `fieldValidation` reports as
    /// unknown. Paths are only written out for unknown fields.
    pub fn unknown_fields(&self, obj: &Value) -> Vec<String> {
        let mut out = Vec::new();
        unknown_node(
            &self.inner.root,
            obj,
            &validate::P::Root(""),
            true,
            &mut out,
        );
        out
    }

    /// Every failing field, with Kubernetes' paths and messages: OpenAPI
    /// keywords, `x-kubernetes-*` extensions, then CEL rules (unless a value
    /// has the wrong type). With `old` (an update), transition rules see
    /// `oldSelf` and unchanged invalid values are accepted (ratcheting).
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
        let root = &self.inner.root;
        let mut v = validate::Validator {
            base: "",
            out: Vec::new(),
        };
        // The root's apiVersion, kind and metadata are checked by the API
        // server as for any object; validate the rest.
        validate_root(&mut v, root, obj, old);
        let blocking = v.out.iter().any(|c| c.reason == "FieldValueTypeInvalid");
        let mut causes = v.out;
        if !blocking && root.has_rules_below {
            rules::validate_rules(root, obj, old, &mut causes);
        }
        causes
    }

    /// The schema as given.
    pub fn raw(&self) -> &Value {
        &self.inner.raw
    }
}

fn validate_root(v: &mut validate::Validator<'_>, root: &Node, obj: &Value, old: Option<&Value>) {
    let Some(m) = obj.as_object() else {
        v.validate(root, obj, old, &validate::P::Root(""));
        return;
    };
    let old_m = old.and_then(Value::as_object);
    for r in &root.required {
        if !m.contains_key(r) && !matches!(r.as_str(), "apiVersion" | "kind" | "metadata") {
            v.out.push(Cause::required(r.clone()));
        }
    }
    for (k, val) in m {
        let o = old_m.and_then(|o| o.get(k));
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                // Only metadata.name and generateName may carry validations.
                if let (Some(p), Some(meta)) = (root.properties.get("metadata"), val.as_object()) {
                    for f in ["name", "generateName"] {
                        if let (Some(fnode), Some(x)) = (p.properties.get(f), meta.get(f)) {
                            let oo = o.and_then(|o| o.get(f));
                            v.validate(fnode, x, oo, &validate::P::Root(&format!("metadata.{f}")));
                        }
                    }
                }
            }
            _ => {
                if let Some(p) = root.properties.get(k) {
                    v.validate(p, val, o, &validate::P::Root(k));
                } else if let Some(a) = &root.additional {
                    v.validate(a, val, o, &validate::P::Root(k));
                }
            }
        }
    }
}

fn is_non_nullable_null(v: &Value, n: &Node) -> bool {
    v.is_null() && !n.nullable
}

/// Defaulting walks the object's fields (not the schema's properties) and
/// descends only into objects and arrays: it runs on every read from
/// storage, where there is usually nothing to do.
/// The defaults of `n`'s properties that `m` lacks, each defaulted inside.
fn add_missing_defaults(n: &Node, m: &mut serde_json::Map<String, Value>) {
    for (k, p) in &n.properties {
        if let Some(d) = &p.default {
            if !m.contains_key(k) {
                let mut x = d.clone();
                default_node(p, &mut x);
                m.insert(k.clone(), x);
            }
        }
    }
}

fn default_node(n: &Node, v: &mut Value) {
    match v {
        Value::Object(m) => {
            if n.properties.is_empty() && n.additional.is_none() {
                return;
            }
            m.retain(|k, x| {
                let prop = n.properties.get(k);
                let Some(c) = prop.or(n.additional.as_deref()) else {
                    return true;
                };
                if is_non_nullable_null(x, c) {
                    if let Some(d) = &c.default {
                        *x = d.clone();
                        default_node(c, x);
                        return true;
                    }
                    // Kubernetes drops nulls of non-nullable properties
                    // without a default (PruneNonNullableNullsWithoutDefaults).
                    return !(prop.is_some() && c.ty.is_some());
                }
                if matches!(x, Value::Object(_) | Value::Array(_)) {
                    default_node(c, x);
                }
                true
            });
            add_missing_defaults(n, m);
        }
        Value::Array(items) => {
            if let Some(i) = &n.items {
                for x in items.iter_mut() {
                    if is_non_nullable_null(x, i) {
                        if let Some(d) = &i.default {
                            *x = d.clone();
                        }
                    }
                    if matches!(x, Value::Object(_) | Value::Array(_)) {
                        default_node(i, x);
                    }
                }
            }
        }
        _ => {}
    }
}

fn prune_meta(meta: &mut Value) {
    if let Some(m) = meta.as_object_mut() {
        m.retain(|k, _| OBJECT_META_FIELDS.contains(&k.as_str()));
    }
}

fn prune_node(n: &Node, v: &mut Value, is_resource: bool) {
    match v {
        Value::Object(m) => {
            let resource = is_resource || n.embedded;
            if n.int_or_string {
                return;
            }
            m.retain(|k, _| {
                (resource && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                    || n.properties.contains_key(k)
                    || n.additional.is_some()
                    || n.additional_any
                    || n.preserve_unknown
            });
            for (k, x) in m.iter_mut() {
                if resource && k == "metadata" {
                    prune_meta(x);
                    continue;
                }
                if resource && matches!(k.as_str(), "apiVersion" | "kind") {
                    continue;
                }
                if let Some(p) = n.properties.get(k) {
                    prune_node(p, x, false);
                } else if let Some(a) = &n.additional {
                    prune_node(a, x, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(i) = &n.items {
                for x in items.iter_mut() {
                    prune_node(i, x, false);
                }
            }
        }
        _ => {}
    }
}

/// `prune_node` then `default_node` on one value, in one walk: each kept
/// field is pruned below and then defaulted, as the two passes would.
fn prune_default_node(n: &Node, v: &mut Value, is_resource: bool) {
    match v {
        Value::Object(m) => {
            if n.int_or_string {
                return;
            }
            let resource = is_resource || n.embedded;
            let keep_all = n.additional.is_some() || n.additional_any || n.preserve_unknown;
            m.retain(|k, x| {
                let prop = n.properties.get(k);
                let special = resource && matches!(k.as_str(), "apiVersion" | "kind" | "metadata");
                if !(special || prop.is_some() || keep_all) {
                    return false;
                }
                if special && k == "metadata" {
                    prune_meta(x);
                }
                let Some(c) = prop.or(n.additional.as_deref()) else {
                    return true;
                };
                if is_non_nullable_null(x, c) {
                    if let Some(d) = &c.default {
                        *x = d.clone();
                        default_node(c, x);
                        return true;
                    }
                    // Kubernetes drops nulls of non-nullable properties
                    // without a default (PruneNonNullableNullsWithoutDefaults).
                    if prop.is_some() && c.ty.is_some() {
                        return false;
                    }
                }
                if special {
                    // Pruning does not descend into these; defaulting does.
                    default_node(c, x);
                } else {
                    prune_default_node(c, x, false);
                }
                true
            });
            add_missing_defaults(n, m);
        }
        Value::Array(items) => {
            if let Some(i) = &n.items {
                for x in items.iter_mut() {
                    match &i.default {
                        Some(d) if is_non_nullable_null(x, i) => {
                            *x = d.clone();
                            default_node(i, x);
                        }
                        _ => prune_default_node(i, x, false),
                    }
                }
            }
        }
        _ => {}
    }
}

/// The fields `prune_node` would drop below `v`.
fn unknown_node(
    n: &Node,
    v: &Value,
    path: &validate::P<'_>,
    is_resource: bool,
    out: &mut Vec<String>,
) {
    match v {
        Value::Object(m) => {
            if n.int_or_string {
                return;
            }
            let resource = is_resource || n.embedded;
            let keep_all = n.additional.is_some() || n.additional_any || n.preserve_unknown;
            for (k, x) in m {
                if resource && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(p) = n.properties.get(k).or(n.additional.as_deref()) {
                    unknown_node(p, x, &validate::P::Field(path, k), false, out);
                } else if !keep_all {
                    out.push(format!(".{}", validate::P::Field(path, k)));
                }
            }
        }
        Value::Array(items) => {
            if let Some(i) = &n.items {
                for (idx, x) in items.iter().enumerate() {
                    unknown_node(i, x, &validate::P::Index(path, idx), false, out);
                }
            }
        }
        _ => {}
    }
}

/// Kubernetes' wording of a cost over its limit (`getCostErrorMessage`).
pub(crate) fn cost_error_message(name: &str, cost: u64, limit: u64) -> String {
    let factor = cost as f64 / limit as f64;
    let f = if factor > 100.0 {
        "more than 100x".to_string()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!(
        "{name} exceeds budget by factor of {f} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

#[derive(Default)]
struct CostTotal {
    total: u64,
    rules: Vec<(String, u64)>,
}

/// The smallest JSON a value of this node can take, for bounding how many
/// elements an unbounded list or map can hold within a request.
fn min_size(n: &Node) -> u64 {
    match n.ty {
        Some(Type::String) => 2,
        Some(Type::Object) | Some(Type::Array) => 2,
        Some(_) => 1,
        None => 1,
    }
}

/// The longest a string without `maxLength` can be: its longest enum value,
/// the fixed length of its format, or what fits in a request (as
/// Kubernetes estimates it).
fn string_bound(n: &Node) -> u64 {
    if let Some(values) = &n.enum_values {
        return values
            .iter()
            .map(|v| v.as_str().map_or(8, str::len) as u64)
            .max()
            .unwrap_or(0);
    }
    match n.format.as_deref() {
        Some("date") => 10,
        Some("date-time") | Some("datetime") => 32,
        Some("uuid") | Some("uuid3") | Some("uuid4") | Some("uuid5") => 36,
        Some("ipv4") => 15,
        Some("ipv6") => 45,
        Some("mac") => 23,
        _ => MAX_REQUEST_BYTES,
    }
}

/// The cost shape of a node's values, from the schema's bounds.
pub(crate) fn shape_of(n: &Node, depth: usize) -> Shape {
    if depth > 32 {
        return Shape::unbounded();
    }
    if n.int_or_string {
        return Shape::Str {
            max_len: n.max_length.unwrap_or(MAX_REQUEST_BYTES),
        };
    }
    match n.ty {
        Some(Type::String) => Shape::Str {
            max_len: n.max_length.unwrap_or_else(|| string_bound(n)),
        },
        Some(Type::Array) => {
            let elem = n.items.as_deref();
            let max = n
                .max_items
                .unwrap_or_else(|| MAX_REQUEST_BYTES / (elem.map(min_size).unwrap_or(1) + 1));
            Shape::List {
                max_items: max,
                elem: Box::new(
                    elem.map(|e| shape_of(e, depth + 1))
                        .unwrap_or(Shape::Scalar),
                ),
            }
        }
        Some(Type::Object) => {
            let fields: std::collections::BTreeMap<String, Shape> = n
                .properties
                .iter()
                .filter_map(|(k, p)| {
                    crate::cel::escape_property(k).map(|e| (e, shape_of(p, depth + 1)))
                })
                .collect();
            match &n.additional {
                Some(a) => Shape::Map {
                    max_props: n
                        .max_properties
                        .unwrap_or(MAX_REQUEST_BYTES / (min_size(a) + 4)),
                    fields,
                    values: Box::new(shape_of(a, depth + 1)),
                },
                None if n.preserve_unknown && n.properties.is_empty() => Shape::unbounded(),
                // An object's values reached by a computed key are taken as
                // anything (merging every field's shape costs more than
                // the rare rule that indexes an object so).
                None => Shape::Map {
                    max_props: fields.len() as u64,
                    fields,
                    values: Box::new(Shape::unbounded()),
                },
            }
        }
        Some(_) => Shape::Scalar,
        None => Shape::unbounded(),
    }
}

/// Compiles the `x-kubernetes-validations` of `n` and below, checking them
/// as Kubernetes does (compilation, oldSelf correlation, cost).
#[allow(clippy::too_many_arguments)]
fn compile_rules(
    n: &mut Node,
    raw: &Value,
    path: &str,
    is_root: bool,
    correlatable: bool,
    uncorrelatable_at: Option<&str>,
    cardinality: Option<u64>,
    cost: &mut CostTotal,
    out: &mut Vec<Cause>,
) {
    if let Some(list) = raw
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for (i, r) in list.iter().enumerate() {
            let rpath = format!("{path}.x-kubernetes-validations[{i}]");
            match compile_rule(r, &rpath, is_root, n, correlatable, uncorrelatable_at, out) {
                Some((rule, c)) => {
                    if c > STATIC_ESTIMATED_COST_LIMIT {
                        out.push(Cause::forbidden(
                            format!("{rpath}.rule"),
                            &cost_error_message(
                                "estimated rule cost",
                                c,
                                STATIC_ESTIMATED_COST_LIMIT,
                            ),
                        ));
                    }
                    // How many times the rule can run: the product of the
                    // enclosing lists' and maps' bounds, or when one is
                    // unbounded, as many values as fit in one request.
                    let times = cardinality.unwrap_or(MAX_REQUEST_BYTES / (min_size(n) + 1));
                    let total = c.saturating_mul(times);
                    cost.total = cost.total.saturating_add(total);
                    if total >= STATIC_ESTIMATED_CRD_COST_LIMIT / 100 {
                        cost.rules.push((format!("{rpath}.rule"), total));
                    }
                    let fields = rules::selected_fields(&rule);
                    n.rule_fields = match (n.rules.is_empty(), n.rule_fields.take(), fields) {
                        (true, _, f) => f,
                        (false, Some(mut a), Some(b)) => {
                            a.extend(b);
                            Some(a)
                        }
                        _ => None,
                    };
                    n.rules.push(rule);
                }
                None => continue,
            }
        }
    }
    if let Some(props) = raw.get("properties").and_then(Value::as_object) {
        let child_correlatable = correlatable && !n.map_atomic;
        for (k, sub) in props {
            if let Some(p) = n.properties.get_mut(k) {
                let ppath = format!("{path}.properties[{k}]");
                let unc = if child_correlatable {
                    uncorrelatable_at.map(str::to_string)
                } else {
                    uncorrelatable_at
                        .map(str::to_string)
                        .or(Some(path.to_string()))
                };
                compile_rules(
                    p,
                    sub,
                    &ppath,
                    false,
                    child_correlatable,
                    unc.as_deref(),
                    cardinality,
                    cost,
                    out,
                );
            }
        }
    }
    if let (Some(a), Some(sub)) = (
        n.additional.as_deref_mut(),
        raw.get("additionalProperties").filter(|a| a.is_object()),
    ) {
        let unc = if correlatable && !n.map_atomic {
            uncorrelatable_at.map(str::to_string)
        } else {
            uncorrelatable_at
                .map(str::to_string)
                .or(Some(path.to_string()))
        };
        compile_rules(
            a,
            sub,
            &format!("{path}.additionalProperties"),
            false,
            correlatable && !n.map_atomic,
            unc.as_deref(),
            cardinality
                .zip(n.max_properties)
                .map(|(c, m)| c.saturating_mul(m)),
            cost,
            out,
        );
    }
    let list_type = n.list_type;
    if let (Some(items), Some(sub)) = (n.items.as_deref_mut(), raw.get("items")) {
        let corr = correlatable && list_type == Some(ListType::Map);
        let unc = if corr {
            uncorrelatable_at.map(str::to_string)
        } else {
            uncorrelatable_at
                .map(str::to_string)
                .or(Some(path.to_string()))
        };
        compile_rules(
            items,
            sub,
            &format!("{path}.items"),
            false,
            corr,
            unc.as_deref(),
            cardinality
                .zip(n.max_items)
                .map(|(c, m)| c.saturating_mul(m)),
            cost,
            out,
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn compile_rule(
    r: &Value,
    rpath: &str,
    is_root: bool,
    n: &Node,
    correlatable: bool,
    uncorrelatable_at: Option<&str>,
    out: &mut Vec<Cause>,
) -> Option<(Rule, u64)> {
    let src = r.get("rule").and_then(Value::as_str).unwrap_or("");
    // Kubernetes prints the rule as its Go struct marshals: fields in the
    // order ValidationRule declares them.
    let shown = {
        let mut m = serde_json::Map::new();
        for k in [
            "rule",
            "message",
            "messageExpression",
            "reason",
            "fieldPath",
            "optionalOldSelf",
        ] {
            if let Some(v) = r.get(k) {
                m.insert(k.to_string(), v.clone());
            }
        }
        Value::Object(m)
    };
    let r = &shown;
    let optional_old_self = r.get("optionalOldSelf").and_then(Value::as_bool) == Some(true);
    let program = match crate::cel::compile(src, &["self", "oldSelf"]) {
        Ok(p) => p,
        Err(e) => {
            out.push(Cause::invalid(format!("{rpath}.rule"), r, &e));
            return None;
        }
    };
    // Kubernetes type-checks the rule: an undeclared function or operands
    // no overload accepts fail its compilation, and a rule must be a bool.
    let checked = match program.undeclared_function() {
        Some(e) => Err(e),
        None => rules::check_types(&program, n, is_root),
    };
    match checked {
        Err(e) => {
            out.push(Cause::invalid(
                format!("{rpath}.rule"),
                r,
                &format!("compilation failed: {e}"),
            ));
            return None;
        }
        Ok(false) => {
            out.push(Cause::invalid(
                format!("{rpath}.rule"),
                r,
                "cel expression must evaluate to a bool",
            ));
            return None;
        }
        Ok(true) => {}
    }
    let uses_old_self = program.reads("oldSelf");
    if uses_old_self && !correlatable {
        out.push(Cause::invalid(
            format!("{rpath}.rule"),
            &Value::String(src.to_string()),
            &format!(
                "oldSelf cannot be used on the uncorrelatable portion of the schema within {}",
                uncorrelatable_at.unwrap_or("")
            ),
        ));
        return None;
    }
    if optional_old_self && !uses_old_self {
        out.push(Cause::invalid(
            format!("{rpath}.optionalOldSelf"),
            &Value::Bool(true),
            "may not be set if oldSelf is not used in rule",
        ));
        return None;
    }
    let message_expression = match r.get("messageExpression").and_then(Value::as_str) {
        Some(me) => match crate::cel::compile(me, &["self", "oldSelf"]).and_then(|p| {
            match p.undeclared_function() {
                Some(e) => Err(format!("compilation failed: {e}")),
                None => Ok(p),
            }
        }) {
            Ok(p) => Some(p),
            Err(e) => {
                out.push(Cause::invalid(
                    format!("{rpath}.messageExpression"),
                    r,
                    &format!("messageExpression {e}"),
                ));
                return None;
            }
        },
        None => None,
    };
    // Size only the fields of `self` the rule reads (all of them when it
    // uses `self` whole): a rule on a large object costs no walk of it all.
    let mut fields = crate::cel::selected_fields(program.ast(), &["self", "oldSelf"]);
    if let Some(me) = &message_expression {
        match (
            &mut fields,
            crate::cel::selected_fields(me.ast(), &["self", "oldSelf"]),
        ) {
            (Some(f), Some(more)) => f.extend(more),
            _ => fields = None,
        }
    }
    let self_shape = match fields {
        Some(fields) if n.ty == Some(Type::Object) && n.additional.is_none() => Shape::Map {
            max_props: n.properties.len() as u64,
            fields: n
                .properties
                .iter()
                .filter_map(|(k, p)| {
                    let e = crate::cel::escape_property(k)?;
                    fields.contains(&e).then(|| (e, shape_of(p, 1)))
                })
                .collect(),
            values: Box::new(Shape::unbounded()),
        },
        _ => shape_of(n, 0),
    };
    let vars = [("self", self_shape.clone()), ("oldSelf", self_shape)];
    let mut c = program.estimate_cost(&vars);
    if let Some(me) = &message_expression {
        let mc = me.estimate_cost(&vars);
        if mc > STATIC_ESTIMATED_COST_LIMIT {
            out.push(Cause::forbidden(
                format!("{rpath}.messageExpression"),
                &cost_error_message(
                    "estimated messageExpression cost",
                    mc,
                    STATIC_ESTIMATED_COST_LIMIT,
                ),
            ));
        }
        c = c.saturating_add(mc);
    }
    let field_path = match r.get("fieldPath").and_then(Value::as_str) {
        Some(fp) => match rules::normalize_field_path(fp, n) {
            Ok(p) => Some(p),
            Err(e) => {
                out.push(Cause::invalid(
                    format!("{rpath}.fieldPath"),
                    &Value::String(fp.to_string()),
                    &e,
                ));
                return None;
            }
        },
        None => None,
    };
    Some((
        Rule {
            rule: src.to_string(),
            program,
            message: r
                .get("message")
                .and_then(Value::as_str)
                .map(|m| m.trim().to_string()),
            message_expression,
            reason: r.get("reason").and_then(Value::as_str).map(str::to_string),
            field_path,
            uses_old_self,
            optional_old_self,
            cost: c,
        },
        c,
    ))
}

/// Every default must validate against its schema and survive pruning.
fn check_defaults(n: &Node, raw: &Value, path: &str, out: &mut Vec<Cause>) {
    if let Some(d) = &n.default {
        let dpath = format!("{path}.default");
        let mut pruned = d.clone();
        prune_node(n, &mut pruned, n.embedded);
        if &pruned != d {
            out.push(Cause::invalid(
                dpath.clone(),
                d,
                "must not have unknown fields",
            ));
        } else {
            let mut defaulted = d.clone();
            default_node(n, &mut defaulted);
            let mut v = validate::Validator {
                base: &dpath,
                out: Vec::new(),
            };
            v.validate(n, &defaulted, None, &validate::P::Root(""));
            let schema_ok = v.out.is_empty();
            out.extend(v.out);
            // Kubernetes also runs the rules on a default.
            if schema_ok && n.has_rules_below {
                let mut rule_causes = Vec::new();
                rules::validate_rules_at(n, &defaulted, n.embedded, &mut rule_causes);
                for mut c in rule_causes {
                    c.field = if c.field.is_empty() {
                        dpath.clone()
                    } else {
                        format!("{dpath}.{}", c.field)
                    };
                    out.push(c);
                }
            }
        }
    }
    if let (Some(props), Some(rawp)) = (
        Some(&n.properties),
        raw.get("properties").and_then(Value::as_object),
    ) {
        for (k, p) in props {
            if let Some(sub) = rawp.get(k) {
                check_defaults(p, sub, &format!("{path}.properties[{k}]"), out);
            }
        }
    }
    if let (Some(a), Some(sub)) = (n.additional.as_deref(), raw.get("additionalProperties")) {
        check_defaults(a, sub, &format!("{path}.additionalProperties"), out);
    }
    if let (Some(i), Some(sub)) = (n.items.as_deref(), raw.get("items")) {
        check_defaults(i, sub, &format!("{path}.items"), out);
    }
}

#[cfg(test)]
mod tests;
