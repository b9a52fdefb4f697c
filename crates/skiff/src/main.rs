//! The `skiff` binary: one program that is the API server and store (and, as
//! they land, the scheduler, controllers and node agent), plus the commands
//! around them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "skiff",
    version,
    about = "A Kubernetes-compatible container orchestrator in one binary"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API server on its embedded store.
    Server(ServerArgs),
    /// Print skiff's version.
    Version,
}

#[derive(Args, Clone)]
struct ServerArgs {
    /// Where the store, certificates and kubeconfig live
    /// (default: /var/lib/skiff as root, ~/.skiff otherwise).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address and port to serve HTTPS on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Extra names or IPs for the serving certificate (repeatable).
    #[arg(long = "tls-san")]
    tls_san: Vec<String>,
    /// Where to write the admin kubeconfig (default: DATA/admin.kubeconfig).
    #[arg(long)]
    write_kubeconfig: Option<PathBuf>,
    /// ClusterIP range for services.
    #[arg(long, default_value = "10.43.0.0/16")]
    service_cidr: String,
    /// Seconds of history kept for watches (Kubernetes keeps 5 minutes).
    #[arg(long, default_value_t = 300, hide = true)]
    compact_keep: u64,
    /// Seconds between compactions.
    #[arg(long, default_value_t = 60, hide = true)]
    compact_every: u64,
}

fn default_data_dir() -> PathBuf {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if is_root {
        return PathBuf::from("/var/lib/skiff");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".skiff"),
        None => PathBuf::from(".skiff"),
    }
}

fn parse_cidr(s: &str) -> Result<(std::net::Ipv4Addr, u8)> {
    let (ip, bits) = s
        .split_once('/')
        .context("a CIDR looks like 10.43.0.0/16")?;
    let ip: std::net::Ipv4Addr = ip.parse().context("bad CIDR address")?;
    let bits: u8 = bits.parse().context("bad CIDR prefix length")?;
    anyhow::ensure!(
        (8..=30).contains(&bits),
        "service CIDR prefix must be between /8 and /30"
    );
    Ok((ip, bits))
}

async fn server(args: ServerArgs) -> Result<()> {
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let started = std::time::Instant::now();
    let pki = skiff_apiserver::tls::Pki::load_or_create(&data_dir.join("pki"), &args.tls_san)?;
    let store = skiff_store::RedbStore::open(&data_dir.join("store.redb"), Default::default())
        .with_context(|| format!("opening the store in {}", data_dir.display()))?;
    let store: Arc<dyn skiff_store::Store> = store;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        addr.ip().to_string()
    };
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let advertise = format!("{host}:{}", addr.port());
    let config = skiff_apiserver::Config {
        advertise: advertise.clone(),
        compact_keep: Duration::from_secs(args.compact_keep),
        compact_every: Duration::from_secs(args.compact_every.max(1)),
        registry: skiff_apiserver::registry::RegistryConfig {
            service_cidr: parse_cidr(&args.service_cidr)?,
        },
    };
    let api = skiff_apiserver::ApiServer::start(store, config).await?;
    let kubeconfig_path = args
        .write_kubeconfig
        .clone()
        .unwrap_or_else(|| data_dir.join("admin.kubeconfig"));
    let kubeconfig = skiff_apiserver::tls::kubeconfig(
        &format!("https://{advertise}"),
        &pki.ca.cert_pem,
        "admin",
        &pki.admin,
    );
    skiff_apiserver::tls::write_secret_file(&kubeconfig_path, &kubeconfig)?;
    let tls = pki.server_config()?;
    tracing::info!(%addr, kubeconfig = %kubeconfig_path.display(), elapsed_ms = started.elapsed().as_millis() as u64, "serving");
    eprintln!(
        "skiff: serving https://{advertise} (kubeconfig: {})",
        kubeconfig_path.display()
    );
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
        }
        eprintln!("skiff: shutting down");
    };
    skiff_apiserver::serve::serve_tls(listener, tls, api.router(), shutdown).await;
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SKIFF_LOG")
                .unwrap_or_else(|_| "warn,skiff=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Version => {
            println!("skiff {} (Kubernetes API v1.33)", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Server(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(server(args))
        }
    }
}
