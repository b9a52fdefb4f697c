//! CRD conversion webhooks with the real kubectl: a two-version
//! definition (v1 keeps `spec.size`, v2 `spec.dimensions.size`) whose
//! conversion webhook is an HTTPS server written for the test (in the test
//! process on loopback, its certificate from a CA made in the test).
//! Objects created in v1 are read, listed, watched and patched in v2; the
//! storage version moves to v2 and the objects stored as v1 still read in
//! both; with the webhook down, reads are a Status error naming it, a
//! watch ends with an ERROR event, and other resources are unaffected.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use skiff_apiserver::testing::{self, Seen, TestServer};
use skiff_e2e::{text, wait_until, Server};

/// Moves `spec.size` (v1) and `spec.dimensions.size` (v2) into each other.
fn convert(obj: &Value, desired: &str) -> Value {
    let mut out = obj.clone();
    let from = obj["apiVersion"].as_str().unwrap_or("");
    if from == desired {
        return out;
    }
    let spec = out["spec"].as_object_mut().cloned().unwrap_or_default();
    let mut spec = spec;
    if desired.ends_with("/v2") {
        if let Some(size) = spec.remove("size") {
            spec.insert("dimensions".into(), json!({"size": size}));
        }
    } else if let Some(size) = spec
        .remove("dimensions")
        .and_then(|d| d.get("size").cloned())
    {
        spec.insert("size".into(), size);
    }
    out["spec"] = Value::Object(spec);
    out["apiVersion"] = json!(desired);
    out
}

/// The conversion webhook's handler: a ConversionReview v1 answered.
fn converter(s: &Seen) -> (u16, Value) {
    let review: Value = serde_json::from_slice(&s.body).unwrap_or(Value::Null);
    let req = &review["request"];
    let desired = req["desiredAPIVersion"].as_str().unwrap_or("");
    let objects: Vec<Value> = req["objects"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|o| convert(o, desired))
        .collect();
    (
        200,
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": req["uid"], "result": {"status": "Success"},
                "convertedObjects": objects}}),
    )
}

async fn webhook() -> TestServer {
    testing::serve(
        "127.0.0.1:0",
        &["127.0.0.1"],
        None,
        Duration::ZERO,
        Arc::new(converter),
    )
    .await
}

fn definition(url: &str, ca_bundle: &str, storage: &str) -> String {
    let version = |name: &str, spec: Value| {
        json!({"name": name, "served": true, "storage": name == storage,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}}})
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [
                version("v1", json!({"type": "object", "properties": {"size": {"type": "integer"}}})),
                version("v2", json!({"type": "object", "properties": {"dimensions": {"type": "object",
                    "properties": {"size": {"type": "integer"}}}}})),
            ],
            "conversion": {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"url": url, "caBundle": ca_bundle}}},
        }
    })
    .to_string()
}

fn gadget(name: &str, size: i64) -> String {
    json!({"apiVersion": "example.com/v1", "kind": "Gadget",
        "metadata": {"name": name}, "spec": {"size": size}})
    .to_string()
}

