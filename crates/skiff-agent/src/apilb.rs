//! The agent's client-side load balancer in front of the API servers (as
//! k3s' agent has one): a TCP proxy on a loopback port that the agent's
//! API client talks to. Each new connection goes to the next server in
//! rotation; a server that refuses or does not answer within 2 s is left
//! out for 10 s and the next one is tried, so the agent fails over on
//! connection errors (a watch broken by a dying server reconnects through
//! here to a live one). TLS passes through untouched: the client verifies
//! each server's certificate against the cluster CA, for the name
//! `127.0.0.1`, which every skiff serving certificate carries.
//!
//! The servers are the addresses of the `kubernetes` Endpoints in
//! `default` (every server keeps its own entry there), re-read every 5 s
//! through the balancer itself; the server the agent was given stays the
//! last resort, so an agent whose servers all changed address can still
//! reach the one it knew.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Endpoints;
use kube::api::Api;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// How long a server that failed a connection is passed over.
const DOWN_FOR: Duration = Duration::from_secs(10);
/// How long a connection to one server may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the `kubernetes` Endpoints are read.
const REFRESH: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct State {
    /// `host:port` of every known server, in rotation order.
    servers: Vec<String>,
    /// The server the agent was given.
    default: String,
    next: usize,
    down: HashMap<String, Instant>,
}

impl State {
    /// The servers to try for one connection: the healthy ones from the
    /// rotation point, then those recently down, then the default.
    fn candidates(&mut self) -> Vec<String> {
        let now = Instant::now();
        self.down.retain(|_, until| *until > now);
        let n = self.servers.len();
        let start = if n == 0 { 0 } else { self.next % n };
        self.next = self.next.wrapping_add(1);
        let rotated: Vec<String> = (0..n)
            .map(|i| self.servers[(start + i) % n].clone())
            .collect();
        let (mut up, down): (Vec<String>, Vec<String>) = rotated
            .into_iter()
            .partition(|s| !self.down.contains_key(s));
        up.extend(down);
        if !up.contains(&self.default) {
            up.push(self.default.clone());
        }
        up
    }
}

/// A running balancer; its tasks end when it is dropped.
pub struct ApiBalancer {
    state: Arc<Mutex<State>>,
    local: SocketAddr,
    _tasks: JoinSet<()>,
}

impl ApiBalancer {
    /// Listens on a free loopback port and forwards to `default`
    /// (`host:port`) until other servers are known.
    pub async fn start(default: &str) -> std::io::Result<ApiBalancer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let local = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            servers: vec![default.to_string()],
            default: default.to_string(),
            next: 0,
            down: HashMap::new(),
        }));
        let mut tasks = JoinSet::new();
        let st = state.clone();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((conn, _)) = accepted else { continue };
                        let st = st.clone();
                        conns.spawn(async move { forward(conn, &st).await });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(ApiBalancer {
            state,
            local,
            _tasks: tasks,
        })
    }

    /// The URL the API client uses: `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.local)
    }

    /// The servers known now, in rotation order.
    pub fn servers(&self) -> Vec<String> {
        self.state.lock().expect("balancer state").servers.clone()
    }

    /// Replaces the known servers (an empty list keeps the current ones).
    pub fn set_servers(&self, mut servers: Vec<String>) -> bool {
        if servers.is_empty() {
            return false;
        }
        servers.sort();
        servers.dedup();
        let mut st = self.state.lock().expect("balancer state");
        if st.servers == servers {
            return false;
        }
        st.servers = servers;
        true
    }

    /// Keeps the servers current from the `kubernetes` Endpoints, read
    /// through `client` (which goes through this balancer). Runs until
    /// dropped.
    pub async fn follow_endpoints(&self, client: kube::Client) {
        let api: Api<Endpoints> = Api::namespaced(client, "default");
        loop {
            match api.get_opt("kubernetes").await {
                Ok(Some(ep)) => {
                    let servers = addresses(&ep);
                    if self.set_servers(servers.clone()) {
                        tracing::info!(?servers, "API servers");
                        eprintln!("skiff: API servers: {}", servers.join(", "));
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "reading the kubernetes Endpoints"),
            }
            tokio::time::sleep(REFRESH).await;
        }
    }
}

/// A client for the cluster `kubeconfig` names, going through a new
/// balancer that starts with the kubeconfig's server.
pub async fn client_for_kubeconfig(
    kubeconfig: &std::path::Path,
) -> anyhow::Result<(kube::Client, Arc<ApiBalancer>)> {
    use anyhow::Context;
    let config = load(kubeconfig).await?;
    let lb = for_server(&config.cluster_url)
        .await
        .context("the kubeconfig's server")?;
    let client = lb.client_for(kubeconfig).await?;
    Ok((client, lb))
}

