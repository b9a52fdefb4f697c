//! CertificateSigningRequests: kube-apiserver's table (signer, requestor,
//! requested duration and the request's condition).

use super::prelude::*;

pub struct CertificateSigningRequest;

impl KindRules for CertificateSigningRequest {
    fn kind(&self) -> &'static str {
        "CertificateSigningRequest"
    }

    fn printer(&self) -> &'static Printer {
        &CSR_PRINTER
    }
}

pub static CSR_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        AGE,
        col("SignerName", "string", 0),
        col("Requestor", "string", 0),
        col("RequestedDuration", "string", 0),
        col("Condition", "string", 0),
    ],
    cells: csr_cells,
};

/// Kubernetes' `extractCSRStatus`: Denied, else Approved, else Pending;
/// then `,Failed` and `,Issued`.
fn condition(obj: &Value) -> String {
    let conds = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let has = |t: &str| {
        conds
            .iter()
            .any(|c| c.get("type").and_then(Value::as_str) == Some(t))
    };
    let mut out = if has("Denied") {
        "Denied".to_string()
    } else if has("Approved") {
        "Approved".to_string()
    } else {
        "Pending".to_string()
    };
    if has("Failed") {
        out.push_str(",Failed");
    }
    if obj
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty())
    {
        out.push_str(",Issued");
    }
    out
}

fn csr_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let requested = match obj
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
    {
        Some(secs) => human_duration(chrono::Duration::seconds(secs)),
        None => "<none>".into(),
    };
    vec![
        json!(s(obj, "/metadata/name")),
        json!(age(obj, "/metadata/creationTimestamp", now)),
        json!(s(obj, "/spec/signerName")),
        json!(s(obj, "/spec/username")),
        json!(requested),
        json!(condition(obj)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_kube_apiservers_columns_and_condition() {
        let names: Vec<&str> = CSR_PRINTER.columns.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "Name",
                "Age",
                "SignerName",
                "Requestor",
                "RequestedDuration",
                "Condition"
            ]
        );
        let now = Utc::now();
        let pending = json!({"metadata": {"name": "node-csr-1", "creationTimestamp": now.to_rfc3339()},
            "spec": {"signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                     "username": "system:bootstrap:abcdef", "expirationSeconds": 86400}});
        let cells = csr_cells(&pending, now);
        assert_eq!(cells[2], "kubernetes.io/kube-apiserver-client-kubelet");
        assert_eq!(cells[3], "system:bootstrap:abcdef");
        assert_eq!(cells[4], "24h");
        assert_eq!(cells[5], "Pending");
        let issued = json!({"spec": {}, "status": {"certificate": "Q0VSVA==",
            "conditions": [{"type": "Approved", "status": "True"}]}});
        assert_eq!(csr_cells(&issued, now)[4], "<none>");
        assert_eq!(condition(&issued), "Approved,Issued");
        let denied = json!({"status": {"conditions": [{"type": "Denied"}, {"type": "Failed"}]}});
        assert_eq!(condition(&denied), "Denied,Failed");
    }
}
