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
//! etcd unreachable: every request fails within [`EtcdOptions::request_timeout`]
//! with [`Error::Unavailable`] or [`Error::Timeout`] (503 and 504 upstream).
//! Watches outlive etcd restarts: the watch is re-established from the last
//! revision it delivered, and events at or below it are dropped, so the
//! stream has no gap and no duplicate.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client as ec;
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::{Error, Event, KeyValue, ListOptions, ListResult, Result, Store, WatchStream};

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
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: ROOT.into(),
            tls: None,
            request_timeout: Duration::from_secs(5),
            dial_timeout: Duration::from_secs(2),
        }
    }
}

/// The etcd-backed [`Store`].
pub struct EtcdStore {
    client: ec::Client,
    /// The prefix replacing `/registry`, without a trailing slash.
    prefix: String,
    timeout: Duration,
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

impl EtcdStore {
    /// Connects to etcd and checks it answers.
    pub async fn connect(opts: EtcdOptions) -> Result<Arc<EtcdStore>> {
        if opts.endpoints.is_empty() {
            return Err(Error::Backend("no etcd endpoints given".into()));
        }
        let mut co = ec::ConnectOptions::new()
            .with_connect_timeout(opts.dial_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
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
        let endpoints: Vec<String> = opts
            .endpoints
            .iter()
            .map(|e| e.trim().trim_end_matches('/').to_string())
            .collect();
        let client = tokio::time::timeout(
            opts.request_timeout,
            ec::Client::connect(&endpoints, Some(co)),
        )
        .await
        .map_err(|_| Error::Timeout(format!("connecting to etcd at {}", endpoints.join(","))))?
        .map_err(map_err)?;
        let store = Arc::new(EtcdStore {
            client,
            prefix: opts.prefix.trim_end_matches('/').to_string(),
            timeout: opts.request_timeout,
            watchers: Default::default(),
        });
        store.current_revision().await?;
        Ok(store)
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

    /// Runs one request with the request timeout.
    async fn call<T, F>(&self, f: F) -> std::result::Result<T, ec::Error>
    where
        F: std::future::Future<Output = std::result::Result<T, ec::Error>>,
    {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(ec::Error::GRpcStatus(tonic::Status::deadline_exceeded(
                format!("etcd did not answer within {:?}", self.timeout),
            ))),
        }
    }

    /// The recorded compaction: (revision, version of the record).
    async fn compaction_record(&self) -> Result<(i64, i64, i64)> {
        let mut kv = self.client.kv_client();
        let r = self
            .call(kv.get(COMPACT_REV_KEY, None))
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
        let mut kv = self.client.kv_client();
        let r = self
            .call(kv.get(self.etcd_key(key), None))
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
        let mut kv = self.client.kv_client();
        let r = match self.call(kv.get(start, Some(o))).await {
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
        let mut kv = self.client.kv_client();
        let r = self.call(kv.get(p, Some(o))).await.map_err(map_err)?;
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
        let mut kv = self.client.kv_client();
        let r = self.call(kv.txn(txn)).await.map_err(map_err)?;
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
        let mut kv = self.client.kv_client();
        let r = self.call(kv.txn(txn)).await.map_err(map_err)?;
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

    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)> {
        let k = self.etcd_key(key);
        let mut kv = self.client.kv_client();
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
                let r = self.call(kv.txn(txn)).await.map_err(map_err)?;
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
                let r = self.call(kv.delete(k, del)).await.map_err(map_err)?;
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
        let client = self.client.clone();
        let first = self
            .call(open_watch(client.clone(), &key, &end, after))
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
            client,
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
        let mut kv = self.client.kv_client();
        let r = self
            .call(kv.get(
                COMPACT_REV_KEY,
                Some(ec::GetOptions::new().with_count_only()),
            ))
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
            let mut kv = self.client.kv_client();
            let r = self.call(kv.txn(txn)).await.map_err(map_err)?;
            if !r.succeeded() {
                continue;
            }
            let o = ec::CompactionOptions::new().with_physical();
            return match self.call(kv.compact(revision, Some(o))).await {
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
    client: ec::Client,
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
            }
            // Re-establish from the last revision delivered.
            loop {
                if self.tx.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                let opened = tokio::time::timeout(
                    Duration::from_secs(5),
                    open_watch(self.client.clone(), &self.key, &self.end, self.resume_after),
                )
                .await;
                match opened {
                    Ok(Ok((s, _))) => {
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
                    Ok(Err(e)) => tracing::debug!(error = %e, "re-establishing an etcd watch"),
                    Err(_) => tracing::debug!("re-establishing an etcd watch timed out"),
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
                        return Flow::Reconnect;
                    }
                    continue;
                }
                _ = self.tx.closed() => return Flow::Stop,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) => return Flow::Reconnect,
                Err(e) => {
                    tracing::debug!(error = %e, "etcd watch broke");
                    return Flow::Reconnect;
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
                return Flow::Reconnect;
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
    Reconnect,
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
