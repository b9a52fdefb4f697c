//! The cluster DNS record index and query answering, without I/O.
//!
//! Records follow Kubernetes' DNS-based service discovery specification
//! (kubernetes/dns `docs/specification.md`, version 1.1.0) and, where the
//! specification leaves room, what CoreDNS's `kubernetes` plugin answers
//! with `pods insecure` (the Corefile kubeadm and k3s ship):
//!
//! - `<svc>.<ns>.svc.<zone>`: A/AAAA of the ClusterIPs; for a headless
//!   service, of its ready endpoints; for an ExternalName service a CNAME.
//! - `<endpoint>.<svc>.<ns>.svc.<zone>`: A/AAAA of one ready endpoint, named
//!   by its `hostname` (pods with `hostname` and `subdomain`: StatefulSet
//!   pods) or else by its address with dashes (`10-42-0-5`).
//! - `_<port>._<proto>.<svc>.<ns>.svc.<zone>`: SRV of each named port; the
//!   target is the service name, or each ready endpoint's name when headless.
//! - `<a-b-c-d>.<ns>.pod.<zone>`: A of that address.
//! - PTR of ClusterIPs and ready endpoint addresses.
//! - `dns-version.<zone>`: TXT `1.1.0`.
//!
//! A name that exists without records of the asked type gets NODATA (no
//! answers, NOERROR, the zone's SOA); a name that does not exist gets
//! NXDOMAIN with the SOA. Names outside the zone, and reverse names of
//! addresses the index does not know, are forwarded upstream.
//!
//! The index keeps Services and EndpointSlices in compact form and builds
//! records per query, so 10,000 services cost a few megabytes, not a
//! materialized zone.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The version of the DNS specification served at `dns-version.<zone>`.
pub const SPEC_VERSION: &str = "1.1.0";

/// Largest UDP answer without EDNS (RFC 1035).
pub const UDP_MIN: usize = 512;
/// Largest UDP answer we send even when a client offers more (the DNS
/// flag day 2020 size, which avoids fragmentation).
pub const UDP_MAX: usize = 1232;

/// A port as DNS names it: `_<name>._<protocol>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    pub name: Box<str>,
    /// Lower case: `tcp`, `udp`, `sctp`.
    pub protocol: Box<str>,
    pub port: u16,
}

/// What a Service contributes to DNS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceKind {
    ClusterIp(Vec<IpAddr>),
    Headless,
    /// The target, as a fully qualified name (boxed: a Name is ~80 bytes
    /// inline and most services have none).
    ExternalName(Box<Name>),
}

/// A Service as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRecord {
    pub kind: ServiceKind,
    /// Named ports only (only they get SRV records).
    pub ports: Vec<Port>,
}

impl ServiceRecord {
    /// The DNS view of a Service; None for one DNS has nothing for (an
    /// ExternalName whose target is not a name).
    pub fn from_service(svc: &Service) -> Option<ServiceRecord> {
        let spec = svc.spec.as_ref()?;
        let kind = if spec.type_.as_deref() == Some("ExternalName") {
            let target = spec.external_name.as_deref()?.trim_end_matches('.');
            let mut n = Name::from_ascii(target).ok()?;
            n.set_fqdn(true);
            ServiceKind::ExternalName(Box::new(n))
        } else if spec.cluster_ip.as_deref() == Some("None") {
            ServiceKind::Headless
        } else {
            let ips: Vec<IpAddr> = match &spec.cluster_ips {
                Some(ips) if !ips.is_empty() => ips.iter().filter_map(|s| s.parse().ok()).collect(),
                _ => spec
                    .cluster_ip
                    .iter()
                    .filter_map(|s| s.parse().ok())
                    .collect(),
            };
            ServiceKind::ClusterIp(ips)
        };
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(Port {
                    name: p.name.as_deref().filter(|n| !n.is_empty())?.into(),
                    protocol: protocol(p.protocol.as_deref()),
                    port: u16::try_from(p.port).ok()?,
                })
            })
            .collect();
        Some(ServiceRecord { kind, ports })
    }
}

fn protocol(p: Option<&str>) -> Box<str> {
    p.unwrap_or("TCP").to_ascii_lowercase().into()
}

/// One ready endpoint of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub hostname: Option<Box<str>>,
}

impl Endpoint {
    /// The endpoint's DNS label: its hostname, or its address with dashes.
    pub fn label(&self) -> String {
        match &self.hostname {
            Some(h) => h.to_ascii_lowercase(),
            None => dashed(&self.ip),
        }
    }
}

/// `10.42.0.5` → `10-42-0-5`; `fd00::1` → `fd00--1` (CoreDNS's form).
pub fn dashed(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

fn undashed(label: &str) -> Option<IpAddr> {
    if let Ok(v4) = label.replace('-', ".").parse::<Ipv4Addr>() {
        if label.matches('-').count() == 3 {
            return Some(IpAddr::V4(v4));
        }
    }
    label
        .replace('-', ":")
        .parse::<Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

/// An EndpointSlice as the index keeps it: its service and its ready
/// endpoints (a nil `ready` counts as ready, as the API says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceRecord {
    pub service: String,
    pub endpoints: Vec<Endpoint>,
    /// Named ports with the endpoints' port numbers (SRV of headless
    /// services).
    pub ports: Vec<Port>,
}

impl SliceRecord {
    /// None for a slice without a service label or of FQDN addresses.
    pub fn from_slice(slice: &EndpointSlice) -> Option<SliceRecord> {
        let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
        if slice.address_type == "FQDN" {
            return None;
        }
        let endpoints = slice
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .flat_map(|e| {
                e.addresses.iter().filter_map(|a| {
                    Some(Endpoint {
                        ip: a.parse().ok()?,
                        hostname: e
                            .hostname
                            .as_deref()
                            .filter(|h| !h.is_empty())
                            .map(Into::into),
                    })
                })
            })
            .collect();
        let ports = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(Port {
                    name: p.name.as_deref().filter(|n| !n.is_empty())?.into(),
                    protocol: protocol(p.protocol.as_deref()),
                    port: u16::try_from(p.port?).ok()?,
                })
            })
            .collect();
        Some(SliceRecord {
            service: service.clone(),
            endpoints,
            ports,
        })
    }
}

/// A service's name, shared by its entry and the reverse index.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SvcId {
    namespace: Arc<str>,
    service: Arc<str>,
}

#[derive(Debug)]
struct ServiceEntry {
    id: Arc<SvcId>,
    record: Option<ServiceRecord>,
    /// Its slices by name (usually one: a Vec, not a map's node of 11).
    slices: Vec<(Box<str>, SliceRecord)>,
}

