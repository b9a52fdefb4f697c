//! Leader election through a `coordination.k8s.io/v1` Lease, as
//! client-go's leaderelection does it: the holder renews `renewTime` every
//! `retry` period; a candidate takes the lease over once `renewTime +
//! leaseDurationSeconds` has passed. Optimistic concurrency (the Lease's
//! resourceVersion) decides races between candidates.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};

/// Timing of an election (client-go's defaults: 15 s lease, 10 s renew
/// deadline, 2 s retry).
#[derive(Debug, Clone)]
pub struct Timing {
    /// How long a lease not renewed stays the holder's (other candidates
    /// wait this long after its last renewal).
    pub lease_duration: Duration,
    /// How long the holder keeps acting without a successful renewal: it
    /// stops at once when this passes, before the lease can lapse for the
    /// others. Shorter than `lease_duration`.
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

/// Waits until `identity` holds the Lease `kube-system/<name>`, then runs
/// `work` while renewing it. Returns when `work` ends (its result) or when
/// the lease is lost (an error), `work` then dropped: lost means another
/// holder took it, or no renewal succeeded within `renew_deadline` of the
/// last one (a renewal that hangs is abandoned at the deadline), so the
/// holder has stopped before `lease_duration` lets anyone else start.
pub async fn run_elected<F, T>(
    client: kube::Client,
    name: &str,
    identity: &str,
    timing: Timing,
    work: F,
) -> anyhow::Result<T>
where
    F: Future<Output = anyhow::Result<T>>,
{
    let leases: Api<Lease> = Api::namespaced(client, "kube-system");
    let mut last_renew;
    loop {
        let attempt = tokio::time::Instant::now();
        match tokio::time::timeout(
            timing.renew_deadline,
            try_acquire(&leases, name, identity, &timing),
        )
        .await
        {
            Ok(Ok(true)) => {
                last_renew = attempt;
                break;
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::debug!(lease = name, error = %e, "leader election attempt failed")
            }
            Err(_) => tracing::debug!(lease = name, "leader election attempt timed out"),
        }
        tokio::time::sleep(timing.retry).await;
    }
    tracing::info!(lease = name, identity, "became leader");
    let renew = async {
        loop {
            tokio::time::sleep(timing.retry).await;
            let deadline = last_renew + timing.renew_deadline;
            let attempt = tokio::time::Instant::now();
            match tokio::time::timeout_at(deadline, try_acquire(&leases, name, identity, &timing))
                .await
            {
                Ok(Ok(true)) => last_renew = attempt,
                Ok(Ok(false)) => return anyhow::anyhow!("lost the lease {name} to another holder"),
                Ok(Err(e)) => {
                    tracing::warn!(lease = name, error = %e, "renewing the lease failed");
                    if tokio::time::Instant::now() >= deadline {
                        return anyhow::anyhow!("could not renew the lease {name}: {e}");
                    }
                }
                Err(_) => {
                    return anyhow::anyhow!(
                        "could not renew the lease {name} within {:?}",
                        timing.renew_deadline
                    )
                }
            }
        }
    };
    tokio::select! {
        out = work => out,
        lost = renew => {
            tracing::warn!(lease = name, identity, error = %lost, "stopped leading");
            Err(lost)
        }
    }
}

/// One attempt to take or renew the lease. `Ok(false)`: someone else holds it.
async fn try_acquire(
    leases: &Api<Lease>,
    name: &str,
    identity: &str,
    timing: &Timing,
) -> anyhow::Result<bool> {
    let now = Timestamp::now();
    let secs = timing.lease_duration.as_secs().max(1) as i32;
    match leases.get_opt(name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some("kube-system".into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(identity.to_string()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            let holder = spec.holder_identity.clone().unwrap_or_default();
            let ours = holder == identity;
            if !ours && !holder.is_empty() {
                let renewed = spec
                    .renew_time
                    .as_ref()
                    .map(|t| t.0)
                    .unwrap_or(Timestamp::UNIX_EPOCH);
                let duration = spec.lease_duration_seconds.unwrap_or(secs) as i64;
                if renewed + SignedDuration::from_secs(duration) > now {
                    return Ok(false);
                }
            }
            if !ours {
                spec.holder_identity = Some(identity.to_string());
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.lease_duration_seconds = Some(secs);
            spec.renew_time = Some(MicroTime(now));
            match leases.replace(name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestCluster;

    #[tokio::test]
    async fn a_second_candidate_waits_until_the_first_stops_renewing() {
        let cluster = TestCluster::start().await.unwrap();
        let client = cluster.client("test");
        let timing = Timing {
            lease_duration: Duration::from_secs(2),
            renew_deadline: Duration::from_millis(1500),
            retry: Duration::from_millis(200),
        };
        let (stop_a, stopped_a) = tokio::sync::oneshot::channel::<()>();
        let a = tokio::spawn(run_elected(
            client.clone(),
            "demo",
            "a",
            timing.clone(),
            async move {
                let _ = stopped_a.await;
                Ok(())
            },
        ));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
        let held = leases.get("demo").await.unwrap();
        assert_eq!(held.spec.unwrap().holder_identity.as_deref(), Some("a"));

        let b_started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = b_started.clone();
        let b = tokio::spawn(run_elected(
            client.clone(),
            "demo",
            "b",
            timing.clone(),
            async move {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            },
        ));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(
            !b_started.load(std::sync::atomic::Ordering::SeqCst),
            "b ran while a held the lease"
        );
        stop_a.send(()).unwrap();
        a.await.unwrap().unwrap();
        tokio::time::timeout(Duration::from_secs(10), b)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(b_started.load(std::sync::atomic::Ordering::SeqCst));
        let lease = leases.get("demo").await.unwrap().spec.unwrap();
        assert_eq!(lease.holder_identity.as_deref(), Some("b"));
        assert_eq!(lease.lease_transitions, Some(1));
    }

    /// A holder whose renewals hang (its API server unreachable) stops its
    /// work within the renew deadline, and a second candidate starts only
    /// after that: never two at once.
    #[tokio::test]
    async fn a_holder_that_cannot_renew_stops_before_another_starts() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let cluster = TestCluster::start().await.unwrap();
        let blocked = Arc::new(AtomicBool::new(false));
        let gate = blocked.clone();
        // A's transport: requests hang while `blocked` is set.
        let router = cluster
            .api
            .in_process_router("test")
            .layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    let hang = gate.load(Ordering::SeqCst);
                    async move {
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        next.run(req).await
                    }
                },
            ));
        let a_client = kube::Client::new(router, "default");
        let timing = Timing {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry: Duration::from_millis(200),
        };
        let acted = Arc::new(AtomicU64::new(0));
        let a_acted = acted.clone();
        let a = tokio::spawn(run_elected(
            a_client,
            "gated",
            "a",
            timing.clone(),
            async move {
                loop {
                    a_acted.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                #[allow(unreachable_code)]
                Ok(())
            },
        ));
        let leases: Api<Lease> = Api::namespaced(cluster.client("test"), "kube-system");
        for _ in 0..100 {
            if acted.load(Ordering::SeqCst) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(acted.load(Ordering::SeqCst) > 0, "a never led");
        let b_started: Arc<std::sync::Mutex<Option<tokio::time::Instant>>> = Default::default();
        let flag = b_started.clone();
        let b = tokio::spawn(run_elected(
            cluster.client("test"),
            "gated",
            "b",
            timing.clone(),
            async move {
                *flag.lock().unwrap() = Some(tokio::time::Instant::now());
                Ok(())
            },
        ));
        let blocked_at = tokio::time::Instant::now();
        blocked.store(true, Ordering::SeqCst);
        let err = tokio::time::timeout(Duration::from_secs(5), a)
            .await
            .expect("a kept leading without renewing")
            .unwrap()
            .unwrap_err();
        let a_stopped = tokio::time::Instant::now();
        assert!(err.to_string().contains("could not renew"), "{err}");
        assert!(
            a_stopped - blocked_at <= timing.renew_deadline + Duration::from_millis(500),
            "a stopped {:?} after losing its API server",
            a_stopped - blocked_at
        );
        // Its work no longer runs.
        let n = acted.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(acted.load(Ordering::SeqCst), n, "a's work still runs");
        tokio::time::timeout(Duration::from_secs(10), b)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let b_at = b_started.lock().unwrap().expect("b ran");
        assert!(b_at >= a_stopped, "b started while a still acted");
        let lease = leases.get("gated").await.unwrap().spec.unwrap();
        assert_eq!(lease.holder_identity.as_deref(), Some("b"));
    }
}
