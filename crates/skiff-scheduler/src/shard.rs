//! Several instances of one scheduler sharing its pods without leader
//! election (Omega's parallel schedulers on one shared state): each
//! instance holds a Lease of its own, labelled with its group (the
//! profiles it runs), renewed every few seconds; an instance counts as
//! live while its Lease keeps changing. Every pending pod belongs to one
//! live instance, chosen by rendezvous hashing over the live instances'
//! names, so when an instance's Lease lapses only its pods move, and each
//! to one of the others. Every instance keeps the whole cluster state;
//! the API server's commit check settles the races their placements
//! still have (two pods of different owners on the same free cpu).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use tokio::sync::watch;

/// The label naming an instance's group on its Lease.
pub const GROUP_LABEL: &str = "skiff.io/scheduler-group";
/// Where the instances' Leases live.
pub const NAMESPACE: &str = "kube-system";
/// How often an instance renews its Lease and looks at the others'.
pub const RENEW: Duration = Duration::from_secs(2);
/// How long an instance whose Lease has not changed still counts as live.
pub const LEASE: Duration = Duration::from_secs(10);

/// The group of an instance running `profiles` (scheduler names): a
/// label value (16 hex digits of their sorted names' FNV-1a hash).
pub fn group_of<'a>(profiles: impl IntoIterator<Item = &'a str>) -> String {
    let names: BTreeSet<&str> = profiles.into_iter().collect();
    let joined = names.into_iter().collect::<Vec<_>>().join(",");
    format!("{:016x}", fnv1a(joined.as_bytes()))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The instance among `members` that owns the pod `uid` (rendezvous
/// hashing: the member with the highest hash of member and pod).
pub fn owner<'a>(uid: &str, members: &'a [String]) -> Option<&'a str> {
    members
        .iter()
        .max_by_key(|m| {
            let mut key = Vec::with_capacity(m.len() + uid.len() + 1);
            key.extend_from_slice(m.as_bytes());
            key.push(b'/');
            key.extend_from_slice(uid.as_bytes());
            // FNV's low bits mix poorly for near-identical keys: one
            // more round of multiplication spreads them.
            fnv1a(&key).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        })
        .map(String::as_str)
}

/// Which pods this instance schedules.
#[derive(Clone)]
pub struct Ownership {
    pub me: String,
    pub members: watch::Receiver<Vec<String>>,
}

impl Ownership {
    /// Whether this instance owns the pod now. Until the first look at
    /// the Leases, it owns everything (as a single instance would).
    pub fn owns(&self, uid: &str) -> bool {
        let members = self.members.borrow();
        if members.is_empty() {
            return true;
        }
        owner(uid, &members) == Some(self.me.as_str())
    }
}

/// Live instances from what was observed of the Leases: a Lease counts
/// while it changed (its resourceVersion) within [`LEASE`].
#[derive(Default)]
pub struct Observed {
    seen: HashMap<String, (String, Instant)>,
}

impl Observed {
    /// Takes a listing of the group's Leases (holder, resourceVersion) at
    /// `now`; the live holders, sorted, with `me` always among them.
    pub fn update(&mut self, leases: &[(String, String)], me: &str, now: Instant) -> Vec<String> {
        let listed: BTreeSet<&str> = leases.iter().map(|(h, _)| h.as_str()).collect();
        self.seen.retain(|h, _| listed.contains(h.as_str()));
        for (holder, rv) in leases {
            match self.seen.get_mut(holder) {
                Some((old, at)) if old != rv => {
                    *old = rv.clone();
                    *at = now;
                }
                Some(_) => {}
                None => {
                    self.seen.insert(holder.clone(), (rv.clone(), now));
                }
            }
        }
        let mut live: BTreeSet<String> = self
            .seen
            .iter()
            .filter(|(_, (_, at))| now.duration_since(*at) < LEASE)
            .map(|(h, _)| h.clone())
            .collect();
        live.insert(me.to_string());
        live.into_iter().collect()
    }
}

fn lease_name(me: &str) -> String {
    let clean: String = me
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("skiff-scheduler-{}", clean.trim_matches('-'))
}

