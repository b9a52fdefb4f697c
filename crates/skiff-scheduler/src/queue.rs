//! The scheduling queue: an active heap ordered by the QueueSort plugin, a
//! back-off heap (1 s doubling to 10 s), and unschedulable pods that wait
//! for a cluster event that could help them (or 5 minutes).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::framework::{ClusterEvent, Plugin, QueuedPod};
use crate::types::PodInfo;

pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
pub const UNSCHEDULABLE_FLUSH: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loc {
    Active,
    Backoff,
    Unschedulable,
    /// Popped: being scheduled.
    InFlight,
}

struct Tracked {
    qp: QueuedPod,
    loc: Loc,
    gen: u64,
    backoff_until: Instant,
    since: Instant,
    rejectors: HashSet<&'static str>,
}

struct ActiveEntry {
    qp: QueuedPod,
    gen: u64,
    sort: Arc<dyn Plugin>,
}

impl PartialEq for ActiveEntry {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for ActiveEntry {}
impl PartialOrd for ActiveEntry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for ActiveEntry {
    fn cmp(&self, o: &Self) -> Ordering {
        // BinaryHeap pops the greatest: "less" (goes first) is greater.
        let qs = self.sort.as_queue_sort();
        match qs {
            Some(q) if q.less(&self.qp, &o.qp) => Ordering::Greater,
            Some(q) if q.less(&o.qp, &self.qp) => Ordering::Less,
            _ => o.qp.timestamp.cmp(&self.qp.timestamp),
        }
    }
}

pub struct SchedulingQueue {
    sort: Arc<dyn Plugin>,
    active: BinaryHeap<ActiveEntry>,
    backoff: BinaryHeap<std::cmp::Reverse<(Instant, u64, String)>>,
    pods: HashMap<String, Tracked>,
    seq: u64,
}

pub fn backoff_for(attempts: u32) -> Duration {
    let shift = attempts.saturating_sub(1).min(16);
    (INITIAL_BACKOFF * (1u32 << shift)).min(MAX_BACKOFF)
}

impl SchedulingQueue {
    pub fn new(sort: Arc<dyn Plugin>) -> SchedulingQueue {
        SchedulingQueue {
            sort,
            active: BinaryHeap::new(),
            backoff: BinaryHeap::new(),
            pods: HashMap::new(),
            seq: 0,
        }
    }

    fn push_active(&mut self, uid: &str) {
        if let Some(t) = self.pods.get_mut(uid) {
            t.gen += 1;
            t.loc = Loc::Active;
            self.active.push(ActiveEntry {
                qp: t.qp.clone(),
                gen: t.gen,
                sort: self.sort.clone(),
            });
        }
    }

    fn push_backoff(&mut self, uid: &str) {
        if let Some(t) = self.pods.get_mut(uid) {
            t.gen += 1;
            t.loc = Loc::Backoff;
            self.backoff
                .push(std::cmp::Reverse((t.backoff_until, t.gen, uid.to_string())));
        }
    }

