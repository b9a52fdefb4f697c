//! The etcd v3 backend of [`Store`], over gRPC with the `etcd-client` crate.
//!
//! Every operation maps onto etcd as kube-apiserver's storage layer maps it:
//! a create is a transaction guarded on the key's create revision being 0, an
//! update or guarded delete one guarded on its mod revision (the other branch
//! reads the current value for the conflict); reads and lists are ranges at a
//! revision with a limit (paging restarts just after the last key); a watch
//! is an etcd watch from `after + 1` with previous values. etcd's revision is
//! the store revision, so resourceVersions mean the same on every API server
//! sharing the etcd cluster.
//!
//! Keys: the API server writes under `/registry/`; with another
//! [`EtcdOptions::prefix`] (kube-apiserver's `--etcd-prefix`) those keys live
//! under that prefix instead.
//!
//! Compaction is etcd-wide. As kube-apiserver does, the revision compacted
//! to is recorded in the `compact_rev_key` key, written in a transaction
//! guarded on that key's version: of several API servers compacting at once
//! one wins, the others see it done (and nobody compacts backwards).
//!
//! Several members: each listed endpoint (and each member etcd's MemberList
//! reports, re-read every [`EtcdOptions::member_sync_interval`]) has its own
//! connection, and requests go to one pinned member. A member that refuses
//! connections, has no leader or breaks a call is passed over for the next
//! one: a request that never reached a member (connection refused, no
//! leader) is retried on another at once, a read after any failure, and a
//! write whose fate is unknown (the connection broke under it) fails with
//! [`Error::Unavailable`] so the client decides, as etcd's clientv3 retries.
//! So losing any one member of a quorum costs at most the writes in flight
//! and those during an election, and a store connects with any member up.
//!
//! etcd unreachable: every request fails within [`EtcdOptions::request_timeout`]
//! with [`Error::Unavailable`] or [`Error::Timeout`] (503 and 504 upstream).
//! Watches outlive etcd restarts and member losses: the watch is
//! re-established (on the pinned member) from the last revision it
//! delivered, and events at or below it are dropped, so the stream has no
//! gap and no duplicate.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client as ec;
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::{Error, Event, KeyValue, ListOptions, ListResult, Result, Store, WatchStream, Write};

/// The root of the keys the API server writes.
const ROOT: &str = "/registry";

/// Where the revision compacted to is recorded (kube-apiserver's key, outside
/// any prefix: compaction is etcd-wide).
const COMPACT_REV_KEY: &str = "compact_rev_key";

/// Client certificates for etcd (kube-apiserver's `--etcd-cafile`,
/// `--etcd-certfile`, `--etcd-keyfile`), PEM.
#[derive(Debug, Clone, Default)]
pub struct EtcdTls {
    pub ca_pem: Option<Vec<u8>>,
    pub cert_pem: Option<Vec<u8>>,
    pub key_pem: Option<Vec<u8>>,
}

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Client URLs (`http://127.0.0.1:2379`, `https://…` with [`EtcdOptions::tls`]).
    pub endpoints: Vec<String>,
    /// The etcd key prefix the store's `/registry` keys live under.
    pub prefix: String,
    pub tls: Option<EtcdTls>,
    /// Every unary request fails after this long.
    pub request_timeout: Duration,
    /// Connecting to an endpoint fails after this long.
    pub dial_timeout: Duration,
    /// How often the members etcd reports (MemberList) are added to the
    /// endpoints (and departed ones dropped); `None`: only the listed ones.
    pub member_sync_interval: Option<Duration>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: ROOT.into(),
            tls: None,
            request_timeout: Duration::from_secs(5),
            dial_timeout: Duration::from_secs(2),
            member_sync_interval: Some(Duration::from_secs(30)),
        }
    }
}

/// The etcd-backed [`Store`].
pub struct EtcdStore {
    members: Arc<Members>,
    /// The prefix replacing `/registry`, without a trailing slash.
    prefix: String,
    /// One sender per open watch, to ask it for progress.
    watchers: Arc<Mutex<Vec<mpsc::UnboundedSender<()>>>>,
}

/// Maps an etcd client error to the store's: unreachable is `Unavailable`,
/// too slow is `Timeout`, the rest `Backend`.
fn map_err(e: ec::Error) -> Error {
    match e {
        ec::Error::GRpcStatus(st) => {
            let msg = st.message().to_string();
            match st.code() {
                tonic::Code::Unavailable => Error::Unavailable(msg),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => Error::Timeout(msg),
                _ if msg.contains("request timed out") => Error::Timeout(msg),
                _ if msg.contains("no leader") || msg.contains("leader changed") => {
                    Error::Unavailable(msg)
                }
                // A connection that broke under a call: tonic reports the
                // transport's failure as a status of code Unknown.
                _ if msg.contains("transport error") || msg.contains("connection") => {
                    Error::Unavailable(msg)
                }
                _ => Error::Backend(msg),
            }
        }
        ec::Error::TransportError(t) => Error::Unavailable(t.to_string()),
        ec::Error::IoError(t) => Error::Unavailable(t.to_string()),
        other => Error::Backend(other.to_string()),
    }
}

