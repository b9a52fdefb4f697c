//! The proxy's watch loop against a real API server and the real kernel
//! (root, nft): the table follows Services and EndpointSlices as they are
//! created, changed and deleted; a Service labelled
//! `skiff.io/node-local=true` (the cluster DNS) is never programmed; a
//! Service without endpoints rejects; the rules stay when the proxy stops.
//! Its own table and the benchmarking ranges (198.18.0.0/15) keep it apart
//! from everything else on the machine.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skiff_agent::proxy::{self, model::NodeFacts, ProxyOptions};

fn list(table: &str) -> String {
    // The main table and its service shards, each listed until nft
    // succeeds (a listing racing the proxy's transaction can fail).
    proxy::nft::all_tables(table)
        .iter()
        .map(|t| {
            for _ in 0..50 {
                let o = Command::new(proxy::nft::tool("nft"))
                    .args(["list", "table", "ip", t])
                    .output()
                    .unwrap();
                if o.status.success() {
                    return String::from_utf8_lossy(&o.stdout).to_string();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            panic!("nft could not list table {t}");
        })
        .collect()
}

async fn until(what: &str, table: &str, f: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = list(table);
        if f(&t) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{t}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the listing DNATs to `ip:port`: a rule of its own (a lone
/// endpoint) or an element of an endpoint map.
fn serves(t: &str, ip: &str, port: u16) -> bool {
    t.contains(&format!("dnat to {ip}:{port}")) || t.contains(&format!(": {ip} . {port}"))
}

fn service(name: &str, labels: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }))
    .unwrap()
}

fn slice(service: &str, ready: &[(&str, bool)]) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{service}-1"), "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": ready.iter().map(|(ip, r)| json!({"addresses": [ip], "conditions": {"ready": r}})).collect::<Vec<_>>(),
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_follows_services_and_slices_and_skips_node_local_services() {
    if !Command::new(skiff_agent::proxy::nft::tool("nft"))
        .args(["list", "tables"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
    {
        eprintln!("skipping: nft is not usable here (needs root and nftables)");
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let store =
        skiff_store::RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let store: Arc<dyn skiff_store::Store> = store;
    let config = skiff_apiserver::Config {
        registry: skiff_apiserver::registry::RegistryConfig {
            service_cidr: ("198.18.0.0".parse().unwrap(), 16),
            ..Default::default()
        },
        ..Default::default()
    };
    let api = skiff_apiserver::ApiServer::start(store, config)
        .await
        .unwrap();
    let client = skiff_kube::in_process(&api, "proxy-test");
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();

    let web = services
        .create(&pp, &service("web", json!({})))
        .await
        .unwrap();
    let web_ip = web.spec.unwrap().cluster_ip.unwrap();
    slices
        .create(
            &pp,
            &slice("web", &[("198.19.0.1", true), ("198.19.0.2", true)]),
        )
        .await
        .unwrap();
    let dns = services
        .create(&pp, &service("dns", json!({"skiff.io/node-local": "true"})))
        .await
        .unwrap();
    let dns_ip = dns.spec.unwrap().cluster_ip.unwrap();
    slices
        .create(&pp, &slice("dns", &[("198.19.0.53", true)]))
        .await
        .unwrap();
    let lonely = services
        .create(&pp, &service("lonely", json!({})))
        .await
        .unwrap();
    let lonely_ip = lonely.spec.unwrap().cluster_ip.unwrap();

    let table = format!("skiff-watch-test-{}", std::process::id());
    let options = ProxyOptions {
        node: NodeFacts {
            name: "n1".into(),
            ips: vec!["198.18.255.1".parse().unwrap()],
            cluster_cidr: Some(("198.19.0.0".parse().unwrap(), 16)),
        },
        table: table.clone(),
    };
    let task = tokio::spawn(proxy::run(client.clone(), options));

    // The proxy's first list may be served from the API server's cache a
    // moment behind the writes above (resourceVersion 0, as informers
    // list); the rest arrives by the watch: wait for all of it.
    let t = until("both endpoints of web, and lonely", &table, |t| {
        serves(t, "198.19.0.1", 8080)
            && serves(t, "198.19.0.2", 8080)
            && t.contains(&format!("{lonely_ip} . tcp . 80"))
    })
    .await;
    assert!(
        t.contains(&format!(
            "{web_ip} . tcp . 80 : goto svc-default/web/tcp/http"
        )),
        "{t}"
    );
    assert!(
        t.contains(&format!("{lonely_ip} . tcp . 80 : goto reject-chain")),
        "{t}"
    );
    assert!(
        !t.contains(&dns_ip),
        "the node-local service must not be programmed:\n{t}"
    );
    assert!(!t.contains("198.19.0.53"), "{t}");

    // One endpoint turns unready: it leaves the service chain.
    let mut s = slices.get("web-1").await.unwrap();
    s.endpoints[1].conditions.as_mut().unwrap().ready = Some(false);
    slices.replace("web-1", &pp, &s).await.unwrap();
    until("web's second endpoint gone", &table, |t| {
        serves(t, "198.19.0.1", 8080) && !serves(t, "198.19.0.2", 8080)
    })
    .await;

    // The lonely service gets an endpoint: no longer rejected.
    slices
        .create(&pp, &slice("lonely", &[("198.19.0.9", true)]))
        .await
        .unwrap();
    until("lonely served", &table, |t| {
        t.contains(&format!(
            "{lonely_ip} . tcp . 80 : goto svc-default/lonely/tcp/http"
        ))
    })
    .await;

    // web is deleted: everything of it goes.
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let t = until("web gone", &table, |t| !t.contains("svc-default/web/")).await;
    assert!(!t.contains(&format!("{web_ip} ")), "{t}");

    // Fail-static: the rules stay when the proxy stops.
    task.abort();
    let _ = task.await;
    assert!(list(&table).contains("svc-default/lonely/tcp/http"));
    proxy::nft::delete_table(&table).unwrap();
}
