//! The agent's DNS responder over real UDP and TCP sockets, fed by its
//! watches of a real API server: what a resolver sees as Services and
//! EndpointSlices come, change and go, forwarding to an upstream (a fake
//! one on loopback) with a cache, truncation over UDP and the TCP retry.
//! Needs no root: it listens on a loopback port, not the cluster address.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skiff_agent::dns::forward::Forwarder;
use skiff_agent::dns::records::{Index, ZoneConfig};
use skiff_agent::dns::server::{Metrics, Responder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A fake upstream resolver: `*.example.` A 192.0.2.x with TTL 60,
/// everything else NXDOMAIN; counts the queries it gets.
async fn upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                return;
            };
            c.fetch_add(1, Ordering::SeqCst);
            let req = Message::from_vec(&buf[..n]).unwrap();
            let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
            resp.metadata.recursion_available = true;
            resp.queries = req.queries.clone();
            let q = &req.queries[0];
            let name = q.name().to_ascii().to_ascii_lowercase();
            if name.ends_with(".example.") && q.query_type() == RecordType::A {
                resp.add_answer(Record::from_rdata(
                    q.name().clone(),
                    60,
                    RData::A(A::new(192, 0, 2, 7)),
                ));
            } else {
                resp.metadata.response_code = ResponseCode::NXDomain;
            }
            let _ = sock.send_to(&resp.to_vec().unwrap(), peer).await;
        }
    });
    (addr, count)
}

fn query(name: &str, t: RecordType, edns: bool) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
    }
    m
}

async fn udp(server: SocketAddr, m: &Message) -> Message {
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(&m.to_vec().unwrap(), server).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), sock.recv_from(&mut buf))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    let r = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(r.metadata.id, m.metadata.id);
    r
}

