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
    pub lease_duration: Duration,
    pub retry: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_duration: Duration::from_secs(15),
            retry: Duration::from_secs(2),
        }
    }
}

/// Waits until `identity` holds the Lease `kube-system/<name>`, then runs
/// `work` while renewing it. Returns when `work` ends (its result) or when
/// the lease is lost (an error: the caller should exit so a fresh process
/// starts from what it observes).
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
    loop {
        match try_acquire(&leases, name, identity, &timing).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => tracing::debug!(lease = name, error = %e, "leader election attempt failed"),
        }
        tokio::time::sleep(timing.retry).await;
    }
    tracing::info!(lease = name, identity, "became leader");
    tokio::pin!(work);
    let mut last_renew = tokio::time::Instant::now();
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tokio::time::sleep(timing.retry) => {
                match try_acquire(&leases, name, identity, &timing).await {
                    Ok(true) => last_renew = tokio::time::Instant::now(),
                    Ok(false) => anyhow::bail!("lost the lease {name} to another holder"),
                    Err(e) => {
                        tracing::warn!(lease = name, error = %e, "renewing the lease failed");
                        if last_renew.elapsed() > timing.lease_duration * 2 / 3 {
                            anyhow::bail!("could not renew the lease {name}: {e}");
                        }
                    }
                }
            }
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
}
