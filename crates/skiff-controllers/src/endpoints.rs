//! The Endpoints and EndpointSlice controllers: for every service with a
//! selector, the addresses of its selected pods that have an IP (ready ones
//! as addresses, others as notReadyAddresses unless the service publishes
//! not-ready addresses), with the service's ports resolved against each
//! pod (named target ports). Pods that resolve ports differently land in
//! different subsets / slices; a slice holds at most 100 endpoints.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::common;
use crate::controller::Controller;
use crate::framework::{self, Next};
use crate::{Ctx, Error};

pub const SERVICE_NAME: &str = "kubernetes.io/service-name";
pub const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGER: &str = "endpointslice-controller.k8s.io";
const MAX_PER_SLICE: usize = 100;

pub struct State {
    endpoints: bool,
    slices: bool,
    written: Mutex<HashMap<String, Value>>,
}

pub fn register(
    ctx: &Arc<Ctx>,
    tasks: &mut tokio::task::JoinSet<()>,
    endpoints: bool,
    slices: bool,
) {
    let st = Arc::new(State {
        endpoints,
        slices,
        written: Mutex::new(HashMap::new()),
    });
    Controller::new(ctx, "endpoints", &ctx.caches.services)
        // A deleted service's key too: its Endpoints go with it.
        .watches(&ctx.caches.services, |_, old, new| {
            old.filter(|_| new.is_none())
                .map(|s| framework::key_of(&s.metadata))
        })
        // Every service of the pod's namespace whose selector matches the
        // pod's labels before or after.
        .watches(&ctx.caches.pods, |c, old, new| {
            let Some(p) = new.or(old) else { return vec![] };
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let empty = BTreeMap::new();
            let labels =
                [old, new].map(|p| p.and_then(|p| p.metadata.labels.as_ref()).unwrap_or(&empty));
            c.caches
                .services
                .in_namespace(ns)
                .iter()
                .filter(|svc| {
                    let sel = svc.spec.as_ref().and_then(|s| s.selector.as_ref());
                    sel.is_some_and(|sel| {
                        !sel.is_empty()
                            && labels
                                .iter()
                                .any(|l| sel.iter().all(|(k, v)| l.get(k) == Some(v)))
                    })
                })
                .map(|svc| framework::key_of(&svc.metadata))
                .collect()
        })
        .workers(4)
        .resync(Duration::from_secs(60))
        .run(tasks, st, |c, st, key| async move {
            reconcile(&c, &st, &key).await
        });
}

fn resolve_port(p: &Pod, target: &IntOrString) -> Option<i32> {
    match target {
        IntOrString::Int(i) => Some(*i),
        IntOrString::String(name) => p
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|cp| cp.name.as_deref() == Some(name.as_str()))
            .map(|cp| cp.container_port),
    }
}

/// One address of a service: its pod, whether it counts as ready, and the
/// ports it resolves to (name, port, protocol).
#[derive(Clone, Debug)]
pub struct Address {
    pub ip: String,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub pod: Arc<Pod>,
    pub ports: Vec<(String, i32, String)>,
    /// The pod's `hostname` when its `subdomain` names this service (in
    /// the same namespace): `<hostname>.<svc>.<ns>.svc.<zone>` in DNS.
    pub hostname: Option<String>,
}

