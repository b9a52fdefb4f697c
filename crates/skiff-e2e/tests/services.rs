//! Services through the agent's proxy (nftables) on a real single-node
//! cluster (`skiff up` with its own containerd), driven with the real
//! kubectl: a ClusterIP spreads a client pod's requests over two busybox
//! httpd backends (named targetPort), answers from the node itself, a
//! NodePort answers on the node's IP, a LoadBalancer gets the node's IP as
//! its ingress and answers there, ClientIP affinity holds, a backend
//! failing readiness stops receiving traffic, a pod reaches itself through
//! its service (hairpin), the `kubernetes` Service reaches the API server,
//! a Service without endpoints refuses at once, and the rules keep serving
//! while skiff is killed and after it starts again.
//! Each cluster uses a service range of its own so concurrent clusters on
//! the machine never share a ClusterIP.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use skiff_e2e::{wait_until, Server, BUSYBOX};

fn rand_byte() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    u64::from_le_bytes(b)
}

fn service_cidr() -> String {
    format!("10.{}.0.0/16", 200 + rand_byte() % 50)
}

fn jsonpath(s: &Server, kind: &str, name: &str, path: &str) -> String {
    let out = s.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")]);
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn backend(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: web}}
spec:
  containers:
  - name: httpd
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www; echo {name} > /www/index.html; echo ok > /www/ready; exec httpd -f -p 8080 -h /www"]
    ports: [{{name: http, containerPort: 8080}}]
    readinessProbe:
      httpGet: {{path: /ready, port: http}}
      periodSeconds: 1
      failureThreshold: 1
"#
    )
}

const SERVICES: &str = r#"apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: sticky}
spec:
  selector: {app: web}
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{name: http, port: 18080, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: local}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: web}
  ports: [{name: http, port: 18081, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: empty}
spec:
  selector: {app: nothing-matches}
  ports: [{name: http, port: 80, targetPort: 8080}]
"#;

const CLIENT: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers:
  - name: c
    image: skiff.local/busybox:1
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#;

/// `n` requests from `pod` to `url`; counts of each answer.
fn spread(s: &Server, pod: &str, url: &str, n: usize) -> BTreeMap<String, usize> {
    // busybox's static wget crashes with -T; `timeout` bounds it instead.
    let script =
        format!("for i in $(seq {n}); do timeout 5 wget -q -O- {url} || echo FAILED; done");
    let out = s.kubectl(&["exec", pod, "--", "sh", "-c", &script]);
    let mut counts = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        *counts.entry(line.trim().to_string()).or_insert(0) += 1;
    }
    counts
}

