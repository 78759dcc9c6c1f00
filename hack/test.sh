#!/usr/bin/env bash
# The project's test command (README.md; .ci/run calls it): build, check
# formatting, lints, generated files and the Dockerfile, run the unit and
# mocked-API tests, build the image (offline, with buildah), then the
# integration, image and chaos tests on a local control plane with kwok
# nodes, once per Kubernetes minor in KUBE_MINORS (default: the newest and the
# oldest supported, 1.37 and 1.35). The planes are built from Go modules on
# first use, in the background while the Rust side builds and runs its unit
# tests (the Go builds keep about one core busy). Integration tests never
# skip: if a control plane cannot be had, this fails saying why. Every test
# binary runs even when one fails; the last line is always `tests: N passed,
# M failed`, also when a step fails early.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
start=$SECONDS
step="starting"
plane_up=false
planes_pid=""
results=""
KUBE_MINORS="${KUBE_MINORS:-1.37 1.35}"

summary() {
  local rc=$? passed=0 failed=0
  if $plane_up; then hack/local-down.sh || true; fi
  if [[ -n "$planes_pid" ]]; then kill "$planes_pid" 2>/dev/null || true; fi
  if [[ -n "$results" && -f "$results" ]]; then
    passed=$(awk '{for (i=1;i<=NF;i++) if ($(i+1) ~ /^passed;?$/) s+=$i} END {print s+0}' "$results")
    failed=$(awk '{for (i=1;i<=NF;i++) if ($(i+1) ~ /^failed;?$/) s+=$i} END {print s+0}' "$results")
    rm -f "$results" "$results.out"
  fi
  if (( rc != 0 && failed == 0 )); then
    failed=1 # the step itself failed: a build, a lint, the control plane
  fi
  (( rc == 0 )) || log "FAILED at: $step"
  log "done in $((SECONDS - start))s"
  echo "tests: $passed passed, $failed failed"
  exit "$rc"
}
trap summary EXIT
results="$(mktemp)"

run_tests() { # cargo test args...; keeps the summary lines for the total
  local rc=0
  cargo test --locked --no-fail-fast "$@" 2>&1 | tee "$results.out" || rc=$?
  grep -E '^test result:' "$results.out" >> "$results" || true
  return "$rc"
}

ran_all() { # suite...: each ran in the last run_tests (a binary that did not build runs nothing)
  local suite missing=()
  for suite in "$@"; do
    grep -qF "Running $suite (" "$results.out" || missing+=("$suite")
  done
  (( ${#missing[@]} == 0 )) || { log "these test suites did not run: ${missing[*]}"; return 1; }
}

planes_log="$(mktemp)"
(for minor in $KUBE_MINORS; do KUBE_MINOR=$minor hack/build-control-plane.sh >/dev/null || exit 1; done) \
  >"$planes_log" 2>&1 &
planes_pid=$!

step="1/6 build"; log "$step"
cargo build --locked --all-targets
step="2/6 formatting, lints, generated CRD matches the Foo type"; log "$step"
cargo fmt --check
cargo clippy --locked --all-targets --quiet -- -D warnings
hack/verify-crds.sh
step="3/6 Dockerfile lint"; log "$step"
hack/lint-dockerfile.sh
step="4/6 unit and mocked-API tests, alert rules"; log "$step"
need_command promtool prometheus "promtool for the alert rules; Prometheus for the metrics tests"
failing=() # steps whose tests failed; the rest still run
run_tests --lib --bins --test reconcile_mock --test alerts || failing+=("unit and mocked-API tests, alert rules")
ran_all "unittests src/lib.rs" "tests/reconcile_mock.rs" "tests/alerts.rs" || failing+=("unit and mocked-API suites")

step="5/6 the image, built from Dockerfile"; log "$step"
image="$(hack/build-image.sh)"

step="6/6 integration, image and chaos tests on local control planes ($KUBE_MINORS)"; log "$step"
if ! wait "$planes_pid"; then
  planes_pid=""
  cat "$planes_log" >&2
  die "the control plane could not be built (see above); integration tests cannot run"
fi
planes_pid=""
for minor in $KUBE_MINORS; do
  step="6/6 integration tests on Kubernetes $minor"; log "$step"
  # The chaos tests restart this plane's components through LOCAL_UP_DIR;
  # tests count requests in its audit log.
  export KUBE_MINOR=$minor LOCAL_UP_DIR="$REPO_ROOT/.local/test-control-plane-$minor"
  export LOCAL_UP_AUDIT_LOG="$LOCAL_UP_DIR/audit.log"
  plane_up=true
  up="$(hack/local-up.sh)" || die "the Kubernetes $minor control plane could not be started (see above); integration tests cannot run"
  eval "$up"
  install_crds
  SAMPLE_CONTROLLER_TEST_KUBECONFIG="$KUBECONFIG" SAMPLE_CONTROLLER_TEST_AUDIT_LOG="$LOCAL_UP_AUDIT_LOG" \
    SAMPLE_CONTROLLER_TEST_IMAGE="$image" run_tests --test 'e2e_*' -- --show-output ||
    failing+=("integration tests on Kubernetes $minor")
  ran_all tests/e2e_*.rs || failing+=("integration suites on Kubernetes $minor")
  hack/local-down.sh
  plane_up=false
done
step="done"
if (( ${#failing[@]} )); then
  step="${failing[*]}"
  exit 1
fi
