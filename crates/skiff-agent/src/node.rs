//! The Node object and its Lease: registration with capacity, allocatable,
//! nodeInfo, addresses and conditions; a Lease in kube-node-lease renewed
//! every 10 s; status written when it changes (and at least every minute,
//! as the heartbeat of the conditions).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::pressure::Condition;

/// The pressure conditions a node reports: whether each holds, and since
/// when (its last transition).
#[derive(Debug, Clone, PartialEq)]
pub struct Pressure(BTreeMap<Condition, (bool, String)>);

impl Pressure {
    /// No pressure, since `since`.
    pub fn since(since: &str) -> Pressure {
        Pressure(
            Condition::ALL
                .iter()
                .map(|c| (*c, (false, since.to_string())))
                .collect(),
        )
    }

    fn get(&self, c: Condition) -> (bool, &str) {
        self.0
            .get(&c)
            .map(|(h, s)| (*h, s.as_str()))
            .unwrap_or((false, ""))
    }

    /// Takes the conditions that hold now; a condition that changed
    /// transitions at `now`. Whether anything changed.
    pub fn update(&mut self, holding: &std::collections::BTreeSet<Condition>, now: &str) -> bool {
        let mut changed = false;
        for c in Condition::ALL {
            let holds = holding.contains(&c);
            let e = self.0.entry(c).or_insert((false, now.to_string()));
            if e.0 != holds {
                *e = (holds, now.to_string());
                changed = true;
            }
        }
        changed
    }
}

/// What the agent reports about its machine.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub name: String,
    pub internal_ip: String,
    pub hostname: String,
    pub cpu: String,
    pub memory: String,
    pub ephemeral_storage: String,
    pub pods: String,
    pub runtime_version: String,
    pub kernel: String,
    pub os_image: String,
    pub machine_id: String,
    pub boot_id: String,
    pub port: u16,
    pub labels: BTreeMap<String, String>,
    pub pod_cidr: Option<String>,
    pub taints: Vec<Value>,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl NodeFacts {
    /// Reads the facts of this machine.
    pub fn of_this_machine(
        name: &str,
        data_dir: &std::path::Path,
        internal_ip: String,
        port: u16,
        runtime_version: String,
    ) -> NodeFacts {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0);
        let storage = nix::sys::statvfs::statvfs(data_dir)
            .map(|s| s.blocks() * s.fragment_size())
            .unwrap_or(0);
        let os_image = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|s| {
                s.lines().find(|l| l.starts_with("PRETTY_NAME=")).map(|l| {
                    l.trim_start_matches("PRETTY_NAME=")
                        .trim_matches('"')
                        .to_string()
                })
            })
            .unwrap_or_else(|| "Linux".into());
        let hostname = read_trim("/proc/sys/kernel/hostname");
        NodeFacts {
            name: name.to_string(),
            internal_ip,
            hostname: if hostname.is_empty() {
                name.to_string()
            } else {
                hostname
            },
            cpu: cpus.to_string(),
            memory: format!("{mem_kib}Ki"),
            ephemeral_storage: format!("{}Ki", storage / 1024),
            pods: "110".into(),
            runtime_version,
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            os_image,
            machine_id: read_trim("/etc/machine-id"),
            boot_id: read_trim("/proc/sys/kernel/random/boot_id"),
            port,
            labels: BTreeMap::new(),
            pod_cidr: None,
            taints: vec![],
        }
    }

    /// Facts of a hollow node: a typical machine, no real resources.
    pub fn hollow(name: &str, port: u16) -> NodeFacts {
        NodeFacts {
            name: name.to_string(),
            internal_ip: "127.0.0.1".into(),
            hostname: name.to_string(),
            cpu: "4".into(),
            memory: "32Gi".into(),
            ephemeral_storage: "100Gi".into(),
            pods: "110".into(),
            runtime_version: "simulated://1.0".into(),
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            os_image: "skiff hollow node".into(),
            machine_id: String::new(),
            boot_id: String::new(),
            port,
            labels: BTreeMap::new(),
            pod_cidr: None,
            taints: vec![],
        }
    }

    fn resources(&self) -> Value {
        json!({
            "cpu": self.cpu,
            "memory": self.memory,
            "ephemeral-storage": self.ephemeral_storage,
            "pods": self.pods,
        })
    }

    fn labels(&self) -> Value {
        let mut l = json!({
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
        });
        for (k, v) in &self.labels {
            l[k] = json!(v);
        }
        l
    }

    /// The status the node reports, with conditions stamped `now` and no
    /// pressure.
    pub fn status(&self, ready_since: &str, now: &str) -> Value {
        self.status_with(ready_since, now, &Pressure::since(ready_since))
    }

    /// The status with the eviction manager's pressure conditions.
    pub fn status_with(&self, ready_since: &str, now: &str, pressure: &Pressure) -> Value {
        let cond = |type_: &str, status: &str, reason: &str, message: &str, since: &str| {
            json!({
                "type": type_, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": since,
            })
        };
        let mut conditions: Vec<Value> = Condition::ALL
            .iter()
            .map(|c| {
                let (holds, since) = pressure.get(*c);
                let (reason, message) = c.reason(holds);
                let status = if holds { "True" } else { "False" };
                cond(c.type_(), status, reason, message, since)
            })
            .collect();
        conditions.push(cond(
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
            ready_since,
        ));
        json!({
            "capacity": self.resources(),
            "allocatable": self.resources(),
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": self.internal_ip},
                {"type": "Hostname", "address": self.hostname},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "nodeInfo": {
                "machineID": self.machine_id,
                "systemUUID": self.machine_id,
                "bootID": self.boot_id,
                "kernelVersion": self.kernel,
                "osImage": self.os_image,
                "containerRuntimeVersion": self.runtime_version,
                "kubeletVersion": "v1.33.0",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        })
    }
}

