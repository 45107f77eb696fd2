# Sourced by scripts/*: make .venv if missing and install the project into it.
# PCG_EXTRAS picks the extras (default: dev). Re-installs only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${PCG_EXTRAS-dev}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
fi
STAMP="$VENV/.installed-${EXTRAS:-base}"
WANT="$(sha256sum < "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  if [ -n "$EXTRAS" ]; then SPEC="$ROOT[$EXTRAS]"; else SPEC="$ROOT"; fi
  "$VENV/bin/python" -m pip install -q -e "$SPEC"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
