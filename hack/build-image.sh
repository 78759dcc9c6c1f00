#!/usr/bin/env bash
# Build the operator's image from Dockerfile, offline: no base image to pull,
# no Docker engine needed.
#
#   hack/build-image.sh             # prints the OCI image layout's path
#
# 1. The release binary, built on the host with glibc linked statically (the
#    FROM-scratch image has no libc). rustup cannot add the musl target on a
#    machine without internet; a static glibc binary needs no files at run
#    time except for host-name lookups (see docs/image.md). jemalloc's C
#    library is the debug build's (built here if it is not yet), linked
#    through tikv-jemalloc-sys's JEMALLOC_OVERRIDE: the same code, compiled
#    once for both profiles (Cargo.toml says why).
# 2. A build context in target/image/context: that binary and the host's CA
#    bundle.
# 3. The image, built from Dockerfile by buildah (Debian's package, installed
#    if missing) into its own storage under target/image, then written as an
#    OCI image layout (target/image/oci, tag <version>) for
#    hack/run-image.sh, skopeo or `podman load`. IMAGE_BUILDER=docker builds
#    the same Dockerfile with `docker build` instead, tagged the same.
# Prints the image's size; all output but the layout's path goes to stderr.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
LICENSES="$(sed -n 's/^license = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
# The commit, "-modified" when the working tree differs from it.
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
[[ $REVISION == unknown ]] || git diff --quiet HEAD 2>/dev/null || REVISION+=-modified
ARCH="$(image_arch)"
# Where the source lives, when the clone says so (an https remote), without
# any user or token the remote's URL carries.
SOURCE="$(git remote get-url origin 2>/dev/null | grep '^https://' | sed -E 's#^https://[^/@]*@#https://#' || true)"
build_args=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "LICENSES=$LICENSES"
  ${SOURCE:+--label "org.opencontainers.image.source=$SOURCE"} --platform "linux/$ARCH")
TAG="sample-controller:$VERSION"
OUT="$REPO_ROOT/target/image"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
[[ -f "$CA_BUNDLE" ]] || die "no CA bundle at $CA_BUNDLE (install ca-certificates or set CA_BUNDLE)"

host="$(rustc -vV | sed -n 's/^host: //p')"
# Fresh after the tests' build (the features are the workspace's either
# way), so every caller, hack/test.sh's and README.md's install alike,
# hands the release build the same path and it stays fresh too. One set
# by the caller is kept.
if [[ -z "${JEMALLOC_OVERRIDE:-}" ]]; then
  out_dir="$(cargo build --locked --quiet -p tikv-jemalloc-sys --message-format=json |
    grep tikv-jemalloc-sys@ |
    sed -n '/"reason":"build-script-executed"/s/.*"out_dir":"\([^"]*\)".*/\1/p')"
  export JEMALLOC_OVERRIDE="$out_dir/lib/libjemalloc.a"
  [[ -f $JEMALLOC_OVERRIDE ]] || die "cargo built tikv-jemalloc-sys but no $JEMALLOC_OVERRIDE came of it"
fi
log "building the release binary for $host (image platform linux/$ARCH), glibc linked statically"
# --target keeps these flags off the host's build scripts and proc macros,
# and the output apart from the usual target/release.
# The commit goes into the binary too: sample_controller_build_info's
# revision label (src/observe/metrics.rs, REVISION).
SAMPLE_CONTROLLER_REVISION="$REVISION" RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release --locked --quiet --target "$host" --bin sample-controller >&2
binary="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/$host/release/sample-controller"
if readelf -d "$binary" | grep -q NEEDED; then
  die "$binary is dynamically linked; it cannot run in a FROM-scratch image"
fi

rm -rf "$OUT/context" "$OUT/oci"
mkdir -p "$OUT/context"
cp "$binary" "$OUT/context/sample-controller"
cp "$CA_BUNDLE" "$OUT/context/ca-certificates.crt"

if [[ "${IMAGE_BUILDER:-buildah}" == docker ]]; then
  docker build "${build_args[@]}" -f Dockerfile -t "$TAG" "$OUT/context" >&2
  log "built $TAG with docker ($(docker image inspect -f '{{.Size}}' "$TAG") bytes)"
  exit 0
fi

need_command buildah buildah "building the image without a Docker engine"
# Its own storage, vfs: no overlay mounts or daemon, nothing outside target/.
storage=(--root "$OUT/storage" --runroot "$OUT/run" --storage-driver vfs)
log "building $TAG from Dockerfile with buildah"
buildah "${storage[@]}" build --quiet --layers=false "${build_args[@]}" -f Dockerfile -t "$TAG" "$OUT/context" >/dev/null
buildah "${storage[@]}" push --quiet "$TAG" "oci:$OUT/oci:$VERSION" >&2
buildah "${storage[@]}" rmi --all >/dev/null

# The size a registry stores and a node pulls: the layout's blobs.
bytes="$(find "$OUT/oci/blobs" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')"
unpacked="$(du -sb "$OUT/context" | cut -f1)"
log "image $TAG: $(awk -v b="$bytes" 'BEGIN {printf "%.1f MiB", b/1048576}') compressed, $(awk -v b="$unpacked" 'BEGIN {printf "%.1f MiB", b/1048576}') unpacked"
echo "$OUT/oci:$VERSION"
