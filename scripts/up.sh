#!/usr/bin/env bash
# Builds skiff and runs its API server in the foreground on this machine,
# with its data (store, certificates, admin kubeconfig) in /var/lib/skiff as
# root or ~/.skiff otherwise. Stop it with Ctrl-C; data stays.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "cargo is missing: install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi
if [ "$(id -u)" = 0 ]; then
  data="${SKIFF_DATA_DIR:-/var/lib/skiff}"
  if ! command -v cc >/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends build-essential pkg-config >/dev/null
  fi
else
  data="${SKIFF_DATA_DIR:-$HOME/.skiff}"
fi
listen="${SKIFF_LISTEN:-127.0.0.1:6443}"
cargo build --release -p skiff
bin="$PWD/.tools/bin"
./scripts/tools.sh >/dev/null 2>&1 || true
echo
echo "skiff is starting; in another shell:"
echo "  export KUBECONFIG=$data/admin.kubeconfig"
if [ -x "$bin/kubectl" ]; then
  echo "  $bin/kubectl get namespaces"
else
  echo "  kubectl get namespaces"
fi
echo
exec ./target/release/skiff server --data-dir "$data" --listen "$listen"