/// The addresses of a service's selected pods.
pub fn addresses(svc: &Service, pods: &[Arc<Pod>]) -> Vec<Address> {
    let spec = svc.spec.clone().unwrap_or_default();
    let Some(selector) = spec.selector.clone().filter(|s| !s.is_empty()) else {
        return vec![];
    };
    let publish = spec.publish_not_ready_addresses.unwrap_or(false);
    let mut out = vec![];
    for p in pods {
        if !selector.iter().all(|(k, v)| p.labels().get(k) == Some(v)) {
            continue;
        }
        let phase = common::phase(p);
        if phase == "Succeeded" || phase == "Failed" {
            continue;
        }
        let Some(ip) = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty())
        else {
            continue;
        };
        let terminating = common::is_terminating(&p.metadata);
        if terminating && !publish {
            // Terminating pods only appear in slices (serving/terminating).
        }
        let serving = common::pod_ready(p);
        let ready = publish || (serving && !terminating);
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|sp| {
                let target = sp.target_port.clone().unwrap_or(IntOrString::Int(sp.port));
                resolve_port(p, &target).map(|port| {
                    (
                        sp.name.clone().unwrap_or_default(),
                        port,
                        sp.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    )
                })
            })
            .collect();
        // Kubernetes' ShouldSetHostname.
        let hostname = p
            .spec
            .as_ref()
            .filter(|s| {
                s.subdomain.as_deref() == svc.metadata.name.as_deref()
                    && p.metadata.namespace == svc.metadata.namespace
            })
            .and_then(|s| s.hostname.clone())
            .filter(|h| !h.is_empty());
        out.push(Address {
            hostname,
            ip,
            ready,
            serving,
            terminating,
            pod: p.clone(),
            ports,
        });
    }
    out.sort_by(|a, b| {
        a.ip.cmp(&b.ip)
            .then(a.pod.name_any().cmp(&b.pod.name_any()))
    });
    out
}

fn ports_json(ports: &[(String, i32, String)]) -> Vec<Value> {
    ports
        .iter()
        .map(|(n, p, proto)| {
            let mut v = json!({"port": p, "protocol": proto});
            if !n.is_empty() {
                v["name"] = json!(n);
            }
            v
        })
        .collect()
}

fn target_ref(a: &Address) -> Value {
    json!({"kind": "Pod", "namespace": a.pod.metadata.namespace, "name": a.pod.name_any(), "uid": a.pod.metadata.uid})
}

type PortSet = Vec<(String, i32, String)>;

/// The subsets of the Endpoints object: one per distinct port set.
pub fn subsets(addrs: &[Address]) -> Vec<Value> {
    let mut groups: BTreeMap<PortSet, (Vec<Value>, Vec<Value>)> = BTreeMap::new();
    for a in addrs.iter().filter(|a| !a.terminating || a.ready) {
        let mut addr = json!({
            "ip": a.ip,
            "nodeName": a.pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            "targetRef": target_ref(a),
        });
        if let Some(h) = &a.hostname {
            addr["hostname"] = json!(h);
        }
        let g = groups.entry(a.ports.clone()).or_default();
        if a.ready {
            g.0.push(addr);
        } else {
            g.1.push(addr);
        }
    }
    groups
        .into_iter()
        .map(|(ports, (ready, not_ready))| {
            let mut s = json!({});
            if !ready.is_empty() {
                s["addresses"] = json!(ready);
            }
            if !not_ready.is_empty() {
                s["notReadyAddresses"] = json!(not_ready);
            }
            if !ports.is_empty() {
                s["ports"] = json!(ports_json(&ports));
            }
            s
        })
        .collect()
}

/// The slices' contents: (ports, endpoints), at most 100 endpoints each.
pub fn slice_contents(addrs: &[Address]) -> Vec<(Vec<Value>, Vec<Value>)> {
    let mut groups: BTreeMap<PortSet, Vec<Value>> = BTreeMap::new();
    for a in addrs {
        let mut ep = json!({
            "addresses": [a.ip],
            "conditions": {"ready": a.ready, "serving": a.serving, "terminating": a.terminating},
            "targetRef": target_ref(a),
        });
        if let Some(n) = a.pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            ep["nodeName"] = json!(n);
        }
        if let Some(h) = &a.hostname {
            ep["hostname"] = json!(h);
        }
        groups.entry(a.ports.clone()).or_default().push(ep);
    }
    let mut out = vec![];
    for (ports, eps) in groups {
        for chunk in eps.chunks(MAX_PER_SLICE) {
            out.push((ports_json(&ports), chunk.to_vec()));
        }
    }
    out
}

