# Sourced by the demo scripts: sets the array `cg` to the cg to run (no nats CLI needed).
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
