#!/usr/bin/env bash
# The whole test suite, from a clean clone, as root (the node tests run real
# containers): installs what is missing (build tools, protoc, containerd,
# runc, CNI plugins, busybox-static, etcd and python's venv support through apt; the real
# kubectl, helm and python client through scripts/tools.sh), builds skiff,
# and runs every crate's tests — unit, store conformance and crash, API
# semantics, and the end-to-end tests that drive the real kubectl, helm and
# python client against a running skiff, after the format check and
# clippy. Extra arguments go to `cargo test`
# (e.g. `scripts/test.sh -p skiff-e2e`).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
  echo "cargo is missing: install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi

# Debian packages, only those missing, and only as root.
missing=()
command -v cc >/dev/null || missing+=(build-essential)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v python3 >/dev/null || missing+=(python3)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
# Real containers: containerd, runc, the CNI plugins, and busybox-static
# for the test image.
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
{ [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; } || missing+=(busybox-static)
command -v ip >/dev/null || missing+=(iproute2)
# The service proxy programs nftables with nft and flushes UDP conntrack entries.
command -v nft >/dev/null || missing+=(nftables)
command -v conntrack >/dev/null || missing+=(conntrack)
# curl drives raw HTTP/2 requests in the API tests.
command -v curl >/dev/null || missing+=(curl)
# etcd 3.4 for the etcd backend's conformance and end-to-end tests (each
# test starts its own member on loopback), etcdctl to look at its keys.
[ -x /usr/bin/etcd ] || command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
# Debian's python3 makes a virtualenv (tools.sh's fallback) only with ensurepip.
if ! python3 -c 'import kubernetes' 2>/dev/null && ! python3 -c 'import ensurepip' 2>/dev/null; then
  missing+=(python3-venv)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "test.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; }
  else
    echo "test.sh: missing ${missing[*]}: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

# A fresh clone gains nothing from incremental caches, and they cost
# gigabytes of disk beside ~100 linked test binaries: off unless asked for.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The build needs about 20 GB; say what is free so a failed link can be
# told apart from a full disk.
df -h "$(pwd)" | awk 'NR == 2 { print "test.sh: " $4 " free on " $6 " before building" }' >&2

# kubectl v1.33.9, helm v4.1.4, python's kubernetes client: SKIFF_KUBECTL=…
tools="$(./scripts/tools.sh)"
while IFS= read -r line; do
  export "${line?}"
done <<<"$tools"

# Style and lints first: the formatting check and clippy, warnings as
# errors (the lints themselves are configured in the workspace manifest).
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all --check
else
  echo "test.sh: rustfmt is missing (rustup component add rustfmt); skipping the format check" >&2
fi
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --workspace --all-targets -- -D warnings
else
  echo "test.sh: clippy is missing (rustup component add clippy); skipping the lints" >&2
fi

cargo build -p skiff

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
if [ "$status" != 0 ]; then
  df -h "$(pwd)" | awk 'NR == 2 { print "test.sh: " $4 " free on " $6 " after the tests" }' >&2
fi
# One closing line for the whole suite (cargo prints one per test binary).
awk '/^test result:/ {
       for (i = 2; i <= NF; i++) {
         if ($(i) ~ /^passed;?$/) p += $(i-1)
         if ($(i) ~ /^failed;?$/) f += $(i-1)
         if ($(i) ~ /^ignored;?$/) s += $(i-1)
       }
     }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
