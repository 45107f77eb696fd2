#!/usr/bin/env bash
# Publishes synchronously (waiting for each ack) to foo.<n>, n cycling through 0..99, one message
# every 10ms, until Ctrl-C (the reference runs
#   nats bench js pub sync foo --multisubject --sleep 10ms --multisubjectmax 100 --stream foo).
# No nats CLI needed. Options: --count N (stop after N), --sleep DURATION, --stream NAME,
# --subject PREFIX, --max-subjects N, --size BYTES, -q, plus the cg connection options
# (--server URL, --context NAME, ...) and NATS_URL etc.
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
exec "${cg[@]}" tools traffic "$@"
