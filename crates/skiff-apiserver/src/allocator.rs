//! Service admission: ClusterIPs from the service CIDR and NodePorts from
//! 30000-32767, allocated on create, kept across updates that leave them
//! out, and released when a service goes.
//!
//! The sets of allocated values are rebuilt from the watch cache on first
//! use, so they survive restarts without a store of their own.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use serde_json::{json, Value};
use skiff_core::resources;
use skiff_core::{ApiError, ApiResult, Cause};

use crate::object::meta_str;
use crate::watchcache::{Filter, WatchCache};

/// The NodePort range Kubernetes uses by default.
pub const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

#[derive(Default)]
struct Allocated {
    ips: HashSet<Ipv4Addr>,
    ports: HashSet<u16>,
}

/// ClusterIP and NodePort allocation.
pub struct ServiceAllocator {
    cidr: (Ipv4Addr, u8),
    state: Mutex<Option<Allocated>>,
}

fn invalid(svc: &Value, field: &str, value: Value, detail: &str) -> ApiError {
    ApiError::invalid(
        "",
        "Service",
        meta_str(svc, "name"),
        vec![Cause::invalid(field, &value, detail)],
    )
}

fn needs_node_ports(svc: &Value) -> bool {
    matches!(
        svc.pointer("/spec/type").and_then(Value::as_str),
        Some("NodePort") | Some("LoadBalancer")
    )
}

impl ServiceAllocator {
    pub fn new(cidr: (Ipv4Addr, u8)) -> Self {
        ServiceAllocator {
            cidr,
            state: Mutex::new(None),
        }
    }

    fn with<T>(&self, cache: &WatchCache, f: impl FnOnce(&mut Allocated) -> T) -> T {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = guard.get_or_insert_with(|| {
            let svcs = resources::lookup("", "v1", "services").expect("services");
            let mut a = Allocated::default();
            for o in cache.resource(svcs).snapshot(&Filter::default()) {
                if let Ok(v) = serde_json::from_slice::<Value>(&o.bytes) {
                    a.take_from(&v);
                }
            }
            a
        });
        f(state)
    }

    /// Allocates what a new service needs.
    pub fn admit_create(
        &self,
        cache: &WatchCache,
        svc: &mut Value,
        dry_run: bool,
    ) -> ApiResult<()> {
        let cidr = self.cidr;
        self.with(cache, |a| {
            let ip = a.cluster_ip(cidr, svc)?;
            let ports = a.node_ports(svc, None)?;
            if !dry_run {
                if let Some(ip) = ip {
                    a.ips.insert(ip);
                }
                a.ports.extend(ports);
            }
            Ok(())
        })
    }

    /// Keeps what an update leaves out; allocates NodePorts it newly needs.
    /// Returns the NodePorts newly allocated, to give back if the update fails.
    pub fn admit_update(
        &self,
        cache: &WatchCache,
        old: &Value,
        new: &mut Value,
    ) -> ApiResult<Vec<u16>> {
        let new_ip = new
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("");
        if new_ip.is_empty() {
            if let (Some(ip), Some(spec)) = (
                old.pointer("/spec/clusterIP").cloned(),
                new.get_mut("spec").and_then(Value::as_object_mut),
            ) {
                spec.insert("clusterIP".into(), ip);
                if let Some(ips) = old.pointer("/spec/clusterIPs") {
                    spec.insert("clusterIPs".into(), ips.clone());
                }
            }
        }
        self.with(cache, |a| {
            let ports = a.node_ports(new, Some(old))?;
            a.ports.extend(ports.iter().copied());
            Ok(ports)
        })
    }

    /// Gives back NodePorts allocated for a write that did not happen.
    pub fn release_ports(&self, ports: &[u16]) {
        if let Some(a) = self
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            for p in ports {
                a.ports.remove(p);
            }
        }
    }

    /// After an update: NodePorts the old service had and the new one has not are free.
    pub fn after_update(&self, old: &Value, new: &Value) {
        let ports = |v: &Value| -> Vec<u16> {
            v.pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|p| p.get("nodePort").and_then(Value::as_u64).map(|n| n as u16))
                .collect()
        };
        let kept = ports(new);
        let gone: Vec<u16> = ports(old)
            .into_iter()
            .filter(|p| !kept.contains(p))
            .collect();
        self.release_ports(&gone);
    }

    /// Returns a deleted service's ClusterIP and NodePorts.
    pub fn release(&self, svc: &Value) {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = guard.as_mut() {
            if let Some(ip) = svc
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok())
            {
                a.ips.remove(&ip);
            }
            for p in svc
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(n) = p.get("nodePort").and_then(Value::as_u64) {
                    a.ports.remove(&(n as u16));
                }
            }
        }
    }
}

