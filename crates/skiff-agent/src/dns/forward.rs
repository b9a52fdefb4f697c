//! Forwarding what is not the cluster's to the node's upstream resolvers
//! (the host's resolv.conf, loopback stubs left out), over UDP with a TCP
//! retry when the upstream truncates, and a cache of the answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, Query, ResponseCode};
use hickory_proto::rr::RecordType;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers are kept at most this long (CoreDNS's cache: 3600 s for
/// answers, 1800 s for denials).
const MAX_TTL: u32 = 3600;
const MAX_NEGATIVE_TTL: u32 = 1800;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    name: String,
    qtype: u16,
    qclass: u16,
    dnssec_ok: bool,
    checking_disabled: bool,
}

impl Key {
    fn of(req: &Message, q: &Query) -> Key {
        Key {
            name: q.name().to_ascii().to_ascii_lowercase(),
            qtype: u16::from(q.query_type()),
            qclass: u16::from(q.query_class()),
            dnssec_ok: req
                .edns
                .as_ref()
                .map(|e| e.flags().dnssec_ok)
                .unwrap_or(false),
            checking_disabled: req.metadata.checking_disabled,
        }
    }
}

struct Entry {
    response: Message,
    stored: Instant,
    ttl: u32,
}

/// A bounded cache of upstream answers keyed by question.
pub struct Cache {
    entries: HashMap<Key, Entry>,
    capacity: usize,
}

impl Cache {
    pub fn new(capacity: usize) -> Cache {
        Cache {
            entries: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The cached answer to `req`, with its TTLs aged and `req`'s id and
    /// question (the asker's letter case).
    pub fn get(&mut self, req: &Message, now: Instant) -> Option<Message> {
        let q = req.queries.first()?;
        let key = Key::of(req, q);
        let e = self.entries.get(&key)?;
        let age = now.saturating_duration_since(e.stored).as_secs() as u32;
        if age >= e.ttl {
            self.entries.remove(&key);
            return None;
        }
        let mut m = e.response.clone();
        m.metadata.id = req.metadata.id;
        m.queries = req.queries.clone();
        for r in m
            .answers
            .iter_mut()
            .chain(m.authorities.iter_mut())
            .chain(m.additionals.iter_mut())
        {
            r.ttl = r.ttl.saturating_sub(age);
        }
        Some(m)
    }

    /// Keeps `resp` for as long as its records allow: the smallest answer
    /// TTL, or for a denial the SOA's negative TTL. Failures and truncated
    /// answers are not kept.
    pub fn put(&mut self, req: &Message, resp: &Message, now: Instant) {
        let Some(q) = req.queries.first() else { return };
        if resp.metadata.truncation {
            return;
        }
        let ttl = match resp.metadata.response_code {
            ResponseCode::NoError if !resp.answers.is_empty() => resp
                .answers
                .iter()
                .map(|r| r.ttl)
                .min()
                .unwrap_or(0)
                .min(MAX_TTL),
            ResponseCode::NoError | ResponseCode::NXDomain => resp
                .authorities
                .iter()
                .find_map(|r| match &r.data {
                    hickory_proto::rr::RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                    _ => None,
                })
                .unwrap_or(0)
                .min(MAX_NEGATIVE_TTL),
            _ => 0,
        };
        if ttl == 0 {
            return;
        }
        if self.entries.len() >= self.capacity {
            self.entries.retain(|_, e| {
                now.saturating_duration_since(e.stored).as_secs() < u64::from(e.ttl)
            });
            if self.entries.len() >= self.capacity {
                // Still full of live answers: drop an arbitrary half.
                let mut n = 0;
                self.entries.retain(|_, _| {
                    n += 1;
                    n % 2 == 0
                });
            }
        }
        self.entries.insert(
            Key::of(req, q),
            Entry {
                response: resp.clone(),
                stored: now,
                ttl,
            },
        );
    }
}

/// Upstream resolvers and the cache in front of them.
pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    timeout: Duration,
    cache: Mutex<Cache>,
}

impl Forwarder {
    pub fn new(upstreams: Vec<SocketAddr>, timeout: Duration, capacity: usize) -> Forwarder {
        Forwarder {
            upstreams,
            timeout,
            cache: Mutex::new(Cache::new(capacity)),
        }
    }

    /// Upstreams from nameserver lines (port 53).
    pub fn upstreams_of(nameservers: &[String]) -> Vec<SocketAddr> {
        nameservers
            .iter()
            .filter_map(|n| n.parse::<std::net::IpAddr>().ok())
            .filter(|ip| !ip.is_loopback())
            .map(|ip| SocketAddr::new(ip, 53))
            .collect()
    }

