//! B9 part 1: service programming latency of the agent's proxy (root,
//! nftables). A real API server on a temporary store in this process
//! (service range 198.18.0.0/16, endpoints in 198.19.0.0/16: the
//! benchmarking ranges, so nothing on the machine is reached), N Services
//! with one EndpointSlice of E hollow endpoints each, and the proxy
//! programming its own table (`skiff-bench-proxy`).
//!
//! Reports the full resync at start (the first transaction, every service)
//! and p50/p99 over C changes of the time from an EndpointSlice write (one
//! endpoint turning unready or ready again) to the end of the nftables
//! transaction that serves it, then checks the kernel's chain of the last
//! changed service.
//!
//! `BENCH_CHANGE=move`: each change moves a service's first endpoint to
//! another address and back instead (the endpoint count stays: with the
//! netlink writer's endpoint maps, only map elements change).
//!
//! Both writers are measured one after the other on the same services:
//! skiff's netlink batches and the `nft` binary (`BENCH_WRITERS=netlink,nft`
//! by default; `BENCH_WRITERS=nft` for one).
//!
//! `cargo run --release -p skiff-agent --example bench_proxy -- 10000 10 200`

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use serde_json::json;
use skiff_agent::proxy::{self, model::NodeFacts, ProxyOptions};

const TABLE: &str = "skiff-bench-proxy";