async fn reconcile(ctx: &Ctx, st: &State, key: &str) -> Result<Next, Error> {
    let (ns, name) = framework::split_key(key);
    let svc = ctx.caches.services.get(key);
    let selector_set = svc
        .as_ref()
        .and_then(|s| s.spec.as_ref()?.selector.as_ref())
        .map(|s| !s.is_empty())
        .unwrap_or(false);
    let eps_api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), ns);
    let slices_api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), ns);
    let Some(svc) = svc.filter(|_| selector_set) else {
        // Gone (or no longer selecting): its Endpoints go; the slices are
        // owned by the service and collected, or deleted here if it stays.
        st.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        if ctx.caches.services.get(key).is_none() && st.endpoints {
            match eps_api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if common::is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if st.slices {
            for s in managed_slices(ctx, ns, name) {
                let _ = slices_api
                    .delete(&s.name_any(), &DeleteParams::default())
                    .await;
            }
        }
        return Ok(None);
    };
    let pods = ctx.caches.pods.in_namespace(ns);
    let addrs = addresses(&svc, &pods);
    let mut labels = svc.labels().clone();
    labels.remove("service.kubernetes.io/headless");
    let ep = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "subsets": subsets(&addrs),
    });
    let owner = json!([{"apiVersion": "v1", "kind": "Service", "name": name, "uid": svc.metadata.uid, "controller": true, "blockOwnerDeletion": true}]);
    let mut slice_labels = svc.labels().clone();
    slice_labels.insert(SERVICE_NAME.into(), name.into());
    slice_labels.insert(MANAGED_BY.into(), MANAGER.into());
    let family = if svc
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.as_ref())
        .map(|f| f.iter().any(|x| x == "IPv6") && !f.iter().any(|x| x == "IPv4"))
        .unwrap_or(false)
    {
        "IPv6"
    } else {
        "IPv4"
    };
    let contents = slice_contents(&addrs);
    let contents = if contents.is_empty() {
        vec![(vec![], vec![])]
    } else {
        contents
    };
    let slices: Vec<(String, Value)> = contents
        .into_iter()
        .enumerate()
        .map(|(i, (ports, eps))| {
            let sname = if i == 0 {
                format!("{name}-skiff")
            } else {
                format!("{name}-skiff-{i}")
            };
            let v = json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": sname, "namespace": ns, "labels": slice_labels, "ownerReferences": owner},
                "addressType": family,
                "endpoints": eps,
                "ports": ports,
            });
            (sname, v)
        })
        .collect();
    let fingerprint = json!([ep, slices.iter().map(|(_, v)| v).collect::<Vec<_>>()]);
    if st
        .written
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(key)
        == Some(&fingerprint)
    {
        return Ok(None);
    }
    if st.endpoints {
        upsert(&eps_api, name, &ep).await?;
    }
    if st.slices {
        for (sname, v) in &slices {
            upsert(&slices_api, sname, v).await?;
        }
        for s in managed_slices(ctx, ns, name) {
            if !slices.iter().any(|(n, _)| *n == s.name_any()) {
                let _ = slices_api
                    .delete(&s.name_any(), &DeleteParams::default())
                    .await;
            }
        }
    }
    st.written
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key.to_string(), fingerprint);
    Ok(None)
}

fn managed_slices(ctx: &Ctx, ns: &str, service: &str) -> Vec<Arc<EndpointSlice>> {
    ctx.caches
        .endpoint_slices
        .in_namespace(ns)
        .into_iter()
        .filter(|s| {
            s.labels().get(SERVICE_NAME).map(String::as_str) == Some(service)
                && s.labels().get(MANAGED_BY).map(String::as_str) == Some(MANAGER)
        })
        .collect()
}

