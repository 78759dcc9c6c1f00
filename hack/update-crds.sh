#!/usr/bin/env bash
# Regenerate crds/ from the Foo type (the counterpart of upstream's
# update-codegen.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
mkdir -p crds
cargo run --quiet --locked --bin crdgen > crds/samplecontroller.k8s.io_foos.yaml.tmp
mv crds/samplecontroller.k8s.io_foos.yaml.tmp crds/samplecontroller.k8s.io_foos.yaml
log "crds/samplecontroller.k8s.io_foos.yaml updated"
