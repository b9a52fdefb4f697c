//! Builders of Pods and Nodes for tests and benchmarks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Container, ContainerImage, ContainerPort, Node, NodeCondition, NodeSpec, NodeStatus, Pod,
    PodSpec, ResourceRequirements, Taint, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::types::{NodeInfo, PodInfo};

static UID: AtomicU64 = AtomicU64::new(1);

pub struct PodBuilder {
    pod: Pod,
}

fn spec(p: &mut Pod) -> &mut PodSpec {
    p.spec.get_or_insert_with(Default::default)
}

fn requests(c: &mut Container) -> &mut BTreeMap<String, Quantity> {
    c.resources
        .get_or_insert_with(ResourceRequirements::default)
        .requests
        .get_or_insert_with(BTreeMap::new)
}

impl PodBuilder {
    pub fn new(name: &str) -> PodBuilder {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{}", UID.fetch_add(1, Ordering::Relaxed))),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    image: Some("pause".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        };
        PodBuilder { pod }
    }
    pub fn namespace(mut self, ns: &str) -> Self {
        self.pod.metadata.namespace = Some(ns.into());
        self
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.pod
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    pub fn priority(mut self, p: i32) -> Self {
        spec(&mut self.pod).priority = Some(p);
        self
    }
    pub fn priority_class(mut self, name: &str) -> Self {
        spec(&mut self.pod).priority_class_name = Some(name.into());
        self
    }
    pub fn grace_period(mut self, s: i64) -> Self {
        spec(&mut self.pod).termination_grace_period_seconds = Some(s);
        self
    }
    pub fn scheduler_name(mut self, s: &str) -> Self {
        spec(&mut self.pod).scheduler_name = Some(s.into());
        self
    }
    pub fn node_name(mut self, n: &str) -> Self {
        spec(&mut self.pod).node_name = if n.is_empty() { None } else { Some(n.into()) };
        self
    }
    pub fn toleration(mut self, key: &str, op: &str, value: &str, effect: &str) -> Self {
        let opt = |s: &str| {
            if s.is_empty() {
                None
            } else {
                Some(s.to_string())
            }
        };
        spec(&mut self.pod)
            .tolerations
            .get_or_insert_with(Vec::new)
            .push(Toleration {
                key: opt(key),
                operator: opt(op),
                value: opt(value),
                effect: opt(effect),
                toleration_seconds: None,
            });
        self
    }
    pub fn node_selector(mut self, k: &str, v: &str) -> Self {
        spec(&mut self.pod)
            .node_selector
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    /// `affinity` as JSON (nodeAffinity / podAffinity / podAntiAffinity).
    pub fn affinity(mut self, a: serde_json::Value) -> Self {
        spec(&mut self.pod).affinity = serde_json::from_value(a).ok();
        self
    }
    /// One topologySpreadConstraint as JSON.
    pub fn spread(mut self, c: serde_json::Value) -> Self {
        if let Ok(c) = serde_json::from_value::<TopologySpreadConstraint>(c) {
            spec(&mut self.pod)
                .topology_spread_constraints
                .get_or_insert_with(Vec::new)
                .push(c);
        }
        self
    }
    /// A request of the first container.
    pub fn request(mut self, k: &str, v: &str) -> Self {
        let c = &mut spec(&mut self.pod).containers[0];
        requests(c).insert(k.into(), Quantity(v.into()));
        self
    }
    /// Requests = limits on the first container.
    pub fn request_and_limit(mut self, k: &str, v: &str) -> Self {
        let c = &mut spec(&mut self.pod).containers[0];
        requests(c).insert(k.into(), Quantity(v.into()));
        c.resources
            .get_or_insert_with(Default::default)
            .limits
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), Quantity(v.into()));
        self
    }
    /// Adds another container requesting `k: v`.
    pub fn container_request(mut self, k: &str, v: &str) -> Self {
        let s = spec(&mut self.pod);
        let mut c = Container {
            name: format!("c{}", s.containers.len()),
            image: Some("pause".into()),
            ..Default::default()
        };
        requests(&mut c).insert(k.into(), Quantity(v.into()));
        s.containers.push(c);
        self
    }
    /// Adds an init container requesting `k: v`.
    pub fn init_request(mut self, k: &str, v: &str) -> Self {
        let s = spec(&mut self.pod);
        let list = s.init_containers.get_or_insert_with(Vec::new);
        let mut c = Container {
            name: format!("init{}", list.len()),
            image: Some("pause".into()),
            ..Default::default()
        };
        requests(&mut c).insert(k.into(), Quantity(v.into()));
        list.push(c);
        self
    }
    pub fn overhead(mut self, k: &str, v: &str) -> Self {
        spec(&mut self.pod)
            .overhead
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), Quantity(v.into()));
        self
    }
    pub fn host_port(mut self, ip: &str, protocol: &str, port: i32) -> Self {
        let c = &mut spec(&mut self.pod).containers[0];
        c.ports.get_or_insert_with(Vec::new).push(ContainerPort {
            container_port: port,
            host_port: Some(port),
            host_ip: if ip.is_empty() { None } else { Some(ip.into()) },
            protocol: Some(protocol.into()),
            name: None,
        });
        self
    }
    pub fn container_port(mut self, port: i32) -> Self {
        let c = &mut spec(&mut self.pod).containers[0];
        c.ports.get_or_insert_with(Vec::new).push(ContainerPort {
            container_port: port,
            ..Default::default()
        });
        self
    }
    pub fn image(mut self, img: &str) -> Self {
        spec(&mut self.pod).containers[0].image = Some(img.into());
        self
    }
    /// Without uid (for objects sent to the API server).
    pub fn for_api(mut self) -> Self {
        self.pod.metadata.uid = None;
        self
    }
    pub fn build(self) -> Pod {
        self.pod
    }
}