/// Creates or replaces an object (a replace keeps what others added to
/// metadata; a 409 is retried by the caller's back-off).
async fn upsert<K>(api: &Api<K>, name: &str, body: &Value) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(body.clone())?;
    match api.get_opt(name).await? {
        Some(_) => {
            let mut merged = body.clone();
            if let Some(o) = merged.as_object_mut() {
                o.remove("apiVersion");
                o.remove("kind");
            }
            api.patch(name, &PatchParams::default(), &Patch::Merge(&merged))
                .await?;
        }
        None => match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: &str, ready: bool, port_name: &str, port: i32) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "labels": {"app": "web"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": port_name, "containerPort": port}]}]},
                "status": {"phase": "Running", "podIP": ip,
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
            }))
            .unwrap(),
        )
    }

    fn svc(publish: bool) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"selector": {"app": "web"}, "publishNotReadyAddresses": publish,
                "ports": [{"name": "http", "port": 80, "targetPort": "web"}]}
        }))
        .unwrap()
    }

    #[test]
    fn ready_pods_are_addresses_and_others_not_ready_addresses_with_named_ports_resolved() {
        let pods = vec![
            pod("a", "10.0.0.1", true, "web", 8080),
            pod("b", "10.0.0.2", false, "web", 8080),
        ];
        let subsets = subsets(&addresses(&svc(false), &pods));
        assert_eq!(subsets.len(), 1);
        assert_eq!(subsets[0]["addresses"][0]["ip"], "10.0.0.1");
        assert_eq!(subsets[0]["notReadyAddresses"][0]["ip"], "10.0.0.2");
        assert_eq!(subsets[0]["ports"][0]["port"], 8080);
        assert_eq!(subsets[0]["ports"][0]["name"], "http");
    }

    #[test]
    fn publish_not_ready_addresses_makes_every_pod_an_address() {
        let pods = vec![pod("b", "10.0.0.2", false, "web", 8080)];
        let subsets = subsets(&addresses(&svc(true), &pods));
        assert_eq!(subsets[0]["addresses"][0]["ip"], "10.0.0.2");
        assert!(subsets[0].get("notReadyAddresses").is_none());
    }

    #[test]
    fn pods_resolving_ports_differently_get_separate_subsets_and_slices() {
        let pods = vec![
            pod("a", "10.0.0.1", true, "web", 8080),
            pod("b", "10.0.0.2", true, "web", 9090),
        ];
        let a = addresses(&svc(false), &pods);
        assert_eq!(subsets(&a).len(), 2);
        assert_eq!(slice_contents(&a).len(), 2);
    }

    #[test]
    fn a_slice_holds_at_most_one_hundred_endpoints() {
        let pods: Vec<_> = (0..250)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    &format!("10.0.{}.{}", i / 200, i % 200),
                    true,
                    "web",
                    80,
                )
            })
            .collect();
        let c = slice_contents(&addresses(&svc(false), &pods));
        assert_eq!(
            c.iter().map(|(_, e)| e.len()).collect::<Vec<_>>(),
            vec![100, 100, 50]
        );
    }

    #[test]
    fn a_pod_whose_subdomain_names_the_service_publishes_its_hostname() {
        let mut named = pod("db-0", "10.0.0.1", true, "web", 8080);
        let mut other = pod("x", "10.0.0.2", true, "web", 8080);
        let mut elsewhere = pod("y", "10.0.0.3", true, "web", 8080);
        {
            let p = Arc::make_mut(&mut named);
            let spec = p.spec.as_mut().unwrap();
            spec.hostname = Some("db-0".into());
            spec.subdomain = Some("web".into());
            let p = Arc::make_mut(&mut other);
            p.spec.as_mut().unwrap().hostname = Some("x".into());
            let p = Arc::make_mut(&mut elsewhere);
            let spec = p.spec.as_mut().unwrap();
            spec.hostname = Some("y".into());
            spec.subdomain = Some("other".into());
        }
        let a = addresses(&svc(false), &[named, other, elsewhere]);
        let eps = &slice_contents(&a)[0].1;
        assert_eq!(eps[0]["hostname"], "db-0");
        assert!(eps[1].get("hostname").is_none(), "no subdomain: {}", eps[1]);
        assert!(
            eps[2].get("hostname").is_none(),
            "another subdomain: {}",
            eps[2]
        );
        assert_eq!(subsets(&a)[0]["addresses"][0]["hostname"], "db-0");
    }
}