impl ServiceEntry {
    fn is_empty(&self) -> bool {
        self.record.is_none() && self.slices.is_empty()
    }

    fn slice_records(&self) -> impl Iterator<Item = &SliceRecord> {
        self.slices.iter().map(|(_, s)| s)
    }

    /// Ready endpoints across slices, each address once.
    fn endpoints(&self) -> Vec<&Endpoint> {
        let mut out: Vec<&Endpoint> = vec![];
        for s in self.slice_records() {
            for e in &s.endpoints {
                if !out.iter().any(|o| o.ip == e.ip) {
                    out.push(e);
                }
            }
        }
        out
    }
}

/// Who answers a PTR query for an address: a service (its ClusterIP) or
/// one of its endpoints (named at answer time from the slices, so the
/// reverse index holds no names of its own).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct PtrTarget {
    id: Arc<SvcId>,
    endpoint: bool,
}

/// The names of one address: nearly always one, kept inline in 16 bytes
/// (a pointer and a tag; the rare several behind one more pointer).
#[derive(Debug)]
enum PtrSet {
    Service(Arc<SvcId>),
    Endpoint(Arc<SvcId>),
    // Boxed on purpose: a thin pointer keeps the enum at 16 bytes.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<PtrTarget>>),
}

impl PtrSet {
    fn one(t: PtrTarget) -> PtrSet {
        if t.endpoint {
            PtrSet::Endpoint(t.id)
        } else {
            PtrSet::Service(t.id)
        }
    }

    fn targets(&self) -> Vec<PtrTarget> {
        match self {
            PtrSet::Service(id) => vec![PtrTarget {
                id: id.clone(),
                endpoint: false,
            }],
            PtrSet::Endpoint(id) => vec![PtrTarget {
                id: id.clone(),
                endpoint: true,
            }],
            PtrSet::Many(v) => v.to_vec(),
        }
    }
}

/// The reverse index: address → names, with IPv4 and IPv6 addresses in
/// maps of their own so an IPv4 entry's key is 4 bytes, not `IpAddr`'s 17
/// padded to 24 (110,000 addresses at 10,000 services: ~2 MB less).
#[derive(Debug, Default)]
struct PtrMap {
    v4: HashMap<u32, PtrSet>,
    v6: HashMap<u128, PtrSet>,
}

impl PtrMap {
    fn get(&self, ip: &IpAddr) -> Option<&PtrSet> {
        match ip {
            IpAddr::V4(a) => self.v4.get(&u32::from(*a)),
            IpAddr::V6(a) => self.v6.get(&u128::from(*a)),
        }
    }
    fn insert(&mut self, ip: IpAddr, set: PtrSet) {
        match ip {
            IpAddr::V4(a) => self.v4.insert(u32::from(a), set),
            IpAddr::V6(a) => self.v6.insert(u128::from(a), set),
        };
    }
    fn remove(&mut self, ip: &IpAddr) -> Option<PtrSet> {
        match ip {
            IpAddr::V4(a) => self.v4.remove(&u32::from(*a)),
            IpAddr::V6(a) => self.v6.remove(&u128::from(*a)),
        }
    }
    fn clear(&mut self) {
        self.v4.clear();
        self.v6.clear();
    }
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }
}

/// The zone's settings.
#[derive(Debug, Clone)]
pub struct ZoneConfig {
    /// The cluster domain, e.g. `cluster.local`.
    pub domain: String,
    /// The cluster DNS address (answers `ns.dns.<zone>`).
    pub dns_ip: Option<IpAddr>,
    /// TTL of every record (CoreDNS's default is 5 s).
    pub ttl: u32,
}

/// What to do with a query.
#[derive(Debug)]
pub enum Outcome {
    /// The answer.
    Answer(Message),
    /// Not ours: forward the query upstream as it is.
    Forward,
    /// A CNAME to a name outside the zone: the answer so far, then the
    /// target's records of the same type from upstream, appended.
    Chase { partial: Message, target: Name },
}

/// The in-memory record index: Services and EndpointSlices of every
/// namespace, updated one object at a time.
#[derive(Debug)]
pub struct Index {
    zone: Name,
    zone_labels: usize,
    config: ZoneConfig,
    /// namespace → service → entry.
    namespaces: HashMap<Arc<str>, HashMap<Arc<str>, ServiceEntry>>,
    /// (namespace, slice) → service, to find a slice's previous service.
    slice_owner: HashMap<(Arc<str>, String), Arc<str>>,
    ptr: PtrMap,
    /// Bumped on every change (the SOA serial).
    serial: u32,
}

fn lower(label: &[u8]) -> String {
    String::from_utf8_lossy(label).to_ascii_lowercase()
}

impl Index {
    pub fn new(config: ZoneConfig) -> Index {
        let domain = config.domain.trim_end_matches('.');
        let mut zone = Name::from_ascii(domain)
            .unwrap_or_else(|_| Name::from_ascii("cluster.local").expect("valid"))
            .to_lowercase();
        zone.set_fqdn(true);
        Index {
            zone_labels: zone.num_labels() as usize,
            zone,
            config,
            namespaces: HashMap::new(),
            slice_owner: HashMap::new(),
            ptr: PtrMap::default(),
            serial: 1,
        }
    }

    pub fn zone(&self) -> &Name {
        &self.zone
    }

    /// How many services the index holds.
    pub fn services(&self) -> usize {
        self.namespaces
            .values()
            .flat_map(|m| m.values())
            .filter(|e| e.record.is_some())
            .count()
    }

    fn key(&mut self, namespace: &str, name: &str) -> (Arc<str>, Arc<str>) {
        let ns: Arc<str> = match self.namespaces.get_key_value(namespace) {
            Some((k, _)) => k.clone(),
            None => Arc::from(namespace),
        };
        let svc: Arc<str> = match self
            .namespaces
            .get(namespace)
            .and_then(|m| m.get_key_value(name))
        {
            Some((k, _)) => k.clone(),
            None => Arc::from(name),
        };
        (ns, svc)
    }

    fn ptr_add(&mut self, ip: IpAddr, t: PtrTarget) {
        match self.ptr.remove(&ip) {
            None => self.ptr.insert(ip, PtrSet::one(t)),
            Some(set) => {
                let mut v = set.targets();
                v.push(t);
                self.ptr.insert(ip, PtrSet::Many(Box::new(v)))
            }
        }
    }

