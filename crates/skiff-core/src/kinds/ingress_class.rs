//! IngressClasses (`networking.k8s.io/v1`): which controller implements a
//! class of Ingresses. The controller is required and may not change; the
//! table shows it and the parameters reference.

use super::prelude::*;

pub struct IngressClass;

impl KindRules for IngressClass {
    fn kind(&self) -> &'static str {
        "IngressClass"
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        match obj.pointer("/spec/controller").and_then(Value::as_str) {
            None | Some("") => vec![Cause::required("spec.controller")],
            Some(_) => Vec::new(),
        }
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<Cause> {
        let controller = |v: &Value| v.pointer("/spec/controller").cloned();
        if controller(new) != controller(old) {
            return vec![Cause::invalid(
                "spec.controller",
                new.pointer("/spec/controller").unwrap_or(&Value::Null),
                "field is immutable",
            )];
        }
        Vec::new()
    }

    fn printer(&self) -> &'static Printer {
        &INGRESS_CLASS_PRINTER
    }
}

pub static INGRESS_CLASS_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Controller", "string", 0),
        col("Parameters", "string", 0),
        AGE,
    ],
    cells: ingress_class_cells,
};

/// `Kind.apiGroup/name` of the parameters, or `<none>`.
fn ingress_class_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let parameters = match obj.pointer("/spec/parameters") {
        Some(p) if p.is_object() => {
            let mut out = s(p, "/kind").to_string();
            let group = s(p, "/apiGroup");
            if !group.is_empty() {
                out = format!("{out}.{group}");
            }
            format!("{out}/{}", s(p, "/name"))
        }
        _ => "<none>".into(),
    };
    vec![
        json!(s(obj, "/metadata/name")),
        json!(s(obj, "/spec/controller")),
        json!(parameters),
        json!(age(obj, "/metadata/creationTimestamp", now)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ingress_class_needs_a_controller_that_then_stays() {
        let none = json!({"metadata": {"name": "c"}, "spec": {}});
        assert_eq!(IngressClass.validate(&none)[0].field, "spec.controller");
        let old = json!({"metadata": {"name": "c"}, "spec": {"controller": "example.com/a"}});
        assert!(IngressClass.validate(&old).is_empty());
        let new = json!({"metadata": {"name": "c"}, "spec": {"controller": "example.com/b"}});
        let c = IngressClass.validate_update(&new, &old);
        assert_eq!(c[0].field, "spec.controller");
    }

    #[test]
    fn an_ingress_class_prints_its_controller_and_parameters() {
        let ic = json!({"metadata": {"name": "nginx"}, "spec": {"controller": "k8s.io/ingress-nginx",
            "parameters": {"apiGroup": "k8s.example.com", "kind": "IngressParameters", "name": "external-lb"}}});
        let cells = (INGRESS_CLASS_PRINTER.cells)(&ic, Utc::now());
        assert_eq!(cells[1], "k8s.io/ingress-nginx");
        assert_eq!(cells[2], "IngressParameters.k8s.example.com/external-lb");
        let bare = json!({"metadata": {"name": "b"}, "spec": {"controller": "x/y"}});
        assert_eq!(
            (INGRESS_CLASS_PRINTER.cells)(&bare, Utc::now())[2],
            "<none>"
        );
    }
}
