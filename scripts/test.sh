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
export SKIFF_KUBECTL="$PWD/.tools/bin/kubectl"
cargo build -p skiff
exec cargo test --workspace