fn is_compacted(e: &ec::Error) -> bool {
    matches!(e, ec::Error::GRpcStatus(st) if st.message().contains("required revision has been compacted"))
}

fn is_future(e: &ec::Error) -> bool {
    matches!(e, ec::Error::GRpcStatus(st) if st.message().contains("required revision is a future revision"))
}

/// The first key after every key starting with `prefix` (etcd's range end).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte is 0xff (or the prefix is empty): to the end of the key space.
    vec![0]
}

/// The store key of an etcd key: under `prefix` it is under `/registry`.
fn store_key(prefix: &str, key: &[u8]) -> String {
    let key = String::from_utf8_lossy(key);
    if prefix != ROOT {
        if let Some(rest) = key.strip_prefix(prefix) {
            if rest.is_empty() || rest.starts_with('/') {
                return format!("{ROOT}{rest}");
            }
        }
    }
    key.into_owned()
}

fn store_kv(prefix: &str, kv: &ec::KeyValue) -> KeyValue {
    KeyValue {
        key: store_key(prefix, kv.key()),
        value: Bytes::copy_from_slice(kv.value()),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
    }
}

fn revision_of(h: Option<&ec::ResponseHeader>) -> i64 {
    h.map(|h| h.revision()).unwrap_or(0)
}

/// One member's client URL and its own connection.
struct Conn {
    url: String,
    client: ec::Client,
    /// Given in the options (kept when MemberList no longer reports it).
    listed: bool,
    /// When a request to it last failed as one to a dead, unreachable or
    /// leaderless member fails.
    failed_at: Mutex<Option<Instant>>,
}

impl Conn {
    fn failed_recently(&self) -> bool {
        let at = *self.failed_at.lock().unwrap_or_else(|e| e.into_inner());
        at.is_some_and(|t| t.elapsed() < PASS_OVER)
    }
}

/// A member that failed is passed over for this long while others remain.
const PASS_OVER: Duration = Duration::from_secs(3);

/// The members' connections and the one requests go to.
struct Pool {
    conns: Vec<Arc<Conn>>,
    pinned: usize,
}

/// The etcd cluster as this store reaches it: a connection per endpoint (the
/// listed ones and those MemberList reports) and the pinned one.
struct Members {
    pool: Mutex<Pool>,
    options: ec::ConnectOptions,
    /// The URL scheme of the listed endpoints; discovered ones must share it.
    scheme: String,
    /// A request (with its retries) fails after this long.
    timeout: Duration,
}

/// What an etcd error says about retrying the request elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// The request's own answer (not found, compacted, invalid…).
    Final,
    /// The member never took the request (connection refused or reset before
    /// sending, no leader): safe to send again, to another member.
    NotTaken,
    /// The member or its connection failed under the request: it may or may
    /// not have been applied. Reads are retried, writes are not.
    Broken,
}

/// Whether `e` is the connector's failure (nothing was sent).
fn connect_failed(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        cur = err.source();
    }
    false
}

fn failure(e: &ec::Error) -> Failure {
    match e {
        ec::Error::GRpcStatus(st) => {
            let msg = st.message();
            if connect_failed(st) || msg.contains("tcp connect error") {
                return Failure::NotTaken;
            }
            // etcd refuses these before proposing anything.
            if msg.contains("no leader") || msg.contains("not capable") {
                return Failure::NotTaken;
            }
            match st.code() {
                tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Aborted => Failure::Broken,
                _ if msg.contains("transport error")
                    || msg.contains("connection")
                    || msg.contains("h2 protocol error")
                    || msg.contains("broken pipe") =>
                {
                    Failure::Broken
                }
                _ => Failure::Final,
            }
        }
        ec::Error::TransportError(_) | ec::Error::IoError(_) => Failure::Broken,
        _ => Failure::Final,
    }
}

/// Whether a request may be sent again after its fate became unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// A client URL as the endpoints list keeps it.
fn normalize(url: &str) -> String {
    url.trim().trim_end_matches('/').to_string()
}

fn scheme_of(url: &str) -> &str {
    url.split_once("://").map(|(s, _)| s).unwrap_or("http")
}

impl Members {
    async fn connect_one(url: &str, options: &ec::ConnectOptions) -> Result<ec::Client> {
        // The channel connects lazily: this checks the URL and options only.
        ec::Client::connect([url], Some(options.clone()))
            .await
            .map_err(|e| Error::Backend(format!("etcd endpoint {url}: {e}")))
    }

    fn pick(&self) -> Arc<Conn> {
        let p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        p.conns[p.pinned].clone()
    }

