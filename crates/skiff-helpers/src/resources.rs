//! Resource amounts of pods and nodes as Kubernetes adds them up: cpu in
//! millicores, everything else in whole units, rounded up; a pod's
//! effective request (`component-helpers/resource`'s PodRequests).
//! Text that is no quantity reads as 0 (validation refused it already).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::quantity;

/// Quantities of resources: cpu in millicores, the rest in units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resource {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    pub pods: i64,
    /// Extended and other named resources, sorted by name.
    pub scalar: Vec<(String, i64)>,
}

impl Resource {
    pub fn from_map(
        m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    ) -> Resource {
        let mut r = Resource::default();
        if let Some(m) = m {
            for (k, v) in m {
                r.set(k, &v.0);
            }
        }
        r
    }

    fn set(&mut self, name: &str, q: &str) {
        match name {
            "cpu" => self.milli_cpu = quantity::milli(q).unwrap_or(0),
            "memory" => self.memory = quantity::units(q).unwrap_or(0),
            "ephemeral-storage" => self.ephemeral_storage = quantity::units(q).unwrap_or(0),
            "pods" => self.pods = quantity::units(q).unwrap_or(0),
            _ => self.set_scalar(name, quantity::units(q).unwrap_or(0)),
        }
    }

    pub fn get(&self, name: &str) -> i64 {
        match name {
            "cpu" => self.milli_cpu,
            "memory" => self.memory,
            "ephemeral-storage" => self.ephemeral_storage,
            "pods" => self.pods,
            _ => self.scalar(name),
        }
    }

    pub fn scalar(&self, name: &str) -> i64 {
        self.scalar
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or(0)
    }

    pub fn set_scalar(&mut self, name: &str, v: i64) {
        match self.scalar.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) => self.scalar[i].1 = v,
            Err(i) => self.scalar.insert(i, (name.to_string(), v)),
        }
    }

    pub fn add(&mut self, o: &Resource) {
        self.milli_cpu = self.milli_cpu.saturating_add(o.milli_cpu);
        self.memory = self.memory.saturating_add(o.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_add(o.ephemeral_storage);
        self.pods = self.pods.saturating_add(o.pods);
        for (n, v) in &o.scalar {
            let cur = self.scalar(n);
            self.set_scalar(n, cur.saturating_add(*v));
        }
    }

    pub fn sub(&mut self, o: &Resource) {
        self.milli_cpu = self.milli_cpu.saturating_sub(o.milli_cpu);
        self.memory = self.memory.saturating_sub(o.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_sub(o.ephemeral_storage);
        self.pods = self.pods.saturating_sub(o.pods);
        for (n, v) in &o.scalar {
            let cur = self.scalar(n);
            self.set_scalar(n, cur.saturating_sub(*v));
        }
    }

    /// Each field the larger of the two.
    pub fn max_with(&mut self, o: &Resource) {
        self.milli_cpu = self.milli_cpu.max(o.milli_cpu);
        self.memory = self.memory.max(o.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(o.ephemeral_storage);
        self.pods = self.pods.max(o.pods);
        for (n, v) in &o.scalar {
            let cur = self.scalar(n);
            self.set_scalar(n, cur.max(*v));
        }
    }
}

/// The cpu and memory assumed for a container that requests none, for
/// scoring only (Kubernetes' 100m and 200Mi).
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

fn container_requests(c: &Container) -> Resource {
    Resource::from_map(
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .or_else(|| {
                // Requests default to limits (the API server usually does this).
                c.resources.as_ref().and_then(|r| r.limits.as_ref())
            }),
    )
}

fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The effective request of a pod as Kubernetes computes it: the sum of its
/// containers (and sidecars), or the largest init container if that is
/// larger, plus the pod overhead. `non_zero` substitutes the scoring
/// defaults for containers requesting no cpu or memory.
pub fn pod_requests(pod: &Pod, non_zero: bool) -> Resource {
    let Some(spec) = pod.spec.as_ref() else {
        return Resource::default();
    };
    let one = |c: &Container| {
        let mut r = container_requests(c);
        if non_zero {
            if r.milli_cpu == 0 {
                r.milli_cpu = DEFAULT_MILLI_CPU_REQUEST;
            }
            if r.memory == 0 {
                r.memory = DEFAULT_MEMORY_REQUEST;
            }
        }
        r
    };
    let mut sum = Resource::default();
    for c in &spec.containers {
        sum.add(&one(c));
    }
    // Init containers run one after another; sidecars (restartable init
    // containers) keep running and add up.
    let mut sidecars = Resource::default();
    let mut init_max = Resource::default();
    for c in spec.init_containers.iter().flatten() {
        let r = one(c);
        if is_restartable_init(c) {
            sidecars.add(&r);
            sum.add(&r);
        } else {
            let mut peak = r;
            peak.add(&sidecars);
            init_max.max_with(&peak);
        }
    }
    sum.max_with(&init_max);
    if let Some(o) = spec.overhead.as_ref() {
        sum.add(&Resource::from_map(Some(o)));
    }
    sum
}
