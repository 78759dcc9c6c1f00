#!/usr/bin/env bash
# Fail if crds/ differs from what the Foo type generates (the counterpart of
# upstream's verify-codegen.sh). Fix with hack/update-crds.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
generated="$(mktemp)"
trap 'rm -f "$generated"' EXIT
cargo run --quiet --locked --bin crdgen > "$generated"
if ! diff -u crds/samplecontroller.k8s.io_foos.yaml "$generated"; then
  die "crds/ is out of date with src/foo.rs; run hack/update-crds.sh and commit the result"
fi
log "crds/ is up to date"