    fn answered(&self, conn: &Conn) {
        *conn.failed_at.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Records that `conn` failed and, if it is the pinned one, pins the next
    /// member that has not failed lately (or else the one that failed
    /// longest ago).
    fn failed(&self, conn: &Conn) {
        *conn.failed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let n = p.conns.len();
        if n < 2 || p.conns[p.pinned].url != conn.url {
            return;
        }
        let from = p.pinned;
        let mut next = None;
        let mut oldest: Option<(Instant, usize)> = None;
        for i in 1..n {
            let j = (from + i) % n;
            match *p.conns[j]
                .failed_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
            {
                None => {
                    next = Some(j);
                    break;
                }
                Some(t) if t.elapsed() >= PASS_OVER => {
                    next = Some(j);
                    break;
                }
                Some(t) => {
                    if oldest.is_none_or(|(o, _)| t < o) {
                        oldest = Some((t, j));
                    }
                }
            }
        }
        p.pinned = next.or(oldest.map(|(_, j)| j)).unwrap_or(from);
        tracing::info!(
            from = %conn.url,
            to = %p.conns[p.pinned].url,
            "etcd member failed; requests go to another"
        );
    }

    /// Whether every member failed lately (so a retry should wait a little).
    fn all_failed_recently(&self) -> bool {
        let p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        p.conns.iter().all(|c| c.failed_recently())
    }

    /// Runs `f` on the pinned member, moving to another member and trying
    /// again while the failure allows (see [`Failure`]), within the request
    /// timeout. Returns the answer and the member that gave it.
    async fn run<T, F, Fut>(
        &self,
        kind: Kind,
        f: F,
    ) -> std::result::Result<(T, Arc<Conn>), ec::Error>
    where
        F: Fn(ec::Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, ec::Error>>,
    {
        let deadline = Instant::now() + self.timeout;
        let mut wait = Duration::from_millis(50);
        loop {
            let conn = self.pick();
            let remaining = deadline.saturating_duration_since(Instant::now());
            let e = match tokio::time::timeout(remaining, f(conn.client.clone())).await {
                Ok(Ok(v)) => {
                    self.answered(&conn);
                    return Ok((v, conn));
                }
                Ok(Err(e)) => e,
                Err(_) => {
                    self.failed(&conn);
                    return Err(ec::Error::GRpcStatus(tonic::Status::deadline_exceeded(
                        format!("etcd did not answer within {:?}", self.timeout),
                    )));
                }
            };
            let retry = match failure(&e) {
                Failure::Final => return Err(e),
                Failure::NotTaken => true,
                Failure::Broken => kind == Kind::Read,
            };
            self.failed(&conn);
            tracing::debug!(member = %conn.url, error = %e, retry, "etcd request failed");
            if !retry {
                return Err(e);
            }
            if self.all_failed_recently() {
                // Every member failed (an election, or etcd down): wait a
                // little before the next round.
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(wait.min(left)).await;
                wait = (wait * 2).min(Duration::from_millis(500));
            }
            if Instant::now() >= deadline {
                return Err(e);
            }
        }
    }

    /// Adds the client URLs of the members etcd reports and drops the
    /// discovered ones of members that left.
    async fn sync(&self) -> Result<()> {
        let (resp, _) = self
            .run(Kind::Read, |mut c| async move { c.member_list().await })
            .await
            .map_err(map_err)?;
        let reported: Vec<String> = resp
            .members()
            .iter()
            .flat_map(|m| m.client_urls())
            .map(|u| normalize(u))
            .filter(|u| scheme_of(u) == self.scheme)
            .collect();
        if reported.is_empty() {
            return Ok(());
        }
        let new: Vec<String> = {
            let p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            let mut new: Vec<String> = Vec::new();
            for u in &reported {
                if !p.conns.iter().any(|c| &c.url == u) && !new.contains(u) {
                    new.push(u.clone());
                }
            }
            new
        };
        let mut made = Vec::new();
        for url in new {
            match Members::connect_one(&url, &self.options).await {
                Ok(client) => made.push(Arc::new(Conn {
                    url,
                    client,
                    listed: false,
                    failed_at: Mutex::new(None),
                })),
                Err(e) => tracing::debug!(error = %e, "a member's client URL"),
            }
        }
        let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        for c in made {
            if !p.conns.iter().any(|k| k.url == c.url) {
                tracing::info!(url = %c.url, "etcd member discovered");
                p.conns.push(c);
            }
        }
        let pinned = p.conns[p.pinned].url.clone();
        p.conns.retain(|c| c.listed || reported.contains(&c.url));
        p.pinned = p.conns.iter().position(|c| c.url == pinned).unwrap_or(0);
        Ok(())
    }

    /// Every `interval`, [`Members::sync`], while the store is in use.
    fn keep_synced(members: Weak<Members>, interval: Duration) {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(m) = members.upgrade() else { return };
                if let Err(e) = m.sync().await {
                    tracing::debug!(error = %e, "reading etcd's member list");
                }
            }
        });
    }
}

