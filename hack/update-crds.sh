#!/usr/bin/env bash
# Regenerate the CRDs from their Rust types (the counterpart of upstream's
# update-codegen.sh): crds/ from the Foo type, deploy/'s LeaderFence CRD
# (the leader fence's parameter) from src/api/leader_fence.rs, and deploy/'s
# confinement policy from src/api/confinement.rs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
mkdir -p crds
cargo run --quiet --locked --bin crdgen > crds/samplecontroller.k8s.io_foos.yaml.tmp
mv crds/samplecontroller.k8s.io_foos.yaml.tmp crds/samplecontroller.k8s.io_foos.yaml
leader_fence_crd > "$LEADER_FENCE_CRD.tmp"
mv "$LEADER_FENCE_CRD.tmp" "$LEADER_FENCE_CRD"
confinement_policy > "$CONFINEMENT_POLICY.tmp"
mv "$CONFINEMENT_POLICY.tmp" "$CONFINEMENT_POLICY"
log "crds/samplecontroller.k8s.io_foos.yaml, $LEADER_FENCE_CRD and $CONFINEMENT_POLICY updated"