fn now() -> String {
    let t = k8s_openapi::jiff::Timestamp::now();
    t.round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or(t)
        .to_string()
}

/// Creates the Node if it does not exist (keeping what others set, such as
/// the podCIDR, taints and cordoning, if it does) and writes its status.
/// Returns the Node as stored.
pub async fn register(client: &kube::Client, facts: &NodeFacts) -> anyhow::Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let stamp = now();
    if nodes.get_opt(&facts.name).await?.is_none() {
        let mut spec = json!({});
        if let Some(cidr) = &facts.pod_cidr {
            spec["podCIDR"] = json!(cidr);
            spec["podCIDRs"] = json!([cidr]);
        }
        if !facts.taints.is_empty() {
            spec["taints"] = json!(facts.taints);
        }
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": facts.name,
                "labels": facts.labels(),
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": spec,
        }))?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    } else {
        let mut patch = json!({"metadata": {"labels": facts.labels()}});
        if let Some(cidr) = &facts.pod_cidr {
            let cur = nodes.get(&facts.name).await?;
            if cur.spec.as_ref().and_then(|s| s.pod_cidr.clone()).is_none() {
                patch["spec"] = json!({"podCIDR": cidr, "podCIDRs": [cidr]});
            }
        }
        nodes
            .patch(&facts.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let status = facts.status(&stamp, &stamp);
    let node = nodes
        .patch_status(
            &facts.name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await?;
    Ok(node)
}

/// Whether `e` is the API server refusing this agent (401 or 403): asking
/// again with the same credentials gets the same answer.
pub fn is_refusal(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(c.downcast_ref::<kube::Error>(),
            Some(kube::Error::Api(s)) if s.code == 401 || s.code == 403)
    })
}

/// Who the API server takes `client` for ("system:node:a (groups
/// system:nodes, system:authenticated)"), from a SelfSubjectReview.
pub async fn whoami(client: &kube::Client) -> Option<String> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()?;
    let user = review.status?.user_info?;
    let name = user.username?;
    let groups = user.groups.unwrap_or_default();
    Some(if groups.is_empty() {
        name
    } else {
        format!("{name} (groups {})", groups.join(", "))
    })
}

