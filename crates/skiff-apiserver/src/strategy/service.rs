//! Services' server-side hooks: ClusterIPs from the service CIDR and
//! NodePorts from 30000-32767, allocated on create, kept across updates
//! that leave them out, and released when a service goes.
//!
//! What is allocated is kept IN THE STORE, as Kubernetes keeps it: one
//! `RangeAllocation` object per range (`/registry/ranges/serviceips` and
//! `/registry/ranges/servicenodeports`) holding a bitmap, changed only by a
//! write conditional on the revision that was read and retried on conflict.
//! So allocations survive a restart, and several API servers on one store
//! never hand out the same value. A range object that is missing (a store
//! from before it existed) or written for another range is rebuilt from the
//! Services; when a server starts, values that Services hold and the bitmap
//! misses are marked (repair).

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use base64::Engine;
use serde_json::{json, Value};
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::{ApiError, ApiResult, Cause};

use super::{AdmissionCtx, Strategy};
use crate::object::meta_str;
use crate::request::Subresource;

/// The NodePort range Kubernetes uses by default.
pub const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

/// Where the ClusterIP range's allocations are kept (as kube-apiserver keeps them).
pub const SERVICE_IPS_KEY: &str = "/registry/ranges/serviceips";
/// Where the NodePort range's allocations are kept.
pub const NODE_PORTS_KEY: &str = "/registry/ranges/servicenodeports";

pub struct ServiceStrategy;

/// A bitmap over a range of `size` values.
#[derive(Clone, PartialEq, Eq)]
struct Bitmap {
    bits: Vec<u8>,
    size: u32,
}

impl Bitmap {
    fn new(size: u32) -> Bitmap {
        Bitmap {
            bits: vec![0; size.div_ceil(8) as usize],
            size,
        }
    }
    fn get(&self, i: u32) -> bool {
        i < self.size && self.bits[(i / 8) as usize] & (1 << (i % 8)) != 0
    }
    fn set(&mut self, i: u32) {
        if i < self.size {
            self.bits[(i / 8) as usize] |= 1 << (i % 8);
        }
    }
    fn clear(&mut self, i: u32) {
        if i < self.size {
            self.bits[(i / 8) as usize] &= !(1 << (i % 8));
        }
    }
}

/// One range: its key in the store, its name (`10.43.0.0/16`,
/// `30000-32767`) and how values map to offsets.
#[derive(Clone, Copy)]
enum Range {
    Ips { base: u32, bits: u8 },
    Ports,
}

impl Range {
    fn ips(cx: &dyn AdmissionCtx) -> Range {
        let (base, bits) = cx.config().service_cidr;
        Range::Ips {
            base: u32::from(base),
            bits,
        }
    }
    fn key(&self) -> &'static str {
        match self {
            Range::Ips { .. } => SERVICE_IPS_KEY,
            Range::Ports => NODE_PORTS_KEY,
        }
    }
    fn name(&self) -> String {
        match self {
            Range::Ips { base, bits } => format!("{}/{bits}", std::net::Ipv4Addr::from(*base)),
            Range::Ports => format!("{}-{}", NODE_PORTS.start(), NODE_PORTS.end()),
        }
    }
    fn size(&self) -> u32 {
        match self {
            Range::Ips { bits, .. } if *bits >= 32 => 1,
            Range::Ips { bits, .. } => 1u32 << (32 - bits),
            Range::Ports => (NODE_PORTS.end() - NODE_PORTS.start()) as u32 + 1,
        }
    }
    /// The value at `offset`, as a user reads it (an IP, a port).
    fn show(&self, offset: u32) -> String {
        match *self {
            Range::Ips { base, .. } => std::net::Ipv4Addr::from(base + offset).to_string(),
            Range::Ports => (u32::from(*NODE_PORTS.start()) + offset).to_string(),
        }
    }
    /// The offsets of the values a Service holds in this range.
    fn held_by(&self, svc: &Value) -> Vec<u32> {
        match *self {
            Range::Ips { base, .. } => svc
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<std::net::Ipv4Addr>().ok())
                .map(u32::from)
                .filter(|u| *u >= base && u - base < self.size())
                .map(|u| u - base)
                .into_iter()
                .collect(),
            Range::Ports => node_ports_of(svc)
                .into_iter()
                .filter(|p| NODE_PORTS.contains(p))
                .map(|p| (p - NODE_PORTS.start()) as u32)
                .collect(),
        }
    }
}

/// The NodePort range's values a Service holds: its ports' NodePorts and
/// its `healthCheckNodePort`.
fn node_ports_of(svc: &Value) -> Vec<u16> {
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("nodePort").and_then(Value::as_u64))
        .chain(health_check_port(svc))
        .filter(|n| *n <= u16::MAX as u64)
        .map(|n| n as u16)
        .collect()
}

