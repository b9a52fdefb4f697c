//! Services: defaults (type, session affinity, IP families, ports), the
//! checks on ports and the immutable cluster IP, field selectors, the
//! table and quota usage. Allocation of cluster IPs and node ports is the
//! server's (`skiff-apiserver`'s `strategy/service.rs`).

use super::prelude::*;

pub struct Service;

impl KindRules for Service {
    fn kind(&self) -> &'static str {
        "Service"
    }

    fn defaults(&self, obj_v: &mut Value) {
        if let Some(spec) = child(obj_v, "spec") {
            set_default(spec, "type", json!("ClusterIP"));
            set_default(spec, "sessionAffinity", json!("None"));
            let ty = spec
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if ty != "ExternalName" {
                set_default(spec, "ipFamilies", json!(["IPv4"]));
                set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
                set_default(spec, "internalTrafficPolicy", json!("Cluster"));
            }
            if ty == "NodePort" || ty == "LoadBalancer" {
                set_default(spec, "externalTrafficPolicy", json!("Cluster"));
            }
            if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                    set_default(p, "protocol", json!("TCP"));
                    if let Some(port) = p.get("port").cloned() {
                        set_default(p, "targetPort", port);
                    }
                }
            }
        }
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({"loadBalancer": {}}))
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        crate::validation::service(obj, &mut c);
        // The API server allocates it for LoadBalancers with
        // externalTrafficPolicy Local; nothing else may carry one.
        if let Some(n) = obj
            .pointer("/spec/healthCheckNodePort")
            .filter(|n| n.as_i64() != Some(0) && !n.is_null())
        {
            let lb_local = obj.pointer("/spec/type").and_then(Value::as_str)
                == Some("LoadBalancer")
                && obj
                    .pointer("/spec/externalTrafficPolicy")
                    .and_then(Value::as_str)
                    == Some("Local");
            if !lb_local {
                c.push(Cause::invalid(
                    "spec.healthCheckNodePort",
                    n,
                    "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
                ));
            }
        }
        c
    }

    /// The cluster IP may not change once set (except to or from ExternalName).
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<Cause> {
        let str_at = |v: &Value, p: &str, d: &'static str| -> String {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or(d)
                .to_string()
        };
        let old_ip = str_at(old, "/spec/clusterIP", "");
        let new_ip = str_at(new, "/spec/clusterIP", "");
        let old_ty = str_at(old, "/spec/type", "ClusterIP");
        let new_ty = str_at(new, "/spec/type", "ClusterIP");
        if !old_ip.is_empty()
            && old_ip != new_ip
            && old_ty != "ExternalName"
            && new_ty != "ExternalName"
        {
            return vec![Cause::invalid(
                "spec.clusterIPs[0]",
                &json!(new_ip),
                "may not change once set",
            )];
        }
        Vec::new()
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.clusterIP", "spec.type"]
    }

    fn name_rule(&self) -> NameRule {
        NameRule::Label
    }

    fn printer(&self) -> &'static Printer {
        &SERVICE_PRINTER
    }

    fn quota_usage(&self, obj: &Value) -> Option<BTreeMap<String, i128>> {
        let mut u = BTreeMap::from([("services".to_string(), 1000)]);
        let ty = obj
            .pointer("/spec/type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP");
        let ports = obj
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .map(|a| a.len() as i128)
            .unwrap_or(0);
        match ty {
            "NodePort" => {
                u.insert("services.nodeports".into(), ports * 1000);
            }
            "LoadBalancer" => {
                u.insert("services.loadbalancers".into(), 1000);
                u.insert("services.nodeports".into(), ports * 1000);
            }
            _ => {}
        }
        Some(u)
    }

    fn quota_tracks(&self, resource: &str) -> bool {
        matches!(
            resource,
            "services" | "services.nodeports" | "services.loadbalancers"
        )
    }

    fn returns_deleted_object(&self) -> bool {
        true
    }
}

pub static SERVICE_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Type", "string", 0),
        col("Cluster-IP", "string", 0),
        col("External-IP", "string", 0),
        col("Port(s)", "string", 0),
        AGE,
        col("Selector", "string", 1),
    ],
    cells: service_cells,
};

fn service_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let ty = s(obj, "/spec/type");
    let ext: Vec<String> = obj
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| {
                    x.get("ip")
                        .or(x.get("hostname"))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    let external = match ty {
        "ExternalName" => s(obj, "/spec/externalName").to_string(),
        "LoadBalancer" if ext.is_empty() => "<pending>".into(),
        _ if !ext.is_empty() => ext.join(","),
        _ => "<none>".into(),
    };
    vec![
        name,
        json!(ty),
        json!(or_none(s(obj, "/spec/clusterIP"))),
        json!(external),
        json!(service_ports(obj)),
        created,
        json!(selector(obj)),
    ]
}

fn service_ports(obj: &Value) -> String {
    let ports = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() {
        return "<none>".into();
    }
    ports
        .iter()
        .map(|p| {
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            match p.get("nodePort").and_then(Value::as_i64) {
                Some(np) => format!("{port}:{np}/{proto}"),
                None => format!("{port}/{proto}"),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}
