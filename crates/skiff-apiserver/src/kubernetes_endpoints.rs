//! The `kubernetes` Service's endpoints, kept by every API server together
//! (kube-apiserver's "lease" endpoint reconciler).
//!
//! Each server renews a Lease in `kube-system` naming the address and port
//! pods reach it at, every [`RENEW_EVERY`], valid for [`LEASE_TTL`]. After
//! each renewal it rewrites the Endpoints and EndpointSlices of
//! `default/kubernetes` to hold exactly the servers whose leases are live,
//! and deletes leases that have expired. So with several servers every live
//! one is an endpoint, a dead one drops out within the TTL plus a renewal
//! period, and one that stops cleanly takes itself out at once ([`leave`]).
//!
//! kube-apiserver keeps these leases as bare storage keys with a TTL; skiff
//! keeps them as ordinary `coordination.k8s.io/v1` Leases (labelled
//! [`LEASE_LABEL`]) so they work unchanged on either store and can be read
//! with kubectl.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::selector::LabelSelector;
use skiff_core::ApiError;

use crate::options::{DeleteOptions, WriteOptions};
use crate::registry::Registry;
use crate::watchcache::Filter;

/// How long a server's entry stays after its last renewal (kube-apiserver's
/// master lease TTL).
pub const LEASE_TTL: Duration = Duration::from_secs(15);
/// How often each server renews its lease and reconciles the endpoints
/// (kube-apiserver's endpoint reconcile interval).
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// The label on the endpoint leases.
pub const LEASE_LABEL: &str = "skiff.io/apiserver-endpoint";

const NAMESPACE: &str = "default";
const LEASE_NAMESPACE: &str = "kube-system";

fn res(group: &str, plural: &str) -> &'static ResourceInfo {
    resources::lookup(group, "v1", plural).expect("built-in resource")
}

fn opts() -> WriteOptions {
    WriteOptions {
        field_manager: "skiff-apiserver".into(),
        ..Default::default()
    }
}

/// The lease name for one server: its address with separators as dashes.
pub fn lease_name(ip: &str, port: u16) -> String {
    let ip: String = ip
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("apiserver-endpoint-{ip}-{port}")
}

/// Renews this server's lease and rewrites the endpoints from the live
/// leases, once.
pub async fn reconcile(reg: &Registry, ip: &str, port: u16) -> Result<(), ApiError> {
    renew(reg, ip, port, Utc::now()).await?;
    let live = live_endpoints(reg, Utc::now(), None).await?;
    write_endpoints(reg, &live).await
}

/// Keeps reconciling every [`RENEW_EVERY`] until the task is dropped.
pub async fn run(reg: Arc<Registry>, ip: String, port: u16) {
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first reconcile happened at start
    loop {
        tick.tick().await;
        if let Err(e) = reconcile(&reg, &ip, port).await {
            tracing::warn!(error = %e.message, "reconciling the kubernetes service's endpoints");
        }
    }
}

/// Takes this server out: deletes its lease and rewrites the endpoints
/// without it (a clean shutdown, so clients stop using it at once).
pub async fn leave(reg: &Registry, ip: &str, port: u16) -> Result<(), ApiError> {
    let name = lease_name(ip, port);
    match reg
        .delete(
            res("coordination.k8s.io", "leases"),
            Some(LEASE_NAMESPACE),
            &name,
            &DeleteOptions::default(),
        )
        .await
    {
        Ok(_) => {}
        Err(e) if e.code == 404 => {}
        Err(e) => return Err(e),
    }
    let live = live_endpoints(reg, Utc::now(), Some(&name)).await?;
    write_endpoints(reg, &live).await
}

async fn renew(reg: &Registry, ip: &str, port: u16, now: DateTime<Utc>) -> Result<(), ApiError> {
    let leases = res("coordination.k8s.io", "leases");
    let name = lease_name(ip, port);
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {
            "name": name, "namespace": LEASE_NAMESPACE,
            "labels": {LEASE_LABEL: "true"},
            "annotations": {"skiff.io/endpoint-ip": ip, "skiff.io/endpoint-port": port.to_string()},
        },
        "spec": {
            "holderIdentity": format!("{ip}:{port}"),
            "leaseDurationSeconds": LEASE_TTL.as_secs(),
            "renewTime": now.to_rfc3339_opts(SecondsFormat::Micros, true),
        },
    });
    match reg
        .create(leases, Some(LEASE_NAMESPACE), lease.clone(), &opts())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.code == 409 => reg
            .update(
                leases,
                Some(LEASE_NAMESPACE),
                &name,
                lease,
                crate::request::Subresource::Main,
                &opts(),
            )
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    }
}

/// One server's entry as its lease describes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub port: u16,
    pub ip: String,
}

