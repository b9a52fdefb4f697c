//! A pod's resolv.conf by `dnsPolicy`, merged with `dnsConfig`, as kubelet
//! builds it (`pkg/kubelet/network/dns`), and the host's resolv.conf the
//! `Default` policy and the upstream forwarder read.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

use crate::runtime::cri;

/// Kubernetes' limits on a pod's resolv.conf (`validation.MaxDNSNameservers`,
/// `MaxDNSSearchPaths`, `MaxDNSSearchListChars`).
pub const MAX_NAMESERVERS: usize = 3;
pub const MAX_SEARCH_PATHS: usize = 32;
pub const MAX_SEARCH_CHARS: usize = 2048;

/// What a node knows about cluster DNS: kubelet's `--cluster-dns` and
/// `--cluster-domain`, and the host's resolver configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterDns {
    /// The cluster DNS address; without one, ClusterFirst pods get the
    /// host's configuration (as kubelet does without `--cluster-dns`).
    pub ip: Option<IpAddr>,
    /// The cluster domain, e.g. `cluster.local` (no trailing dot).
    pub domain: String,
    /// The host's resolver configuration (`Default` pods, upstreams).
    pub host: ResolvConf,
}

/// The parts of a resolv.conf kubelet reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl ResolvConf {
    /// Parses resolv.conf text like kubelet's `parseResolvConf`: every
    /// `nameserver`, the last `search` line (without "."), every option.
    pub fn parse(text: &str) -> ResolvConf {
        let mut rc = ResolvConf::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut fields = line.split_whitespace();
            match fields.next() {
                Some("nameserver") => {
                    if let Some(ns) = fields.next() {
                        rc.nameservers.push(ns.to_string());
                    }
                }
                Some("search") => {
                    rc.searches = fields
                        .filter(|s| *s != ".")
                        .map(|s| s.trim_end_matches('.').to_string())
                        .collect();
                }
                Some("options") => rc.options.extend(fields.map(str::to_string)),
                _ => {}
            }
        }
        rc
    }

    /// The host's resolver configuration as pods and the forwarder can use
    /// it: /etc/resolv.conf, or systemd-resolved's upstream list when
    /// /etc/resolv.conf only names a loopback stub (as k3s does), with
    /// loopback nameservers left out (a pod cannot reach the host's
    /// loopback, and forwarding to a stub that forwards back would loop).
    pub fn of_host() -> ResolvConf {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .map(|t| ResolvConf::parse(&t))
        };
        let etc = read("/etc/resolv.conf").unwrap_or_default();
        let mut rc = if etc.nameservers.iter().all(|n| is_loopback(n)) {
            match read("/run/systemd/resolve/resolv.conf") {
                Some(r) if !r.nameservers.is_empty() => r,
                _ => etc,
            }
        } else {
            etc
        };
        rc.nameservers.retain(|n| !is_loopback(n));
        rc
    }
}

fn is_loopback(ns: &str) -> bool {
    ns.parse::<IpAddr>()
        .map(|ip| ip.is_loopback())
        .unwrap_or(false)
}

/// How kubelet treats a pod's `dnsPolicy` (`getPodDNSType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PodDnsType {
    Cluster,
    Host,
    None,
}

fn pod_dns_type(pod: &Pod, dns: &ClusterDns) -> PodDnsType {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let t = match spec.and_then(|s| s.dns_policy.as_deref()) {
        Some("None") => PodDnsType::None,
        Some("Default") => PodDnsType::Host,
        Some("ClusterFirstWithHostNet") => PodDnsType::Cluster,
        // ClusterFirst (the default): host-network pods use the host's.
        _ if host_network => PodDnsType::Host,
        _ => PodDnsType::Cluster,
    };
    if t == PodDnsType::Cluster && dns.ip.is_none() {
        // kubelet: "ClusterFirst policy specified without ClusterDNS IP
        // configured", falls back to the host's.
        return PodDnsType::Host;
    }
    t
}

fn push_unique(list: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for i in items {
        if !list.contains(&i) {
            list.push(i);
        }
    }
}