impl EtcdStore {
    /// Connects to etcd and checks it answers: any member of a quorum will
    /// do (the others are tried in turn).
    pub async fn connect(opts: EtcdOptions) -> Result<Arc<EtcdStore>> {
        if opts.endpoints.is_empty() {
            return Err(Error::Backend("no etcd endpoints given".into()));
        }
        // Every request asks for a member with a leader: one cut off from
        // the quorum refuses at once (and closes its watches) rather than
        // waiting, so the request goes to another member.
        let mut co = ec::ConnectOptions::new()
            .with_connect_timeout(opts.dial_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some(tls) = &opts.tls {
            let mut t = ec::TlsOptions::new();
            if let Some(ca) = &tls.ca_pem {
                t = t.ca_certificate(ec::Certificate::from_pem(ca));
            }
            match (&tls.cert_pem, &tls.key_pem) {
                (Some(c), Some(k)) => t = t.identity(ec::Identity::from_pem(c, k)),
                (None, None) => {}
                _ => {
                    return Err(Error::Backend(
                        "an etcd client certificate needs both its certificate and its key".into(),
                    ))
                }
            }
            co = co.with_tls(t);
        }
        let mut endpoints: Vec<String> = Vec::new();
        for e in &opts.endpoints {
            let e = normalize(e);
            if !endpoints.contains(&e) {
                endpoints.push(e);
            }
        }
        let mut conns = Vec::new();
        for url in &endpoints {
            let client = tokio::time::timeout(opts.request_timeout, Members::connect_one(url, &co))
                .await
                .map_err(|_| Error::Timeout(format!("connecting to etcd at {url}")))??;
            conns.push(Arc::new(Conn {
                url: url.clone(),
                client,
                listed: true,
                failed_at: Mutex::new(None),
            }));
        }
        let members = Arc::new(Members {
            pool: Mutex::new(Pool { conns, pinned: 0 }),
            options: co,
            scheme: scheme_of(&endpoints[0]).to_string(),
            timeout: opts.request_timeout,
        });
        let store = Arc::new(EtcdStore {
            members,
            prefix: opts.prefix.trim_end_matches('/').to_string(),
            watchers: Default::default(),
        });
        store.current_revision().await?;
        if let Some(interval) = opts.member_sync_interval {
            if let Err(e) = store.members.sync().await {
                tracing::debug!(error = %e, "reading etcd's member list");
            }
            Members::keep_synced(Arc::downgrade(&store.members), interval);
        }
        Ok(store)
    }

    /// The client URLs requests may go to: the listed endpoints and the
    /// members etcd reported.
    pub fn endpoints(&self) -> Vec<String> {
        let p = self.members.pool.lock().unwrap_or_else(|e| e.into_inner());
        p.conns.iter().map(|c| c.url.clone()).collect()
    }

    /// The etcd key of a store key.
    fn etcd_key(&self, key: &str) -> Vec<u8> {
        if self.prefix != ROOT {
            if let Some(rest) = key.strip_prefix(ROOT) {
                if rest.is_empty() || rest.starts_with('/') {
                    return format!("{}{rest}", self.prefix).into_bytes();
                }
            }
        }
        key.as_bytes().to_vec()
    }

    fn kv(&self, kv: &ec::KeyValue) -> KeyValue {
        store_kv(&self.prefix, kv)
    }

    /// A read on the pinned member, failing over to the others.
    async fn read<T, F, Fut>(&self, f: F) -> std::result::Result<T, ec::Error>
    where
        F: Fn(ec::KvClient) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, ec::Error>>,
    {
        Ok(self.members.run(Kind::Read, |c| f(c.kv_client())).await?.0)
    }

    /// A write on the pinned member, sent to another only when the first
    /// never took it.
    async fn write<T, F, Fut>(&self, f: F) -> std::result::Result<T, ec::Error>
    where
        F: Fn(ec::KvClient) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, ec::Error>>,
    {
        Ok(self.members.run(Kind::Write, |c| f(c.kv_client())).await?.0)
    }

    /// Sends a transaction as a write.
    async fn txn(&self, txn: ec::Txn) -> Result<ec::TxnResponse> {
        let txn = &txn;
        self.write(|mut kv| async move { kv.txn(txn.clone()).await })
            .await
            .map_err(map_err)
    }

    /// The recorded compaction: (revision, version of the record).
    async fn compaction_record(&self) -> Result<(i64, i64, i64)> {
        let r = self
            .read(|mut kv| async move { kv.get(COMPACT_REV_KEY, None).await })
            .await
            .map_err(map_err)?;
        let header = revision_of(r.header());
        Ok(match r.kvs().first() {
            Some(kv) => (
                std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0),
                kv.version(),
                header,
            ),
            None => (0, 0, header),
        })
    }