    fn ptr_remove(&mut self, ip: IpAddr, t: &PtrTarget) {
        let Some(set) = self.ptr.remove(&ip) else {
            return;
        };
        let mut v = set.targets();
        if let Some(i) = v.iter().position(|x| x == t) {
            v.swap_remove(i);
        }
        match v.len() {
            0 => {}
            1 => {
                self.ptr.insert(ip, PtrSet::one(v.remove(0)));
            }
            _ => {
                self.ptr.insert(ip, PtrSet::Many(Box::new(v)));
            }
        }
    }

    fn entry(&mut self, ns: &Arc<str>, svc: &Arc<str>) -> &mut ServiceEntry {
        self.namespaces
            .entry(ns.clone())
            .or_default()
            .entry(svc.clone())
            .or_insert_with(|| ServiceEntry {
                id: Arc::new(SvcId {
                    namespace: ns.clone(),
                    service: svc.clone(),
                }),
                record: None,
                slices: Vec::new(),
            })
    }

    fn prune(&mut self, ns: &Arc<str>, svc: &Arc<str>) {
        if let Some(m) = self.namespaces.get_mut(ns) {
            if m.get(svc).map(ServiceEntry::is_empty).unwrap_or(false) {
                m.remove(svc);
            }
            if m.is_empty() {
                self.namespaces.remove(ns);
            }
        }
    }

