#!/usr/bin/env bash
# Creates the demo stream for elastic groups: stream foo, subjects foo.* (the reference runs
#   nats stream add foo --subjects="foo.*" --defaults).
# No nats CLI needed. Options: --stream NAME (subjects NAME.*), --replicas N, --memory, plus the
# cg connection options (--server URL, --context NAME, ...) and NATS_URL etc.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -n "${CG:-}" ]; then
  cg=("$CG")                               # an explicit cg executable
elif [ -x "$here/../.venv/bin/cg" ]; then
  cg=("$here/../.venv/bin/cg")             # this checkout's venv
elif command -v cg >/dev/null 2>&1; then
  cg=("$(command -v cg)")
else
  cg=("${PYTHON:-python3}" -m cg.main)     # pcgroups installed without the console script
fi
exec "${cg[@]}" tools stream-setup "$@"