fn health_check_port(svc: &Value) -> Option<u64> {
    svc.pointer("/spec/healthCheckNodePort")
        .and_then(Value::as_u64)
        .filter(|n| *n != 0)
}

/// Whether a Service gets a `healthCheckNodePort`: a LoadBalancer whose
/// external traffic stays on the node it arrives at (Kubernetes'
/// `needsHCNodePort`).
fn needs_health_check(svc: &Value) -> bool {
    svc.pointer("/spec/type").and_then(Value::as_str) == Some("LoadBalancer")
        && svc
            .pointer("/spec/externalTrafficPolicy")
            .and_then(Value::as_str)
            == Some("Local")
}

fn services() -> &'static ResourceInfo {
    resources::lookup("", "v1", "services").expect("services")
}

/// The range's bitmap as every Service holds it.
async fn from_services(cx: &dyn AdmissionCtx, range: Range) -> ApiResult<Bitmap> {
    let mut bm = Bitmap::new(range.size());
    for svc in cx.consistent_list(services(), None, false).await? {
        for i in range.held_by(&svc) {
            bm.set(i);
        }
    }
    Ok(bm)
}

/// Reads a range: its bitmap and the revision it was read at (`None`: not
/// stored yet, or stored for another range; rebuilt from the Services).
async fn read(cx: &dyn AdmissionCtx, range: Range) -> ApiResult<(Bitmap, Option<i64>)> {
    let Some((value, revision)) = cx.read_range(range.key()).await? else {
        return Ok((from_services(cx, range).await?, None));
    };
    let stored: Value = serde_json::from_slice(&value)
        .map_err(|e| ApiError::internal(format!("allocation range {}: {e}", range.key())))?;
    let data = stored
        .get("data")
        .and_then(Value::as_str)
        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok());
    let size = range.size();
    match data {
        Some(bits)
            if stored.get("range").and_then(Value::as_str) == Some(&range.name())
                && bits.len() == size.div_ceil(8) as usize =>
        {
            Ok((Bitmap { bits, size }, Some(revision)))
        }
        // Another range (the flag changed) or unreadable: rebuild, and
        // overwrite what is there at the revision read.
        _ => {
            let mut bm = from_services(cx, range).await?;
            bm.size = size;
            Ok((bm, Some(revision)))
        }
    }
}

/// One lock per range for the writers of this process: as kube-apiserver's
/// allocator holds its own lock around an allocation, so the creates
/// racing on one server queue here instead of conflicting in the store
/// (32 concurrent creates used to exhaust the retries below). Only other
/// servers' writes can conflict.
fn local_lock(range: Range) -> &'static tokio::sync::Mutex<()> {
    static IPS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    static PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    match range {
        Range::Ips { .. } => &IPS,
        Range::Ports => &PORTS,
    }
}

