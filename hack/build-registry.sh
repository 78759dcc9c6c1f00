#!/usr/bin/env bash
# Builds the CNCF distribution registry (hack/tools/registry/main.go: its
# filesystem storage driver alone) from the Go module pinned in
# hack/tools/registry/go.mod, for the install test (tests/e2e_image.rs): a
# real OCI registry the README's install pushes to and the image is pulled
# from. Only the Go module proxy is used; a warm run (built from the same
# go.sum and main.go) returns at once. Prints the binary's path.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v go >/dev/null || die "Go is needed to build the test registry; install Go >= 1.26"
module="$REPO_ROOT/hack/tools/registry"
version="$(awk '{for (i = 1; i < NF; i++) if ($i == "github.com/distribution/distribution/v3") {print $(i + 1); exit}}' "$module/go.mod")"
out="$CACHE_ROOT/registry/$version-${GOOS_:-linux}-${GOARCH_:-amd64}"
stamp="$out/.go.sum.sha256"
want="$(cat "$module/go.sum" "$module/main.go" | sha256sum | cut -d' ' -f1)"
if [[ -x "$out/registry" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "$out/registry"
  exit 0
fi

log "building the distribution registry $version into $out (first run only)"
start=$SECONDS
mkdir -p "$out"
cd "$module"
go_build -ldflags='-s -w' -o "$out/registry" .
echo "$want" > "$stamp"
log "built in $((SECONDS - start))s"
echo "$out/registry"
