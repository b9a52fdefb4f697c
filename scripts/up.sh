#!/usr/bin/env bash
# Brings up a single-node skiff cluster on this machine and runs a demo
# workload on it: installs what is missing (as root: containerd, runc, the
# CNI plugins, busybox-static for the demo image, a C toolchain and protoc
# for the build), builds skiff (release), starts `skiff up` (API server,
# scheduler, controllers and a node agent with its own containerd; data in
# /var/lib/skiff, $SKIFF_DATA_DIR overrides; API on 127.0.0.1:6443,
# $SKIFF_LISTEN overrides), then creates a Deployment of two busybox httpd
# pods, checks that their pod IPs answer HTTP, and that a client pod reaches
# them through a Service by name (cluster DNS and the service proxy).
#
# Runs in the foreground: Ctrl-C stops skiff (the containers keep running,
# as on a real node); `skiff down --purge` removes them and the data.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
  echo "cargo is missing: install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "up.sh runs containers, which needs root: sudo $0" >&2
  exit 1
fi
missing=()
command -v cc >/dev/null || missing+=(build-essential)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
{ [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; } || missing+=(busybox-static)
command -v ip >/dev/null || missing+=(iproute2)
command -v nft >/dev/null || missing+=(nftables)
command -v conntrack >/dev/null || missing+=(conntrack)
command -v mount >/dev/null || missing+=(mount)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "up.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
data="${SKIFF_DATA_DIR:-/var/lib/skiff}"
listen="${SKIFF_LISTEN:-127.0.0.1:6443}"

cargo build --release -p skiff
skiff="$PWD/target/release/skiff"

# The real kubectl v1.33 in .tools/bin (a machine's own kubectl works too).
kubectl=kubectl
if ./scripts/tools.sh >/dev/null; then
  kubectl="$PWD/.tools/bin/kubectl"
elif ! command -v kubectl >/dev/null; then
  echo "up.sh: could not fetch kubectl into .tools/bin" >&2
  exit 1
fi

mkdir -p "$data"
log="$data/up.log"
: >"$log"
"$skiff" up --data-dir "$data" --listen "$listen" > >(tee -a "$log") 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' INT TERM
for _ in $(seq 600); do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" || true
    echo "up.sh: skiff up exited; is $listen already in use? (see $log)" >&2
    exit 1
  fi
  grep -q "skiff is up" "$log" && break
  sleep 0.1
done
grep -q "skiff is up" "$log" || { echo "up.sh: skiff did not come up (see $log)" >&2; exit 1; }
export KUBECONFIG="$data/admin.kubeconfig"

# The demo image: busybox from Debian's busybox-static, built by skiff.
"$skiff" image build-busybox --output "$data/busybox.tar" >/dev/null
"$skiff" image import "$data/busybox.tar" --data-dir "$data" >/dev/null

"$kubectl" apply -f - <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata:
  name: demo
  labels: {app: demo}
spec:
  replicas: 2
  selector:
    matchLabels: {app: demo}
  template:
    metadata:
      labels: {app: demo}
    spec:
      containers:
      - name: httpd
        image: skiff.local/busybox:1
        imagePullPolicy: IfNotPresent
        command: [sh, -c, 'mkdir -p /www && echo "hello from $HOSTNAME" > /www/index.html && exec httpd -f -p 8080 -h /www']
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /index.html, port: 8080}, periodSeconds: 2}
YAML
"$kubectl" rollout status deployment/demo --timeout=120s
"$kubectl" get pods -l app=demo -o wide
for ip in $("$kubectl" get pods -l app=demo -o jsonpath='{.items[*].status.podIP}'); do
  printf 'http://%s:8080/ answers: ' "$ip"
  busybox wget -qO- "http://$ip:8080/index.html"
done
# A client pod reaches the Deployment by its Service's name: the cluster DNS
# answers `demo`, the service proxy spreads the connections over the pods.
"$kubectl" apply -f - <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: demo}
spec:
  selector: {app: demo}
  ports: [{port: 80, targetPort: 8080}]
YAML
"$kubectl" delete pod demo-client --ignore-not-found --wait=true >/dev/null
"$kubectl" run demo-client --restart=Never --image=skiff.local/busybox:1 \
  --image-pull-policy=IfNotPresent --command -- sh -c \
  'for i in $(seq 30); do wget -qO- http://demo/index.html && exit 0; sleep 1; done; exit 1' >/dev/null
"$kubectl" wait pod/demo-client --for=jsonpath='{.status.phase}'=Succeeded --timeout=90s >/dev/null
printf 'http://demo/ from a client pod answers: '
"$kubectl" logs demo-client
cat <<EOF

skiff is up on https://$listen (data in $data), with the demo Deployment running.
In another shell:

  export KUBECONFIG=$KUBECONFIG
  $kubectl get pods -o wide

Ctrl-C here stops skiff (containers keep running); then
  $skiff down --purge --data-dir $data
removes them and the data.
EOF
wait "$pid"
