//! The pod as the scheduler watches it: decoded without
//! `metadata.managedFields`, which the scheduler never reads and which cost
//! more to decode and drop than the rest of a pod (`examples/bench_decode.rs`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

/// A `Pod` decoded as `Pod` decodes it, except that `metadata.managedFields`
/// is skipped (always `None`) and `apiVersion`/`kind` are not checked (the
/// watch is of pods).
#[derive(Clone, Debug, PartialEq)]
pub struct LeanPod(pub Pod);

impl<'de> Deserialize<'de> for LeanPod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Fields {
            metadata: Option<Meta>,
            spec: Option<PodSpec>,
            status: Option<PodStatus>,
        }
        let f = Fields::deserialize(d)?;
        Ok(LeanPod(Pod {
            metadata: f.metadata.map(ObjectMeta::from).unwrap_or_default(),
            spec: f.spec,
            status: f.status,
        }))
    }
}

/// `ObjectMeta` less `managedFields`: serde skips the keys a struct does not
/// name, without building them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl From<Meta> for ObjectMeta {
    // No `..Default::default()`: a field added to ObjectMeta must be added
    // to `Meta` too, or this stops compiling.
    fn from(m: Meta) -> ObjectMeta {
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

// `kube::Resource` (what `Api` and the watcher need) comes with these.
impl k8s_openapi::Resource for LeanPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for LeanPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use kube::core::WatchEvent;

    use super::*;

    /// B1's pod as the in-process API server sends it: ADDED, then MODIFIED
    /// after binding.
    const EVENTS: &str = include_str!("../testdata/pod-watch-events.jsonl");

    fn object<K>(ev: WatchEvent<K>) -> K {
        match ev {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o,
            _ => panic!("not an object event"),
        }
    }

    #[test]
    fn a_watched_pod_decodes_as_pod_does_less_its_managed_fields() {
        for line in EVENTS.lines() {
            let mut full = object(serde_json::from_str::<WatchEvent<Pod>>(line).unwrap());
            let lean = object(serde_json::from_str::<WatchEvent<LeanPod>>(line).unwrap());
            assert!(
                full.metadata.managed_fields.is_some(),
                "the fixture has managedFields"
            );
            assert_eq!(lean.0.metadata.managed_fields, None);
            full.metadata.managed_fields = None;
            assert_eq!(lean.0, full);
        }
    }

    #[test]
    fn every_other_metadata_field_is_decoded() {
        let t = |s: &str| Some(Time(s.parse::<Timestamp>().unwrap()));
        let map = |k: &str, v: &str| Some(BTreeMap::from([(k.to_string(), v.to_string())]));
        let pod = Pod {
            metadata: ObjectMeta {
                annotations: map("a", "1"),
                creation_timestamp: t("2024-01-02T03:04:05Z"),
                deletion_grace_period_seconds: Some(30),
                deletion_timestamp: t("2024-01-02T03:05:05Z"),
                finalizers: Some(vec!["example.com/f".into()]),
                generate_name: Some("p-".into()),
                generation: Some(2),
                labels: map("app", "x"),
                managed_fields: None,
                name: Some("p-1".into()),
                namespace: Some("ns".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    block_owner_deletion: Some(true),
                    controller: Some(true),
                    kind: "ReplicaSet".into(),
                    name: "rs".into(),
                    uid: "rs-uid".into(),
                }]),
                resource_version: Some("7".into()),
                self_link: Some("/api/v1/namespaces/ns/pods/p-1".into()),
                uid: Some("uid-1".into()),
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus::default()),
        };
        let json = serde_json::to_string(&pod).unwrap();
        assert_eq!(serde_json::from_str::<LeanPod>(&json).unwrap().0, pod);
    }

    #[test]
    fn an_object_without_metadata_spec_or_status_decodes_to_defaults() {
        let lean: LeanPod = serde_json::from_str(r#"{"metadata": null}"#).unwrap();
        assert_eq!(lean.0, Pod::default());
    }
}