/// Holds this instance's Lease and publishes the live members of its
/// group, while anyone reads them.
pub async fn run(client: kube::Client, group: String, me: String, tx: watch::Sender<Vec<String>>) {
    let api: Api<Lease> = Api::namespaced(client, NAMESPACE);
    let name = lease_name(&me);
    let mut observed = Observed::default();
    let mut tick = tokio::time::interval(RENEW);
    loop {
        tick.tick().await;
        // The scheduler that reads the members is gone: so is this
        // instance (its Lease lapses).
        if tx.is_closed() {
            return;
        }
        if let Err(e) = renew(&api, &name, &group, &me).await {
            tracing::warn!(lease = %name, error = %e, "renewing the scheduler instance's Lease");
        }
        let lp = ListParams::default().labels(&format!("{GROUP_LABEL}={group}"));
        match api.list(&lp).await {
            Ok(list) => {
                let leases: Vec<(String, String)> = list
                    .items
                    .iter()
                    .filter_map(|l| {
                        let holder = l.spec.as_ref()?.holder_identity.clone()?;
                        Some((
                            holder,
                            l.metadata.resource_version.clone().unwrap_or_default(),
                        ))
                    })
                    .collect();
                let live = observed.update(&leases, &me, Instant::now());
                tx.send_if_modified(|cur| {
                    if *cur == live {
                        return false;
                    }
                    tracing::info!(instances = ?live, "scheduler instances sharing the pods");
                    *cur = live;
                    true
                });
            }
            Err(e) => tracing::warn!(error = %e, "listing the scheduler instances' Leases"),
        }
    }
}

async fn renew(api: &Api<Lease>, name: &str, group: &str, me: &str) -> kube::Result<()> {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    match api.get_opt(name).await? {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.holder_identity = Some(me.to_string());
            spec.renew_time = Some(now);
            spec.lease_duration_seconds = Some(LEASE.as_secs() as i32);
            api.replace(name, &PostParams::default(), &lease).await?;
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(NAMESPACE.to_string()),
                    labels: Some([(GROUP_LABEL.to_string(), group.to_string())].into()),
                    ..Default::default()
                },
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    holder_identity: Some(me.to_string()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_duration_seconds: Some(LEASE.as_secs() as i32),
                    ..Default::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("instance-{i}")).collect()
    }

    #[test]
    fn pods_spread_over_the_instances_and_only_a_lost_one_s_pods_move() {
        let four = members(4);
        let uids: Vec<String> = (0..4000).map(|i| format!("uid-{i:05}")).collect();
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for u in &uids {
            *counts.entry(owner(u, &four).unwrap()).or_default() += 1;
        }
        for m in &four {
            let c = counts.get(m.as_str()).copied().unwrap_or(0);
            assert!((800..1200).contains(&c), "{m} owns {c} of 4000");
        }
        // instance-2 goes: its pods move, nobody else's do.
        let three: Vec<String> = four
            .iter()
            .filter(|m| *m != "instance-2")
            .cloned()
            .collect();
        for u in &uids {
            let before = owner(u, &four).unwrap();
            let after = owner(u, &three).unwrap();
            if before != "instance-2" {
                assert_eq!(before, after, "{u} moved");
            }
        }
        assert_eq!(owner("x", &[]), None);
    }

    #[test]
    fn an_instance_is_live_while_its_lease_changes() {
        let mut o = Observed::default();
        let t0 = Instant::now();
        let l = |rv_a: &str, rv_b: &str| {
            vec![
                ("a".to_string(), rv_a.to_string()),
                ("b".to_string(), rv_b.to_string()),
            ]
        };
        assert_eq!(o.update(&l("1", "1"), "a", t0), vec!["a", "b"]);
        // b stops renewing; a goes on.
        let t1 = t0 + LEASE / 2;
        assert_eq!(o.update(&l("2", "1"), "a", t1), vec!["a", "b"]);
        let t2 = t0 + LEASE + Duration::from_secs(1);
        assert_eq!(o.update(&l("3", "1"), "a", t2), vec!["a"]);
        // b comes back.
        assert_eq!(o.update(&l("4", "2"), "a", t2), vec!["a", "b"]);
        // Me, always, even before my Lease is listed.
        assert_eq!(o.update(&[], "a", t2), vec!["a"]);
    }

    #[test]
    fn a_group_is_the_same_for_the_same_profiles_in_any_order() {
        assert_eq!(group_of(["b", "a"]), group_of(["a", "b"]));
        assert_ne!(group_of(["a"]), group_of(["a", "b"]));
        assert_eq!(group_of(["a"]).len(), 16);
        assert_eq!(lease_name("Host_1:abc"), "skiff-scheduler-host-1-abc");
    }
}
