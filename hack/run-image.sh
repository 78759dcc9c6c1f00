#!/usr/bin/env bash
# Run the operator's image with runc, configured in-cluster as deploy/ runs
# it: no Docker engine, no kubelet.
#
#   KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=6443 \
#     hack/run-image.sh IMAGE TOKEN_DIR [ARG...]
#
# IMAGE      an OCI image layout reference, DIR:TAG, as hack/build-image.sh
#            prints it.
# TOKEN_DIR  a ServiceAccount's token, ca.crt and namespace; mounted
#            read-only at /var/run/secrets/kubernetes.io/serviceaccount,
#            where the kubelet mounts them.
# ARG...     the container's arguments (after the image's entrypoint).
# MEMORY_LIMIT (bytes, optional) caps the container's memory, as a pod's
# limit does; POD_NAME (optional) is passed on, as deploy/'s downward API
# sets it.
#
# The container runs as the image's user (65532) with a read-only root
# filesystem, no capabilities and no privilege escalation, like deploy/'s
# securityContext; it shares the host's network namespace, so the API server
# on loopback is reachable and its ports are the host's. Its output is this
# script's. TERM or INT kills it; the unpacked bundle is removed on exit.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

(( $# >= 2 )) || die "usage: $0 IMAGE TOKEN_DIR [ARG...]"
image=$1 token_dir=$2; shift 2
[[ -n "${KUBERNETES_SERVICE_HOST:-}" && -n "${KUBERNETES_SERVICE_PORT:-}" ]] \
  || die "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must point at the API server"
for f in token ca.crt namespace; do
  [[ -r "$token_dir/$f" ]] || die "$token_dir/$f is missing"
done
need_command umoci umoci "unpacking the image"
need_command runc runc "running the image"

bundle="$(mktemp -d)"
id="sample-controller-$$"
cleanup() {
  runc delete --force "$id" >/dev/null 2>&1 || true
  rm -rf "$bundle"
}
trap cleanup EXIT
umoci unpack --image "$image" "$bundle/unpacked" >/dev/null

# umoci writes the runtime config from the image (user, entrypoint, env);
# add what the kubelet would.
python3 - "$bundle/unpacked/config.json" "$token_dir" "$@" <<'PY'
import json, os, sys
path, token_dir, args = sys.argv[1], sys.argv[2], sys.argv[3:]
c = json.load(open(path))
p = c["process"]
p["args"] += args
p["terminal"] = False
p["noNewPrivileges"] = True
p["capabilities"] = {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}
p["env"] += [f"{k}={os.environ[k]}" for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")]
if "POD_NAME" in os.environ:  # the downward API's, as deploy/ sets it
    p["env"].append(f"POD_NAME={os.environ['POD_NAME']}")
if "RUST_LOG" in os.environ:
    p["env"].append(f"RUST_LOG={os.environ['RUST_LOG']}")
c["root"]["readonly"] = True
c["mounts"].append({
    "destination": "/var/run/secrets/kubernetes.io/serviceaccount",
    "type": "bind", "source": os.path.abspath(token_dir), "options": ["rbind", "ro"],
})
linux = c.setdefault("linux", {})
linux["namespaces"] = [n for n in linux.get("namespaces", []) if n["type"] != "network"]
if os.environ.get("MEMORY_LIMIT"):
    linux.setdefault("resources", {})["memory"] = {"limit": int(os.environ["MEMORY_LIMIT"])}
json.dump(c, open(path, "w"), indent=1)
PY

runc run --bundle "$bundle/unpacked" "$id" &
runc_pid=$!
trap 'runc kill "$id" KILL 2>/dev/null || true' TERM INT
rc=0
wait "$runc_pid" || rc=$?
# A trapped signal interrupts the first wait; wait for runc itself.
if kill -0 "$runc_pid" 2>/dev/null; then wait "$runc_pid" || rc=$?; fi
exit "$rc"