    /// A Service was added or changed (None: it says nothing to DNS).
    pub fn set_service(&mut self, namespace: &str, name: &str, record: Option<ServiceRecord>) {
        let (ns, svc) = self.key(namespace, name);
        let entry = self.entry(&ns, &svc);
        let old = entry.record.take();
        let target = PtrTarget {
            id: entry.id.clone(),
            endpoint: false,
        };
        if let Some(ServiceRecord {
            kind: ServiceKind::ClusterIp(ips),
            ..
        }) = &old
        {
            for ip in ips {
                self.ptr_remove(*ip, &target);
            }
        }
        if let Some(ServiceRecord {
            kind: ServiceKind::ClusterIp(ips),
            ..
        }) = &record
        {
            for ip in ips {
                self.ptr_add(*ip, target.clone());
            }
        }
        self.entry(&ns, &svc).record = record;
        self.prune(&ns, &svc);
        self.serial = self.serial.wrapping_add(1);
    }

    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        self.set_service(namespace, name, None);
    }

    /// An EndpointSlice was added or changed (None: it no longer feeds DNS).
    pub fn set_slice(&mut self, namespace: &str, slice: &str, record: Option<SliceRecord>) {
        let ns: Arc<str> = self.key(namespace, "").0;
        // Remove what the slice gave before.
        if let Some(owner) = self.slice_owner.remove(&(ns.clone(), slice.to_string())) {
            let old = self
                .namespaces
                .get_mut(&ns)
                .and_then(|m| m.get_mut(&owner))
                .and_then(|e| {
                    let i = e.slices.iter().position(|(n, _)| &**n == slice)?;
                    Some((e.id.clone(), e.slices.swap_remove(i).1))
                });
            if let Some((id, old)) = old {
                for e in &old.endpoints {
                    let t = PtrTarget {
                        id: id.clone(),
                        endpoint: true,
                    };
                    self.ptr_remove(e.ip, &t);
                }
            }
            self.prune(&ns, &owner);
        }
        if let Some(mut record) = record {
            let (ns, svc) = self.key(namespace, &record.service);
            // The owner is known from here on; the copy would cost a heap
            // block a slice.
            record.service = String::new();
            let id = self.entry(&ns, &svc).id.clone();
            for e in &record.endpoints {
                let t = PtrTarget {
                    id: id.clone(),
                    endpoint: true,
                };
                self.ptr_add(e.ip, t);
            }
            self.slice_owner
                .insert((ns.clone(), slice.to_string()), svc.clone());
            self.entry(&ns, &svc).slices.push((slice.into(), record));
        }
        self.serial = self.serial.wrapping_add(1);
    }

    pub fn delete_slice(&mut self, namespace: &str, slice: &str) {
        self.set_slice(namespace, slice, None);
    }

    /// Drops everything (before a relist).
    pub fn clear(&mut self) {
        self.namespaces.clear();
        self.slice_owner.clear();
        self.ptr.clear();
        self.serial = self.serial.wrapping_add(1);
    }

    fn service(&self, ns: &str, svc: &str) -> Option<&ServiceEntry> {
        self.namespaces
            .get(ns)?
            .get(svc)
            .filter(|e| e.record.is_some())
    }

    fn record(&self, name: Name, data: RData) -> Record {
        Record::from_rdata(name, self.config.ttl, data)
    }

    fn soa(&self) -> Record {
        let ns = Name::from_ascii("ns.dns")
            .expect("valid")
            .append_domain(&self.zone)
            .expect("fits");
        let mbox = Name::from_ascii("hostmaster")
            .expect("valid")
            .append_domain(&self.zone)
            .expect("fits");
        // CoreDNS's timers; the minimum (negative TTL) is the record TTL.
        let soa = SOA::new(ns, mbox, self.serial, 7200, 1800, 86400, self.config.ttl);
        self.record(self.zone.clone(), RData::SOA(soa))
    }

    fn ip_record(&self, name: &Name, ip: IpAddr) -> Record {
        let data = match ip {
            IpAddr::V4(v4) => RData::A(A(v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
        };
        self.record(name.clone(), data)
    }

    /// Answers one query. `request` is the decoded request message.
    pub fn answer(&self, request: &Message) -> Outcome {
        let mut resp = Message::response(request.metadata.id, request.metadata.op_code);
        resp.metadata.recursion_desired = request.metadata.recursion_desired;
        resp.metadata.recursion_available = true;
        resp.metadata.checking_disabled = request.metadata.checking_disabled;
        if request.edns.is_some() {
            let mut e = Edns::new();
            e.set_max_payload(UDP_MAX as u16);
            resp.set_edns(e);
        }
        if request.metadata.message_type != MessageType::Query {
            resp.metadata.response_code = ResponseCode::FormErr;
            return Outcome::Answer(resp);
        }
        if request.metadata.op_code != OpCode::Query {
            resp.metadata.response_code = ResponseCode::NotImp;
            return Outcome::Answer(resp);
        }
        if request.edns.as_ref().map(|e| e.version()).unwrap_or(0) > 0 {
            resp.metadata.response_code = ResponseCode::BADVERS;
            return Outcome::Answer(resp);
        }
        let [query] = request.queries.as_slice() else {
            resp.metadata.response_code = ResponseCode::FormErr;
            return Outcome::Answer(resp);
        };
        resp.add_query(query.clone());
        if query.query_class() != DNSClass::IN {
            return Outcome::Forward;
        }
        let qname = query.name();
        if self.zone.zone_of(qname) {
            resp.metadata.authoritative = true;
            return self.answer_in_zone(resp, query, 0);
        }
        if let Some(ip) = reverse_ip(qname) {
            if let Some(targets) = self.ptr.get(&ip) {
                resp.metadata.authoritative = true;
                if matches!(query.query_type(), RecordType::PTR | RecordType::ANY) {
                    let mut seen: Vec<PtrTarget> = targets.targets();
                    seen.sort();
                    seen.dedup();
                    for t in seen {
                        let mut s = format!("{}.{}.svc.", t.id.service, t.id.namespace);
                        if t.endpoint {
                            let label = self
                                .namespaces
                                .get(&t.id.namespace)
                                .and_then(|m| m.get(&t.id.service))
                                .and_then(|e| {
                                    e.endpoints()
                                        .into_iter()
                                        .find(|e| e.ip == ip)
                                        .map(Endpoint::label)
                                });
                            let Some(label) = label else { continue };
                            s = format!("{label}.{s}");
                        }
                        if let Ok(n) =
                            Name::from_ascii(&s).and_then(|n| n.append_domain(&self.zone))
                        {
                            resp.add_answer(self.record(qname.clone(), RData::PTR(PTR(n))));
                        }
                    }
                }
                return Outcome::Answer(resp);
            }
        }
        Outcome::Forward
    }

    fn nxdomain(&self, mut resp: Message) -> Outcome {
        resp.metadata.response_code = ResponseCode::NXDomain;
        resp.add_authority(self.soa());
        Outcome::Answer(resp)
    }

    /// The name exists: the records of the asked type, or NODATA.
    fn finish(&self, mut resp: Message, records: Vec<Record>, qtype: RecordType) -> Outcome {
        let mut any = false;
        for r in records {
            if qtype == RecordType::ANY || r.record_type() == qtype {
                resp.add_answer(r);
                any = true;
            }
        }
        if !any {
            resp.add_authority(self.soa());
        }
        Outcome::Answer(resp)
    }

    fn answer_in_zone(&self, resp: Message, query: &Query, depth: u8) -> Outcome {
        let qname = query.name();
        let qtype = query.query_type();
        let n = qname.num_labels() as usize;
        let rel: Vec<String> = qname.iter().take(n - self.zone_labels).map(lower).collect();
        let rel: Vec<&str> = rel.iter().map(String::as_str).collect();
        let zone = &self.zone;
        match rel.as_slice() {
            [] => {
                let mut recs = vec![self.soa()];
                let ns_name = Name::from_ascii("ns.dns")
                    .expect("valid")
                    .append_domain(zone)
                    .expect("fits");
                recs.push(self.record(qname.clone(), RData::NS(NS(ns_name))));
                self.finish(resp, recs, qtype)
            }
            ["dns-version"] => {
                let txt = TXT::new(vec![SPEC_VERSION.to_string()]);
                self.finish(
                    resp,
                    vec![self.record(qname.clone(), RData::TXT(txt))],
                    qtype,
                )
            }
            ["dns"] | ["svc"] | ["pod"] | [_, "pod"] => self.finish(resp, vec![], qtype),
            ["ns", "dns"] => {
                let recs = self
                    .config
                    .dns_ip
                    .iter()
                    .map(|ip| self.ip_record(qname, *ip))
                    .collect();
                self.finish(resp, recs, qtype)
            }
            [ip, _ns, "pod"] => match undashed(ip) {
                Some(ip) => {
                    let r = self.ip_record(qname, ip);
                    self.finish(resp, vec![r], qtype)
                }
                None => self.nxdomain(resp),
            },
            [ns, "svc"] => {
                if self
                    .namespaces
                    .get(*ns)
                    .is_some_and(|m| m.values().any(|e| e.record.is_some()))
                {
                    self.finish(resp, vec![], qtype)
                } else {
                    self.nxdomain(resp)
                }
            }
            [svc, ns, "svc"] => {
                let Some(entry) = self.service(ns, svc) else {
                    return self.nxdomain(resp);
                };
                let record = entry.record.as_ref().expect("service has a record");
                match &record.kind {
                    ServiceKind::ClusterIp(ips) => {
                        let recs = ips.iter().map(|ip| self.ip_record(qname, *ip)).collect();
                        self.finish(resp, recs, qtype)
                    }
                    ServiceKind::Headless => {
                        let recs = entry
                            .endpoints()
                            .iter()
                            .map(|e| self.ip_record(qname, e.ip))
                            .collect();
                        self.finish(resp, recs, qtype)
                    }
                    ServiceKind::ExternalName(target) => {
                        self.cname(resp, query, (**target).clone(), depth)
                    }
                }
            }
            [proto, svc, ns, "svc"] if proto.starts_with('_') => {
                // `_tcp.<svc>…` exists when a named port has that protocol.
                let proto = &proto[1..];
                match self.service(ns, svc) {
                    Some(e) if self.srv_ports(e).any(|p| &*p.protocol == proto) => {
                        self.finish(resp, vec![], qtype)
                    }
                    _ => self.nxdomain(resp),
                }
            }
            [endpoint, svc, ns, "svc"] => {
                let Some(entry) = self.service(ns, svc) else {
                    return self.nxdomain(resp);
                };
                let recs: Vec<Record> = entry
                    .endpoints()
                    .iter()
                    .filter(|e| e.label() == *endpoint)
                    .map(|e| self.ip_record(qname, e.ip))
                    .collect();
                if recs.is_empty() {
                    return self.nxdomain(resp);
                }
                self.finish(resp, recs, qtype)
            }
            [port, proto, svc, ns, "svc"] if port.starts_with('_') && proto.starts_with('_') => {
                let (port, proto) = (&port[1..], &proto[1..]);
                let Some(entry) = self.service(ns, svc) else {
                    return self.nxdomain(resp);
                };
                let record = entry.record.as_ref().expect("service has a record");
                let base =
                    Name::from_ascii(format!("{svc}.{ns}.svc")).and_then(|n| n.append_domain(zone));
                let Ok(base) = base else {
                    return self.nxdomain(resp);
                };
                let mut recs = vec![];
                let mut extra = vec![];
                match &record.kind {
                    ServiceKind::Headless => {
                        let eps = entry.endpoints();
                        let mut ports: Vec<u16> = entry
                            .slice_records()
                            .flat_map(|s| s.ports.iter())
                            .filter(|p| &*p.name == port && &*p.protocol == proto)
                            .map(|p| p.port)
                            .collect();
                        ports.sort_unstable();
                        ports.dedup();
                        if ports.is_empty() {
                            return self.nxdomain(resp);
                        }
                        let weight = srv_weight(eps.len() * ports.len());
                        for e in &eps {
                            let Ok(target) =
                                Name::from_ascii(e.label()).and_then(|l| l.append_domain(&base))
                            else {
                                continue;
                            };
                            for p in &ports {
                                let srv = SRV::new(0, weight, *p, target.clone());
                                recs.push(self.record(qname.clone(), RData::SRV(srv)));
                            }
                            extra.push(self.ip_record(&target, e.ip));
                        }
                    }
                    ServiceKind::ClusterIp(ips) => {
                        let ports: Vec<u16> = record
                            .ports
                            .iter()
                            .filter(|p| &*p.name == port && &*p.protocol == proto)
                            .map(|p| p.port)
                            .collect();
                        if ports.is_empty() {
                            return self.nxdomain(resp);
                        }
                        let weight = srv_weight(ports.len());
                        for p in ports {
                            let srv = SRV::new(0, weight, p, base.clone());
                            recs.push(self.record(qname.clone(), RData::SRV(srv)));
                        }
                        extra.extend(ips.iter().map(|ip| self.ip_record(&base, *ip)));
                    }
                    ServiceKind::ExternalName(_) => return self.nxdomain(resp),
                }
                let wants_srv = matches!(qtype, RecordType::SRV | RecordType::ANY);
                let mut out = match self.finish(resp, recs, qtype) {
                    Outcome::Answer(m) => m,
                    other => return other,
                };
                if wants_srv {
                    // The targets' addresses, as CoreDNS adds them.
                    for r in extra {
                        out.add_additional(r);
                    }
                }
                Outcome::Answer(out)
            }
            _ => self.nxdomain(resp),
        }
    }

    /// Named ports DNS knows for a service: its own, or its slices' for a
    /// headless service.
    fn srv_ports<'a>(&'a self, e: &'a ServiceEntry) -> Box<dyn Iterator<Item = &'a Port> + 'a> {
        match e.record.as_ref().map(|r| &r.kind) {
            Some(ServiceKind::Headless) => Box::new(e.slice_records().flat_map(|s| s.ports.iter())),
            Some(ServiceKind::ClusterIp(_)) => {
                Box::new(e.record.iter().flat_map(|r| r.ports.iter()))
            }
            _ => Box::new(std::iter::empty()),
        }
    }

    fn cname(&self, mut resp: Message, query: &Query, target: Name, depth: u8) -> Outcome {
        resp.add_answer(self.record(query.name().clone(), RData::CNAME(CNAME(target.clone()))));
        if matches!(query.query_type(), RecordType::CNAME | RecordType::ANY) {
            return Outcome::Answer(resp);
        }
        if self.zone.zone_of(&target) {
            // An ExternalName naming another in-cluster name: follow it here.
            if depth >= 8 {
                resp.metadata.response_code = ResponseCode::ServFail;
                return Outcome::Answer(resp);
            }
            let mut q = query.clone();
            q.set_name(target);
            let sub = Message::response(resp.metadata.id, resp.metadata.op_code);
            return match self.answer_in_zone(sub, &q, depth + 1) {
                Outcome::Answer(sub) => {
                    resp.metadata.response_code = sub.metadata.response_code;
                    resp.answers.extend(sub.answers);
                    resp.authorities.extend(sub.authorities);
                    resp.additionals.extend(sub.additionals);
                    Outcome::Answer(resp)
                }
                Outcome::Chase { partial, target } => {
                    resp.answers.extend(partial.answers);
                    Outcome::Chase {
                        partial: resp,
                        target,
                    }
                }
                Outcome::Forward => Outcome::Answer(resp),
            };
        }
        Outcome::Chase {
            partial: resp,
            target,
        }
    }
}

