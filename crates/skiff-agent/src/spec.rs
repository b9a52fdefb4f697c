//! Turning a Pod's spec into CRI configs: the sandbox (hostname, DNS, port
//! mappings, labels), and each container (command with `$(VAR)` expansion,
//! env from values, fields, resources, ConfigMaps and Secrets, mounts,
//! resources and security context).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::runtime::{
    cri, ANNOTATION_INIT, ANNOTATION_SPEC_HASH, LABEL_CONTAINER_NAME, LABEL_POD_NAME,
    LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}
pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}
pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// The directory CRI writes a pod's container logs under.
pub fn log_dir(logs_root: &Path, pod: &Pod) -> std::path::PathBuf {
    logs_root.join(format!("{}_{}_{}", namespace(pod), name(pod), uid(pod)))
}

/// The sandbox config of a pod (attempt: how many sandboxes it had before).
/// A batch pod goes under `batch_cgroup_parent` when the node has one.
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    logs_root: &Path,
    dns: &crate::dns::ClusterDns,
    batch_cgroup_parent: Option<&str>,
) -> cri::PodSandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    labels.insert(LABEL_POD_UID.into(), uid(pod).into());
    labels.insert(LABEL_POD_NAME.into(), name(pod).into());
    labels.insert(LABEL_POD_NAMESPACE.into(), namespace(pod).into());
    let annotations: HashMap<String, String> = pod
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let host_network = spec.host_network.unwrap_or(false);
    let hostname = if host_network {
        String::new()
    } else {
        spec.hostname
            .clone()
            .unwrap_or_else(|| name(pod).to_string())
    };
    let mut port_mappings = vec![];
    for c in &spec.containers {
        for p in c.ports.iter().flatten() {
            if let Some(hp) = p.host_port.filter(|h| *h > 0) {
                let protocol = match p.protocol.as_deref() {
                    Some("UDP") => cri::Protocol::Udp,
                    Some("SCTP") => cri::Protocol::Sctp,
                    _ => cri::Protocol::Tcp,
                };
                port_mappings.push(cri::PortMapping {
                    protocol: protocol as i32,
                    container_port: p.container_port,
                    host_port: hp,
                    host_ip: p.host_ip.clone().unwrap_or_default(),
                });
            }
        }
    }
    let dns_config = Some(crate::dns::resolvconf::sandbox_dns_config(pod, dns));
    let privileged = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name(pod).into(),
            uid: uid(pod).into(),
            namespace: namespace(pod).into(),
            attempt,
        }),
        hostname,
        log_directory: log_dir(logs_root, pod).to_string_lossy().into_owned(),
        dns_config,
        port_mappings,
        labels,
        annotations,
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                privileged,
                ..Default::default()
            }),
            cgroup_parent: batch_cgroup_parent
                .filter(|_| crate::reclaim::is_batch(pod))
                .unwrap_or_default()
                .to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Parses a Kubernetes quantity into a number in base units (cores for cpu,
/// bytes for memory). None if it does not parse.
pub fn quantity(q: &Quantity) -> Option<f64> {
    skiff_helpers::Quantity::parse(&q.0)
        .ok()
        .map(|q| q.as_f64())
}

/// A container's resource settings for CRI: cpu shares from the request,
/// CFS quota from the limit, the memory limit. A batch container (one
/// asking for `skiff.io/batch-cpu` or `skiff.io/batch-memory`) gets the
/// least cpu weight (2 shares, cgroup v2's cpu.weight 1), so any prod
/// container wins the cpu at once, and its quota and memory limit from its
/// batch limits.
pub fn resources(c: &Container) -> cri::LinuxContainerResources {
    let res = c.resources.clone().unwrap_or_default();
    let req = res.requests.unwrap_or_default();
    let lim = res.limits.unwrap_or_default();
    let batch_cpu = lim
        .get(crate::reclaim::BATCH_CPU)
        .or(req.get(crate::reclaim::BATCH_CPU))
        .and_then(quantity);
    let batch_mem = lim
        .get(crate::reclaim::BATCH_MEMORY)
        .or(req.get(crate::reclaim::BATCH_MEMORY))
        .and_then(quantity);
    if batch_cpu.is_some() || batch_mem.is_some() {
        return cri::LinuxContainerResources {
            cpu_shares: 2,
            // Millicores: 100 µs of each 100 ms period per millicore.
            cpu_quota: batch_cpu
                .map(|m| ((m * 100.0).round() as i64).max(1000))
                .unwrap_or(0),
            cpu_period: if batch_cpu.is_some() { 100_000 } else { 0 },
            memory_limit_in_bytes: batch_mem.map(|b| b as i64).unwrap_or(0),
            ..Default::default()
        };
    }
    let cpu_req = req.get("cpu").or(lim.get("cpu")).and_then(quantity);
    let cpu_lim = lim.get("cpu").and_then(quantity);
    let mem_lim = lim.get("memory").and_then(quantity);
    let shares = match cpu_req {
        Some(cores) => ((cores * 1024.0).round() as i64).max(2),
        None => 2,
    };
    let (quota, period) = match cpu_lim {
        Some(cores) => (((cores * 100_000.0).round() as i64).max(1000), 100_000),
        None => (0, 0),
    };
    cri::LinuxContainerResources {
        cpu_shares: shares,
        cpu_quota: quota,
        cpu_period: period,
        memory_limit_in_bytes: mem_lim.map(|b| b as i64).unwrap_or(0),
        ..Default::default()
    }
}

/// Expands `$(VAR)` references as Kubernetes does: `$$` escapes, unknown
/// references stay as written.
pub fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    expand_with(s, |name| env.get(name).map(String::as_str))
}

