//! A joined node's client certificate renewed while the agent runs: once
//! 80% of its life has passed, a new one comes through the CSR API
//! (approved as the node renewing itself, signed by the cluster CA), and
//! the agent's client swaps to it without a restart. Against a real API
//! server in this process.

use std::sync::Arc;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use skiff_agent::join;
use skiff_apiserver::auth::Identity;

async fn server(dir: &std::path::Path) -> (skiff_apiserver::ApiServer, skiff_apiserver::tls::Pki) {
    let pki = skiff_apiserver::tls::Pki::load_or_create(&dir.join("server-pki"), &[]).unwrap();
    let store: Arc<dyn skiff_store::Store> =
        skiff_store::RedbStore::open(&dir.join("store.redb"), Default::default()).unwrap();
    let config = skiff_apiserver::Config {
        cluster_signing: Some((pki.ca.cert_pem.clone(), pki.ca.key_pem.clone())),
        ..Default::default()
    };
    (
        skiff_apiserver::ApiServer::start(store, config)
            .await
            .unwrap(),
        pki,
    )
}

fn client_as(api: &skiff_apiserver::ApiServer, user: &str, groups: &[&str]) -> kube::Client {
    let id = Identity::new(user, groups.iter().map(|g| g.to_string()).collect());
    kube::Client::new(api.router_as(id), "default")
}

async fn whoami(c: kube::Client) -> String {
    let r = Api::<SelfSubjectReview>::all(c)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    r.status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default()
}

/// A node certificate of `ca` valid from `days_ago` days ago for `days` days.
fn node_cert(
    pki: &skiff_apiserver::tls::Pki,
    node: &str,
    days_ago: i64,
    days: i64,
) -> (String, String) {
    let ca_key = rcgen::KeyPair::from_pem(&pki.ca.key_pem).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&pki.ca.cert_pem, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:nodes");
    dn.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name = dn;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(days_ago);
    params.not_after = params.not_before + time::Duration::days(days);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

#[tokio::test]
async fn a_certificate_past_80_percent_of_its_life_is_renewed_and_the_client_swapped() {
    let tmp = tempfile::tempdir().unwrap();
    let (api, pki) = server(tmp.path()).await;
    let dir = tmp.path().join("agent");
    std::fs::create_dir_all(dir.join("pki")).unwrap();
    std::fs::write(dir.join("pki/ca.crt"), &pki.ca.cert_pem).unwrap();

    // 70% of its life passed: not due yet, nothing requested.
    let (cert, key) = node_cert(&pki, "n1", 7, 10);
    std::fs::write(dir.join("pki/kubelet-client.crt"), &cert).unwrap();
    std::fs::write(dir.join("pki/kubelet-client.key"), &key).unwrap();
    let node = client_as(&api, "system:node:n1", &["system:nodes"]);
    assert!(join::due_in(&dir, join::RENEW_AT) > std::time::Duration::from_secs(86400 / 2));
    let none = join::renew_if_due(
        node.clone(),
        "https://127.0.0.1:1",
        "n1",
        &dir,
        join::RENEW_AT,
    )
    .await
    .unwrap();
    assert!(none.is_none());
    assert_eq!(
        std::fs::read_to_string(dir.join("pki/kubelet-client.crt")).unwrap(),
        cert
    );

    // 90% passed: renewed through the CSR API as the node itself.
    let (cert, key) = node_cert(&pki, "n1", 9, 10);
    std::fs::write(dir.join("pki/kubelet-client.crt"), &cert).unwrap();
    std::fs::write(dir.join("pki/kubelet-client.key"), &key).unwrap();
    assert!(join::due_in(&dir, join::RENEW_AT).is_zero());
    let kc = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        join::renew_if_due(
            node.clone(),
            "https://127.0.0.1:1",
            "n1",
            &dir,
            join::RENEW_AT,
        ),
    )
    .await
    .expect("the renewal was not issued")
    .unwrap()
    .expect("renewed");
    let new = std::fs::read_to_string(dir.join("pki/kubelet-client.crt")).unwrap();
    assert_ne!(new, cert);
    assert!(join::due_in(&dir, join::RENEW_AT) > std::time::Duration::from_secs(200 * 86400));
    let der = rustls_pki_types::pem::PemObject::from_pem_slice(new.as_bytes())
        .map(|c: rustls_pki_types::CertificateDer<'static>| c.to_vec())
        .unwrap();
    assert_eq!(
        skiff_apiserver::tls::identity_from_cert(&der),
        Some((
            "system:node:n1".to_string(),
            vec!["system:nodes".to_string()]
        ))
    );
    let kubeconfig = std::fs::read_to_string(kc).unwrap();
    use base64::Engine;
    assert!(kubeconfig.contains(&base64::engine::general_purpose::STANDARD.encode(&new)));
    // The request is visible as kube-apiserver shows one.
    let csrs = Api::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>::all(
        client_as(&api, "admin", &["system:masters"]),
    )
    .list(&Default::default())
    .await
    .unwrap();
    assert_eq!(csrs.items.len(), 1);
    assert_eq!(
        csrs.items[0].spec.username.as_deref(),
        Some("system:node:n1")
    );

    // The agent's client follows a swap: clones made before it included.
    let rotating = join::Rotating::new(client_as(&api, "system:node:n1", &["system:nodes"]));
    let c = rotating.client();
    assert_eq!(whoami(c.clone()).await, "system:node:n1");
    rotating.swap(client_as(&api, "system:node:n2", &["system:nodes"]));
    assert_eq!(whoami(c).await, "system:node:n2");
}

/// The agent's serving certificate: a `kubelet-serving` request for the
/// node's own address and name is approved and signed for server auth
/// with those names; one naming another address stays pending.
#[tokio::test]
async fn a_serving_certificate_for_the_nodes_own_names_is_issued_by_the_cluster_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let (api, pki) = server(tmp.path()).await;
    let admin = client_as(&api, "admin", &["system:masters"]);
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.1.2.3"},
                                 {"type": "Hostname", "address": "n1"}]}
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let as_node = client_as(&api, "system:node:n1", &["system:nodes"]);
    let dir = tmp.path().join("agent");

    // Another node's address: not approved.
    let (foreign_client, foreign_dir) = (as_node.clone(), tmp.path().join("foreign"));
    let foreign = tokio::spawn(async move {
        let names = skiff_agent::serving::names("n1", "10.9.9.9");
        skiff_agent::serving::obtain(foreign_client, "n1", &names, &foreign_dir).await
    });
    // Its request is in before the good one.
    for _ in 0..100 {
        let n = Api::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>::all(
            admin.clone(),
        )
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len();
        if n == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let names = skiff_agent::serving::names("n1", "10.1.2.3");
    let (cert, key) = skiff_agent::serving::obtain(as_node.clone(), "n1", &names, &dir)
        .await
        .unwrap();
    let der: rustls_pki_types::CertificateDer<'static> =
        rustls_pki_types::pem::PemObject::from_pem_slice(cert.as_bytes()).unwrap();
    let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
    let sans: Vec<String> = parsed
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(sans, ["IPAddress(0a:01:02:03)", "DNSName(n1)"]);
    let eku = parsed.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && !eku.client_auth);
    // A TLS client trusting only the cluster CA accepts it for the address.
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::pem::PemObject::from_pem_slice(pki.ca.cert_pem.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    use rustls::client::danger::ServerCertVerifier;
    let now = rustls_pki_types::UnixTime::now();
    let ip = rustls_pki_types::ServerName::try_from("10.1.2.3").unwrap();
    verifier
        .verify_server_cert(&der, &[], &ip, &[], now)
        .expect("the cluster CA verifies the agent for its address");
    let other = rustls_pki_types::ServerName::try_from("10.9.9.9").unwrap();
    assert!(verifier
        .verify_server_cert(&der, &[], &other, &[], now)
        .is_err());
    // It serves: the swappable certificate takes it.
    let served = skiff_agent::serving::ServingCert::new(&cert, &key).unwrap();
    served.set(&cert, &key).unwrap();
    // Kept and reused at the next start.
    let again = skiff_agent::serving::obtain(as_node, "n1", &names, &dir)
        .await
        .unwrap();
    assert_eq!(again.0, cert);

    let csrs = Api::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>::all(admin)
        .list(&Default::default())
        .await
        .unwrap();
    let pending: Vec<_> = csrs
        .items
        .iter()
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_none()
        })
        .collect();
    assert_eq!(pending.len(), 1, "the foreign request was approved");
    foreign.abort();
}

