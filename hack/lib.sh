# Shared settings for the hack/ scripts. Sourced, not run.

# Where the control-plane binaries live: envtest's layout (one directory
# holding etcd, kube-apiserver, ...). A user who already has KUBEBUILDER_ASSETS
# (for example from setup-envtest) gets that directory instead of a build.
KUBE_VERSION="v1.34.4"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_ROOT="${SAMPLE_CONTROLLER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sample-controller-rs}"
if [[ -z "${KUBEBUILDER_ASSETS:-}" ]]; then
  # One `go env` for both values (each run costs a Go start-up).
  { read -r GOOS_ && read -r GOARCH_; } < <(go env GOOS GOARCH 2>/dev/null || printf 'linux\namd64\n')
fi
# What hack/build-control-plane.sh builds and hack/local-up.sh starts.
PLANE_BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
ASSETS_DIR="${KUBEBUILDER_ASSETS:-$CACHE_ROOT/k8s/$KUBE_VERSION-${GOOS_:-linux}-${GOARCH_:-amd64}}"

log() { echo "[$(basename "$0")] $*" >&2; }
die() { echo "[$(basename "$0")] ERROR: $*" >&2; exit 1; }