    /// A new pending pod, or a newer version of one.
    pub fn add_or_update(&mut self, info: Arc<PodInfo>) {
        let uid = info.uid.clone();
        match self.pods.get_mut(&uid) {
            None => {
                self.seq += 1;
                let now = Instant::now();
                self.pods.insert(
                    uid.clone(),
                    Tracked {
                        qp: QueuedPod {
                            info,
                            timestamp: self.seq,
                            attempts: 0,
                        },
                        loc: Loc::Active,
                        gen: 0,
                        backoff_until: now,
                        since: now,
                        rejectors: HashSet::new(),
                    },
                );
                self.push_active(&uid);
            }
            Some(t) => {
                let changed = t.qp.info.pod.spec != info.pod.spec
                    || t.qp.info.pod.metadata.labels != info.pod.metadata.labels
                    || t.qp.info.priority != info.priority;
                t.qp.info = info;
                match t.loc {
                    Loc::Active => self.push_active(&uid),
                    Loc::Unschedulable if changed => {
                        if t.backoff_until > Instant::now() {
                            self.push_backoff(&uid);
                        } else {
                            self.push_active(&uid);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    pub fn delete(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// The next pod to schedule.
    pub fn pop(&mut self) -> Option<QueuedPod> {
        while let Some(e) = self.active.pop() {
            let uid = &e.qp.info.uid;
            let Some(t) = self.pods.get_mut(uid) else {
                continue;
            };
            if t.gen != e.gen || t.loc != Loc::Active {
                continue;
            }
            t.loc = Loc::InFlight;
            t.qp.attempts += 1;
            return Some(t.qp.clone());
        }
        None
    }

    /// The pod was assumed on a node: the queue forgets it.
    pub fn done(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    /// The pod fits nowhere now: wait for an event from one of `rejectors`.
    pub fn add_unschedulable(&mut self, qp: QueuedPod, rejectors: HashSet<&'static str>) {
        let now = Instant::now();
        let uid = qp.info.uid.clone();
        let t = self.pods.entry(uid.clone()).or_insert_with(|| Tracked {
            qp: qp.clone(),
            loc: Loc::Unschedulable,
            gen: 0,
            backoff_until: now,
            since: now,
            rejectors: HashSet::new(),
        });
        // An entry that still exists holds the newest version of the pod.
        t.qp.attempts = qp.attempts.max(t.qp.attempts);
        t.loc = Loc::Unschedulable;
        t.gen += 1;
        t.backoff_until = now + backoff_for(t.qp.attempts);
        t.since = now;
        t.rejectors = rejectors;
    }

    /// A binding that lost a race for the node (a failed transaction):
    /// back in the active queue at once, to be placed on the refreshed
    /// state.
    pub fn add_retry(&mut self, qp: QueuedPod) {
        let uid = qp.info.uid.clone();
        self.add_unschedulable(qp, HashSet::new());
        if let Some(t) = self.pods.get_mut(&uid) {
            t.backoff_until = Instant::now();
        }
        self.push_active(&uid);
    }

    /// An error (not the pod's fault): retry after back-off.
    pub fn add_backoff(&mut self, qp: QueuedPod) {
        let uid = qp.info.uid.clone();
        self.add_unschedulable(qp, HashSet::new());
        self.push_backoff(&uid);
    }

    /// A cluster event: unschedulable pods it could help move on.
    pub fn on_event(&mut self, may_help: impl Fn(&QueuedPod, &HashSet<&'static str>) -> bool) {
        let now = Instant::now();
        let movers: Vec<(String, bool)> = self
            .pods
            .iter()
            .filter(|(_, t)| t.loc == Loc::Unschedulable && may_help(&t.qp, &t.rejectors))
            .map(|(uid, t)| (uid.clone(), t.backoff_until > now))
            .collect();
        for (uid, backing_off) in movers {
            if backing_off {
                self.push_backoff(&uid);
            } else {
                self.push_active(&uid);
            }
        }
    }

    /// Moves pods whose back-off ended, and pods unschedulable for too long.
    pub fn flush(&mut self, now: Instant) {
        while let Some(std::cmp::Reverse((at, gen, uid))) = self.backoff.peek().cloned() {
            if at > now {
                break;
            }
            self.backoff.pop();
            if self
                .pods
                .get(&uid)
                .is_some_and(|t| t.gen == gen && t.loc == Loc::Backoff)
            {
                self.push_active(&uid);
            }
        }
        let stale: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, t)| {
                t.loc == Loc::Unschedulable && now.duration_since(t.since) >= UNSCHEDULABLE_FLUSH
            })
            .map(|(u, _)| u.clone())
            .collect();
        for uid in stale {
            self.push_active(&uid);
        }
    }

    /// When the next back-off ends.
    pub fn next_backoff(&self) -> Option<Instant> {
        self.backoff.peek().map(|r| r.0 .0)
    }

    pub fn has_active(&self) -> bool {
        !self.active.is_empty()
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    pub fn unschedulable_count(&self) -> usize {
        self.pods
            .values()
            .filter(|t| t.loc == Loc::Unschedulable)
            .count()
    }
}

/// Whether an event helps a pod rejected by `rejectors` under `fw`.
pub fn event_helps(
    event: ClusterEvent,
    rejectors: &HashSet<&'static str>,
    plugin_events: &HashMap<&'static str, &'static [ClusterEvent]>,
) -> bool {
    if rejectors.is_empty() {
        return true;
    }
    rejectors
        .iter()
        .any(|r| plugin_events.get(r).is_some_and(|evs| evs.contains(&event)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::priority_sort::PrioritySort;
    use crate::testing::*;

    fn q() -> SchedulingQueue {
        SchedulingQueue::new(Arc::new(PrioritySort))
    }

    fn pod(name: &str, prio: i32) -> Arc<PodInfo> {
        Arc::new(pod_info(PodBuilder::new(name).priority(prio).build()))
    }

    #[test]
    fn the_active_queue_pops_by_priority_then_arrival() {
        let mut q = q();
        q.add_or_update(pod("low-1", 1));
        q.add_or_update(pod("high", 100));
        q.add_or_update(pod("low-2", 1));
        let order: Vec<String> = std::iter::from_fn(|| q.pop())
            .map(|p| p.info.name.clone())
            .collect();
        assert_eq!(order, vec!["high", "low-1", "low-2"]);
    }

    #[test]
    fn back_off_doubles_from_one_second_up_to_ten() {
        let got: Vec<u64> = (1..=6).map(|a| backoff_for(a).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn an_unschedulable_pod_waits_for_an_event_that_could_help_it() {
        let mut q = q();
        q.add_or_update(pod("p", 0));
        let p = q.pop().unwrap();
        let mut rej = HashSet::new();
        rej.insert("NodeResourcesFit");
        q.add_unschedulable(p, rej);
        assert!(q.pop().is_none());
        let mut events: HashMap<&'static str, &'static [ClusterEvent]> = HashMap::new();
        events.insert("NodeResourcesFit", &[ClusterEvent::NodeAdd]);
        q.on_event(|_, r| event_helps(ClusterEvent::NodeLabelChange, r, &events));
        q.flush(Instant::now() + Duration::from_secs(2));
        assert!(
            q.pop().is_none(),
            "a label change does not help a pod short of cpu"
        );
        q.on_event(|_, r| event_helps(ClusterEvent::NodeAdd, r, &events));
        // Still backing off (1 s after the first attempt).
        assert!(q.pop().is_none());
        q.flush(Instant::now() + Duration::from_secs(2));
        assert_eq!(q.pop().unwrap().info.name, "p");
    }

    #[test]
    fn unschedulable_pods_are_retried_after_five_minutes_anyway() {
        let mut q = q();
        q.add_or_update(pod("p", 0));
        let p = q.pop().unwrap();
        q.add_unschedulable(p, ["X"].into_iter().collect());
        q.flush(Instant::now() + Duration::from_secs(10));
        assert!(q.pop().is_none());
        q.flush(Instant::now() + UNSCHEDULABLE_FLUSH + Duration::from_secs(1));
        assert!(q.pop().is_some());
    }

    #[test]
    fn a_deleted_pod_is_never_popped() {
        let mut q = q();
        let p = pod("p", 0);
        q.add_or_update(p.clone());
        q.delete(&p.uid);
        assert!(q.pop().is_none());
    }
}