fn jsonpath(s: &Server, resource: &str, path: &str) -> String {
    s.ok(&["get", resource, "-o", &format!("jsonpath={path}")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversion_webhook_converts_every_read_and_write_with_kubectl() {
    let s = Server::start();
    let hook = webhook().await;
    let url = format!("https://{}/convert", hook.addr);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &definition(&url, &hook.ca_bundle(), "v1"),
    );
    s.ok(&[
        "wait",
        "--for",
        "condition=established",
        "--timeout=30s",
        "crd/gadgets.example.com",
    ]);

    // Created in v1 (the storage version): no conversion needed.
    s.ok_stdin(&["apply", "-f", "-"], &gadget("g1", 3));
    assert_eq!(
        jsonpath(&s, "gadgets.v1.example.com/g1", "{.spec.size}"),
        "3"
    );
    // Read in v2: converted by the webhook.
    let v2: Value =
        serde_json::from_str(&s.ok(&["get", "gadgets.v2.example.com/g1", "-o", "json"])).unwrap();
    assert_eq!(v2["apiVersion"], "example.com/v2");
    assert_eq!(v2["spec"]["dimensions"]["size"], 3);
    assert!(v2["spec"].get("size").is_none(), "{v2}");
    let seen = hook.requests();
    let review: Value = serde_json::from_slice(&seen.last().expect("a review").body).unwrap();
    assert_eq!(review["apiVersion"], "apiextensions.k8s.io/v1");
    assert_eq!(review["kind"], "ConversionReview");
    assert_eq!(review["request"]["desiredAPIVersion"], "example.com/v2");
    assert_eq!(
        review["request"]["objects"][0]["apiVersion"],
        "example.com/v1"
    );
    assert!(!review["request"]["uid"].as_str().unwrap_or("").is_empty());

    // A watch in v2 sees an object created in v1, converted.
    let watch = s.kubectl_background(&[
        "get",
        "gadgets.v2.example.com",
        "--watch",
        "--output-watch-events",
        "-o",
        "json",
    ]);
    watch.wait_for("the existing gadget", |o| o.contains("\"g1\""));
    s.ok_stdin(&["apply", "-f", "-"], &gadget("g2", 5));
    let out = watch.wait_for("the new gadget in v2", |o| o.contains("\"g2\""));
    assert!(
        out.contains("\"dimensions\"") && !out.contains("\"apiVersion\": \"example.com/v1\""),
        "{out}"
    );

    // A list in v2: one review for the list.
    let before = hook.requests().len();
    let list: Value =
        serde_json::from_str(&s.ok(&["get", "gadgets.v2.example.com", "-o", "json"])).unwrap();
    let sizes: Vec<i64> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["spec"]["dimensions"]["size"].as_i64().unwrap())
        .collect();
    assert_eq!(sizes, vec![3, 5]);
    let reviews: Vec<Value> = hook.requests()[before..]
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert!(
        reviews
            .iter()
            .any(|r| r["request"]["objects"].as_array().map(Vec::len) == Some(2)),
        "{reviews:?}"
    );

    // The server keeps its connection to the webhook between calls.
    let calls = hook.requests().len();
    let connections = hook.connections.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        connections < calls,
        "{connections} connections for {calls} calls"
    );

    // A merge patch in v2 lands in the v1 storage as spec.size.
    s.ok(&[
        "patch",
        "gadgets.v2.example.com",
        "g1",
        "--type=merge",
        "-p",
        r#"{"spec":{"dimensions":{"size":7}}}"#,
    ]);
    assert_eq!(
        jsonpath(&s, "gadgets.v1.example.com/g1", "{.spec.size}"),
        "7"
    );
    // Server-side apply in v2.
    s.ok_stdin(
        &["apply", "--server-side", "-f", "-"],
        &json!({"apiVersion": "example.com/v2", "kind": "Gadget", "metadata": {"name": "g3"},
            "spec": {"dimensions": {"size": 9}}})
        .to_string(),
    );
    assert_eq!(
        jsonpath(&s, "gadgets.v1.example.com/g3", "{.spec.size}"),
        "9"
    );
    assert_eq!(
        jsonpath(&s, "gadgets.v2.example.com/g3", "{.spec.dimensions.size}"),
        "9"
    );

    // The storage version moves to v2: objects stored as v1 still read in
    // both versions; new ones are stored as v2; both are recorded.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &definition(&url, &hook.ca_bundle(), "v2"),
    );
    wait_until("v2 to be recorded as stored", 30, || {
        (jsonpath(&s, "crd/gadgets.example.com", "{.status.storedVersions}") == r#"["v1","v2"]"#)
            .then_some(())
    });
    let before = hook.requests().len();
    s.ok_stdin(&["apply", "-f", "-"], &gadget("g4", 11));
    let to_v2 = hook.requests()[before..].iter().any(|r| {
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        v["request"]["desiredAPIVersion"] == "example.com/v2"
            && v["request"]["objects"][0]["metadata"]["name"] == "g4"
    });
    assert!(to_v2, "g4 was not converted to the storage version v2");
    for (name, size) in [("g1", "7"), ("g2", "5"), ("g4", "11")] {
        assert_eq!(
            jsonpath(
                &s,
                &format!("gadgets.v2.example.com/{name}"),
                "{.spec.dimensions.size}"
            ),
            size
        );
        assert_eq!(
            jsonpath(
                &s,
                &format!("gadgets.v1.example.com/{name}"),
                "{.spec.size}"
            ),
            size
        );
    }

    // Admission sees the object in the version it matched: a policy for
    // v1 reads `spec.size` of objects now stored as v2, converted by the
    // webhook.
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: small-gadgets}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [example.com], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [gadgets]}
  validations:
  - {expression: "object.spec.size <= 100", message: "gadgets are at most 100"}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: small-gadgets}
spec:
  policyName: small-gadgets
  validationActions: [Deny]
"#,
    );
    let err = wait_until("the policy to deny a big gadget", 30, || {
        let out = s.kubectl_stdin(&["apply", "-f", "-"], &gadget("big", 500));
        (!out.status.success()).then(|| text(&out.stderr))
    });
    assert!(
        err.contains("ValidatingAdmissionPolicy 'small-gadgets' with binding 'small-gadgets' denied request: gadgets are at most 100"),
        "{err}"
    );
    s.ok_stdin(&["apply", "-f", "-"], &gadget("small", 50));
    s.ok(&[
        "delete",
        "validatingadmissionpolicybinding",
        "small-gadgets",
    ]);

    // The webhook goes down (the definition points at a port nothing
    // listens on): reads that need it fail with a Status naming it, the
    // watch ends with an error, and other resources are unaffected.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    s.ok_stdin(
        &["apply", "-f", "-"],
        &definition(&format!("https://{down}/convert"), &hook.ca_bundle(), "v2"),
    );
    let err = wait_until("the webhook to be unreachable", 30, || {
        let out = s.kubectl(&["get", "gadgets.v2.example.com/g1", "-o", "json"]);
        (!out.status.success()).then(|| text(&out.stderr))
    });
    assert!(
        err.contains("Error from server (InternalError)")
            && err.contains("conversion webhook for example.com/v1, Kind=Gadget failed:")
            && err.contains("connection refused"),
        "{err}"
    );
    // The list is one error too; a watch gets an ERROR event and ends.
    let list = s.fails(&["get", "gadgets.v2.example.com"]);
    assert!(list.contains("conversion webhook for"), "{list}");
    let w = s.kubectl_background(&[
        "get",
        "--raw",
        "/apis/example.com/v2/namespaces/default/gadgets?watch=true",
    ]);
    let (_, out, stderr) = w.finish();
    assert!(
        out.contains(r#""type":"ERROR""#) && out.contains("conversion webhook for"),
        "{out}\n{stderr}"
    );
    // Objects that need no conversion and other resources are unaffected.
    let g4 = s.ok(&[
        "get",
        "gadgets.v2.example.com/g4",
        "-o",
        "jsonpath={.spec.dimensions.size}",
    ]);
    assert_eq!(g4, "11");
    s.ok(&["create", "configmap", "still-fine"]);
    assert!(s.ok(&["get", "configmaps"]).contains("still-fine"));
    drop(watch);
}