/// Changes a range with `f` under optimistic concurrency: read, change,
/// write conditional on the revision read, and on a conflict (another
/// server's write) start again from a fresh read after a short random
/// pause (so `f` must only depend on the bitmap it is given).
/// A dry run reads and changes, but writes nothing.
async fn modify<T: Send>(
    cx: &dyn AdmissionCtx,
    range: Range,
    dry_run: bool,
    mut f: impl FnMut(&mut Bitmap) -> ApiResult<T> + Send,
) -> ApiResult<T> {
    let _local = local_lock(range).lock().await;
    for attempt in 0..64u32 {
        if attempt > 0 {
            let ms = rand::random::<u64>() % (u64::from(attempt.min(10)) * 5 + 1);
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        let (mut bm, rev) = read(cx, range).await?;
        let before = bm.clone();
        let out = f(&mut bm)?;
        if dry_run || (bm == before && rev.is_some()) {
            return Ok(out);
        }
        let body = json!({
            "kind": "RangeAllocation",
            "apiVersion": "v1",
            "metadata": {"name": range.key().rsplit('/').next().unwrap_or_default()},
            "range": range.name(),
            "data": base64::engine::general_purpose::STANDARD.encode(&bm.bits),
        });
        let bytes = bytes::Bytes::from(serde_json::to_vec(&body).expect("json"));
        if cx.write_range(range.key(), bytes, rev).await? {
            return Ok(out);
        }
    }
    Err(ApiError::internal(format!(
        "allocation range {}: too many concurrent changes",
        range.key()
    )))
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

/// Picks (or checks) the service's ClusterIP against `bm` and marks it;
/// writes it into the spec. `None`: the service takes none.
fn cluster_ip(range: Range, bm: &mut Bitmap, svc: &mut Value) -> ApiResult<Option<u32>> {
    let Range::Ips { base, bits } = range else {
        return Ok(None);
    };
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
    let size = range.size();
    let offset = if requested.is_empty() {
        // Skip the network address and the first address, which belongs
        // to the `kubernetes` service.
        let span = size.saturating_sub(2).max(1);
        let start = (rand::random::<u64>() % span as u64) as u32;
        (0..span)
            .map(|i| 2 + (start + i) % span)
            .find(|c| !bm.get(*c))
            .ok_or_else(|| ApiError::internal("failed to allocate a serviceIP: range is full"))?
    } else {
        let ip: std::net::Ipv4Addr = requested.parse().map_err(|_| {
            invalid(
                svc,
                "spec.clusterIPs[0]",
                json!(requested),
                "must be a valid IP address",
            )
        })?;
        let u = u32::from(ip);
        if u < base || u - base >= size {
            return Err(invalid(
                svc,
                "spec.clusterIPs",
                json!([requested]),
                &format!("failed to allocate IP {requested}: the provided IP ({requested}) is not in the valid range. The range of valid IPs is {}/{bits}", std::net::Ipv4Addr::from(base)),
            ));
        }
        if bm.get(u - base) {
            return Err(invalid(
                svc,
                "spec.clusterIPs",
                json!([requested]),
                &format!("failed to allocate IP {requested}: provided IP is already allocated"),
            ));
        }
        u - base
    };
    bm.set(offset);
    let ip = std::net::Ipv4Addr::from(base + offset).to_string();
    if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("clusterIP".into(), json!(ip));
        spec.insert("clusterIPs".into(), json!([ip]));
    }
    Ok(Some(offset))
}

/// Fills in NodePorts for services that need them, checked against and
/// marked in `bm`; returns the newly taken ones. Ports `old` held stay its.
fn node_ports(bm: &mut Bitmap, svc: &mut Value, old: Option<&Value>) -> ApiResult<Vec<u16>> {
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
    let off = |p: u16| (p - NODE_PORTS.start()) as u32;
    for (i, p) in ports.iter_mut().enumerate() {
        let Some(pm) = p.as_object_mut() else {
            continue;
        };
        match pm.get("nodePort").and_then(Value::as_u64) {
            Some(n) => {
                if n > u16::MAX as u64 || !NODE_PORTS.contains(&(n as u16)) {
                    return Err(ApiError::invalid("", "Service", &name, vec![Cause::invalid(format!("spec.ports[{i}].nodePort"), &json!(n), "provided port is not in the valid range. The range of valid ports is 30000-32767")]));
                }
                let n16 = n as u16;
                let ours = old_ports_of_same.contains(&n);
                if !ours && (bm.get(off(n16)) || fresh.contains(&n16)) {
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
                            .find(|c| !bm.get(off(*c)) && !fresh.contains(c))
                            .ok_or_else(|| {
                                ApiError::internal("failed to allocate a nodePort: range is full")
                            })?;
                        fresh.push(n);
                        json!(n)
                    }
                };
                pm.insert("nodePort".into(), n);
            }
        }
    }
    if needs_health_check(svc) {
        // Given, kept from before, or picked like a NodePort.
        let field = "spec.healthCheckNodePort";
        let kept = old
            .filter(|o| needs_health_check(o))
            .and_then(health_check_port);
        let n = match health_check_port(svc).or(kept) {
            Some(n) => {
                if n > u16::MAX as u64 || !NODE_PORTS.contains(&(n as u16)) {
                    return Err(ApiError::invalid("", "Service", &name, vec![Cause::invalid(field, &json!(n), "provided port is not in the valid range. The range of valid ports is 30000-32767")]));
                }
                let n16 = n as u16;
                let ours = old.and_then(health_check_port) == Some(n)
                    || old.is_some_and(|o| node_ports_of(o).contains(&n16));
                if !ours && (bm.get(off(n16)) || fresh.contains(&n16)) {
                    return Err(ApiError::invalid(
                        "",
                        "Service",
                        &name,
                        vec![Cause::invalid(
                            field,
                            &json!(n),
                            "provided port is already allocated",
                        )],
                    ));
                }
                if !ours {
                    fresh.push(n16);
                }
                n16
            }
            None => {
                let span = (NODE_PORTS.end() - NODE_PORTS.start() + 1) as u64;
                let start = rand::random::<u64>() % span;
                let n = (0..span)
                    .map(|k| NODE_PORTS.start() + ((start + k) % span) as u16)
                    .find(|c| !bm.get(off(*c)) && !fresh.contains(c))
                    .ok_or_else(|| {
                        ApiError::internal(
                            "failed to allocate a healthCheckNodePort: range is full",
                        )
                    })?;
                fresh.push(n);
                n
            }
        };
        if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("healthCheckNodePort".into(), json!(n));
        }
    }
    for p in &fresh {
        bm.set(off(*p));
    }
    Ok(fresh)
}

