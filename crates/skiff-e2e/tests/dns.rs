//! Cluster DNS as a user sees it from a pod on `skiff up`: resolv.conf by
//! dnsPolicy, service names, headless services, StatefulSet-style pod
//! names, SRV, PTR, ExternalName and NXDOMAIN through busybox's nslookup,
//! the responder's metrics, `kubectl cluster-info`, and `skiff down` taking
//! the node's DNS address away.

use skiff_e2e::{text, wait_until, Server, BUSYBOX};

fn jsonpath(s: &Server, kind: &str, name: &str, path: &str) -> String {
    let out = s.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")]);
    text(&out.stdout)
}

fn wait_running(s: &Server, pod: &str) -> String {
    wait_until(&format!("pod {pod} Running"), 120, || {
        let phase = jsonpath(s, "pod", pod, "{.status.phase}");
        let ip = jsonpath(s, "pod", pod, "{.status.podIP}");
        (phase == "Running" && !ip.is_empty()).then_some(ip)
    })
}

/// `kubectl exec client -- <cmd>`: (success, stdout + stderr).
fn exec(s: &Server, pod: &str, cmd: &[&str]) -> (bool, String) {
    let mut args = vec!["exec", pod, "--"];
    args.extend_from_slice(cmd);
    let out = s.kubectl(&args);
    (
        out.status.success(),
        format!("{}{}", text(&out.stdout), text(&out.stderr)),
    )
}

/// Runs `cmd` in `pod` until its output satisfies `want` (the agent's
/// watches need a moment after objects change).
fn exec_until(s: &Server, pod: &str, cmd: &[&str], want: impl Fn(bool, &str) -> bool) -> String {
    let mut last = String::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(&format!("{cmd:?} in {pod}"), 60, || {
            let (ok, out) = exec(s, pod, cmd);
            last = out.clone();
            want(ok, &out).then_some(out)
        })
    }));
    match r {
        Ok(out) => out,
        Err(_) => panic!("{cmd:?} in {pod} never gave the expected output; last:\n{last}"),
    }
}

fn manifest() -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: web, labels: {{app: web}}}}
spec:
  containers:
  - name: web
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www; echo hello-dns > /www/index.html; exec httpd -f -p 8080 -h /www"]
    ports: [{{name: http, containerPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 80, targetPort: http}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web-h}}
spec:
  clusterIP: None
  selector: {{app: web}}
  ports: [{{name: http, port: 8080}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: db-0, labels: {{app: db}}}}
spec:
  hostname: db-0
  subdomain: db
  containers:
  - name: db
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
---
apiVersion: v1
kind: Service
metadata: {{name: db}}
spec:
  clusterIP: None
  selector: {{app: db}}
  ports: [{{name: pg, port: 5432}}]
---
apiVersion: v1
kind: Service
metadata: {{name: elsewhere}}
spec:
  type: ExternalName
  externalName: web.default.svc.cluster.local
---
apiVersion: v1
kind: Pod
metadata: {{name: client}}
spec:
  containers:
  - name: client
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
---
apiVersion: v1
kind: Pod
metadata: {{name: custom}}
spec:
  dnsPolicy: None
  dnsConfig:
    nameservers: ["192.0.2.53"]
    searches: ["corp.example"]
    options: [{{name: ndots, value: "2"}}, {{name: edns0}}]
  containers:
  - name: c
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#
    )
}