/// [`expand`] with the variables looked up by `lookup`.
pub fn expand_with<'a>(s: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            if b[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if b[i + 1] == b'(' {
                if let Some(end) = s[i + 2..].find(')') {
                    let name = &s[i + 2..i + 2 + end];
                    if let Some(v) = lookup(name) {
                        out.push_str(v);
                    } else {
                        out.push_str(&s[i..i + 3 + end]);
                    }
                    i += 3 + end;
                    continue;
                }
            }
        }
        let ch = s[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Everything a container config needs that comes from outside the pod.
pub struct ContainerInputs<'a> {
    pub env: Vec<(String, String)>,
    pub mounts: Vec<cri::Mount>,
    pub image: &'a str,
    pub attempt: u32,
    pub init: bool,
    pub spec_hash: String,
    /// The container whose PID namespace an ephemeral container joins
    /// (its `targetContainerName`, running under this id).
    pub pid_target: Option<String>,
}

/// The namespaces of a pod's sandbox and of each of its containers, as
/// kubelet sets them: network and IPC shared by the pod (or the node's),
/// and a PID namespace per container unless the pod shares one
/// (`shareProcessNamespace`) or uses the node's (`hostPID`). The CRI
/// default (all zero) would be the pod's PID namespace for every container.
pub fn namespace_options(pod: &Pod) -> cri::NamespaceOption {
    let spec = pod.spec.clone().unwrap_or_default();
    let shared = |host: bool| {
        if host {
            cri::NamespaceMode::Node as i32
        } else {
            cri::NamespaceMode::Pod as i32
        }
    };
    cri::NamespaceOption {
        network: shared(spec.host_network.unwrap_or(false)),
        pid: if spec.host_pid.unwrap_or(false) {
            cri::NamespaceMode::Node as i32
        } else if spec.share_process_namespace.unwrap_or(false) {
            cri::NamespaceMode::Pod as i32
        } else {
            cri::NamespaceMode::Container as i32
        },
        ipc: shared(spec.host_ipc.unwrap_or(false)),
        ..Default::default()
    }
}

/// A container's namespaces: the pod's, except that a container with a
/// PID target (an ephemeral container's `targetContainerName`) joins that
/// container's PID namespace where each container would have its own
/// (a pod sharing one namespace, or the node's, already shares it).
fn container_namespaces(pod: &Pod, pid_target: Option<String>) -> cri::NamespaceOption {
    let mut ns = namespace_options(pod);
    if let Some(target) = pid_target {
        if ns.pid == cri::NamespaceMode::Container as i32 {
            ns.pid = cri::NamespaceMode::Target as i32;
            ns.target_id = target;
        }
    }
    ns
}

/// An ephemeral container as the container it runs as (the same fields,
/// less `targetContainerName`).
pub fn ephemeral_as_container(ec: &EphemeralContainer) -> Container {
    serde_json::to_value(ec)
        .and_then(serde_json::from_value)
        .unwrap_or_else(|_| Container {
            name: ec.name.clone(),
            image: ec.image.clone(),
            ..Default::default()
        })
}