    pub fn cached(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// A cached answer, without going upstream.
    pub fn from_cache(&self, req: &Message) -> Option<Message> {
        self.cache.lock().ok()?.get(req, Instant::now())
    }

    /// The upstream answer to `req` (its id, its question), from the cache
    /// when fresh; SERVFAIL when no upstream answers.
    pub async fn resolve(&self, req: &Message) -> Message {
        if let Some(m) = self.from_cache(req) {
            return m;
        }
        let mut out = Message::response(req.metadata.id, req.metadata.op_code);
        out.metadata.recursion_desired = req.metadata.recursion_desired;
        out.metadata.recursion_available = true;
        out.queries = req.queries.clone();
        out.metadata.response_code = ResponseCode::ServFail;
        let mut up = req.clone();
        up.metadata.id = rand::random();
        up.metadata.recursion_desired = true;
        // Ask for large answers; the client gets them truncated to its own
        // size by the server.
        let mut edns = req.edns.clone().unwrap_or_default();
        edns.set_max_payload(super::records::UDP_MAX as u16);
        up.edns = Some(edns);
        let Ok(wire) = up.to_vec() else {
            return out;
        };
        for server in &self.upstreams {
            match tokio::time::timeout(self.timeout, exchange(*server, &wire, up.metadata.id)).await
            {
                Ok(Ok(mut m)) => {
                    m.metadata.id = req.metadata.id;
                    m.queries = req.queries.clone();
                    if req.edns.is_none() {
                        m.edns = None;
                    } else if let Some(e) = m.edns.as_mut() {
                        e.set_max_payload(super::records::UDP_MAX as u16);
                    }
                    if let Ok(mut c) = self.cache.lock() {
                        c.put(req, &m, Instant::now());
                    }
                    return m;
                }
                Ok(Err(e)) => tracing::debug!(%server, error = %e, "upstream DNS failed"),
                Err(_) => tracing::debug!(%server, "upstream DNS timed out"),
            }
        }
        out
    }

    /// The records of `target` of type `qtype`, for following a CNAME.
    pub async fn lookup(
        &self,
        req: &Message,
        target: hickory_proto::rr::Name,
        qtype: RecordType,
    ) -> Message {
        let mut q = Message::query();
        q.metadata.recursion_desired = true;
        q.metadata.id = req.metadata.id;
        q.add_query(Query::query(target, qtype));
        if req.edns.is_some() {
            q.set_edns(Edns::new());
        }
        self.resolve(&q).await
    }
}

/// One question to one upstream: UDP, then TCP when the answer is cut.
async fn exchange(server: SocketAddr, wire: &[u8], id: u16) -> std::io::Result<Message> {
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("valid")
    } else {
        "[::]:0".parse().expect("valid")
    };
    let sock = tokio::net::UdpSocket::bind(bind).await?;
    sock.connect(server).await?;
    sock.send(wire).await?;
    let mut buf = vec![0u8; 4096];
    loop {
        let n = sock.recv(&mut buf).await?;
        let Ok(m) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if m.metadata.id != id {
            continue; // a stray or spoofed answer
        }
        if !m.metadata.truncation {
            return Ok(m);
        }
        break;
    }
    let mut tcp = tokio::net::TcpStream::connect(server).await?;
    let mut framed = Vec::with_capacity(wire.len() + 2);
    framed.extend_from_slice(&(wire.len() as u16).to_be_bytes());
    framed.extend_from_slice(wire);
    tcp.write_all(&framed).await?;
    let len = tcp.read_u16().await? as usize;
    let mut buf = vec![0u8; len];
    tcp.read_exact(&mut buf).await?;
    Message::from_vec(&buf)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::{A, SOA};
    use hickory_proto::rr::{Name, RData, Record};

    fn req(name: &str) -> Message {
        let mut m = Message::query();
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        m
    }

    #[test]
    fn answers_are_cached_for_their_smallest_ttl_and_age() {
        let mut c = Cache::new(10);
        let r = req("example.com.");
        let mut resp = Message::response(r.metadata.id, r.metadata.op_code);
        resp.queries = r.queries.clone();
        let n = Name::from_ascii("example.com.").unwrap();
        resp.add_answer(Record::from_rdata(
            n.clone(),
            60,
            RData::A(A::new(1, 2, 3, 4)),
        ));
        resp.add_answer(Record::from_rdata(n, 30, RData::A(A::new(1, 2, 3, 5))));
        let t0 = Instant::now();
        c.put(&r, &resp, t0);
        let mut again = req("EXAMPLE.com.");
        again.metadata.id = 777;
        let hit = c.get(&again, t0 + Duration::from_secs(10)).expect("cached");
        assert_eq!(hit.metadata.id, 777);
        assert_eq!(
            hit.queries[0].name().to_ascii(),
            "EXAMPLE.com.",
            "the asker's case"
        );
        assert_eq!(
            hit.answers.iter().map(|r| r.ttl).collect::<Vec<_>>(),
            [50, 20]
        );
        assert!(
            c.get(&again, t0 + Duration::from_secs(30)).is_none(),
            "expired"
        );
        assert!(c.is_empty());
    }

    #[test]
    fn denials_are_cached_for_the_soa_minimum_and_failures_not_at_all() {
        let mut c = Cache::new(10);
        let r = req("nope.example.");
        let mut resp = Message::response(r.metadata.id, r.metadata.op_code);
        resp.metadata.response_code = ResponseCode::NXDomain;
        let soa = SOA::new(
            Name::from_ascii("ns.example.").unwrap(),
            Name::from_ascii("h.example.").unwrap(),
            1,
            1,
            1,
            1,
            15,
        );
        resp.add_authority(Record::from_rdata(
            Name::from_ascii("example.").unwrap(),
            300,
            RData::SOA(soa),
        ));
        let t0 = Instant::now();
        c.put(&r, &resp, t0);
        assert!(c.get(&r, t0 + Duration::from_secs(14)).is_some());
        assert!(c.get(&r, t0 + Duration::from_secs(15)).is_none());
        resp.metadata.response_code = ResponseCode::ServFail;
        c.put(&r, &resp, t0);
        assert!(c.is_empty());
    }

    #[test]
    fn a_full_cache_makes_room() {
        let mut c = Cache::new(4);
        let t0 = Instant::now();
        for i in 0..20 {
            let r = req(&format!("n{i}.example."));
            let mut resp = Message::response(r.metadata.id, r.metadata.op_code);
            resp.add_answer(Record::from_rdata(
                Name::from_ascii(format!("n{i}.example.")).unwrap(),
                60,
                RData::A(A::new(1, 1, 1, 1)),
            ));
            c.put(&r, &resp, t0);
            assert!(c.len() <= 4);
        }
    }
}