/// CoreDNS spreads the weight 100 over a name's SRV records.
fn srv_weight(n: usize) -> u16 {
    (100 / n.max(1)).max(1) as u16
}

/// The address a complete reverse name stands for: `4.3.2.1.in-addr.arpa.`
/// or 32 nibbles under `ip6.arpa.`.
pub fn reverse_ip(name: &Name) -> Option<IpAddr> {
    let labels: Vec<String> = name.iter().map(lower).collect();
    match labels.as_slice() {
        [d, c, b, a, in_addr, arpa] if in_addr == "in-addr" && arpa == "arpa" => {
            let octet = |s: &str| -> Option<u8> {
                if s.len() > 1 && s.starts_with('0') {
                    return None;
                }
                s.parse().ok()
            };
            Some(IpAddr::V4(Ipv4Addr::new(
                octet(a)?,
                octet(b)?,
                octet(c)?,
                octet(d)?,
            )))
        }
        [nibbles @ .., ip6, arpa] if nibbles.len() == 32 && ip6 == "ip6" && arpa == "arpa" => {
            let mut v: u128 = 0;
            for n in nibbles.iter().rev() {
                if n.len() != 1 {
                    return None;
                }
                v = (v << 4) | u128::from(u8::from_str_radix(n, 16).ok()?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(v)))
        }
        _ => None,
    }
}

/// The largest UDP answer a request allows: 512 bytes, or its EDNS size
/// (capped at [`UDP_MAX`]).
pub fn udp_limit(request: &Message) -> usize {
    match &request.edns {
        Some(e) => usize::from(e.max_payload()).clamp(UDP_MIN, UDP_MAX),
        None => UDP_MIN,
    }
}

