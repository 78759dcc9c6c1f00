# Shared settings for the hack/ scripts. Sourced, not run.

# Where the control-plane binaries live: envtest's layout (one directory
# holding etcd, kube-apiserver, ...). A user whose KUBEBUILDER_ASSETS directory
# holds every binary in PLANE_BINARIES gets it instead of a build
# (setup-envtest's holds only etcd, kube-apiserver and kubectl: not enough).
#
# KUBE_MINOR picks the Kubernetes minor: one folder per supported minor under
# hack/tools (v1.35, v1.37) pins its patch release and the etcd it is tested
# with. The newest is the default; the test command also runs on the oldest.
NEWEST_KUBE_MINOR=1.37
KUBE_MINOR="${KUBE_MINOR:-$NEWEST_KUBE_MINOR}"
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/tools/v$KUBE_MINOR"
# A bad KUBE_MINOR stops a script, and returns from `source` in a shell
# without closing it.
[[ -f "$TOOLS_DIR/go.mod" ]] || { echo "KUBE_MINOR=$KUBE_MINOR: no hack/tools/v$KUBE_MINOR/go.mod (supported: $(cd "$(dirname "${BASH_SOURCE[0]}")/tools" && ls -d v1.* | tr '\n' ' '))" >&2; return 1 2>/dev/null || exit 1; }
KUBE_VERSION="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$TOOLS_DIR/go.mod")"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_ROOT="${SAMPLE_CONTROLLER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sample-controller-rs}"
if [[ -z "${KUBEBUILDER_ASSETS:-}" ]]; then
  # One `go env` for both values (each run costs a Go start-up).
  { read -r GOOS_ && read -r GOARCH_; } < <(go env GOOS GOARCH 2>/dev/null || printf 'linux\namd64\n')
fi
# kwok's module: the newest plane's, whose compiled client-go it shares
# (its tools.go says why). One kwok serves every plane.
KWOK_TOOLS_DIR="$(dirname "$TOOLS_DIR")/v$NEWEST_KUBE_MINOR"
# What hack/build-control-plane.sh builds and hack/local-up.sh starts.
PLANE_BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
ASSETS_DIR="${KUBEBUILDER_ASSETS:-$CACHE_ROOT/k8s/$KUBE_VERSION-${GOOS_:-linux}-${GOARCH_:-amd64}}"

log() { echo "[$(basename "$0")] $*" >&2; }

# `go build` as every Go tool of the tests and benchmarks is built (the
# planes, kwok, the registry, the reference controllers): one set of flags,
# since a package compiled under other flags shares nothing through Go's
# build cache (tests/e2e_upstream_swap.rs's client-go reference takes the
# plane's client-go packages from it). -trimpath and no VCS stamping:
# reproducible, and independent of where the clone lives. CGO off: all of
# them are pure Go. No DWARF from the compiler: the linker's -w drops it
# anyway where it is given, and it is 5% of a build's CPU (measured on
# kwok's).
go_build() { # go-build-args...
  CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly -buildvcs=false -gcflags=all=-dwarf=false" go build -trimpath "$@"
}

# The architecture, in Go's and OCI's names, of what this machine's Rust
# toolchain builds: the image's platform (hack/build-image.sh) and the kwok
# nodes' kubernetes.io/arch (hack/local-up.sh), so the image's pods can
# land on them.
image_arch() {
  local host
  host="$(rustc -vV 2>/dev/null | sed -n 's/^host: //p')"
  case "${host%%-*}" in
    x86_64) echo amd64 ;;
    aarch64) echo arm64 ;;
    "") die "rustc not found: the image's architecture is that of the Rust toolchain" ;;
    *) die "no OCI name known for the Rust host ${host%%-*}" ;;
  esac
}

# Run COMMAND every 0.2 s until it succeeds (0), or SECONDS have passed (1).
# wait_for WHAT SECONDS COMMAND...; WHAT names it in the log on a timeout.
wait_for() {
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS >= deadline )); then
      log "$what: not ready after ${secs}s"
      return 1
    fi
    sleep 0.2
  done
}

# The port an operator serving ENDPOINTS bound, from its start-up log line
# (text format): it binds 127.0.0.1:0 and the kernel picks. bound_port LOG ENDPOINTS
bound_port() {
  sed -n "s|.*serving HTTP addr=[0-9.]*:\([0-9]*\) endpoints=$2\$|\1|p" "$1" | head -n 1
}
die() { echo "[$(basename "$0")] ERROR: $*" >&2; exit 1; }

# The Debian package providing `command`, installed if the command is
# missing (the scripts run as root on a fresh CI machine; elsewhere, install
# it yourself). need_command COMMAND PACKAGE WHY
need_command() {
  command -v "$1" >/dev/null && return 0
  log "installing $2 (Debian; $3)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2") >&2 \
    || die "$1 is missing and could not be installed: install the $2 package"
}

# Where hack/local-up.sh keeps a plane's state, logs and kubeconfig.
PLANE_DIR="${LOCAL_UP_DIR:-$REPO_ROOT/.local/control-plane}"

# Install crds/ into the current cluster and wait until Foos are served.
install_crds() {
  kubectl apply -f "$REPO_ROOT/crds/" >&2
  kubectl wait --for condition=established --timeout=60s crd/foos.samplecontroller.k8s.io >/dev/null
}

# Whether a plane component answers: etcd's and the API server's health
# endpoints, else whether its process is alive. Uses the plane's settings
# (DIR, ETCD_PORT, APISERVER_PORT, PKI: hack/local-up.sh's, or its env file).
component_serving() { # name
  case $1 in
    etcd) curl -fsS "http://127.0.0.1:$ETCD_PORT/health" ;;
    kube-apiserver) curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
        "https://127.0.0.1:$APISERVER_PORT/readyz" ;;
    *) kill -0 "$(cat "$DIR/$1.pid")" ;;
  esac
}

# deploy/'s LeaderFence CRD, the leader fence's parameter, and what it holds:
# a header, then what `crdgen leader-fence` prints (hack/update-crds.sh
# writes it, hack/verify-crds.sh checks it).
LEADER_FENCE_CRD=deploy/11-leader-fence-crd.yaml
leader_fence_crd() {
  cat <<'HEADER'
# The leader fence's parameter (11-leader-fence-policy.yaml): a LeaderFence
# of the Lease's name names the replica that leads; the leader writes it
# before its first write (src/api/leader_fence.rs, which this file is generated
# from by hack/update-crds.sh). A CRD rather than the Lease itself: the API
# server stops reading a built-in parameter kind for good once its binding
# is deleted (docs/design.md, "The leader fence").
HEADER
  cargo run --quiet --locked --bin crdgen -- leader-fence
}
# deploy/'s confinement of the operator's ServiceAccount, generated from
# src/api/confinement.rs (hack/update-crds.sh writes it, hack/verify-crds.sh
# checks it).
CONFINEMENT_POLICY=deploy/13-deployment-writes-policy.yaml
confinement_policy() {
  cargo run --quiet --locked --bin crdgen -- deployment-writes-policy
}