async fn tcp(server: SocketAddr, m: &Message) -> Message {
    let mut conn = tokio::net::TcpStream::connect(server).await.unwrap();
    let wire = m.to_vec().unwrap();
    conn.write_all(&(wire.len() as u16).to_be_bytes())
        .await
        .unwrap();
    conn.write_all(&wire).await.unwrap();
    let len = conn.read_u16().await.unwrap() as usize;
    let mut buf = vec![0u8; len];
    conn.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

/// Answer records as `TYPE data`, sorted.
fn data(m: &Message) -> Vec<String> {
    let mut v: Vec<String> = m
        .answers
        .iter()
        .map(|r| format!("{} {}", r.record_type(), r.data))
        .collect();
    v.sort();
    v
}

/// Asks until the answer is what `want` accepts (watches take a moment).
async fn until(
    server: SocketAddr,
    name: &str,
    t: RecordType,
    what: &str,
    want: impl Fn(&Message) -> bool,
) -> Message {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = udp(server, &query(name, t, false)).await;
        if want(&r) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {name} {t} still answers {:?} {:?}",
            r.metadata.response_code,
            data(&r)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Dns {
    _cluster: skiff_kube::testing::TestCluster,
    client: kube::Client,
    addr: SocketAddr,
    upstream_queries: Arc<AtomicUsize>,
    metrics: SocketAddr,
}

async fn start() -> Dns {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = skiff_kube::testing::TestCluster::start().await.unwrap();
    let client = cluster.client("node:dns-test");
    let (up, upstream_queries) = upstream().await;
    let responder = Arc::new(Responder {
        index: Arc::new(RwLock::new(Index::new(ZoneConfig {
            domain: "cluster.local".into(),
            dns_ip: Some("10.43.0.10".parse().unwrap()),
            ttl: 5,
        }))),
        forwarder: Arc::new(Forwarder::new(vec![up], Duration::from_secs(2), 100)),
        metrics: Arc::new(Metrics::default()),
    });
    // A free port for UDP and TCP alike, and one for metrics.
    let (addr, metrics) = loop {
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        if std::net::TcpListener::bind(addr).is_ok() {
            let m = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            break (addr, m.local_addr().unwrap());
        }
    };
    tokio::spawn(skiff_agent::dns::serve(
        client.clone(),
        responder,
        addr,
        Some(metrics),
    ));
    // Served once the kube-dns Service (created at API server start) shows.
    until(
        addr,
        "kube-dns.kube-system.svc.cluster.local.",
        RecordType::A,
        "kube-dns",
        |r| data(r) == ["A 10.43.0.10"],
    )
    .await;
    Dns {
        _cluster: cluster,
        client,
        addr,
        upstream_queries,
        metrics,
    }
}

#[tokio::test]
async fn services_and_slices_show_in_dns_as_they_change() {
    let d = start().await;
    let svcs: Api<Service> = Api::namespaced(d.client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(d.client.clone(), "default");
    let pp = PostParams::default();
    let web: Service = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"ports": [{"name": "http", "port": 80}], "selector": {"app": "web"}}}))
    .unwrap();
    let web = svcs.create(&pp, &web).await.unwrap();
    let ip = web.spec.unwrap().cluster_ip.unwrap();
    until(
        d.addr,
        "web.default.svc.cluster.local.",
        RecordType::A,
        "a new service",
        |r| data(r) == [format!("A {ip}")],
    )
    .await;
    let r = udp(
        d.addr,
        &query(
            "_http._tcp.web.default.svc.cluster.local.",
            RecordType::SRV,
            false,
        ),
    )
    .await;
    assert_eq!(data(&r), ["SRV 0 100 80 web.default.svc.cluster.local."]);
    let r = udp(
        d.addr,
        &query("web.default.svc.cluster.local.", RecordType::AAAA, false),
    )
    .await;
    assert!(
        r.answers.is_empty() && r.metadata.response_code == ResponseCode::NoError,
        "NODATA"
    );
    let r = udp(
        d.addr,
        &query("nope.default.svc.cluster.local.", RecordType::A, false),
    )
    .await;
    assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);

    // A headless service and its slice: a StatefulSet-like pod name.
    let db: Service = serde_json::from_value(json!({"metadata": {"name": "db"},
        "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}}))
    .unwrap();
    svcs.create(&pp, &db).await.unwrap();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "db-x", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.42.0.11"], "hostname": "db-0", "conditions": {"ready": true}},
            {"addresses": ["10.42.0.12"], "hostname": "db-1", "conditions": {"ready": false}}],
        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}))
    .unwrap();
    slices.create(&pp, &slice).await.unwrap();
    until(
        d.addr,
        "db.default.svc.cluster.local.",
        RecordType::A,
        "headless",
        |r| data(r) == ["A 10.42.0.11"],
    )
    .await;
    let r = udp(
        d.addr,
        &query("db-0.db.default.svc.cluster.local.", RecordType::A, false),
    )
    .await;
    assert_eq!(data(&r), ["A 10.42.0.11"]);
    let r = udp(
        d.addr,
        &query("11.0.42.10.in-addr.arpa.", RecordType::PTR, false),
    )
    .await;
    assert_eq!(data(&r), ["PTR db-0.db.default.svc.cluster.local."]);
    // The second pod turns ready.
    slices
        .patch(
            "db-x",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": [
                {"addresses": ["10.42.0.11"], "hostname": "db-0", "conditions": {"ready": true}},
                {"addresses": ["10.42.0.12"], "hostname": "db-1", "conditions": {"ready": true}}]})),
        )
        .await
        .unwrap();
    until(
        d.addr,
        "db.default.svc.cluster.local.",
        RecordType::A,
        "readiness",
        |r| data(r) == ["A 10.42.0.11", "A 10.42.0.12"],
    )
    .await;
    let r = udp(
        d.addr,
        &query(
            "_pg._tcp.db.default.svc.cluster.local.",
            RecordType::SRV,
            false,
        ),
    )
    .await;
    assert_eq!(
        data(&r),
        [
            "SRV 0 50 5432 db-0.db.default.svc.cluster.local.",
            "SRV 0 50 5432 db-1.db.default.svc.cluster.local."
        ]
    );

    // Deleting a service takes its names away.
    svcs.delete("web", &DeleteParams::default()).await.unwrap();
    until(
        d.addr,
        "web.default.svc.cluster.local.",
        RecordType::A,
        "deleted",
        |r| r.metadata.response_code == ResponseCode::NXDomain,
    )
    .await;
}