/// Whether a lease has lapsed at `now`, and the endpoint it names.
pub fn read_lease(lease: &Value, now: DateTime<Utc>) -> (bool, Option<Endpoint>) {
    let ann = &lease["metadata"]["annotations"];
    let endpoint = match (
        ann["skiff.io/endpoint-ip"].as_str(),
        ann["skiff.io/endpoint-port"]
            .as_str()
            .and_then(|p| p.parse::<u16>().ok()),
    ) {
        (Some(ip), Some(port)) => Some(Endpoint {
            ip: ip.to_string(),
            port,
        }),
        _ => None,
    };
    let renewed = lease["spec"]["renewTime"]
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc));
    let ttl = lease["spec"]["leaseDurationSeconds"].as_i64().unwrap_or(0);
    let expired = match renewed {
        Some(t) => t + chrono::Duration::seconds(ttl) < now,
        None => true,
    };
    (expired, endpoint)
}

/// The endpoints of live leases (all but `skip`), sorted; expired leases
/// are deleted on the way (guarded by their resourceVersion, so a lease
/// renewed meanwhile stays).
async fn live_endpoints(
    reg: &Registry,
    now: DateTime<Utc>,
    skip: Option<&str>,
) -> Result<Vec<Endpoint>, ApiError> {
    let leases = res("coordination.k8s.io", "leases");
    let filter = Filter {
        namespace: Some(LEASE_NAMESPACE.into()),
        labels: Some(LabelSelector::parse(LEASE_LABEL).map_err(ApiError::internal)?),
        fields: None,
    };
    let list = reg.list(leases, &filter, 0, None, None, false).await?;
    let mut live = Vec::new();
    for item in list.items {
        let lease: Value = serde_json::from_slice(&item)
            .map_err(|e| ApiError::internal(format!("decoding a lease: {e}")))?;
        let name = lease["metadata"]["name"].as_str().unwrap_or_default();
        if Some(name) == skip {
            continue;
        }
        match read_lease(&lease, now) {
            (false, Some(ep)) => live.push(ep),
            _ => {
                let del = DeleteOptions {
                    precondition_resource_version: lease["metadata"]["resourceVersion"]
                        .as_str()
                        .map(str::to_string),
                    ..Default::default()
                };
                match reg.delete(leases, Some(LEASE_NAMESPACE), name, &del).await {
                    Ok(_) => tracing::info!(lease = name, "an API server's endpoint lease expired"),
                    Err(e) if e.code == 404 || e.code == 409 => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    live.sort();
    live.dedup();
    Ok(live)
}

/// The Endpoints object for `live`: one subset per port, as the API
/// groups addresses that share their ports.
pub fn endpoints_object(live: &[Endpoint]) -> Value {
    let mut by_port: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
    for ep in live {
        by_port.entry(ep.port).or_default().push(&ep.ip);
    }
    let subsets: Vec<Value> = by_port
        .iter()
        .map(|(port, ips)| {
            json!({
                "addresses": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            })
        })
        .collect();
    let mut obj = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": NAMESPACE,
            "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
    });
    if !subsets.is_empty() {
        obj["subsets"] = Value::Array(subsets);
    }
    obj
}

/// The EndpointSlices for `live`: `kubernetes` holds the first port's (and
/// address family's) servers, `kubernetes-<port>` any others (a slice has
/// one port list and one address type).
pub fn slice_objects(live: &[Endpoint]) -> Vec<(String, Value)> {
    let mut groups: BTreeMap<(bool, u16), Vec<&str>> = BTreeMap::new();
    for ep in live {
        groups
            .entry((ep.ip.contains(':'), ep.port))
            .or_default()
            .push(&ep.ip);
    }
    let mut out = Vec::new();
    for (i, ((v6, port), ips)) in groups.iter().enumerate() {
        let name = if i == 0 {
            "kubernetes".to_string()
        } else if *v6 {
            format!("kubernetes-ipv6-{port}")
        } else {
            format!("kubernetes-{port}")
        };
        out.push((
            name.clone(),
            json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": NAMESPACE,
                    "labels": {"kubernetes.io/service-name": "kubernetes",
                        "endpointslice.kubernetes.io/managed-by": "skiff-apiserver"}},
                "addressType": if *v6 { "IPv6" } else { "IPv4" },
                "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>(),
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            }),
        ));
    }
    if out.is_empty() {
        out.push((
            "kubernetes".into(),
            json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "kubernetes", "namespace": NAMESPACE,
                    "labels": {"kubernetes.io/service-name": "kubernetes",
                        "endpointslice.kubernetes.io/managed-by": "skiff-apiserver"}},
                "addressType": "IPv4",
                "endpoints": [],
                "ports": [],
            }),
        ));
    }
    out
}