    /// The current value of `key` from a transaction's else branch.
    fn current_from(&self, resp: &ec::TxnResponse) -> Option<KeyValue> {
        resp.op_responses().iter().find_map(|op| match op {
            ec::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| self.kv(kv)),
            _ => None,
        })
    }

    async fn read_error(&self, e: ec::Error, requested: i64) -> Error {
        if is_compacted(&e) {
            let compacted = self
                .compacted_revision()
                .await
                .unwrap_or(0)
                .max(requested + 1);
            return Error::Compacted {
                requested,
                compacted,
            };
        }
        if is_future(&e) {
            let current = self.current_revision().await.unwrap_or(0);
            return Error::FutureRevision { requested, current };
        }
        map_err(e)
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let k = &self.etcd_key(key);
        let r = self
            .read(|mut kv| async move { kv.get(k.clone(), None).await })
            .await
            .map_err(map_err)?;
        Ok(r.kvs().first().map(|kv| self.kv(kv)))
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        let p = self.etcd_key(prefix);
        let end = prefix_end(&p);
        let start = match &opts.start_after {
            Some(k) => {
                let mut s = self.etcd_key(k);
                s.push(0);
                s
            }
            None => p,
        };
        let at = opts.revision.unwrap_or(0).max(0);
        let o = ec::GetOptions::new()
            .with_range(end)
            .with_limit(opts.limit.max(0))
            .with_revision(at);
        let (start, o) = (&start, &o);
        let r = match self
            .read(|mut kv| async move { kv.get(start.clone(), Some(o.clone())).await })
            .await
        {
            Ok(r) => r,
            Err(e) => return Err(self.read_error(e, at).await),
        };
        let items: Vec<KeyValue> = r.kvs().iter().map(|kv| self.kv(kv)).collect();
        let more = r.more();
        let remaining = if more {
            (r.count() - items.len() as i64).max(1)
        } else {
            0
        };
        Ok(ListResult {
            revision: if at > 0 { at } else { revision_of(r.header()) },
            items,
            more,
            remaining,
        })
    }

    async fn count(&self, prefix: &str) -> Result<i64> {
        let p = self.etcd_key(prefix);
        let o = ec::GetOptions::new()
            .with_range(prefix_end(&p))
            .with_count_only();
        let (p, o) = (&p, &o);
        let r = self
            .read(|mut kv| async move { kv.get(p.clone(), Some(o.clone())).await })
            .await
            .map_err(map_err)?;
        Ok(r.count())
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        let k = self.etcd_key(key);
        let txn = ec::Txn::new()
            .when([ec::Compare::create_revision(
                k.clone(),
                ec::CompareOp::Equal,
                0,
            )])
            .and_then([ec::TxnOp::put(k, value.to_vec(), None)]);
        let r = self.txn(txn).await?;
        if !r.succeeded() {
            return Err(Error::AlreadyExists(key.to_string()));
        }
        let rev = revision_of(r.header());
        Ok(KeyValue {
            key: key.to_string(),
            value,
            create_revision: rev,
            mod_revision: rev,
        })
    }

    async fn update(&self, key: &str, value: Bytes, expected_revision: i64) -> Result<KeyValue> {
        let k = self.etcd_key(key);
        let txn = ec::Txn::new()
            .when([
                ec::Compare::mod_revision(k.clone(), ec::CompareOp::Equal, expected_revision),
                ec::Compare::create_revision(k.clone(), ec::CompareOp::Greater, 0),
            ])
            .and_then([ec::TxnOp::put(
                k.clone(),
                value.to_vec(),
                Some(ec::PutOptions::new().with_prev_key()),
            )])
            .or_else([ec::TxnOp::get(k, None)]);
        let r = self.txn(txn).await?;
        if !r.succeeded() {
            return Err(match self.current_from(&r) {
                None => Error::NotFound(key.to_string()),
                Some(cur) => Error::Conflict {
                    key: key.to_string(),
                    expected: expected_revision,
                    current: Some(cur),
                },
            });
        }
        let rev = revision_of(r.header());
        let create_revision = r
            .op_responses()
            .iter()
            .find_map(|op| match op {
                ec::TxnOpResponse::Put(p) => p.prev_key().map(|kv| kv.create_revision()),
                _ => None,
            })
            .unwrap_or(rev);
        Ok(KeyValue {
            key: key.to_string(),
            value,
            create_revision,
            mod_revision: rev,
        })
    }

    async fn commit(&self, writes: Vec<Write>) -> Result<Vec<KeyValue>> {
        let mut seen = std::collections::HashSet::new();
        if let Some(w) = writes.iter().find(|w| !seen.insert(w.key())) {
            return Err(Error::Backend(format!(
                "a commit writes key {:?} twice",
                w.key()
            )));
        }
        let mut compares = Vec::with_capacity(writes.len() * 2);
        let mut puts = Vec::with_capacity(writes.len());
        let mut gets = Vec::with_capacity(writes.len());
        for w in &writes {
            let k = self.etcd_key(w.key());
            match w {
                Write::Create { value, .. } => {
                    compares.push(ec::Compare::create_revision(
                        k.clone(),
                        ec::CompareOp::Equal,
                        0,
                    ));
                    puts.push(ec::TxnOp::put(k.clone(), value.to_vec(), None));
                }
                Write::Update {
                    value,
                    expected_revision,
                    ..
                } => {
                    compares.push(ec::Compare::mod_revision(
                        k.clone(),
                        ec::CompareOp::Equal,
                        *expected_revision,
                    ));
                    compares.push(ec::Compare::create_revision(
                        k.clone(),
                        ec::CompareOp::Greater,
                        0,
                    ));
                    puts.push(ec::TxnOp::put(
                        k.clone(),
                        value.to_vec(),
                        Some(ec::PutOptions::new().with_prev_key()),
                    ));
                }
            }
            gets.push(ec::TxnOp::get(k, None));
        }
        let txn = ec::Txn::new().when(compares).and_then(puts).or_else(gets);
        let r = self.txn(txn).await?;
        if !r.succeeded() {
            // The keys as they are: the first write whose condition fails.
            for (w, op) in writes.iter().zip(r.op_responses()) {
                let cur = match op {
                    ec::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| self.kv(kv)),
                    _ => None,
                };
                match (w, cur) {
                    (Write::Create { key, .. }, Some(_)) => {
                        return Err(Error::AlreadyExists(key.clone()))
                    }
                    (Write::Update { key, .. }, None) => return Err(Error::NotFound(key.clone())),
                    (
                        Write::Update {
                            key,
                            expected_revision,
                            ..
                        },
                        Some(cur),
                    ) if cur.mod_revision != *expected_revision => {
                        return Err(Error::Conflict {
                            key: key.clone(),
                            expected: *expected_revision,
                            current: Some(cur),
                        })
                    }
                    _ => {}
                }
            }
            return Err(Error::Backend(
                "a commit failed, yet every condition holds now".into(),
            ));
        }
        let rev = revision_of(r.header());
        let created: Vec<Option<i64>> = r
            .op_responses()
            .iter()
            .map(|op| match op {
                ec::TxnOpResponse::Put(p) => p.prev_key().map(|kv| kv.create_revision()),
                _ => None,
            })
            .collect();
        Ok(writes
            .into_iter()
            .zip(created.into_iter().chain(std::iter::repeat(None)))
            .map(|(w, prev_create)| {
                let (key, value) = match w {
                    Write::Create { key, value } | Write::Update { key, value, .. } => (key, value),
                };
                KeyValue {
                    key,
                    value,
                    create_revision: prev_create.unwrap_or(rev),
                    mod_revision: rev,
                }
            })
            .collect())
    }

    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)> {
        let k = self.etcd_key(key);
        let del = Some(ec::DeleteOptions::new().with_prev_key());
        let (prev, header) = match expected_revision {
            Some(expected) => {
                let txn = ec::Txn::new()
                    .when([
                        ec::Compare::mod_revision(k.clone(), ec::CompareOp::Equal, expected),
                        ec::Compare::create_revision(k.clone(), ec::CompareOp::Greater, 0),
                    ])
                    .and_then([ec::TxnOp::delete(k.clone(), del)])
                    .or_else([ec::TxnOp::get(k, None)]);
                let r = self.txn(txn).await?;
                if !r.succeeded() {
                    return Err(match self.current_from(&r) {
                        None => Error::NotFound(key.to_string()),
                        Some(cur) => Error::Conflict {
                            key: key.to_string(),
                            expected,
                            current: Some(cur),
                        },
                    });
                }
                let prev = r.op_responses().iter().find_map(|op| match op {
                    ec::TxnOpResponse::Delete(d) => d.prev_kvs().first().map(|kv| self.kv(kv)),
                    _ => None,
                });
                (prev, revision_of(r.header()))
            }
            None => {
                let (k, del) = (&k, &del);
                let r = self
                    .write(|mut kv| async move { kv.delete(k.clone(), del.clone()).await })
                    .await
                    .map_err(map_err)?;
                (
                    r.prev_kvs().first().map(|kv| self.kv(kv)),
                    revision_of(r.header()),
                )
            }
        };
        match prev {
            Some(prev) => Ok((prev, header)),
            None => Err(Error::NotFound(key.to_string())),
        }
    }

    async fn watch(
        &self,
        prefix: &str,
        after_revision: i64,
        progress_interval: Option<Duration>,
    ) -> Result<WatchStream> {
        let after = after_revision.max(0);
        if after > 0 {
            let compacted = self.compacted_revision().await?;
            if after < compacted {
                return Err(Error::Compacted {
                    requested: after,
                    compacted,
                });
            }
        }
        let key = self.etcd_key(prefix);
        let end = prefix_end(&key);
        let (k, e) = (&key, &end);
        let (first, conn) = self
            .members
            .run(Kind::Read, |c| open_watch(c, k, e, after))
            .await
            .map_err(map_err)?;
        let (tx, out) = mpsc::channel::<Result<Event>>(1024);
        let (ctl_tx, ctl_rx) = mpsc::unbounded_channel::<()>();
        {
            let mut w = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
            w.retain(|s| !s.is_closed());
            w.push(ctl_tx);
        }
        let prefix = self.prefix.clone();
        let follower = Follower {
            members: self.members.clone(),
            conn,
            key,
            end,
            prefix,
            tx,
            ctl: ctl_rx,
            progress_interval,
            last_event: after,
            resume_after: after,
        };
        tokio::spawn(follower.run(first));
        Ok(tokio_stream::wrappers::ReceiverStream::new(out).boxed())
    }

    async fn current_revision(&self) -> Result<i64> {
        let r = self
            .read(|mut kv| async move {
                kv.get(
                    COMPACT_REV_KEY,
                    Some(ec::GetOptions::new().with_count_only()),
                )
                .await
            })
            .await
            .map_err(map_err)?;
        Ok(revision_of(r.header()))
    }

    async fn request_progress(&self) -> Result<i64> {
        let rev = self.current_revision().await?;
        let mut w = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        w.retain(|s| s.send(()).is_ok());
        Ok(rev)
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        loop {
            let (done, version, current) = self.compaction_record().await?;
            if revision > current {
                return Err(Error::FutureRevision {
                    requested: revision,
                    current,
                });
            }
            if done >= revision {
                // Another server compacted at least this far.
                return Ok(());
            }
            // Claim this compaction: only one writer of the record wins.
            let txn = ec::Txn::new()
                .when([ec::Compare::version(
                    COMPACT_REV_KEY,
                    ec::CompareOp::Equal,
                    version,
                )])
                .and_then([ec::TxnOp::put(COMPACT_REV_KEY, revision.to_string(), None)]);
            let r = self.txn(txn).await?;
            if !r.succeeded() {
                continue;
            }
            let o = ec::CompactionOptions::new().with_physical();
            let o = &o;
            let compacted = self
                .write(|mut kv| async move { kv.compact(revision, Some(o.clone())).await })
                .await;
            return match compacted {
                Ok(_) => Ok(()),
                Err(e) if is_compacted(&e) => Ok(()),
                Err(e) => Err(map_err(e)),
            };
        }
    }

    async fn compacted_revision(&self) -> Result<i64> {
        Ok(self.compaction_record().await?.0)
    }
}