/// Service `i`'s slice: `eps` endpoints, one of them unready, or the
/// first one `moved` to another address (the same number of endpoints).
fn slice(i: usize, eps: usize, unready: Option<usize>, moved: bool) -> EndpointSlice {
    let endpoints: Vec<_> = (0..eps)
        .map(|e| {
            let n = i * eps + e;
            let address = if moved && e == 0 {
                format!("198.19.{}.{}", 250 + (i / 250) % 5, i % 250 + 1)
            } else {
                format!("198.19.{}.{}", (n / 250) % 250, n % 250 + 1)
            };
            json!({
                "addresses": [address],
                "conditions": {"ready": Some(e) != unready},
                "nodeName": "bench-node",
            })
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-1"), "namespace": "default",
            "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: SERVICES ENDPOINTS CHANGES"))
        .collect();
    let services = args.first().copied().unwrap_or(1000);
    let eps = args.get(1).copied().unwrap_or(10);
    let changes = args.get(2).copied().unwrap_or(200);
    // Which writers to measure, in order (default: both, side by side).
    let backends: Vec<String> = std::env::var("BENCH_WRITERS")
        .unwrap_or_else(|_| "netlink,nft".into())
        .split(',')
        .map(str::to_string)
        .collect();

    let dir = tempfile::tempdir()?;
    let store = skiff_store::RedbStore::open(&dir.path().join("s.redb"), Default::default())?;
    let store: Arc<dyn skiff_store::Store> = store;
    let config = skiff_apiserver::Config {
        registry: skiff_apiserver::registry::RegistryConfig {
            service_cidr: ("198.18.0.0".parse()?, 16),
            ..Default::default()
        },
        ..Default::default()
    };
    let api = skiff_apiserver::ApiServer::start(store, config).await?;
    let client = skiff_kube::in_process(&api, "bench");
    let svc_api: Api<Service> = Api::namespaced(client.clone(), "default");
    let slice_api: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");

    let t = Instant::now();
    futures::stream::iter(0..services)
        .map(|i| {
            let (svc_api, slice_api) = (svc_api.clone(), slice_api.clone());
            async move {
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": format!("svc-{i}")},
                    "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
                }))
                .unwrap();
                svc_api.create(&PostParams::default(), &svc).await.unwrap();
                slice_api
                    .create(&PostParams::default(), &slice(i, eps, None, false))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    eprintln!(
        "created {services} services × {eps} endpoints in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let mut unready = vec![false; services];
    let mut seed = 0x9E3779B97F4A7C15u64;
    for backend in &backends {
        run(
            &client,
            &slice_api,
            backend,
            (services, eps, changes),
            &mut unready,
            &mut seed,
        )
        .await?;
    }
    Ok(())
}

/// Starts the proxy writing through `backend` ("netlink" or "nft"),
/// measures its full load and `changes` endpoint changes, checks the
/// kernel, stops it and deletes its tables.
async fn run(
    client: &kube::Client,
    slice_api: &Api<EndpointSlice>,
    backend: &str,
    (services, eps, changes): (usize, usize, usize),
    unready: &mut [bool],
    seed: &mut u64,
) -> anyhow::Result<()> {
    let moving = std::env::var("BENCH_CHANGE").as_deref() == Ok("move");
    // The proxy picks its writer from the environment when it starts.
    std::env::set_var("SKIFF_NFT_BACKEND", backend);
    println!("--- writer: {backend}");
    let (tx, mut rx) = tokio::sync::watch::channel(proxy::Sync::default());
    let options = ProxyOptions {
        node: NodeFacts {
            name: "bench-node".into(),
            ips: vec![],
            cluster_cidr: Some(("198.19.0.0".parse()?, 16)),
        },
        table: TABLE.into(),
    };
    let t = Instant::now();
    let proxy_task = tokio::spawn(proxy::run_with_progress(client.clone(), options, tx));
    rx.wait_for(|s| s.generation >= 1).await?;
    let first = *rx.borrow();
    println!(
        "full resync: {services} services × {eps} endpoints: {:.0} ms, of which nft {:.0} ms (from proxy start incl. initial lists: {:.0} ms)",
        first.elapsed.as_secs_f64() * 1000.0,
        first.nft.as_secs_f64() * 1000.0,
        t.elapsed().as_secs_f64() * 1000.0
    );

    let mut lat = vec![];
    let mut txn = vec![];
    let mut nft = vec![];
    let mut last = 0;
    for _ in 0..changes {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let i = (*seed % services as u64) as usize;
        unready[i] = !unready[i];
        let mut body = if moving {
            slice(i, eps, None, unready[i])
        } else {
            slice(i, eps, unready[i].then_some(0), false)
        };
        body.metadata.resource_version = slice_api
            .get(&format!("svc-{i}-1"))
            .await?
            .metadata
            .resource_version;
        let generation = rx.borrow().generation;
        let t = Instant::now();
        slice_api
            .replace(&format!("svc-{i}-1"), &PostParams::default(), &body)
            .await?;
        tokio::time::timeout(
            Duration::from_secs(30),
            rx.wait_for(|s| s.generation > generation),
        )
        .await??;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        txn.push(rx.borrow().elapsed.as_secs_f64() * 1000.0);
        nft.push(rx.borrow().nft.as_secs_f64() * 1000.0);
        last = i;
    }
    println!(
        "endpoint change -> rules in the kernel over {changes} changes: p50 {:.1} ms, p99 {:.1} ms (proxy's sync p50 {:.1}/p99 {:.1} ms, of which nft p50 {:.1}/p99 {:.1} ms)",
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut txn, 0.5),
        pct(&mut txn, 0.99),
        pct(&mut nft, 0.5),
        pct(&mut nft, 0.99)
    );
    let out = std::process::Command::new(skiff_agent::proxy::nft::tool("nft"))
        .args([
            "list",
            "chain",
            "ip",
            &skiff_agent::proxy::nft::shard_table(
                TABLE,
                skiff_agent::proxy::rules::shard_of("default", &format!("svc-{last}")),
            ),
            &format!("svc-default/svc-{last}/tcp/http"),
        ])
        .output()?;
    let chain = String::from_utf8_lossy(&out.stdout);
    let want = if unready[last] && !moving {
        eps - 1
    } else {
        eps
    };
    assert!(
        chain.contains(&format!("numgen random mod {want} ")),
        "the kernel's chain does not show the last change:\n{chain}"
    );
    println!("kernel check: svc-{last} spreads over {want} endpoints as written");
    proxy_task.abort();
    let _ = proxy_task.await;
    skiff_agent::proxy::nft::delete_table(TABLE)?;
    Ok(())
}