#[tokio::test]
async fn other_names_go_upstream_once_and_external_names_are_followed() {
    let d = start().await;
    let r = udp(d.addr, &query("www.example.", RecordType::A, false)).await;
    assert_eq!(data(&r), ["A 192.0.2.7"]);
    assert!(!r.metadata.authoritative);
    assert_eq!(d.upstream_queries.load(Ordering::SeqCst), 1);
    let r = udp(d.addr, &query("WWW.example.", RecordType::A, false)).await;
    assert_eq!(data(&r), ["A 192.0.2.7"]);
    assert_eq!(r.queries[0].name().to_ascii(), "WWW.example.");
    assert!(r.answers[0].ttl <= 60);
    assert_eq!(
        d.upstream_queries.load(Ordering::SeqCst),
        1,
        "the second answer came from the cache"
    );
    let r = udp(d.addr, &query("nothing.invalid.", RecordType::A, false)).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);

    let svcs: Api<Service> = Api::namespaced(d.client.clone(), "default");
    let ext: Service = serde_json::from_value(json!({"metadata": {"name": "ext"},
        "spec": {"type": "ExternalName", "externalName": "db.example"}}))
    .unwrap();
    svcs.create(&PostParams::default(), &ext).await.unwrap();
    let r = until(
        d.addr,
        "ext.default.svc.cluster.local.",
        RecordType::A,
        "externalname",
        |r| !r.answers.is_empty(),
    )
    .await;
    assert_eq!(data(&r), ["A 192.0.2.7", "CNAME db.example."]);

    let text = reqwest_metrics(d.metrics).await;
    assert!(
        text.contains("skiff_dns_answers_total{source=\"cache\"} 1"),
        "{text}"
    );
}

/// GET /metrics without an HTTP client crate.
async fn reqwest_metrics(addr: SocketAddr) -> String {
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut s = String::new();
    c.read_to_string(&mut s).await.unwrap();
    s
}

#[tokio::test]
async fn a_large_answer_is_truncated_over_udp_and_whole_over_tcp() {
    let d = start().await;
    let svcs: Api<Service> = Api::namespaced(d.client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(d.client.clone(), "default");
    let pp = PostParams::default();
    let big: Service =
        serde_json::from_value(json!({"metadata": {"name": "big"}, "spec": {"clusterIP": "None"}}))
            .unwrap();
    svcs.create(&pp, &big).await.unwrap();
    let endpoints: Vec<serde_json::Value> = (1..=60)
        .map(|i| json!({"addresses": [format!("10.42.1.{i}")]}))
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "big-1", "labels": {"kubernetes.io/service-name": "big"}},
        "addressType": "IPv4", "endpoints": endpoints}))
    .unwrap();
    slices.create(&pp, &slice).await.unwrap();
    let r = until(
        d.addr,
        "big.default.svc.cluster.local.",
        RecordType::A,
        "60 endpoints",
        |r| r.metadata.truncation,
    )
    .await;
    assert!(
        r.answers.is_empty(),
        "a truncated answer carries no records"
    );
    let r = udp(
        d.addr,
        &query("big.default.svc.cluster.local.", RecordType::A, true),
    )
    .await;
    assert!(
        !r.metadata.truncation,
        "60 A records (~1 KB) fit in EDNS's 1232 bytes"
    );
    assert_eq!(r.answers.len(), 60);
    let r = tcp(
        d.addr,
        &query("big.default.svc.cluster.local.", RecordType::A, false),
    )
    .await;
    assert!(!r.metadata.truncation);
    assert_eq!(r.answers.len(), 60);
    let r = tcp(d.addr, &query("www.example.", RecordType::A, false)).await;
    assert_eq!(data(&r), ["A 192.0.2.7"], "forwarding over TCP too");
}

/// Needs root (CI runs as root): the node-local address on `skiff-dns0`.
#[tokio::test]
async fn the_dns_address_goes_on_skiff_dns0_and_comes_off_with_teardown() {
    use skiff_agent::dns::link;
    let n = std::process::id() % 200;
    let ip: std::net::IpAddr = format!("10.251.{n}.10").parse().unwrap();
    link::ensure(ip).await.expect("ensure (needs root)");
    link::ensure(ip).await.expect("ensure twice is fine");
    assert!(link::list().await.unwrap().contains(&ip));
    // A server can bind the address at once.
    let s = tokio::net::UdpSocket::bind((ip, 0))
        .await
        .expect("bind on skiff-dns0");
    drop(s);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(skiff_agent::dns::ADDRESS_FILE),
        ip.to_string(),
    )
    .unwrap();
    skiff_agent::dns::teardown(dir.path()).await.unwrap();
    assert!(!link::list().await.unwrap().contains(&ip));
    assert!(!dir.path().join(skiff_agent::dns::ADDRESS_FILE).exists());
    skiff_agent::dns::teardown(dir.path())
        .await
        .expect("nothing to do is fine");
}
