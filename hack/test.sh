#!/usr/bin/env bash
# The project's test command (README.md; .ci/run calls it): build, check
# formatting, lints, generated files and the Dockerfile, run the unit and
# mocked-API tests, build the image (offline, with buildah), then the
# integration, image, install and chaos tests on a local control plane with kwok
# nodes, once per Kubernetes minor in KUBE_MINORS (default: the newest and the
# oldest supported, 1.37 and 1.35). The planes (and the OCI registry of the
# install test) are built from Go modules on first use, in the background while the Rust side builds and runs its unit
# tests (the Go builds keep about one core busy). Integration tests never
# skip: if a control plane cannot be had, this fails saying why. Tests run
# under cargo-nextest (installed on first use; .config/nextest.toml): every
# test runs even when one fails, each within its own timeout, and the totals
# come from its JUnit report. The last line is always `tests: N passed,
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
    read -r passed failed < <(awk '{p += $1; f += $2} END {print p+0, f+0}' "$results")
    rm -f "$results"
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

junit="target/nextest/default/junit.xml"
run_tests() { # cargo nextest run args...; adds "passed failed" from its JUnit report to the totals
  local rc=0 tests failures errors
  rm -f "$junit"
  cargo nextest run --locked --no-tests=fail "$@" || rc=$?
  [[ -f "$junit" ]] || { log "cargo nextest wrote no report: the tests did not run"; return 1; }
  # The root element: <testsuites name="nextest-run" tests="N" skipped="S" failures="F" errors="E" ...>
  local root; root=$(grep -m 1 -o '<testsuites [^>]*>' "$junit" || true)
  attr() { sed -n "s/.* $1=\"\([0-9]*\)\".*/\1/p" <<<"$root"; }
  tests=$(attr tests) failures=$(attr failures) errors=$(attr errors)
  echo "$((tests - failures - errors)) $((failures + errors))" >> "$results"
  return "$rc"
}

planes_log="$(mktemp)"
(for minor in $KUBE_MINORS; do KUBE_MINOR=$minor hack/build-control-plane.sh >/dev/null || exit 1; done
  hack/build-registry.sh >/dev/null) \
  >"$planes_log" 2>&1 &
planes_pid=$!

step="1/6 build"; log "$step"
if ! cargo nextest --version >/dev/null 2>&1; then
  # Without its self-update (an HTTP client and TLS stack to build for nothing).
  log "installing cargo-nextest, the test runner (crates.io; once per machine)"
  cargo install --locked cargo-nextest@0.9.151 --no-default-features --features default-no-update >&2
fi
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
run_tests --lib --bins --test reconcile_mock --test alerts --test layers ||
  failing+=("unit and mocked-API tests, alert rules, layers")

step="5/6 the image, built from Dockerfile"; log "$step"
image="$(hack/build-image.sh)"
need_command skopeo skopeo "the install test pushes the image to a registry, as README.md's install does"

step="6/6 integration, image and chaos tests on local control planes ($KUBE_MINORS)"; log "$step"
if ! wait "$planes_pid"; then
  planes_pid=""
  cat "$planes_log" >&2
  die "the control plane or the test registry could not be built (see above); integration tests cannot run"
fi
planes_pid=""
registry="$(hack/build-registry.sh)" || die "the test registry could not be built; the install test cannot run"
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
  export SAMPLE_CONTROLLER_TEST_KUBECONFIG="$KUBECONFIG" SAMPLE_CONTROLLER_TEST_AUDIT_LOG="$LOCAL_UP_AUDIT_LOG"
  export SAMPLE_CONTROLLER_TEST_IMAGE="$image" SAMPLE_CONTROLLER_TEST_REGISTRY="$registry"
  # One binary at a time, its tests two at once, as cargo test runs them:
  # the chaos tests restart this plane and the deploy tests drain its nodes,
  # so no other binary's tests may run beside theirs.
  for suite in tests/e2e_*.rs; do
    suite=$(basename "$suite" .rs)
    run_tests --test "$suite" || failing+=("$suite on Kubernetes $minor")
  done
  hack/local-down.sh
  plane_up=false
done
step="done"
if (( ${#failing[@]} )); then
  step="${failing[*]}"
  exit 1
fi