fn http_get(ip: &str, port: u16) -> Result<String, std::io::Error> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect_timeout(
        &format!("{ip}:{port}").parse().unwrap(),
        Duration::from_secs(3),
    )?;
    c.set_read_timeout(Some(Duration::from_secs(3)))?;
    c.write_all(format!("GET / HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    c.read_to_string(&mut out)?;
    Ok(out)
}

fn ready(s: &Server, pod: &str) -> bool {
    jsonpath(
        s,
        "pod",
        pod,
        "{.status.conditions[?(@.type==\"Ready\")].status}",
    ) == "True"
}

#[test]
fn cluster_ip_node_port_affinity_readiness_hairpin_and_rejection_work_through_the_proxy() {
    let cidr = service_cidr();
    let mut s = Server::up_with(&["--service-cidr", &cidr]);
    s.ok_stdin(&["apply", "-f", "-"], &backend("web-a"));
    s.ok_stdin(&["apply", "-f", "-"], &backend("web-b"));
    s.ok_stdin(&["apply", "-f", "-"], CLIENT);
    s.ok_stdin(&["apply", "-f", "-"], SERVICES);
    wait_until("both backends Ready", 120, || {
        (ready(&s, "web-a") && ready(&s, "web-b")).then_some(())
    });
    wait_until("client Running", 120, || {
        (jsonpath(&s, "pod", "client", "{.status.phase}") == "Running").then_some(())
    });
    let web_ip = jsonpath(&s, "service", "web", "{.spec.clusterIP}");
    let sticky_ip = jsonpath(&s, "service", "sticky", "{.spec.clusterIP}");
    let empty_ip = jsonpath(&s, "service", "empty", "{.spec.clusterIP}");
    let node_port: u16 = jsonpath(&s, "service", "web", "{.spec.ports[0].nodePort}")
        .parse()
        .unwrap();
    let node_ip = jsonpath(
        &s,
        "node",
        "e2e-node",
        "{.status.addresses[?(@.type==\"InternalIP\")].address}",
    );

    // ClusterIP from a pod: requests spread over both backends.
    let counts = wait_until(
        "requests through the ClusterIP reach both backends",
        60,
        || {
            let c = spread(&s, "client", &format!("http://{web_ip}:80/"), 30);
            (c.contains_key("web-a") && c.contains_key("web-b")).then_some(c)
        },
    );
    assert_eq!(counts.values().sum::<usize>(), 30, "{counts:?}");
    assert!(!counts.contains_key("FAILED"), "{counts:?}");

    // By name, through the cluster DNS.
    let counts = spread(&s, "client", "http://web.default.svc.cluster.local:80/", 4);
    assert_eq!(counts.values().sum::<usize>(), 4, "{counts:?}");
    assert!(!counts.contains_key("FAILED"), "{counts:?}");

    // From the node itself, and the NodePort on the node's address.
    let body = http_get(&web_ip, 80).expect("ClusterIP from the node");
    assert!(body.contains("web-a") || body.contains("web-b"), "{body}");
    let body = http_get(&node_ip, node_port).expect("NodePort on the node IP");
    assert!(body.contains("web-a") || body.contains("web-b"), "{body}");

    // LoadBalancer: the node's address in its status, answering there.
    let ingress = wait_until("LoadBalancer ingress", 30, || {
        let ip = jsonpath(&s, "service", "lb", "{.status.loadBalancer.ingress[0].ip}");
        (!ip.is_empty()).then_some(ip)
    });
    assert_eq!(ingress, node_ip);
    let wide = s.ok(&["get", "service", "lb"]);
    assert!(wide.contains(&node_ip), "EXTERNAL-IP column: {wide}");
    let body = wait_until("the LoadBalancer address answers", 30, || {
        http_get(&node_ip, 18080).ok()
    });
    assert!(body.contains("web-a") || body.contains("web-b"), "{body}");

    // externalTrafficPolicy Local: the API server allocated a health check
    // node port, which counts this node's endpoints.
    let hc: u16 = jsonpath(&s, "service", "local", "{.spec.healthCheckNodePort}")
        .parse()
        .expect("an allocated healthCheckNodePort");
    assert!((30000..=32767).contains(&hc), "{hc}");
    let health = wait_until("the health check node port answers", 30, || {
        http_get(&node_ip, hc).ok()
    });
    assert!(health.starts_with("HTTP/1.0 200"), "{health}");
    assert!(health.contains("\"localEndpoints\":2"), "{health}");

    // ClientIP affinity: one client, one backend.
    let counts = spread(&s, "client", &format!("http://{sticky_ip}:80/"), 20);
    assert_eq!(counts.len(), 1, "affinity broke: {counts:?}");
    assert!(
        counts.contains_key("web-a") || counts.contains_key("web-b"),
        "{counts:?}"
    );

    // The `kubernetes` Service leads to the API server: its endpoint is the
    // node's address, a verifying client accepts the server's certificate
    // at the ClusterIP, and a pod gets TLS there (an alert answering
    // plain text: busybox's own TLS client cannot negotiate with it).
    let eps = s.ok(&["get", "endpoints", "kubernetes"]);
    assert!(eps.contains(&node_ip), "{eps}");
    let k_ip = jsonpath(&s, "service", "kubernetes", "{.spec.clusterIP}");
    let version = s.ok(&[
        "--server",
        &format!("https://{k_ip}:443"),
        "get",
        "--raw",
        "/version",
    ]);
    assert!(version.contains("gitVersion"), "{version}");
    let out = s.ok(&[
        "exec",
        "client",
        "--",
        "sh",
        "-c",
        &format!("printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 {k_ip} 443 | od -An -tx1 | head -1"),
    ]);
    assert!(
        out.trim().starts_with("15 03"),
        "expected a TLS alert record: {out:?}"
    );
    let out = s.ok(&[
        "exec",
        "client",
        "--",
        "sh",
        "-c",
        "printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 kubernetes.default.svc.cluster.local 443 | od -An -tx1 | head -1",
    ]);
    assert!(
        out.trim().starts_with("15 03"),
        "kubernetes.default.svc by name: {out:?}"
    );

    // No endpoints: refused at once, from a pod and from the node.
    let started = Instant::now();
    let out = s.kubectl(&[
        "exec",
        "client",
        "--",
        "timeout",
        "10",
        "wget",
        "-q",
        "-O-",
        &format!("http://{empty_ip}:80/"),
    ]);
    let elapsed = started.elapsed();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused"), "{err}");
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    let started = Instant::now();
    let e = http_get(&empty_ip, 80).expect_err("no endpoints");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    assert!(started.elapsed() < Duration::from_secs(1));

    // web-b fails readiness: it stops receiving traffic.
    s.ok(&["exec", "web-b", "--", "rm", "/www/ready"]);
    wait_until("web-b not Ready", 60, || {
        (!ready(&s, "web-b")).then_some(())
    });
    let counts = wait_until("only web-a answers", 30, || {
        let c = spread(&s, "client", &format!("http://{web_ip}:80/"), 20);
        (c.len() == 1 && c.contains_key("web-a")).then_some(c)
    });
    assert_eq!(counts["web-a"], 20);

    // Hairpin: web-a reaches itself through its service.
    let counts = spread(&s, "web-a", &format!("http://{web_ip}:80/"), 3);
    assert_eq!(counts.get("web-a"), Some(&3), "{counts:?}");

    // Fail-static: with skiff killed the rules stay and keep serving; after
    // the restart (a full resync) they still do.
    s.kill9();
    let body = http_get(&web_ip, 80).expect("ClusterIP while skiff is down");
    assert!(body.contains("web-a"), "{body}");
    s.start_again();
    let body = wait_until("ClusterIP after the restart", 30, || {
        http_get(&web_ip, 80).ok()
    });
    assert!(body.contains("web-a"), "{body}");

    // An endpoint appearing again is served again.
    s.ok(&["exec", "web-b", "--", "sh", "-c", "echo ok > /www/ready"]);
    wait_until("web-b serves again", 60, || {
        let c = spread(&s, "client", &format!("http://{web_ip}:80/"), 20);
        c.contains_key("web-b").then_some(())
    });
}
