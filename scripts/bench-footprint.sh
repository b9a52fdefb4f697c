#!/usr/bin/env bash
# Benchmark B5: footprint and cold start of `skiff up` on an idle single node.
# Needs root (containerd). Builds the release binary, starts `skiff up` in a
# temp dir on a free port, and reports: time from start to node Ready and to
# a first pod Running, resident memory of skiff and of its containerd after
# 20 s idle with that one pod, and their CPU use over 10 s idle. Stops and
# removes everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p skiff
./scripts/tools.sh >/dev/null
skiff="$PWD/target/release/skiff"
kubectl="$PWD/.tools/bin/kubectl"
dir=$(mktemp -d /tmp/skfb5.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$skiff" image build-busybox --output "$dir/bb.tar" >/dev/null 2>&1
start=$(date +%s.%N)
"$skiff" up --data-dir "$dir/data" --listen "127.0.0.1:$port" --agent-port 0 --node-name b5 >"$dir/up.log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  "$skiff" down --purge --data-dir "$dir/data" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
until grep -q "skiff is up" "$dir/up.log"; do
  kill -0 "$pid" || { cat "$dir/up.log"; exit 1; }
  sleep 0.01
done
ready=$(grep -o '^\[ *[0-9.]*s\] node b5 Ready' "$dir/up.log" | grep -o '[0-9.]*s' | tr -d s)
export KUBECONFIG="$dir/data/admin.kubeconfig"
"$skiff" image import "$dir/bb.tar" --data-dir "$dir/data" >/dev/null 2>&1
t0=$(date +%s.%N)
"$kubectl" run first --image=skiff.local/busybox:1 --image-pull-policy=IfNotPresent -- sleep 3600 >/dev/null
until [ "$("$kubectl" get pod first -o jsonpath='{.status.phase}')" = Running ]; do sleep 0.02; done
t1=$(date +%s.%N)
sleep 20
rss() { awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
cpid=$(cat "$dir/data/agent/containerd/containerd.pid")
s1=$(ticks "$pid"); c1=$(ticks "$cpid")
sleep 10
s2=$(ticks "$pid"); c2=$(ticks "$cpid")
hz=$(getconf CLK_TCK)
echo "| measure | skiff | containerd |"
echo "| --- | ---: | ---: |"
echo "| resident memory, idle with one pod (MiB) | $(rss "$pid") | $(rss "$cpid") |"
echo "| CPU while idle (% of one core, 10 s) | $(awk "BEGIN {printf \"%.2f\", ($s2-$s1)*100/$hz/10}") | $(awk "BEGIN {printf \"%.2f\", ($c2-$c1)*100/$hz/10}") |"
echo "| start to node Ready (s) | $ready | |"
echo "| pod create to Running, first pod (s) | $(awk "BEGIN {printf \"%.2f\", $t1-$t0}") | |"
echo "| start to first pod Running incl. image import (s) | $(awk "BEGIN {printf \"%.2f\", $t1-$start}") | |"