/// Opens an etcd watch of `[key, end)` for revisions after `after` (0: from
/// now), with previous values, and waits for etcd to confirm it.
async fn open_watch(
    mut client: ec::Client,
    key: &[u8],
    end: &[u8],
    after: i64,
) -> std::result::Result<(ec::WatchStream, i64), ec::Error> {
    let mut o = ec::WatchOptions::new()
        .with_range(end.to_vec())
        .with_prev_key();
    if after > 0 {
        o = o.with_start_revision(after + 1);
    }
    let mut stream = client.watch(key.to_vec(), Some(o)).await?;
    loop {
        match stream.message().await? {
            Some(resp) if resp.created() => {
                if resp.canceled() {
                    return Err(ec::Error::WatchError(resp.cancel_reason().to_string()));
                }
                return Ok((stream, revision_of(resp.header())));
            }
            Some(_) => continue,
            None => return Err(ec::Error::WatchError("the watch stream closed".into())),
        }
    }
}

/// One store watch: follows its etcd watch, asks for progress when told to
/// (or when idle for the interval), and re-establishes the etcd watch after
/// the last delivered revision when it breaks.
struct Follower {
    members: Arc<Members>,
    /// The member the etcd watch is on.
    conn: Arc<Conn>,
    key: Vec<u8>,
    end: Vec<u8>,
    prefix: String,
    tx: mpsc::Sender<Result<Event>>,
    ctl: mpsc::UnboundedReceiver<()>,
    progress_interval: Option<Duration>,
    /// The revision of the last event delivered: later ones only.
    last_event: i64,
    /// Every change up to this revision was delivered (events or progress).
    resume_after: i64,
}

