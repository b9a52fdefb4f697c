//! An in-cluster client, as operators and controllers start: kube-rs's
//! `Config::incluster()` (the `KUBERNETES_SERVICE_HOST`/`_PORT` variables
//! kubelet sets, the pod's ServiceAccount token, CA and namespace), then
//! the server's version and a list of the pods of its own namespace.
//! `tests/incluster.rs` runs it in a pod as a Job, with nothing but what
//! the cluster gives a pod. Prints one line and exits 0 on success; says
//! what failed and exits 1 otherwise.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    match run().await {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("in-cluster client failed: {e}");
            std::process::exit(1);
        }
    }
}

async fn run() -> Result<String, Box<dyn std::error::Error>> {
    let config = kube::Config::incluster()?;
    let url = config.cluster_url.to_string();
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config)?;
    let version = client.apiserver_version().await?;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let list = pods.list(&ListParams::default()).await?;
    Ok(format!(
        "in-cluster client ok: {url} is Kubernetes {}.{}; {} pod(s) in namespace {namespace}",
        version.major,
        version.minor,
        list.items.len()
    ))
}