/// Clears NodePorts in the port range.
async fn release_ports(cx: &dyn AdmissionCtx, ports: &[u16]) {
    if ports.is_empty() {
        return;
    }
    let r = modify(cx, Range::Ports, false, |bm| {
        for p in ports.iter().filter(|p| NODE_PORTS.contains(p)) {
            bm.clear((p - NODE_PORTS.start()) as u32);
        }
        Ok(())
    })
    .await;
    if let Err(e) = r {
        tracing::warn!("releasing node ports {ports:?}: {}", e.message);
    }
}

#[async_trait]
impl Strategy for ServiceStrategy {
    /// A Service that stops needing its `healthCheckNodePort` (no longer a
    /// LoadBalancer with externalTrafficPolicy Local) loses it unless the
    /// update changed it, as Kubernetes' `dropTypeDependentFields` does; the
    /// port is released once the update is stored.
    fn prepare_for_update(&self, old: &Value, new: &mut Value, _sub: Subresource) {
        if needs_health_check(old)
            && !needs_health_check(new)
            && health_check_port(new).is_some()
            && health_check_port(new) == health_check_port(old)
        {
            if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove("healthCheckNodePort");
            }
        }
    }

    async fn allocate(
        &self,
        cx: &dyn AdmissionCtx,
        svc: &mut Value,
        dry_run: bool,
    ) -> ApiResult<()> {
        let ips = Range::ips(cx);
        // Each try starts from the service as it came (a retry after a
        // conflict may pick another value).
        let original = svc.clone();
        let (with_ip, ip) = modify(cx, ips, dry_run, |bm| {
            let mut s = original.clone();
            let ip = cluster_ip(ips, bm, &mut s)?;
            Ok((s, ip))
        })
        .await?;
        let ports = modify(cx, Range::Ports, dry_run, |bm| {
            let mut s = with_ip.clone();
            node_ports(bm, &mut s, None)?;
            Ok(s)
        })
        .await;
        match ports {
            Ok(done) => {
                *svc = done;
                Ok(())
            }
            Err(e) => {
                if let (Some(ip), false) = (ip, dry_run) {
                    let _ = modify(cx, ips, false, |bm| {
                        bm.clear(ip);
                        Ok(())
                    })
                    .await;
                }
                Err(e)
            }
        }
    }

    async fn allocate_update(
        &self,
        cx: &dyn AdmissionCtx,
        old: &Value,
        new: &mut Value,
        dry_run: bool,
    ) -> ApiResult<Value> {
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
        if !needs_node_ports(new) {
            return Ok(Value::Null);
        }
        let original = new.clone();
        let (done, fresh) = modify(cx, Range::Ports, dry_run, |bm| {
            let mut s = original.clone();
            let fresh = node_ports(bm, &mut s, Some(old))?;
            Ok((s, fresh))
        })
        .await?;
        *new = done;
        Ok(if dry_run { Value::Null } else { json!(fresh) })
    }

    async fn finish_update(
        &self,
        cx: &dyn AdmissionCtx,
        old: &Value,
        written: Option<&Value>,
        fresh: Value,
    ) {
        match written {
            Some(new) => {
                let kept = node_ports_of(new);
                let gone: Vec<u16> = node_ports_of(old)
                    .into_iter()
                    .filter(|p| !kept.contains(p))
                    .collect();
                release_ports(cx, &gone).await;
            }
            None => {
                let fresh: Vec<u16> = serde_json::from_value(fresh).unwrap_or_default();
                release_ports(cx, &fresh).await;
            }
        }
    }

    async fn release(&self, cx: &dyn AdmissionCtx, svc: &Value) {
        let ips = Range::ips(cx);
        let held = ips.held_by(svc);
        if !held.is_empty() {
            let r = modify(cx, ips, false, |bm| {
                held.iter().for_each(|i| bm.clear(*i));
                Ok(())
            })
            .await;
            if let Err(e) = r {
                tracing::warn!("releasing the ClusterIP of a service: {}", e.message);
            }
        }
        release_ports(cx, &node_ports_of(svc)).await;
    }

    /// Marks what Services hold and the ranges miss. Never frees: a value
    /// taken by another server for a Service not yet written must stay.
    async fn repair(&self, cx: &dyn AdmissionCtx) -> ApiResult<()> {
        for range in [Range::ips(cx), Range::Ports] {
            let held = from_services(cx, range).await?;
            modify(cx, range, false, |bm| {
                for i in 0..held.size {
                    if held.get(i) {
                        bm.set(i);
                    }
                }
                Ok(())
            })
            .await?;
        }
        Ok(())
    }
}

