#!/usr/bin/env bash
# Fail if crds/ differs from what the Foo type generates, deploy/'s
# LeaderFence CRD from what src/api/leader_fence.rs does, or deploy/'s
# confinement policy from what src/api/confinement.rs does (the counterpart
# of upstream's verify-codegen.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
generated="$(mktemp)"
trap 'rm -f "$generated"' EXIT
cargo run --quiet --locked --bin crdgen > "$generated"
if ! diff -u crds/samplecontroller.k8s.io_foos.yaml "$generated"; then
  die "crds/ is out of date with src/api/foo.rs; run hack/update-crds.sh and commit the result"
fi
leader_fence_crd > "$generated"
if ! diff -u "$LEADER_FENCE_CRD" "$generated"; then
  die "$LEADER_FENCE_CRD is out of date with src/api/leader_fence.rs; run hack/update-crds.sh and commit the result"
fi
confinement_policy > "$generated"
if ! diff -u "$CONFINEMENT_POLICY" "$generated"; then
  die "$CONFINEMENT_POLICY is out of date with src/api/confinement.rs; run hack/update-crds.sh and commit the result"
fi
log "crds/, $LEADER_FENCE_CRD and $CONFINEMENT_POLICY are up to date"
