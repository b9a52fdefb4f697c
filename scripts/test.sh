#!/usr/bin/env bash
# The whole test suite: fetches the real kubectl (scripts/tools.sh), builds
# skiff, and runs every crate's tests, including the end-to-end tests that
# drive kubectl and the python client against a running skiff.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "cargo is missing: install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi
if ! command -v cc >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y --no-install-recommends build-essential pkg-config >&2
fi
./scripts/tools.sh >/dev/null
export SKIFF_KUBECTL="$PWD/.tools/bin/kubectl" SKIFF_HELM="$PWD/.tools/bin/helm"
cargo build -p skiff
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace 2>&1 | tee "$log" || status=$?
# One closing line for the whole suite (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
