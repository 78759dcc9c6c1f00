#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kube-scheduler from
# the Go modules pinned in hack/tools/v$KUBE_MINOR/go.mod (lib.sh), and kwok
# from the newest plane's (KWOK_TOOLS_DIR),
# into $ASSETS_DIR (envtest's KUBEBUILDER_ASSETS layout). Only the Go module
# proxy is used. A warm run (binaries present and built from the same go.sum
# files) returns at once.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  for b in "${PLANE_BINARIES[@]}"; do
    [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable $b"
  done
  log "using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

command -v go >/dev/null || die "Go is needed to build the test control plane (${PLANE_BINARIES[*]}); install Go >= 1.26 or set KUBEBUILDER_ASSETS"

stamp="$ASSETS_DIR/.go.sum.sha256"
want="$(cat "$TOOLS_DIR/go.sum" "$KWOK_TOOLS_DIR/go.sum" | sha256sum | cut -d' ' -f1)"
all_built() {
  local b
  for b in "${PLANE_BINARIES[@]}"; do [[ -x "$ASSETS_DIR/$b" ]] || return 1; done
}
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && all_built; then
  echo "$ASSETS_DIR"
  exit 0
fi

mkdir -p "$ASSETS_DIR"
log "building the Kubernetes $KUBE_VERSION control plane into $ASSETS_DIR (first run only; see docs/DEVELOPMENT.md for how long)"
start=$SECONDS
cd "$TOOLS_DIR"
# Stamp the release into the servers as Kubernetes' own build does, so
# /version (and kubectl's skew check) report it rather than v0.0.0.
minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
# One `go build` for the four servers rather than one each: it compiles the
# packages they share once and keeps both cores busy through each link,
# where four builds in a row wait for each link alone. etcd has no
# component-base, so the -X flags leave it as it is; its binary is named
# after the package's last path element before /v3.
go_build -ldflags="$kube_ldflags" -o "$ASSETS_DIR/" go.etcd.io/etcd/server/v3 \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
mv "$ASSETS_DIR/server" "$ASSETS_DIR/etcd"
(cd "$KWOK_TOOLS_DIR" && go_build -ldflags='-s -w' -o "$ASSETS_DIR/kwok" sigs.k8s.io/kwok/cmd/kwok)
echo "$want" > "$stamp"
log "built in $((SECONDS - start))s"
echo "$ASSETS_DIR"