/// What to tell the user when the server refuses to let `client` register
/// `node` (`error`): which identity was refused, and what would work.
pub async fn refusal(client: &kube::Client, node: &str, error: anyhow::Error) -> anyhow::Error {
    let who = whoami(client)
        .await
        .unwrap_or_else(|| "an identity the server would not name".into());
    let hint = if who.starts_with(&format!("system:node:{node} "))
        || who == format!("system:node:{node}")
    {
        "its credentials do not allow what a node needs".to_string()
    } else if who.starts_with("system:node:") {
        format!(
            "a node's identity may register only its own Node (the Node authorizer and NodeRestriction), \
             and this agent is not system:node:{node}; hollow nodes need --server and --token (each then \
             joins with its own identity) or a kubeconfig whose user may register every Node"
        )
    } else {
        "give the agent --server and --token to join as the node, or a kubeconfig whose user may \
         register the Node"
            .to_string()
    };
    // The server's own words, without the client's wrapping.
    let said = error
        .chain()
        .find_map(|c| match c.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(s)) => Some(format!("{} ({})", s.message, s.code)),
            _ => None,
        })
        .unwrap_or_else(|| format!("{error:#}"));
    anyhow::anyhow!(
        "the API server refuses to let this agent register node {node:?}: {said}. It is authenticated as {who}, and {hint}. Not retrying: asking again as the same identity gets the same answer"
    )
}

/// Renews the node's Lease every `every` (Kubernetes: 10 s, duration 40 s).
pub async fn renew_lease_forever(client: kube::Client, node: String, uid: String, every: Duration) {
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    loop {
        if let Err(e) = renew_lease(&leases, &node, &uid).await {
            tracing::warn!(node, error = %e, "renewing the node lease failed");
        }
        tokio::time::sleep(every).await;
    }
}

pub async fn renew_lease(leases: &Api<Lease>, node: &str, uid: &str) -> anyhow::Result<()> {
    let t = k8s_openapi::jiff::Timestamp::now();
    let stamp = t
        .round(k8s_openapi::jiff::Unit::Microsecond)
        .unwrap_or(t)
        .to_string();
    let body = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": "kube-node-lease",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        },
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": stamp},
    });
    match leases
        .patch(node, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": stamp}})))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let lease: Lease = serde_json::from_value(body)?;
            match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Writes the node's status every `every` so its conditions' heartbeats
/// stay fresh, keeping the transition times of conditions that held.
pub async fn report_status_forever(client: kube::Client, facts: NodeFacts, every: Duration) {
    let (_keep, address) = tokio::sync::watch::channel(facts.internal_ip.clone());
    report_status_following(client, facts, every, address, None).await
}

/// [`report_status_forever`] with the node's InternalIP taken from
/// `address` at each write (pod routing re-detects it) and the pressure
/// conditions from the eviction manager (`pressure`), written at once
/// when they change.
pub async fn report_status_following(
    client: kube::Client,
    mut facts: NodeFacts,
    every: Duration,
    address: tokio::sync::watch::Receiver<String>,
    mut pressure: Option<crate::pressure::Conditions>,
) {
    let nodes: Api<Node> = Api::all(client);
    let since = now();
    let mut reported = Pressure::since(&since);
    loop {
        let changed = async {
            match pressure.as_mut() {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = changed => {}
        }
        let stamp = now();
        if let Some(rx) = pressure.as_ref() {
            if let Some(holding) = rx.borrow().as_ref() {
                reported.update(holding, &stamp);
            }
        }
        facts.internal_ip = address.borrow().clone();
        let status = facts.status_with(&since, &stamp, &reported);
        if let Err(e) = nodes
            .patch_status(
                &facts.name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await
        {
            tracing::warn!(node = facts.name, error = %e, "updating node status failed");
        }
    }
}
