#!/usr/bin/env bash
# Builds skiff (release) and runs its API server on this machine, with its
# data (store, certificates, admin kubeconfig) in /var/lib/skiff as root or
# ~/.skiff otherwise ($SKIFF_DATA_DIR overrides), on 127.0.0.1:6443
# ($SKIFF_LISTEN overrides). Once it answers, prints how to use it with
# kubectl. Runs in the foreground: Ctrl-C stops it; the data stays, and the
# next start picks it up.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
  echo "cargo is missing: install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi
if [ "$(id -u)" = 0 ]; then
  data="${SKIFF_DATA_DIR:-/var/lib/skiff}"
  missing=()
  command -v cc >/dev/null || missing+=(build-essential)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  if [ "${#missing[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  data="${SKIFF_DATA_DIR:-$HOME/.skiff}"
  if ! command -v cc >/dev/null; then
    echo "a C compiler is missing: sudo apt-get install build-essential pkg-config" >&2
    exit 1
  fi
fi
listen="${SKIFF_LISTEN:-127.0.0.1:6443}"

cargo build --release -p skiff

# The real kubectl v1.33 in .tools/bin (a machine's own kubectl works too).
kubectl=kubectl
if ./scripts/tools.sh >/dev/null; then
  kubectl="$PWD/.tools/bin/kubectl"
else
  echo "up.sh: could not fetch kubectl into .tools/bin; use your own kubectl" >&2
fi

./target/release/skiff server --data-dir "$data" --listen "$listen" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' INT TERM
kubeconfig="$data/admin.kubeconfig"
for _ in $(seq 300); do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" || true
    echo "up.sh: skiff server exited; is $listen already in use?" >&2
    exit 1
  fi
  if [ -f "$kubeconfig" ] && KUBECONFIG="$kubeconfig" "$kubectl" get --raw /readyz >/dev/null 2>&1; then
    break
  fi
  sleep 0.1
done
cat <<EOF

skiff is up on https://$listen (data in $data). In another shell:

  export KUBECONFIG=$kubeconfig
  $kubectl get ns

Ctrl-C here stops it.
EOF
wait "$pid"