impl Allocated {
    fn take_from(&mut self, svc: &Value) {
        if let Some(ip) = svc
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
        {
            self.ips.insert(ip);
        }
        for p in svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(n) = p.get("nodePort").and_then(Value::as_u64) {
                self.ports.insert(n as u16);
            }
        }
    }

    /// Picks (or checks) the service's ClusterIP and writes it into the spec.
    fn cluster_ip(
        &mut self,
        (base, bits): (Ipv4Addr, u8),
        svc: &mut Value,
    ) -> ApiResult<Option<Ipv4Addr>> {
        let ty = svc
            .pointer("/spec/type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP");
        if ty == "ExternalName" {
            return Ok(None);
        }
        let requested = svc
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if requested == "None" {
            if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("clusterIPs".into(), json!(["None"]));
            }
            return Ok(None);
        }
        let size: u32 = if bits >= 32 { 1 } else { 1u32 << (32 - bits) };
        let base_u = u32::from(base);
        let ip = if requested.is_empty() {
            // Skip the network address and the first address, which belongs
            // to the `kubernetes` service.
            let span = size.saturating_sub(2).max(1);
            let start = (rand::random::<u64>() % span as u64) as u32;
            (0..span)
                .map(|i| Ipv4Addr::from(base_u + 2 + (start + i) % span))
                .find(|c| !self.ips.contains(c))
                .ok_or_else(|| {
                    ApiError::internal("failed to allocate a serviceIP: range is full")
                })?
        } else {
            let ip: Ipv4Addr = requested.parse().map_err(|_| {
                invalid(
                    svc,
                    "spec.clusterIPs[0]",
                    json!(requested),
                    "must be a valid IP address",
                )
            })?;
            let u = u32::from(ip);
            if u < base_u || u >= base_u + size {
                return Err(invalid(
                    svc,
                    "spec.clusterIPs",
                    json!([requested]),
                    &format!("failed to allocate IP {requested}: the provided IP ({requested}) is not in the valid range. The range of valid IPs is {base}/{bits}"),
                ));
            }
            if self.ips.contains(&ip) {
                return Err(invalid(
                    svc,
                    "spec.clusterIPs",
                    json!([requested]),
                    &format!("failed to allocate IP {requested}: provided IP is already allocated"),
                ));
            }
            ip
        };
        if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("clusterIP".into(), json!(ip.to_string()));
            spec.insert("clusterIPs".into(), json!([ip.to_string()]));
        }
        Ok(Some(ip))
    }

    /// Fills in NodePorts for services that need them; returns the new ones.
    fn node_ports(&mut self, svc: &mut Value, old: Option<&Value>) -> ApiResult<Vec<u16>> {
        if !needs_node_ports(svc) {
            return Ok(Vec::new());
        }
        let old_ports: Vec<Value> = old
            .and_then(|o| o.pointer("/spec/ports"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let old_ports_of_same: Vec<u64> = old_ports
            .iter()
            .filter_map(|p| p.get("nodePort").and_then(Value::as_u64))
            .collect();
        let name = meta_str(svc, "name").to_string();
        let mut fresh = Vec::new();
        let Some(ports) = svc.pointer_mut("/spec/ports").and_then(Value::as_array_mut) else {
            return Ok(fresh);
        };
        for (i, p) in ports.iter_mut().enumerate() {
            let Some(pm) = p.as_object_mut() else {
                continue;
            };
            match pm.get("nodePort").and_then(Value::as_u64) {
                Some(n) => {
                    let n16 = n as u16;
                    if !NODE_PORTS.contains(&n16) || n > u16::MAX as u64 {
                        return Err(ApiError::invalid("", "Service", &name, vec![Cause::invalid(format!("spec.ports[{i}].nodePort"), &json!(n), "provided port is not in the valid range. The range of valid ports is 30000-32767")]));
                    }
                    let ours = old_ports_of_same.contains(&n);
                    if !ours && (self.ports.contains(&n16) || fresh.contains(&n16)) {
                        return Err(ApiError::invalid(
                            "",
                            "Service",
                            &name,
                            vec![Cause::invalid(
                                format!("spec.ports[{i}].nodePort"),
                                &json!(n),
                                "provided port is already allocated",
                            )],
                        ));
                    }
                    if !ours {
                        fresh.push(n16);
                    }
                }
                None => {
                    // Keep the NodePort an update left out for the same port.
                    let port = pm.get("port").cloned();
                    let proto = pm.get("protocol").cloned().unwrap_or(json!("TCP"));
                    let kept = old_ports
                        .iter()
                        .find(|o| {
                            o.get("port") == port.as_ref()
                                && o.get("protocol").cloned().unwrap_or(json!("TCP")) == proto
                        })
                        .and_then(|o| o.get("nodePort").cloned());
                    let n = match kept {
                        Some(k) => k,
                        None => {
                            let span = (NODE_PORTS.end() - NODE_PORTS.start() + 1) as u64;
                            let start = rand::random::<u64>() % span;
                            let n = (0..span)
                                .map(|k| NODE_PORTS.start() + ((start + k) % span) as u16)
                                .find(|c| !self.ports.contains(c) && !fresh.contains(c))
                                .ok_or_else(|| {
                                    ApiError::internal(
                                        "failed to allocate a nodePort: range is full",
                                    )
                                })?;
                            fresh.push(n);
                            json!(n)
                        }
                    };
                    pm.insert("nodePort".into(), n);
                }
            }
        }
        Ok(fresh)
    }
}
