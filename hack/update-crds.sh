#!/usr/bin/env bash
# Regenerate the CRDs from their Rust types (the counterpart of upstream's
# update-codegen.sh): crds/ from the Foo type, and deploy/'s LeaderFence CRD
# (the leader fence's parameter) from src/api/leader_fence.rs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
mkdir -p crds
cargo run --quiet --locked --bin crdgen > crds/samplecontroller.k8s.io_foos.yaml.tmp
mv crds/samplecontroller.k8s.io_foos.yaml.tmp crds/samplecontroller.k8s.io_foos.yaml
leader_fence_crd > "$LEADER_FENCE_CRD.tmp"
mv "$LEADER_FENCE_CRD.tmp" "$LEADER_FENCE_CRD"
log "crds/samplecontroller.k8s.io_foos.yaml and $LEADER_FENCE_CRD updated"