/// Writes the Endpoints and slices for `live` where they differ from what
/// is stored, and deletes slices no longer needed.
async fn write_endpoints(reg: &Registry, live: &[Endpoint]) -> Result<(), ApiError> {
    put_if_changed(
        reg,
        res("", "endpoints"),
        "kubernetes",
        endpoints_object(live),
    )
    .await?;
    let slices = res("discovery.k8s.io", "endpointslices");
    let wanted = slice_objects(live);
    for (name, obj) in &wanted {
        put_if_changed(reg, slices, name, obj.clone()).await?;
    }
    let filter = Filter {
        namespace: Some(NAMESPACE.into()),
        labels: Some(
            LabelSelector::parse(
                "kubernetes.io/service-name=kubernetes,endpointslice.kubernetes.io/managed-by=skiff-apiserver",
            )
            .map_err(ApiError::internal)?,
        ),
        fields: None,
    };
    for item in reg.list(slices, &filter, 0, None, None, false).await?.items {
        let obj: Value = serde_json::from_slice(&item)
            .map_err(|e| ApiError::internal(format!("decoding a slice: {e}")))?;
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        if !wanted.iter().any(|(n, _)| n == name) {
            match reg
                .delete(slices, Some(NAMESPACE), name, &DeleteOptions::default())
                .await
            {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Creates `body`, or replaces the stored object when its content (the
/// fields this module writes) differs.
async fn put_if_changed(
    reg: &Registry,
    res: &'static ResourceInfo,
    name: &str,
    body: Value,
) -> Result<(), ApiError> {
    match reg.get(res, Some(NAMESPACE), name).await {
        Ok(cur) => {
            let same = ["subsets", "endpoints", "ports", "addressType"]
                .iter()
                .all(|k| cur.get(*k) == body.get(*k))
                && cur["metadata"]["labels"] == body["metadata"]["labels"];
            if same {
                return Ok(());
            }
            reg.update(
                res,
                Some(NAMESPACE),
                name,
                body,
                crate::request::Subresource::Main,
                &opts(),
            )
            .await
            .map(|_| ())
        }
        Err(e) if e.code == 404 => match reg.create(res, Some(NAMESPACE), body, &opts()).await {
            Ok(_) => Ok(()),
            // Another server created it meanwhile: the next round compares.
            Err(e) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(ip: &str, port: u16, renewed: &str, ttl: i64) -> Value {
        json!({
            "metadata": {"name": lease_name(ip, port), "annotations": {
                "skiff.io/endpoint-ip": ip, "skiff.io/endpoint-port": port.to_string()}},
            "spec": {"renewTime": renewed, "leaseDurationSeconds": ttl},
        })
    }

    #[test]
    fn a_lease_is_live_until_its_duration_after_renewal_has_passed() {
        let now: DateTime<Utc> = "2026-11-25T12:00:20Z".parse().unwrap();
        let (expired, ep) = read_lease(
            &lease("10.0.0.1", 6443, "2026-11-25T12:00:10.000000Z", 15),
            now,
        );
        assert!(!expired);
        assert_eq!(
            ep,
            Some(Endpoint {
                ip: "10.0.0.1".into(),
                port: 6443
            })
        );
        let (expired, _) = read_lease(
            &lease("10.0.0.1", 6443, "2026-11-25T12:00:04.000000Z", 15),
            now,
        );
        assert!(expired);
        let (expired, _) = read_lease(&json!({"spec": {}}), now);
        assert!(expired, "a lease that was never renewed is not live");
    }

    #[test]
    fn servers_sharing_a_port_share_one_subset_and_one_slice() {
        let live = vec![
            Endpoint {
                port: 6443,
                ip: "10.0.0.1".into(),
            },
            Endpoint {
                port: 6443,
                ip: "10.0.0.2".into(),
            },
            Endpoint {
                port: 6444,
                ip: "10.0.0.1".into(),
            },
        ];
        let eps = endpoints_object(&live);
        assert_eq!(
            eps["subsets"][0]["addresses"],
            json!([{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}])
        );
        assert_eq!(eps["subsets"][0]["ports"][0]["port"], 6443);
        assert_eq!(eps["subsets"][1]["addresses"], json!([{"ip": "10.0.0.1"}]));
        let slices = slice_objects(&live);
        let names: Vec<_> = slices.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["kubernetes", "kubernetes-6444"]);
        assert_eq!(slices[0].1["endpoints"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn no_live_server_leaves_no_subsets() {
        let eps = endpoints_object(&[]);
        assert!(eps.get("subsets").is_none());
        let slices = slice_objects(&[]);
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].1["endpoints"], json!([]));
    }
}