/// A new balancer that starts with the server at `url`.
pub async fn for_server(url: &http::Uri) -> anyhow::Result<Arc<ApiBalancer>> {
    use anyhow::Context;
    let host = url.host().context("the server's URL has no host")?;
    let port = url.port_u16().unwrap_or(443);
    let default = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    Ok(Arc::new(
        ApiBalancer::start(&default)
            .await
            .context("starting the API server load balancer")?,
    ))
}

async fn load(kubeconfig: &std::path::Path) -> anyhow::Result<kube::Config> {
    use anyhow::Context;
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("loading kubeconfig {}", kubeconfig.display()))
}

impl ApiBalancer {
    /// A client with the credentials of `kubeconfig` that goes through
    /// this balancer.
    pub async fn client_for(&self, kubeconfig: &std::path::Path) -> anyhow::Result<kube::Client> {
        use anyhow::Context;
        let mut config = load(kubeconfig).await?;
        config.cluster_url = self.url().parse().context("the balancer's URL")?;
        kube::Client::try_from(config).context("building the API client")
    }
}

/// `host:port` of each address of the Endpoints' `https` port.
pub fn addresses(ep: &Endpoints) -> Vec<String> {
    let mut out = Vec::new();
    for subset in ep.subsets.iter().flatten() {
        let ports = subset.ports.iter().flatten();
        let Some(port) = ports
            .clone()
            .find(|p| p.name.as_deref() == Some("https"))
            .or_else(|| subset.ports.iter().flatten().next())
            .map(|p| p.port)
        else {
            continue;
        };
        for a in subset.addresses.iter().flatten() {
            if a.ip.contains(':') {
                out.push(format!("[{}]:{port}", a.ip));
            } else {
                out.push(format!("{}:{port}", a.ip));
            }
        }
    }
    out
}

/// Connects `conn` to the first server that answers and copies both ways
/// until either side closes.
async fn forward(mut conn: TcpStream, state: &Mutex<State>) {
    let candidates = state.lock().expect("balancer state").candidates();
    for server in candidates {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&server)).await {
            Ok(Ok(mut upstream)) => {
                let _ = upstream.set_nodelay(true);
                let _ = conn.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(%server, error = %e, "API server refused a connection")
            }
            Err(_) => tracing::debug!(%server, "API server did not answer"),
        }
        state
            .lock()
            .expect("balancer state")
            .down
            .insert(server, Instant::now() + DOWN_FOR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server answering each connection with its name.
    async fn named(name: &'static str) -> (String, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let h = tokio::spawn(async move {
            loop {
                let (mut c, _) = l.accept().await.unwrap();
                let _ = c.write_all(name.as_bytes()).await;
            }
        });
        (addr, h)
    }

    async fn ask(lb: &ApiBalancer) -> String {
        let mut c = TcpStream::connect(lb.local).await.unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).await.unwrap();
        s
    }

    #[tokio::test]
    async fn connections_rotate_and_fail_over_to_live_servers() {
        let (a, ha) = named("a").await;
        let (b, _hb) = named("b").await;
        let lb = ApiBalancer::start(&a).await.unwrap();
        assert_eq!(ask(&lb).await, "a");
        assert!(lb.set_servers(vec![a.clone(), b.clone()]));
        assert!(!lb.set_servers(vec![b.clone(), a.clone()]), "same set");
        let mut seen: Vec<String> = Vec::new();
        for _ in 0..4 {
            seen.push(ask(&lb).await);
        }
        assert!(
            seen.contains(&"a".into()) && seen.contains(&"b".into()),
            "{seen:?}"
        );
        // The first server dies: every connection reaches the other.
        ha.abort();
        let _ = ha.await;
        for _ in 0..4 {
            assert_eq!(ask(&lb).await, "b");
        }
        // An empty list keeps what is known.
        assert!(!lb.set_servers(Vec::new()));
        assert_eq!(lb.servers().len(), 2);
    }

    #[test]
    fn endpoints_give_host_and_https_port() {
        let ep: Endpoints = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes"},
            "subsets": [{"addresses": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}],
                         "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}]
        }))
        .unwrap();
        assert_eq!(addresses(&ep), ["10.0.0.1:6443", "[fd00::1]:6443"]);
    }
}
