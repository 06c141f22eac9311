#!/usr/bin/env bash
# A fresh virtual environment installed from a wheelhouse alone (no package index, no network)
# passes `make doctor`. Usage: tests/offline_install.sh WHEELHOUSE   (make test-offline)
set -euo pipefail
wheelhouse=$(realpath "$1")
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

git -C "$repo" archive HEAD | tar -x -C "$work"   # the committed series, nothing else
cd "$work"
echo "wheelhouse: $(du -sh "$wheelhouse" | cut -f1) in $(ls "$wheelhouse" | wc -l) files"
start=$(date +%s)
# any attempt to reach an index fails: the install must come from the wheelhouse alone
PIP_NO_INDEX=1 PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_FIND_LINKS="$wheelhouse" \
  make install WHEELHOUSE="$wheelhouse"
echo "installed from the wheelhouse alone in $(( $(date +%s) - start )) s"
make doctor