pub struct NodeBuilder {
    node: Node,
}

impl NodeBuilder {
    /// A Ready node with 110 pods, 4 cpu, 32Gi memory allocatable.
    pub fn new(name: &str) -> NodeBuilder {
        let mut alloc = BTreeMap::new();
        alloc.insert("pods".to_string(), Quantity("110".into()));
        alloc.insert("cpu".to_string(), Quantity("4".into()));
        alloc.insert("memory".to_string(), Quantity("32Gi".into()));
        NodeBuilder {
            node: Node {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: Some(NodeSpec::default()),
                status: Some(NodeStatus {
                    capacity: Some(alloc.clone()),
                    allocatable: Some(alloc),
                    conditions: Some(vec![NodeCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
        }
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.node
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.node
            .spec
            .get_or_insert_with(Default::default)
            .taints
            .get_or_insert_with(Vec::new)
            .push(Taint {
                key: key.into(),
                value: if value.is_empty() {
                    None
                } else {
                    Some(value.into())
                },
                effect: effect.into(),
                time_added: None,
            });
        self
    }
    pub fn unschedulable(mut self, u: bool) -> Self {
        self.node
            .spec
            .get_or_insert_with(Default::default)
            .unschedulable = if u { Some(true) } else { None };
        self
    }
    pub fn allocatable(mut self, k: &str, v: &str) -> Self {
        let st = self.node.status.get_or_insert_with(Default::default);
        for m in [&mut st.allocatable, &mut st.capacity] {
            m.get_or_insert_with(BTreeMap::new)
                .insert(k.into(), Quantity(v.into()));
        }
        self
    }
    pub fn image(mut self, name: &str, size: i64) -> Self {
        self.node
            .status
            .get_or_insert_with(Default::default)
            .images
            .get_or_insert_with(Vec::new)
            .push(ContainerImage {
                names: Some(vec![name.into()]),
                size_bytes: Some(size),
            });
        self
    }
    pub fn build(self) -> Node {
        self.node
    }
}

/// A PodInfo with `spec.priority` (0 if unset).
pub fn pod_info(pod: Pod) -> PodInfo {
    let p = PodInfo::spec_priority(&pod).unwrap_or(0);
    PodInfo::new(pod, p)
}

/// A NodeInfo with these pods on it.
pub fn node_info(node: Node, pods: &[Pod]) -> NodeInfo {
    let mut n = NodeInfo::empty(node.metadata.name.as_deref().unwrap_or(""));
    n.set_node(Arc::new(node));
    for p in pods {
        n.add_pod(Arc::new(pod_info(p.clone())));
    }
    n
}