#[test]
fn pods_resolve_services_headless_pods_srv_and_ptr_through_the_node_local_dns() {
    // A service CIDR of its own, so its DNS address differs from other
    // concurrent clusters' 10.43.0.10.
    let n = std::process::id() % 30;
    let cidr = format!("10.{}.0.0/16", 60 + n);
    let dns_ip = format!("10.{}.0.10", 60 + n);
    let s = Server::up_with(&["--service-cidr", &cidr]);

    let info = s.ok(&["cluster-info"]);
    assert!(info.contains("CoreDNS is running at"), "{info}");
    assert_eq!(
        jsonpath(&s, "svc", "kube-dns", "{.spec.clusterIP}"),
        "",
        "kube-dns is in kube-system, not default"
    );
    let kube_dns = s.ok(&[
        "get",
        "svc",
        "-n",
        "kube-system",
        "kube-dns",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    assert_eq!(kube_dns, dns_ip);

    s.ok_stdin(&["apply", "-f", "-"], &manifest());
    let web_ip = wait_running(&s, "web");
    let db_ip = wait_running(&s, "db-0");
    wait_running(&s, "client");
    wait_running(&s, "custom");
    let web_cluster_ip = jsonpath(&s, "svc", "web", "{.spec.clusterIP}");

    let (_, resolv) = exec(&s, "client", &["cat", "/etc/resolv.conf"]);
    assert!(resolv.contains(&format!("nameserver {dns_ip}")), "{resolv}");
    assert!(
        resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
        "{resolv}"
    );
    assert!(resolv.contains("options ndots:5"), "{resolv}");
    let (_, custom) = exec(&s, "custom", &["cat", "/etc/resolv.conf"]);
    assert!(custom.contains("nameserver 192.0.2.53"), "{custom}");
    assert!(
        !custom.contains(&dns_ip),
        "dnsPolicy None: only dnsConfig: {custom}"
    );
    assert!(custom.contains("search corp.example"), "{custom}");
    assert!(
        custom.contains("ndots:2") && custom.contains("edns0"),
        "{custom}"
    );

    // A ClusterIP service by its short name (the search path) and FQDN.
    let out = exec_until(
        &s,
        "client",
        &["nslookup", "web.default.svc.cluster.local"],
        |ok, o| ok && o.contains(&web_cluster_ip),
    );
    assert!(
        out.contains(&format!("Server:\t\t{dns_ip}")) || out.contains(&dns_ip),
        "{out}"
    );
    // busybox's nslookup tries every search domain and exits 1 when any
    // of them is NXDOMAIN, as it does on any Kubernetes cluster.
    exec_until(&s, "client", &["nslookup", "web"], |_, o| {
        o.contains("Name:\tweb.default.svc.cluster.local") && o.contains(&web_cluster_ip)
    });
    // A headless service answers its pod; a pod with hostname + subdomain
    // has its own name.
    exec_until(
        &s,
        "client",
        &["nslookup", "web-h.default.svc.cluster.local"],
        |ok, o| ok && o.contains(&web_ip),
    );
    exec_until(
        &s,
        "client",
        &["nslookup", "db-0.db.default.svc.cluster.local"],
        |ok, o| ok && o.contains(&db_ip),
    );
    // SRV of a named port, PTR of the ClusterIP, a pod's dashed name, and
    // the ExternalName alias.
    let srv = exec_until(
        &s,
        "client",
        &[
            "nslookup",
            "-type=srv",
            "_http._tcp.web.default.svc.cluster.local",
        ],
        |ok, o| ok && o.contains("80 web.default.svc.cluster.local"),
    );
    assert!(srv.contains("0 100 80"), "{srv}");
    exec_until(&s, "client", &["nslookup", &web_cluster_ip], |ok, o| {
        ok && o.contains("web.default.svc.cluster.local")
    });
    let dashed = format!("{}.default.pod.cluster.local", web_ip.replace('.', "-"));
    exec_until(&s, "client", &["nslookup", &dashed], |ok, o| {
        ok && o.contains(&web_ip)
    });
    exec_until(
        &s,
        "client",
        &["nslookup", "elsewhere.default.svc.cluster.local"],
        |ok, o| ok && o.contains("web.default.svc.cluster.local") && o.contains(&web_cluster_ip),
    );
    // A name that does not exist.
    let (ok, out) = exec(
        &s,
        "client",
        &["nslookup", "nope.default.svc.cluster.local"],
    );
    assert!(!ok && out.contains("NXDOMAIN"), "{out}");

    // (Not `wget http://web-h`: Debian's static busybox crashes in
    // getaddrinfo for any name, on the host too; its nslookup has its own
    // resolver.)

    // The responder's counters, on the DNS address's port 9153 as CoreDNS's.
    let metrics = {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect((dns_ip.as_str(), 9153)).expect("metrics port");
        c.write_all(b"GET /metrics HTTP/1.0\r\nhost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    };
    assert!(
        metrics.contains("skiff_dns_requests_total{proto=\"udp\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("skiff_dns_responses_total{rcode=\"NXDOMAIN\"}"),
        "{metrics}"
    );

    drop(s);
    let addrs = std::process::Command::new("ip")
        .args(["-o", "addr", "show", "dev", "skiff-dns0"])
        .output()
        .map(|o| text(&o.stdout))
        .unwrap_or_default();
    assert!(
        !addrs.contains(&format!("{dns_ip}/32")),
        "skiff down removed the DNS address: {addrs}"
    );
}
