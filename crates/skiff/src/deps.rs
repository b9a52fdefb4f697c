//! `skiff deps`: the declared-dependency graph of a cluster, read through
//! its API (any kubeconfig that may list pods, Services, EndpointSlices,
//! namespaces, ReplicaSets, Jobs and NetworkPolicies) and decided by the
//! same code the dependencies controller runs
//! (`skiff_helpers::dependencies::graph`).
//!
//! Each edge is a workload's declared dependency, in one state: `missing`
//! (no such Service), `waiting` (no ready endpoint), `ready`, or
//! `enforced` (ready, in an enforcing namespace, with its generated
//! NetworkPolicy in place); edges inside a cycle are marked. A workload
//! whose pods made connections their declaration does not name (counted
//! by the nodes outside enforcing namespaces) gets `violated` rows.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ListParams};
use serde_json::{json, Value};
use skiff_helpers::dependencies::graph::{Edge, Graph, Inputs, State};
use skiff_helpers::dependencies::UNDECLARED_CONDITION as UNDECLARED;

#[derive(Args, Clone)]
pub struct DepsArgs {
    /// Only workloads of this namespace and the dependencies they name,
    /// or that name its Services.
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// text (a table), json, or dot (Graphviz).
    #[arg(short = 'o', long, default_value = "text")]
    output: String,
    /// The kubeconfig (default: $KUBECONFIG, ~/.kube/config, then the
    /// admin kubeconfig of `skiff up`'s default data directory).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

async fn client(args: &DepsArgs, default_data_dir: PathBuf) -> Result<kube::Client> {
    if let Some(p) = &args.kubeconfig {
        return skiff_kube::client_from_kubeconfig(p).await;
    }
    match kube::Client::try_default().await {
        Ok(c) => Ok(c),
        Err(first) => {
            let admin = default_data_dir.join("admin.kubeconfig");
            if admin.exists() {
                skiff_kube::client_from_kubeconfig(&admin).await
            } else {
                Err(first).context("no kubeconfig: pass --kubeconfig or set KUBECONFIG")
            }
        }
    }
}

async fn all<K>(c: &kube::Client) -> Result<Vec<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(c.clone());
    Ok(api
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing {}", K::plural(&())))?
        .items)
}

/// One edge as shown: its state word.
fn state_word(
    e: &Edge,
    enforced_hashes: &BTreeMap<String, bool>,
    hashes: &[String],
) -> &'static str {
    match e.state {
        State::Missing => "missing",
        State::Waiting => "waiting",
        State::Ready if e.enforced && hashes.iter().any(|h| enforced_hashes.contains_key(h)) => {
            "enforced"
        }
        State::Ready => "ready",
    }
}