impl Follower {
    fn kv(&self, kv: &ec::KeyValue) -> KeyValue {
        store_kv(&self.prefix, kv)
    }

    fn event(&self, ev: &ec::Event) -> Option<Event> {
        let kv = ev.kv()?;
        match ev.event_type() {
            ec::EventType::Put => {
                let prev = if kv.version() > 1 {
                    ev.prev_kv().map(|p| self.kv(p))
                } else {
                    None
                };
                Some(Event::Put {
                    kv: self.kv(kv),
                    prev,
                })
            }
            ec::EventType::Delete => {
                let revision = kv.mod_revision();
                let prev = match ev.prev_kv() {
                    Some(p) => self.kv(p),
                    None => KeyValue {
                        mod_revision: revision,
                        ..self.kv(kv)
                    },
                };
                Some(Event::Delete { prev, revision })
            }
        }
    }

    async fn run(mut self, first: (ec::WatchStream, i64)) {
        let (mut stream, created_at) = first;
        if self.resume_after == 0 {
            self.resume_after = created_at;
            self.last_event = created_at;
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.follow(&mut stream).await {
                Flow::Stop => return,
                Flow::Reconnect => {}
                Flow::MemberFailed => self.members.failed(&self.conn),
            }
            // Re-establish from the last revision delivered, on the pinned
            // member (another one when this one failed).
            loop {
                if self.tx.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                let conn = self.members.pick();
                let opened = tokio::time::timeout(
                    Duration::from_secs(5),
                    open_watch(conn.client.clone(), &self.key, &self.end, self.resume_after),
                )
                .await;
                match opened {
                    Ok(Ok((s, _))) => {
                        self.members.answered(&conn);
                        self.conn = conn;
                        stream = s;
                        backoff = Duration::from_millis(100);
                        break;
                    }
                    Ok(Err(e)) if is_compacted(&e) => {
                        let _ = self
                            .tx
                            .send(Err(Error::Compacted {
                                requested: self.resume_after,
                                compacted: self.resume_after + 1,
                            }))
                            .await;
                        return;
                    }
                    Ok(Err(e)) => {
                        if failure(&e) != Failure::Final {
                            self.members.failed(&conn);
                        }
                        tracing::debug!(error = %e, "re-establishing an etcd watch")
                    }
                    Err(_) => {
                        self.members.failed(&conn);
                        tracing::debug!("re-establishing an etcd watch timed out")
                    }
                }
            }
        }
    }

