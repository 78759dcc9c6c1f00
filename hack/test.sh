#!/usr/bin/env bash
# The project's test command (README.md; .ci/run calls it): build, check
# generated files and the Dockerfile, run the unit and mocked-API tests, then
# the integration tests on a local control plane (built from Go modules on
# first use). Integration tests never skip: if the control plane cannot be
# had, this fails saying why.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
start=$SECONDS
results="$(mktemp)"

run_tests() { # cargo test args...; keeps the summary lines for the total
  local out rc=0
  out="$(mktemp)"
  cargo test --locked "$@" 2>&1 | tee "$out" || rc=$?
  grep -E '^test result:' "$out" >> "$results" || true
  rm -f "$out"
  return "$rc"
}

log "1/5 build"
cargo build --locked --all-targets
log "2/5 formatting, lints, generated CRD matches the Foo type"
cargo fmt --check
cargo clippy --locked --all-targets --quiet -- -D warnings
hack/verify-crds.sh
log "3/5 Dockerfile lint"
hack/lint-dockerfile.sh
log "4/5 unit and mocked-API tests"
run_tests --lib --bins --test reconcile_mock

log "5/5 integration tests on a local control plane"
export LOCAL_UP_DIR="$REPO_ROOT/.local/test-control-plane"
trap 'hack/local-down.sh || true; rm -f "$results"' EXIT
up="$(hack/local-up.sh)" || die "the local control plane could not be started (see above); integration tests cannot run"
eval "$up"
kubectl apply -f crds/ >&2
kubectl wait --for condition=established --timeout=60s crd/foos.samplecontroller.k8s.io >&2
SAMPLE_CONTROLLER_TEST_KUBECONFIG="$KUBECONFIG" run_tests --test 'e2e_*'
hack/local-down.sh

passed=$(awk '{for (i=1;i<=NF;i++) if ($(i+1) ~ /^passed;?$/) s+=$i} END {print s+0}' "$results")
failed=$(awk '{for (i=1;i<=NF;i++) if ($(i+1) ~ /^failed;?$/) s+=$i} END {print s+0}' "$results")
log "done in $((SECONDS - start))s"
rm -f "$results"
trap - EXIT
echo "tests: $passed passed, $failed failed"
