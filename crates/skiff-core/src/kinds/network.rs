//! Endpoints and EndpointSlices: created by a PUT as well, and their tables.

use super::prelude::*;

pub struct Endpoints;

impl KindRules for Endpoints {
    fn kind(&self) -> &'static str {
        "Endpoints"
    }

    fn allow_create_on_update(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &ENDPOINTS_PRINTER
    }
}

pub struct EndpointSlice;

impl KindRules for EndpointSlice {
    fn kind(&self) -> &'static str {
        "EndpointSlice"
    }

    fn allow_create_on_update(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &ENDPOINT_SLICE_PRINTER
    }
}

pub struct NetworkPolicy;

impl KindRules for NetworkPolicy {
    fn kind(&self) -> &'static str {
        "NetworkPolicy"
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &NETWORK_POLICY_PRINTER
    }
}

pub static NETWORK_POLICY_PRINTER: Printer = Printer {
    columns: &[NAME, col("Pod-Selector", "string", 0), AGE],
    cells: |obj, now| {
        vec![
            json!(s(obj, "/metadata/name")),
            json!(or_none(&crate::selector::selector_string(
                obj.pointer("/spec/podSelector")
            ))),
            json!(age(obj, "/metadata/creationTimestamp", now)),
        ]
    },
};

pub static ENDPOINTS_PRINTER: Printer = Printer {
    columns: &[NAME, col("Endpoints", "string", 0), AGE],
    cells: endpoints_cells,
};

fn endpoints_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let mut eps = Vec::new();
    for sub in obj
        .pointer("/subsets")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
    {
        let ports: Vec<i64> = sub
            .get("ports")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|p| p.get("port").and_then(Value::as_i64))
                    .collect()
            })
            .unwrap_or_default();
        for a in sub
            .get("addresses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
        {
            let ip = s(&a, "/ip");
            if ports.is_empty() {
                eps.push(ip.to_string());
            }
            for p in &ports {
                eps.push(format!("{ip}:{p}"));
            }
        }
    }
    let shown = if eps.len() > 3 {
        format!("{} + {} more...", eps[..3].join(","), eps.len() - 3)
    } else {
        or_none(&eps.join(","))
    };
    vec![name, json!(shown), created]
}

pub static ENDPOINT_SLICE_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("AddressType", "string", 0),
        col("Ports", "string", 0),
        col("Endpoints", "string", 0),
        AGE,
    ],
    cells: endpoint_slice_cells,
};

fn endpoint_slice_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let ports: Vec<String> = obj
        .get("ports")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|p| p.get("port").and_then(Value::as_i64))
                .map(|p| p.to_string())
                .collect()
        })
        .unwrap_or_default();
    let eps: Vec<String> = obj
        .get("endpoints")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .flat_map(|e| {
                    e.get("addresses")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    vec![
        name,
        json!(s(obj, "/addressType")),
        json!(or_none(&ports.join(","))),
        json!(or_none(&eps.join(","))),
        created,
    ]
}

#[cfg(test)]
mod policy_printer_tests {
    use super::*;

    #[test]
    fn a_network_policy_prints_its_pod_selector() {
        let all = json!({"metadata": {"name": "deny"}, "spec": {"podSelector": {}}});
        assert_eq!(
            (NETWORK_POLICY_PRINTER.cells)(&all, Utc::now())[1],
            "<none>"
        );
        let some = json!({"metadata": {"name": "web"}, "spec": {"podSelector": {"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}}});
        assert_eq!(
            (NETWORK_POLICY_PRINTER.cells)(&some, Utc::now())[1],
            "app=web,tier in (a,b)"
        );
    }
}