    /// Delivers what `stream` sends until it breaks or the receiver is gone.
    async fn follow(&mut self, stream: &mut ec::WatchStream) -> Flow {
        loop {
            let idle = self.progress_interval.unwrap_or(Duration::from_secs(3600));
            let msg = tokio::select! {
                m = stream.message() => m,
                c = self.ctl.recv() => {
                    if c.is_some() {
                        let _ = stream.request_progress().await;
                    }
                    continue;
                }
                _ = tokio::time::sleep(idle), if self.progress_interval.is_some() => {
                    if stream.request_progress().await.is_err() {
                        return Flow::MemberFailed;
                    }
                    continue;
                }
                _ = self.tx.closed() => return Flow::Stop,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) => return Flow::MemberFailed,
                Err(e) => {
                    tracing::debug!(error = %e, "etcd watch broke");
                    return if failure(&e) == Failure::Final {
                        Flow::Reconnect
                    } else {
                        Flow::MemberFailed
                    };
                }
            };
            if resp.compact_revision() > 0 {
                let _ = self
                    .tx
                    .send(Err(Error::Compacted {
                        requested: self.resume_after,
                        compacted: resp.compact_revision(),
                    }))
                    .await;
                return Flow::Stop;
            }
            if resp.canceled() {
                tracing::debug!(reason = resp.cancel_reason(), "etcd canceled a watch");
                // A member that lost its leader cancels its watches.
                return if resp.cancel_reason().contains("leader") {
                    Flow::MemberFailed
                } else {
                    Flow::Reconnect
                };
            }
            if resp.created() {
                continue;
            }
            let header = revision_of(resp.header());
            if resp.events().is_empty() {
                // Progress: everything up to the header revision was sent.
                let revision = header.max(self.last_event);
                self.resume_after = self.resume_after.max(revision);
                if self
                    .tx
                    .send(Ok(Event::Progress { revision }))
                    .await
                    .is_err()
                {
                    return Flow::Stop;
                }
                continue;
            }
            let mut newest = self.last_event;
            for ev in resp.events() {
                let Some(e) = self.event(ev) else { continue };
                let rev = e.revision();
                if rev <= self.last_event {
                    continue;
                }
                newest = newest.max(rev);
                if self.tx.send(Ok(e)).await.is_err() {
                    return Flow::Stop;
                }
            }
            self.last_event = newest;
            self.resume_after = self.resume_after.max(newest);
        }
    }
}

enum Flow {
    Stop,
    /// The etcd watch ended; open it again.
    Reconnect,
    /// The member under the etcd watch failed: open it on another.
    MemberFailed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_ends() {
        assert_eq!(prefix_end(b"/registry/"), b"/registry0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