pub async fn run(args: DepsArgs, default_data_dir: PathBuf) -> Result<()> {
    if !matches!(args.output.as_str(), "text" | "json" | "dot") {
        bail!("--output must be text, json or dot, not {:?}", args.output);
    }
    let c = client(&args, default_data_dir).await?;
    let pods: Vec<Pod> = all(&c).await?;
    let services: Vec<Service> = all(&c).await?;
    let slices: Vec<EndpointSlice> = all(&c).await?;
    let namespaces: Vec<Namespace> = all(&c).await?;
    let replicasets: Vec<ReplicaSet> = all(&c).await?;
    let jobs: Vec<Job> = all(&c).await?;
    let policies: Vec<NetworkPolicy> = all(&c).await?;
    let owners: BTreeMap<(String, String, String), OwnerReference> = replicasets
        .iter()
        .map(|r| (r.metadata.clone(), "ReplicaSet"))
        .chain(jobs.iter().map(|j| (j.metadata.clone(), "Job")))
        .filter_map(|(m, kind)| {
            let up = m
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.controller == Some(true))?
                .clone();
            Some(((m.namespace?, kind.to_string(), m.name?), up))
        })
        .collect();
    let owner_of = |ns: &str, r: &OwnerReference| {
        owners
            .get(&(ns.to_string(), r.kind.clone(), r.name.clone()))
            .cloned()
    };
    let pod_refs: Vec<&Pod> = pods.iter().collect();
    let svc_refs: Vec<&Service> = services.iter().collect();
    let slice_refs: Vec<&EndpointSlice> = slices.iter().collect();
    let ns_refs: Vec<&Namespace> = namespaces.iter().collect();
    let g = Graph::build(&Inputs {
        pods: &pod_refs,
        services: &svc_refs,
        slices: &slice_refs,
        namespaces: &ns_refs,
        owner_of: &owner_of,
    });
    // The declarations whose generated egress policy is in place.
    let enforced_hashes: BTreeMap<String, bool> = policies
        .iter()
        .filter_map(|p| {
            let name = p.metadata.name.as_deref()?;
            let h = name.strip_prefix("skiff-deps-")?;
            (h.len() == 16).then(|| (h.to_string(), true))
        })
        .collect();
    let shown = |e: &Edge| match &args.namespace {
        None => true,
        Some(ns) => &g.units[e.from].workload.namespace == ns || &e.to.namespace == ns,
    };
    let edges: Vec<(&Edge, &'static str)> = g
        .edges
        .iter()
        .filter(|e| shown(e))
        .map(|e| {
            let hashes: Vec<String> = g.units[e.from].hashes.iter().cloned().collect();
            (e, state_word(e, &enforced_hashes, &hashes))
        })
        .collect();
    // Undeclared connections the nodes counted (outside enforcing
    // namespaces), per workload: `violated`.
    let mut violations: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in &pods {
        let Some(c) = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == UNDECLARED && c.status == "True")
            })
        else {
            continue;
        };
        let (ns, name) = (
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default(),
        );
        if args.namespace.as_ref().is_some_and(|n| n != &ns) {
            continue;
        }
        let Some(v) = g
            .verdicts
            .iter()
            .find(|v| v.namespace == ns && v.name == name)
        else {
            continue;
        };
        let message = c.message.clone().unwrap_or_default();
        let dests = message
            .split_once(": ")
            .map(|(_, d)| d.to_string())
            .unwrap_or(message);
        violations
            .entry(g.units[v.unit].workload.key())
            .or_default()
            .push(format!("pod {name}: {dests}"));
    }
    let cycles: Vec<String> = g
        .cycles
        .iter()
        .filter(|c| {
            args.namespace
                .as_ref()
                .is_none_or(|ns| c.iter().any(|&i| &g.units[i].workload.namespace == ns))
        })
        .map(|c| g.describe_cycle(c))
        .collect();
    let out = match args.output.as_str() {
        "json" => {
            let v = json!({
                "edges": edges.iter().map(|(e, s)| json!({
                    "from": g.units[e.from].workload.key(),
                    "to": format!("{}/{}", e.to.namespace, e.to.service),
                    "port": e.to.port.as_ref().map(|p| p.to_string()),
                    "state": s,
                    "inCycle": e.in_cycle,
                })).collect::<Vec<Value>>(),
                "cycles": cycles,
                "violations": violations.iter().map(|(w, v)| json!({
                    "from": w, "state": "violated", "undeclared": v,
                })).collect::<Vec<Value>>(),
                "dependents": g.dependents.iter()
                    .filter(|((ns, _), _)| args.namespace.as_ref().is_none_or(|n| n == ns))
                    .map(|((ns, svc), us)| json!({
                        "service": format!("{ns}/{svc}"),
                        "workloads": us.iter().map(|&i| g.units[i].workload.key()).collect::<Vec<_>>(),
                    })).collect::<Vec<Value>>(),
            });
            serde_json::to_string_pretty(&v)? + "\n"
        }
        "dot" => {
            let mut s = String::from("digraph dependencies {\n  rankdir=LR;\n");
            for (e, state) in &edges {
                let color = match *state {
                    "missing" => "red",
                    "waiting" => "orange",
                    "enforced" => "blue",
                    _ => "darkgreen",
                };
                let mut label = state.to_string();
                if let Some(p) = &e.to.port {
                    label = format!("{p}: {label}");
                }
                if e.in_cycle {
                    label.push_str(" (cycle)");
                }
                let _ = writeln!(
                    s,
                    "  \"{}\" [shape=box];\n  \"svc/{}/{}\" [shape=ellipse];\n  \"{}\" -> \"svc/{}/{}\" [label=\"{}\", color={}];",
                    g.units[e.from].workload.key(),
                    e.to.namespace,
                    e.to.service,
                    g.units[e.from].workload.key(),
                    e.to.namespace,
                    e.to.service,
                    label,
                    color
                );
            }
            for (w, v) in &violations {
                let _ = writeln!(
                    s,
                    "  \"{w}\" -> \"undeclared\" [label=\"violated ({})\", color=red, style=dashed];",
                    v.len()
                );
            }
            s.push_str("}\n");
            s
        }
        _ => {
            let mut rows: Vec<[String; 3]> = edges
                .iter()
                .map(|(e, state)| {
                    let mut st = state.to_string();
                    if e.in_cycle {
                        st.push_str(" (cycle)");
                    }
                    [g.units[e.from].workload.key(), e.to.to_string(), st]
                })
                .collect();
            for (w, v) in &violations {
                for line in v {
                    rows.push([w.clone(), format!("undeclared ({line})"), "violated".into()]);
                }
            }
            let mut s = String::new();
            if rows.is_empty() {
                s.push_str("No declared dependencies.\n");
            } else {
                let w0 = rows.iter().map(|r| r[0].len()).max().unwrap_or(0).max(8);
                let w1 = rows.iter().map(|r| r[1].len()).max().unwrap_or(0).max(10);
                let _ = writeln!(s, "{:w0$}   {:w1$}   STATE", "WORKLOAD", "DEPENDENCY");
                for r in &rows {
                    let _ = writeln!(s, "{:w0$}   {:w1$}   {}", r[0], r[1], r[2]);
                }
            }
            for c in &cycles {
                let _ = writeln!(s, "cycle: {c} (start-up ordering skipped inside it)");
            }
            s
        }
    };
    print!("{out}");
    Ok(())
}