pub fn container_config(
    pod: &Pod,
    c: &Container,
    inputs: ContainerInputs<'_>,
) -> cri::ContainerConfig {
    let env_map: BTreeMap<String, String> = inputs.env.iter().cloned().collect();
    let command: Vec<String> = c
        .command
        .iter()
        .flatten()
        .map(|s| expand(s, &env_map))
        .collect();
    let args: Vec<String> = c
        .args
        .iter()
        .flatten()
        .map(|s| expand(s, &env_map))
        .collect();
    let sc = c.security_context.clone().unwrap_or_default();
    let psc = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    let run_as_user = sc.run_as_user.or(psc.run_as_user);
    let run_as_group = sc.run_as_group.or(psc.run_as_group);
    let caps = sc.capabilities.clone().unwrap_or_default();
    let mut labels = HashMap::new();
    labels.insert(LABEL_POD_UID.to_string(), uid(pod).to_string());
    labels.insert(LABEL_POD_NAME.to_string(), name(pod).to_string());
    labels.insert(LABEL_POD_NAMESPACE.to_string(), namespace(pod).to_string());
    labels.insert(LABEL_CONTAINER_NAME.to_string(), c.name.clone());
    let mut annotations: HashMap<String, String> = pod
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    annotations.insert(ANNOTATION_SPEC_HASH.into(), inputs.spec_hash);
    if inputs.init {
        annotations.insert(ANNOTATION_INIT.into(), "true".into());
    }
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt: inputs.attempt,
        }),
        image: Some(cri::ImageSpec {
            image: inputs.image.to_string(),
            ..Default::default()
        }),
        command,
        args,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: inputs
            .env
            .iter()
            .map(|(k, v)| cri::KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
        mounts: inputs.mounts,
        labels,
        annotations,
        log_path: format!("{}/{}.log", c.name, inputs.attempt),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources(c)),
            security_context: Some(cri::LinuxContainerSecurityContext {
                capabilities: Some(cri::Capability {
                    add_capabilities: caps.add.unwrap_or_default(),
                    drop_capabilities: caps.drop.unwrap_or_default(),
                    ..Default::default()
                }),
                privileged: sc.privileged.unwrap_or(false),
                namespace_options: Some(container_namespaces(pod, inputs.pid_target)),
                run_as_user: run_as_user.map(|u| cri::Int64Value { value: u }),
                run_as_group: run_as_group.map(|g| cri::Int64Value { value: g }),
                readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
                supplemental_groups: psc.supplemental_groups.clone().unwrap_or_default(),
                no_new_privs: sc.allow_privilege_escalation == Some(false),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// A stable hash of a container's spec without its resources and resize
/// policy (kubelet's hash leaves them out too): a change means the
/// container must be replaced, a resize does not.
pub fn spec_hash(c: &Container) -> String {
    let mut c = c.clone();
    c.resources = None;
    c.resize_policy = None;
    hash_of(&c)
}

/// Whether a container created with `hash` still matches `c`'s spec ("":
/// unknown, taken as matching). A hash of the whole spec (the agents
/// before in-place resize wrote those) matches too, so an upgraded agent
/// restarts nothing.
pub fn hash_matches(c: &Container, hash: &str) -> bool {
    hash.is_empty() || hash == spec_hash(c) || hash == hash_of(c)
}

fn hash_of(c: &Container) -> String {
    let bytes = serde_json::to_vec(c).unwrap_or_default();
    let d = ring::digest::digest(&ring::digest::SHA256, &bytes);
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn variable_references_expand_and_unknown_ones_stay_as_written() {
        let e = env(&[("A", "x"), ("B", "y")]);
        assert_eq!(expand("$(A)-$(B)", &e), "x-y");
        assert_eq!(expand("$(C)", &e), "$(C)");
        assert_eq!(expand("$$(A)", &e), "$(A)");
        assert_eq!(expand("cost $5", &e), "cost $5");
        assert_eq!(expand("$(A", &e), "$(A");
        assert_eq!(expand("é$(A)", &e), "éx");
    }

    #[test]
    fn cpu_requests_become_shares_and_limits_become_a_cfs_quota() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "500m", "memory": "64Mi"}}
        }))
        .unwrap();
        let r = resources(&c);
        assert_eq!(r.cpu_shares, 256);
        assert_eq!(r.cpu_quota, 50_000);
        assert_eq!(r.cpu_period, 100_000);
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
    }

    fn container_pid_mode(pod: serde_json::Value) -> (i32, i32) {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let inputs = ContainerInputs {
            env: vec![],
            mounts: vec![],
            image: "i",
            attempt: 0,
            init: false,
            spec_hash: String::new(),
            pid_target: None,
        };
        let config = container_config(&pod, c, inputs);
        let ns = config
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .expect("container namespace options");
        let sandbox = sandbox_config(&pod, 0, Path::new("/logs"), &Default::default(), None)
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .expect("sandbox namespace options");
        assert_eq!(ns, sandbox, "containers and sandbox agree");
        (ns.pid, ns.network)
    }

    #[test]
    fn each_container_has_its_own_pid_namespace_unless_the_pod_shares_one() {
        let pod = |extra: serde_json::Value| {
            let mut p = serde_json::json!({"metadata": {"name": "p", "namespace": "d", "uid": "u"},
                "spec": {"containers": [{"name": "c"}]}});
            p["spec"]
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            p
        };
        let (container, pod_ns, node) = (
            cri::NamespaceMode::Container as i32,
            cri::NamespaceMode::Pod as i32,
            cri::NamespaceMode::Node as i32,
        );
        assert_eq!(
            container_pid_mode(pod(serde_json::json!({}))),
            (container, pod_ns)
        );
        assert_eq!(
            container_pid_mode(pod(serde_json::json!({"shareProcessNamespace": true}))),
            (pod_ns, pod_ns)
        );
        assert_eq!(
            container_pid_mode(pod(
                serde_json::json!({"hostPID": true, "hostNetwork": true})
            )),
            (node, node)
        );
    }

    #[test]
    fn an_ephemeral_container_with_a_target_joins_its_pid_namespace() {
        let pod = |share: bool| -> Pod {
            serde_json::from_value(
                serde_json::json!({"metadata": {"name": "p", "namespace": "d", "uid": "u"},
                "spec": {"shareProcessNamespace": share, "containers": [{"name": "app"}],
                    "ephemeralContainers": [{"name": "dbg", "image": "busybox",
                        "targetContainerName": "app", "stdin": true, "tty": true}]}}),
            )
            .unwrap()
        };
        let ns_of = |pod: &Pod| {
            let ec = &pod
                .spec
                .as_ref()
                .unwrap()
                .ephemeral_containers
                .as_ref()
                .unwrap()[0];
            let c = ephemeral_as_container(ec);
            assert_eq!(
                (c.name.as_str(), c.stdin, c.tty),
                ("dbg", Some(true), Some(true))
            );
            let inputs = ContainerInputs {
                env: vec![],
                mounts: vec![],
                image: "busybox",
                attempt: 0,
                init: false,
                spec_hash: String::new(),
                pid_target: Some("app-id".into()),
            };
            container_config(pod, &c, inputs)
                .linux
                .and_then(|l| l.security_context)
                .and_then(|s| s.namespace_options)
                .unwrap()
        };
        let ns = ns_of(&pod(false));
        assert_eq!(ns.pid, cri::NamespaceMode::Target as i32);
        assert_eq!(ns.target_id, "app-id");
        assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
        // A pod that shares one PID namespace keeps it.
        let ns = ns_of(&pod(true));
        assert_eq!(ns.pid, cri::NamespaceMode::Pod as i32);
        assert_eq!(ns.target_id, "");
    }

    #[test]
    fn only_a_batch_pod_goes_under_the_batch_cgroup() {
        let pod = |resources: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "d", "uid": "u"},
                "spec": {"containers": [{"name": "c", "resources": resources}]}
            }))
            .unwrap()
        };
        let parent = |pod: &Pod, batch_parent| {
            sandbox_config(
                pod,
                0,
                Path::new("/logs"),
                &Default::default(),
                batch_parent,
            )
            .linux
            .map(|l| l.cgroup_parent)
            .unwrap_or_default()
        };
        let batch = pod(serde_json::json!({"requests": {"skiff.io/batch-cpu": "500"}}));
        let prod = pod(serde_json::json!({"requests": {"cpu": "500m"}}));
        assert_eq!(parent(&batch, Some("/skiff-batch")), "/skiff-batch");
        assert_eq!(parent(&prod, Some("/skiff-batch")), "");
        // A node that could not prepare the group leaves it to containerd.
        assert_eq!(parent(&batch, None), "");
    }

    #[test]
    fn a_batch_container_gets_the_least_weight_and_its_batch_limits() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "resources": {
                "requests": {"skiff.io/batch-cpu": "250", "skiff.io/batch-memory": "67108864"},
                "limits": {"skiff.io/batch-cpu": "250", "skiff.io/batch-memory": "67108864"},
            }
        }))
        .unwrap();
        let r = resources(&c);
        assert_eq!(
            (
                r.cpu_shares,
                r.cpu_quota,
                r.cpu_period,
                r.memory_limit_in_bytes
            ),
            (2, 25_000, 100_000, 64 << 20)
        );
        let mem_only: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "resources": {"limits": {"skiff.io/batch-memory": "1048576"}}
        }))
        .unwrap();
        let r = resources(&mem_only);
        assert_eq!(
            (
                r.cpu_shares,
                r.cpu_quota,
                r.cpu_period,
                r.memory_limit_in_bytes
            ),
            (2, 0, 0, 1 << 20)
        );
    }

    #[test]
    fn a_container_without_resources_gets_minimal_shares_and_no_limits() {
        let c: Container = serde_json::from_value(serde_json::json!({"name": "c"})).unwrap();
        let r = resources(&c);
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes),
            (2, 0, 0)
        );
    }
}