/// A node whose address changes gets a serving certificate for the new
/// one once its Node shows it.
#[tokio::test]
async fn the_serving_certificate_follows_a_new_node_address() {
    let tmp = tempfile::tempdir().unwrap();
    let (api, _pki) = server(tmp.path()).await;
    let admin = client_as(&api, "admin", &["system:masters"]);
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone());
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.1.2.3"}]}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let as_node = client_as(&api, "system:node:n1", &["system:nodes"]);
    let dir = tmp.path().join("agent");
    let (cert, key) = skiff_agent::serving::obtain(
        as_node.clone(),
        "n1",
        &skiff_agent::serving::names("n1", "10.1.2.3"),
        &dir,
    )
    .await
    .unwrap();
    let serving = Arc::new(skiff_agent::serving::ServingCert::new(&cert, &key).unwrap());
    let (tx, rx) = tokio::sync::watch::channel("10.1.2.3".to_string());
    let task = tokio::spawn(skiff_agent::serving::keep_renewed(
        as_node,
        serving,
        "n1".into(),
        rx,
        dir.clone(),
    ));
    // The Node's address changes, then the agent notices.
    let patch = serde_json::json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.1.2.4"}]}});
    nodes
        .patch_status("n1", &Default::default(), &kube::api::Patch::Merge(&patch))
        .await
        .unwrap();
    tx.send("10.1.2.4".into()).unwrap();
    let crt = dir.join("pki/kubelet-serving.crt");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let pem = std::fs::read(&crt).unwrap();
        let der: rustls_pki_types::CertificateDer<'static> =
            rustls_pki_types::pem::PemObject::from_pem_slice(&pem).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        let sans: Vec<String> = parsed
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        if sans.contains(&"IPAddress(0a:01:02:04)".to_string()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {sans:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    task.abort();
}