/// Encodes an answer for UDP: when it does not fit in `limit` bytes, the
/// header and question only, with TC set, so the client retries over TCP.
pub fn encode_udp(resp: &Message, limit: usize) -> Option<Vec<u8>> {
    let bytes = resp.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    resp.truncate().to_vec().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn index() -> Index {
        Index::new(ZoneConfig {
            domain: "cluster.local".into(),
            dns_ip: Some("10.43.0.10".parse().unwrap()),
            ttl: 5,
        })
    }

    fn add_service(ix: &mut Index, v: serde_json::Value) {
        let svc: Service = serde_json::from_value(v).unwrap();
        ix.set_service(
            svc.metadata.namespace.as_deref().unwrap(),
            svc.metadata.name.as_deref().unwrap(),
            ServiceRecord::from_service(&svc),
        );
    }

    fn add_slice(ix: &mut Index, v: serde_json::Value) {
        let s: EndpointSlice = serde_json::from_value(v).unwrap();
        ix.set_slice(
            s.metadata.namespace.as_deref().unwrap(),
            s.metadata.name.as_deref().unwrap(),
            SliceRecord::from_slice(&s),
        );
    }

    /// web (ClusterIP, ports http/80 and 53/udp unnamed), db (headless with
    /// two ready pods with hostnames, one not ready, one without a
    /// hostname), ext (ExternalName), alias (ExternalName to web).
    fn cluster() -> Index {
        let mut ix = index();
        add_service(
            &mut ix,
            json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": {
                "clusterIP": "10.43.0.20", "clusterIPs": ["10.43.0.20"],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}}),
        );
        add_slice(
            &mut ix,
            json!({"metadata": {"name": "web-abc", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.42.0.7"], "conditions": {"ready": true}}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
        );
        add_service(
            &mut ix,
            json!({"metadata": {"name": "db", "namespace": "shop"}, "spec": {
                "clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}}),
        );
        add_slice(
            &mut ix,
            json!({"metadata": {"name": "db-1", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "db"}},
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["10.42.0.11"], "hostname": "db-0", "conditions": {"ready": true}},
                    {"addresses": ["10.42.0.12"], "hostname": "db-1"},
                    {"addresses": ["10.42.0.13"], "hostname": "db-2", "conditions": {"ready": false}},
                    {"addresses": ["10.42.0.14"], "conditions": {"ready": true}}],
                "ports": [{"name": "pg", "port": 5433, "protocol": "TCP"}]}),
        );
        add_service(
            &mut ix,
            json!({"metadata": {"name": "ext", "namespace": "shop"}, "spec": {
                "type": "ExternalName", "externalName": "db.example.com"}}),
        );
        add_service(
            &mut ix,
            json!({"metadata": {"name": "alias", "namespace": "shop"}, "spec": {
                "type": "ExternalName", "externalName": "web.shop.svc.cluster.local."}}),
        );
        ix
    }

    fn ask(ix: &Index, name: &str, t: RecordType) -> Outcome {
        let mut m = Message::query();
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        ix.answer(&m)
    }

    fn answer(ix: &Index, name: &str, t: RecordType) -> Message {
        match ask(ix, name, t) {
            Outcome::Answer(m) => m,
            other => panic!("{name} {t}: expected a local answer, got {other:?}"),
        }
    }

    /// The answer section as `type data` strings, sorted.
    fn data(m: &Message) -> Vec<String> {
        let mut v: Vec<String> = m
            .answers
            .iter()
            .map(|r| format!("{} {}", r.record_type(), r.data))
            .collect();
        v.sort();
        v
    }

    fn is_nodata(m: &Message) -> bool {
        m.metadata.response_code == ResponseCode::NoError
            && m.answers.is_empty()
            && m.authorities
                .iter()
                .any(|r| r.record_type() == RecordType::SOA)
    }

    fn is_nxdomain(m: &Message) -> bool {
        m.metadata.response_code == ResponseCode::NXDomain
            && m.answers.is_empty()
            && m.authorities
                .iter()
                .any(|r| r.record_type() == RecordType::SOA)
    }

    #[test]
    fn a_cluster_ip_service_answers_its_cluster_ip_authoritatively() {
        let ix = cluster();
        let m = answer(&ix, "web.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(data(&m), ["A 10.43.0.20"]);
        assert!(m.metadata.authoritative);
        assert_eq!(m.answers[0].ttl, 5);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    }

    #[test]
    fn names_match_case_insensitively_and_keep_the_askers_case() {
        let ix = cluster();
        let m = answer(&ix, "WeB.Shop.SVC.cluster.LOCAL.", RecordType::A);
        assert_eq!(data(&m), ["A 10.43.0.20"]);
        assert_eq!(m.answers[0].name.to_ascii(), "WeB.Shop.SVC.cluster.LOCAL.");
    }

    #[test]
    fn aaaa_of_an_ipv4_service_is_nodata_not_nxdomain() {
        let ix = cluster();
        assert!(is_nodata(&answer(
            &ix,
            "web.shop.svc.cluster.local.",
            RecordType::AAAA
        )));
        assert!(is_nodata(&answer(
            &ix,
            "web.shop.svc.cluster.local.",
            RecordType::MX
        )));
    }

    #[test]
    fn unknown_services_and_search_path_expansions_are_nxdomain() {
        let ix = cluster();
        for name in [
            "nope.shop.svc.cluster.local.",
            "web.other.svc.cluster.local.",
            "example.com.shop.svc.cluster.local.",
            "www.example.com.cluster.local.",
            "other.svc.cluster.local.",
            "a.b.c.d.e.f.svc.cluster.local.",
        ] {
            assert!(is_nxdomain(&answer(&ix, name, RecordType::A)), "{name}");
        }
    }

    #[test]
    fn empty_non_terminals_are_nodata() {
        let ix = cluster();
        for name in [
            "svc.cluster.local.",
            "shop.svc.cluster.local.",
            "pod.cluster.local.",
            "_tcp.web.shop.svc.cluster.local.",
        ] {
            assert!(is_nodata(&answer(&ix, name, RecordType::A)), "{name}");
        }
        assert!(
            is_nxdomain(&answer(
                &ix,
                "_udp.web.shop.svc.cluster.local.",
                RecordType::A
            )),
            "web's UDP port has no name"
        );
    }

    #[test]
    fn the_zone_apex_has_soa_and_ns_and_the_spec_version() {
        let ix = cluster();
        let m = answer(&ix, "cluster.local.", RecordType::SOA);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].record_type(), RecordType::SOA);
        let m = answer(&ix, "cluster.local.", RecordType::NS);
        assert_eq!(data(&m), ["NS ns.dns.cluster.local."]);
        let m = answer(&ix, "ns.dns.cluster.local.", RecordType::A);
        assert_eq!(data(&m), ["A 10.43.0.10"]);
        let m = answer(&ix, "dns-version.cluster.local.", RecordType::TXT);
        assert_eq!(data(&m), ["TXT 1.1.0"]);
    }

    #[test]
    fn a_headless_service_answers_its_ready_endpoints() {
        let ix = cluster();
        let m = answer(&ix, "db.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(
            data(&m),
            ["A 10.42.0.11", "A 10.42.0.12", "A 10.42.0.14"],
            "not the unready one; a nil ready condition counts as ready"
        );
    }

    #[test]
    fn a_headless_service_without_ready_endpoints_is_nodata() {
        let mut ix = cluster();
        add_slice(
            &mut ix,
            json!({"metadata": {"name": "db-1", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "db"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.42.0.11"], "hostname": "db-0", "conditions": {"ready": false}}]}),
        );
        assert!(is_nodata(&answer(
            &ix,
            "db.shop.svc.cluster.local.",
            RecordType::A
        )));
        assert!(is_nxdomain(&answer(
            &ix,
            "db-0.db.shop.svc.cluster.local.",
            RecordType::A
        )));
    }

    #[test]
    fn pods_with_hostname_and_subdomain_have_their_own_name() {
        let ix = cluster();
        let m = answer(&ix, "db-0.db.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(data(&m), ["A 10.42.0.11"]);
        let m = answer(&ix, "10-42-0-14.db.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(
            data(&m),
            ["A 10.42.0.14"],
            "an endpoint without hostname by its dashed address"
        );
        assert!(
            is_nxdomain(&answer(
                &ix,
                "db-2.db.shop.svc.cluster.local.",
                RecordType::A
            )),
            "not ready"
        );
        assert!(is_nodata(&answer(
            &ix,
            "db-0.db.shop.svc.cluster.local.",
            RecordType::AAAA
        )));
    }

    #[test]
    fn srv_of_a_named_port_points_at_the_service() {
        let ix = cluster();
        let m = answer(
            &ix,
            "_http._tcp.web.shop.svc.cluster.local.",
            RecordType::SRV,
        );
        assert_eq!(data(&m), ["SRV 0 100 80 web.shop.svc.cluster.local."]);
        assert_eq!(
            m.additionals
                .iter()
                .map(|r| format!("{} {}", r.name, r.data))
                .collect::<Vec<_>>(),
            ["web.shop.svc.cluster.local. 10.43.0.20"]
        );
        assert!(is_nxdomain(&answer(
            &ix,
            "_http._udp.web.shop.svc.cluster.local.",
            RecordType::SRV
        )));
        assert!(is_nxdomain(&answer(
            &ix,
            "_https._tcp.web.shop.svc.cluster.local.",
            RecordType::SRV
        )));
        assert!(is_nodata(&answer(
            &ix,
            "_http._tcp.web.shop.svc.cluster.local.",
            RecordType::A
        )));
    }

    #[test]
    fn srv_of_a_headless_service_lists_each_ready_endpoint_with_its_port() {
        let ix = cluster();
        let m = answer(&ix, "_pg._tcp.db.shop.svc.cluster.local.", RecordType::SRV);
        assert_eq!(
            data(&m),
            [
                "SRV 0 33 5433 10-42-0-14.db.shop.svc.cluster.local.",
                "SRV 0 33 5433 db-0.db.shop.svc.cluster.local.",
                "SRV 0 33 5433 db-1.db.shop.svc.cluster.local.",
            ]
        );
        assert_eq!(m.additionals.len(), 3);
    }

    #[test]
    fn ptr_answers_for_cluster_ips_and_endpoint_addresses() {
        let ix = cluster();
        let m = answer(&ix, "20.0.43.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(data(&m), ["PTR web.shop.svc.cluster.local."]);
        let m = answer(&ix, "11.0.42.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(data(&m), ["PTR db-0.db.shop.svc.cluster.local."]);
        let m = answer(&ix, "7.0.42.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(data(&m), ["PTR 10-42-0-7.web.shop.svc.cluster.local."]);
        assert!(matches!(
            ask(&ix, "8.8.8.8.in-addr.arpa.", RecordType::PTR),
            Outcome::Forward
        ));
        assert!(
            matches!(
                ask(&ix, "13.0.42.10.in-addr.arpa.", RecordType::PTR),
                Outcome::Forward
            ),
            "an unready endpoint is not ours"
        );
    }

    #[test]
    fn ptr_of_an_ipv6_service() {
        let mut ix = index();
        add_service(
            &mut ix,
            json!({"metadata": {"name": "v6", "namespace": "d"}, "spec": {
                "clusterIP": "fd00:43::a", "clusterIPs": ["fd00:43::a"]}}),
        );
        let m = answer(&ix, "v6.d.svc.cluster.local.", RecordType::AAAA);
        assert_eq!(data(&m), ["AAAA fd00:43::a"]);
        let ip: Ipv6Addr = "fd00:43::a".parse().unwrap();
        let nibbles: Vec<String> = format!("{:032x}", u128::from(ip))
            .chars()
            .rev()
            .map(|c| c.to_string())
            .collect();
        let m = answer(
            &ix,
            &format!("{}.ip6.arpa.", nibbles.join(".")),
            RecordType::PTR,
        );
        assert_eq!(data(&m), ["PTR v6.d.svc.cluster.local."]);
    }

    #[test]
    fn external_name_is_a_cname_chased_upstream_or_in_the_zone() {
        let ix = cluster();
        match ask(&ix, "ext.shop.svc.cluster.local.", RecordType::A) {
            Outcome::Chase { partial, target } => {
                assert_eq!(data(&partial), ["CNAME db.example.com."]);
                assert_eq!(target.to_ascii(), "db.example.com.");
            }
            other => panic!("{other:?}"),
        }
        let m = answer(&ix, "ext.shop.svc.cluster.local.", RecordType::CNAME);
        assert_eq!(data(&m), ["CNAME db.example.com."]);
        let m = answer(&ix, "alias.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(
            data(&m),
            ["A 10.43.0.20", "CNAME web.shop.svc.cluster.local."]
        );
    }

    #[test]
    fn pod_names_answer_the_address_they_spell() {
        let ix = cluster();
        let m = answer(&ix, "10-42-3-4.anything.pod.cluster.local.", RecordType::A);
        assert_eq!(data(&m), ["A 10.42.3.4"]);
        assert!(is_nodata(&answer(
            &ix,
            "10-42-3-4.anything.pod.cluster.local.",
            RecordType::AAAA
        )));
        assert!(is_nxdomain(&answer(
            &ix,
            "not-an-ip.ns.pod.cluster.local.",
            RecordType::A
        )));
        let m = answer(&ix, "fd00--1.ns.pod.cluster.local.", RecordType::AAAA);
        assert_eq!(data(&m), ["AAAA fd00::1"]);
    }

    #[test]
    fn names_outside_the_zone_are_forwarded() {
        let ix = cluster();
        assert!(matches!(
            ask(&ix, "example.com.", RecordType::A),
            Outcome::Forward
        ));
        assert!(matches!(
            ask(&ix, "local.", RecordType::A),
            Outcome::Forward
        ));
    }

    #[test]
    fn updates_and_deletes_take_effect_incrementally() {
        let mut ix = cluster();
        add_service(
            &mut ix,
            json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": {
                "clusterIP": "10.43.0.21", "clusterIPs": ["10.43.0.21"]}}),
        );
        let m = answer(&ix, "web.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(data(&m), ["A 10.43.0.21"]);
        assert!(matches!(
            ask(&ix, "20.0.43.10.in-addr.arpa.", RecordType::PTR),
            Outcome::Forward
        ));
        ix.delete_service("shop", "web");
        assert!(is_nxdomain(&answer(
            &ix,
            "web.shop.svc.cluster.local.",
            RecordType::A
        )));
        assert!(matches!(
            ask(&ix, "21.0.43.10.in-addr.arpa.", RecordType::PTR),
            Outcome::Forward
        ));
        // The slice of a deleted service still feeds PTR until it goes too.
        ix.delete_slice("shop", "web-abc");
        assert!(matches!(
            ask(&ix, "7.0.42.10.in-addr.arpa.", RecordType::PTR),
            Outcome::Forward
        ));
        // A slice moving from one endpoint set to another.
        add_slice(
            &mut ix,
            json!({"metadata": {"name": "db-1", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "db"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.42.0.99"], "hostname": "db-0"}]}),
        );
        let m = answer(&ix, "db.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(data(&m), ["A 10.42.0.99"]);
        assert!(matches!(
            ask(&ix, "11.0.42.10.in-addr.arpa.", RecordType::PTR),
            Outcome::Forward
        ));
        ix.delete_service("shop", "db");
        ix.delete_slice("shop", "db-1");
        ix.delete_service("shop", "ext");
        ix.delete_service("shop", "alias");
        assert!(ix.namespaces.is_empty() && ix.ptr.is_empty() && ix.slice_owner.is_empty());
        assert!(is_nxdomain(&answer(
            &ix,
            "shop.svc.cluster.local.",
            RecordType::A
        )));
    }

    #[test]
    fn endpoints_in_two_slices_count_once() {
        let mut ix = cluster();
        add_slice(
            &mut ix,
            json!({"metadata": {"name": "db-2", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "db"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.42.0.11"], "hostname": "db-0"},
                              {"addresses": ["10.42.0.15"], "hostname": "db-3"}]}),
        );
        let m = answer(&ix, "db.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(
            data(&m),
            [
                "A 10.42.0.11",
                "A 10.42.0.12",
                "A 10.42.0.14",
                "A 10.42.0.15"
            ]
        );
        ix.delete_slice("shop", "db-2");
        let m = answer(&ix, "11.0.42.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(
            data(&m),
            ["PTR db-0.db.shop.svc.cluster.local."],
            "still in db-1"
        );
    }

    #[test]
    fn another_cluster_domain_is_served_instead() {
        let mut ix = Index::new(ZoneConfig {
            domain: "corp.internal.".into(),
            dns_ip: None,
            ttl: 30,
        });
        add_service(
            &mut ix,
            json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {"clusterIP": "10.43.1.1"}}),
        );
        let m = answer(&ix, "web.d.svc.corp.internal.", RecordType::A);
        assert_eq!(data(&m), ["A 10.43.1.1"]);
        assert_eq!(m.answers[0].ttl, 30);
        assert!(matches!(
            ask(&ix, "web.d.svc.cluster.local.", RecordType::A),
            Outcome::Forward
        ));
    }

    #[test]
    fn bad_requests_get_formerr_notimp_or_badvers() {
        let ix = cluster();
        let mut m = Message::query();
        assert!(
            matches!(ix.answer(&m), Outcome::Answer(r) if r.metadata.response_code == ResponseCode::FormErr)
        );
        m.add_query(Query::query(
            Name::from_ascii("web.shop.svc.cluster.local.").unwrap(),
            RecordType::A,
        ));
        m.metadata.op_code = OpCode::Status;
        assert!(
            matches!(ix.answer(&m), Outcome::Answer(r) if r.metadata.response_code == ResponseCode::NotImp)
        );
        m.metadata.op_code = OpCode::Query;
        let mut e = Edns::new();
        e.set_version(1);
        m.set_edns(e);
        assert!(
            matches!(ix.answer(&m), Outcome::Answer(r) if r.metadata.response_code == ResponseCode::BADVERS)
        );
    }

    #[test]
    fn a_large_answer_is_truncated_over_udp_unless_edns_allows_it() {
        let mut ix = index();
        add_service(
            &mut ix,
            json!({"metadata": {"name": "big", "namespace": "d"}, "spec": {"clusterIP": "None"}}),
        );
        let endpoints: Vec<serde_json::Value> = (1..=60)
            .map(|i| json!({"addresses": [format!("10.42.1.{i}")]}))
            .collect();
        add_slice(
            &mut ix,
            json!({"metadata": {"name": "big-1", "namespace": "d",
                "labels": {"kubernetes.io/service-name": "big"}},
                "addressType": "IPv4", "endpoints": endpoints}),
        );
        let mut req = Message::query();
        req.add_query(Query::query(
            Name::from_ascii("big.d.svc.cluster.local.").unwrap(),
            RecordType::A,
        ));
        let Outcome::Answer(resp) = ix.answer(&req) else {
            panic!()
        };
        assert_eq!(resp.answers.len(), 60);
        // 60 A records take ~1 KB: over 512 without EDNS.
        let wire = encode_udp(&resp, udp_limit(&req)).unwrap();
        assert!(wire.len() <= UDP_MIN);
        let back = Message::from_vec(&wire).unwrap();
        assert!(back.metadata.truncation);
        assert!(back.answers.is_empty());
        assert_eq!(back.queries.len(), 1);
        // With EDNS 1232 it fits whole.
        let mut e = Edns::new();
        e.set_max_payload(4096);
        req.set_edns(e);
        assert_eq!(udp_limit(&req), UDP_MAX);
        let Outcome::Answer(resp) = ix.answer(&req) else {
            panic!()
        };
        let wire = encode_udp(&resp, udp_limit(&req)).unwrap();
        let back = Message::from_vec(&wire).unwrap();
        assert!(!back.metadata.truncation);
        assert_eq!(back.answers.len(), 60);
        assert!(back.edns.is_some(), "an EDNS request gets an OPT back");
    }

    #[test]
    fn reverse_names_parse_only_when_complete() {
        let n = |s: &str| Name::from_ascii(s).unwrap();
        assert_eq!(
            reverse_ip(&n("4.3.2.1.in-addr.arpa.")),
            Some("1.2.3.4".parse().unwrap())
        );
        assert_eq!(reverse_ip(&n("3.2.1.in-addr.arpa.")), None);
        assert_eq!(reverse_ip(&n("04.3.2.1.in-addr.arpa.")), None);
        assert_eq!(reverse_ip(&n("256.3.2.1.in-addr.arpa.")), None);
    }
}
