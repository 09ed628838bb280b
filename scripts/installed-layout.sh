#!/usr/bin/env bash
# Lays the package out in DIR as a wheel installs it (setup.py's mapping of the layers'
# folders into `tierbroker`), from the working tree's files. mypy and import-linter read
# modules from files and cannot follow the editable install's import hook, so they check
# this layout: what users install. A finding at DIR/tierbroker/broker/x.py is broker/x.py.
set -euo pipefail
dir="${1:?usage: scripts/installed-layout.sh DIR}"
root="$(cd "$(dirname "$0")/.." && pwd)"
source="$(mktemp -d)"
trap 'rm -rf "$source"' EXIT
# A copy of the tree's files: a build in the tree would leave build/lib behind, whose
# stale modules a later build would lay out again.
(cd "$root" && git ls-files -z --cached --others --exclude-standard | tar -c --null -T - -f -) \
  | tar -x -C "$source" -f -
rm -rf "$dir"
"$root/.venv/bin/pip" install --quiet --no-deps --no-build-isolation --no-compile \
  --target "$dir" "$source"
