//! Tests of the CEL environment and Kubernetes' libraries.

use serde_json::json;

use super::compile;

#[test]
fn an_expression_sees_its_json_variables() {
    let p = compile("object.spec.replicas > 2", &["object"]).unwrap();
    assert_eq!(
        p.eval(&[("object", &json!({"spec": {"replicas": 3}}))])
            .unwrap(),
        json!(true)
    );
}