/// kube-apiserver's repair loop for the ClusterIP and NodePort ranges: a
/// value a range holds but no Service has is a leak (a server died
/// between allocating it and writing its Service); one seen leaked in
/// three passes in a row is freed. Younger leaks may still be a Service
/// another server is writing, so they stay.
#[derive(Debug, Default)]
pub struct LeakRepair {
    /// (range key, value) → passes in a row it was seen leaked.
    seen: HashMap<(&'static str, u32), u32>,
}

/// How often the server runs a [`LeakRepair`] pass (kube-apiserver: 3 min).
pub const REPAIR_INTERVAL: std::time::Duration = std::time::Duration::from_secs(180);
/// Passes a leak survives before it is freed.
const LEAK_PASSES: u32 = 3;

impl LeakRepair {
    /// One pass over both ranges: marks what Services hold and the ranges
    /// miss, frees leaks seen [`LEAK_PASSES`] times. Returns how many
    /// values it freed.
    pub async fn pass(&mut self, cx: &dyn AdmissionCtx) -> ApiResult<usize> {
        let mut freed = 0;
        for range in [Range::ips(cx), Range::Ports] {
            let held = from_services(cx, range).await?;
            let (stored, _) = read(cx, range).await?;
            let key = range.key();
            let mut leaked = HashSet::new();
            for i in 0..range.size() {
                if stored.get(i) && !held.get(i) {
                    leaked.insert(i);
                }
            }
            self.seen
                .retain(|(k, i), _| *k != key || leaked.contains(i));
            let mut free = Vec::new();
            for i in leaked {
                let n = self.seen.entry((key, i)).or_insert(0);
                *n += 1;
                if *n >= LEAK_PASSES {
                    free.push(i);
                }
            }
            modify(cx, range, false, |bm| {
                for i in 0..held.size {
                    if held.get(i) {
                        bm.set(i);
                    }
                }
                for i in &free {
                    bm.clear(*i);
                }
                Ok(())
            })
            .await?;
            for i in &free {
                self.seen.remove(&(key, *i));
                tracing::info!(range = %range.name(), value = %range.show(*i), "freed a leaked allocation");
            }
            freed += free.len();
        }
        Ok(freed)
    }
}

/// Runs [`LeakRepair`] passes every [`REPAIR_INTERVAL`] until the server
/// is gone.
pub async fn repair_forever(reg: std::sync::Weak<dyn AdmissionCtx>) {
    let mut repair = LeakRepair::default();
    loop {
        tokio::time::sleep(REPAIR_INTERVAL).await;
        let Some(reg) = reg.upgrade() else {
            return;
        };
        if let Err(e) = repair.pass(&*reg).await {
            tracing::warn!(error = %e.message, "repairing the allocation ranges");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bitmap_sets_and_clears_single_values() {
        let mut bm = Bitmap::new(20);
        bm.set(3);
        bm.set(19);
        bm.set(25); // outside: ignored
        assert!(bm.get(3) && bm.get(19) && !bm.get(4) && !bm.get(25));
        bm.clear(3);
        assert!(!bm.get(3));
        assert_eq!(bm.bits.len(), 3);
    }

    #[test]
    fn a_requested_cluster_ip_outside_the_range_or_taken_is_refused() {
        let range = Range::Ips {
            base: u32::from(std::net::Ipv4Addr::new(10, 43, 0, 0)),
            bits: 16,
        };
        let mut bm = Bitmap::new(range.size());
        let mut svc = json!({"metadata": {"name": "s"}, "spec": {"clusterIP": "10.43.0.9"}});
        assert_eq!(cluster_ip(range, &mut bm, &mut svc).unwrap(), Some(9));
        let mut again = json!({"metadata": {"name": "t"}, "spec": {"clusterIP": "10.43.0.9"}});
        let e = cluster_ip(range, &mut bm, &mut again).unwrap_err();
        assert!(e.message.contains("already allocated"), "{}", e.message);
        let mut outside = json!({"metadata": {"name": "u"}, "spec": {"clusterIP": "10.44.0.1"}});
        let e = cluster_ip(range, &mut bm, &mut outside).unwrap_err();
        assert!(
            e.message.contains("not in the valid range"),
            "{}",
            e.message
        );
    }
}