/// The pod's resolv.conf as the runtime writes it (`GetPodDNS`).
pub fn pod_resolv_conf(pod: &Pod, dns: &ClusterDns) -> ResolvConf {
    let mut rc = match pod_dns_type(pod, dns) {
        PodDnsType::None => ResolvConf::default(),
        PodDnsType::Host => dns.host.clone(),
        PodDnsType::Cluster => {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let zone = dns.domain.trim_end_matches('.');
            let mut searches = vec![];
            if !zone.is_empty() {
                searches = vec![
                    format!("{ns}.svc.{zone}"),
                    format!("svc.{zone}"),
                    zone.to_string(),
                ];
            }
            push_unique(&mut searches, dns.host.searches.iter().cloned());
            ResolvConf {
                nameservers: dns.ip.iter().map(|ip| ip.to_string()).collect(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
    };
    if let Some(extra) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) {
        push_unique(
            &mut rc.nameservers,
            extra.nameservers.iter().flatten().cloned(),
        );
        push_unique(&mut rc.searches, extra.searches.iter().flatten().cloned());
        // mergeDNSOptions: the pod's options replace the base ones of the
        // same name (kubelet's order is a map's; ours is stable: base
        // options first, in place, then new ones).
        for o in extra.options.iter().flatten() {
            let Some(name) = o.name.as_deref().filter(|n| !n.is_empty()) else {
                continue;
            };
            let rendered = match o.value.as_deref() {
                Some(v) if !v.is_empty() => format!("{name}:{v}"),
                _ => name.to_string(),
            };
            let same = |x: &String| x.split(':').next() == Some(name);
            match rc.options.iter().position(same) {
                Some(i) => rc.options[i] = rendered,
                None => rc.options.push(rendered),
            }
        }
    }
    // formDNSConfigFitsLimits.
    rc.nameservers.truncate(MAX_NAMESERVERS);
    rc.searches.truncate(MAX_SEARCH_PATHS);
    let mut chars = 0;
    let mut keep = 0;
    for s in &rc.searches {
        if chars + s.len() + usize::from(keep > 0) > MAX_SEARCH_CHARS {
            break;
        }
        chars += s.len() + usize::from(keep > 0);
        keep += 1;
    }
    rc.searches.truncate(keep);
    rc
}

/// The CRI sandbox DNS config of a pod. Always set, so the runtime writes
/// exactly this (without one, containerd copies the host's file, loopback
/// stubs included).
pub fn sandbox_dns_config(pod: &Pod, dns: &ClusterDns) -> cri::DnsConfig {
    let rc = pod_resolv_conf(pod, dns);
    cri::DnsConfig {
        servers: rc.nameservers,
        searches: rc.searches,
        options: rc.options,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster() -> ClusterDns {
        ClusterDns {
            ip: Some("10.43.0.10".parse().unwrap()),
            domain: "cluster.local".into(),
            host: ResolvConf {
                nameservers: vec!["192.0.2.53".into()],
                searches: vec!["corp.example".into()],
                options: vec!["timeout:2".into()],
            },
        }
    }

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c"}]);
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": spec}),
        )
        .unwrap()
    }

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_cluster_first_pod_gets_the_cluster_dns_its_namespace_search_and_ndots_5() {
        let rc = pod_resolv_conf(&pod(json!({})), &cluster());
        assert_eq!(rc.nameservers, strs(&["10.43.0.10"]));
        assert_eq!(
            rc.searches,
            strs(&[
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example"
            ])
        );
        assert_eq!(rc.options, strs(&["ndots:5"]));
    }

    #[test]
    fn a_host_network_pod_with_cluster_first_gets_the_hosts_resolv_conf() {
        let rc = pod_resolv_conf(&pod(json!({"hostNetwork": true})), &cluster());
        assert_eq!(rc, cluster().host);
        let rc = pod_resolv_conf(
            &pod(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"})),
            &cluster(),
        );
        assert_eq!(rc.nameservers, strs(&["10.43.0.10"]));
    }

    #[test]
    fn default_is_the_hosts_and_none_is_only_dns_config() {
        let rc = pod_resolv_conf(&pod(json!({"dnsPolicy": "Default"})), &cluster());
        assert_eq!(rc, cluster().host);
        let rc = pod_resolv_conf(
            &pod(json!({"dnsPolicy": "None", "dnsConfig": {
                "nameservers": ["1.2.3.4"], "searches": ["a.example"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}})),
            &cluster(),
        );
        assert_eq!(rc.nameservers, strs(&["1.2.3.4"]));
        assert_eq!(rc.searches, strs(&["a.example"]));
        assert_eq!(rc.options, strs(&["ndots:2", "edns0"]));
    }

    #[test]
    fn dns_config_is_appended_without_duplicates_and_its_options_win() {
        let rc = pod_resolv_conf(
            &pod(json!({"dnsConfig": {
                "nameservers": ["10.43.0.10", "1.1.1.1"],
                "searches": ["svc.cluster.local", "x.example"],
                "options": [{"name": "ndots", "value": "1"}, {"name": "single-request"}]}})),
            &cluster(),
        );
        assert_eq!(rc.nameservers, strs(&["10.43.0.10", "1.1.1.1"]));
        assert_eq!(
            rc.searches,
            strs(&[
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example",
                "x.example"
            ])
        );
        assert_eq!(rc.options, strs(&["ndots:1", "single-request"]));
    }

    #[test]
    fn without_a_cluster_dns_cluster_first_falls_back_to_the_host() {
        let mut dns = cluster();
        dns.ip = None;
        assert_eq!(pod_resolv_conf(&pod(json!({})), &dns), dns.host);
    }

    #[test]
    fn nameservers_and_searches_are_cut_to_kubernetes_limits() {
        let servers: Vec<String> = (1..=5).map(|i| format!("1.1.1.{i}")).collect();
        let searches: Vec<String> = (0..40).map(|i| format!("s{i}.example")).collect();
        let rc = pod_resolv_conf(
            &pod(
                json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": servers, "searches": searches}}),
            ),
            &cluster(),
        );
        assert_eq!(rc.nameservers.len(), MAX_NAMESERVERS);
        assert_eq!(rc.searches.len(), MAX_SEARCH_PATHS);
        let long: Vec<String> = (0..10).map(|i| format!("{i}{}", "x".repeat(250))).collect();
        let rc = pod_resolv_conf(
            &pod(json!({"dnsPolicy": "None", "dnsConfig": {"searches": long}})),
            &cluster(),
        );
        assert_eq!(rc.searches.len(), 8, "8 × 251 + 7 spaces fit in 2048");
    }

    #[test]
    fn resolv_conf_parsing_keeps_the_last_search_line_and_skips_comments() {
        let rc = ResolvConf::parse(
            "# generated\nnameserver 127.0.0.53\nsearch old.example\nsearch a.example. . b.example\noptions edns0 trust-ad ; x\nnameserver 10.0.0.2 # second\n",
        );
        assert_eq!(rc.nameservers, strs(&["127.0.0.53", "10.0.0.2"]));
        assert_eq!(rc.searches, strs(&["a.example", "b.example"]));
        assert_eq!(rc.options, strs(&["edns0", "trust-ad"]));
    }
}
