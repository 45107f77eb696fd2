# Sourced by scripts/*: make .venv if missing and install the project into it.
# PCG_EXTRAS picks the extras (default: dev), PYTHON the interpreter that makes the venv (python3) and
# PCG_VENV the venv (.venv). Re-installs only when pyproject.toml or the install mode changed.
# Says what it does, one line per step on stderr; pip's output is shown only when a step fails.
# The install is editable in setuptools' compat mode: a .pth file puts this tree on sys.path, which type
# checkers read (the default mode's import hook is invisible to mypy: a user's program then type-checks
# as if pcgroups were not installed), and PYTHONPATH still comes first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PCG_VENV:-$ROOT/.venv}"
EXTRAS="${PCG_EXTRAS-dev}"
PYTHON="${PYTHON:-python3}"

_step() { printf 'pcgroups setup: %s\n' "$*" >&2; }

# Run a command quietly; on failure show everything it printed, then fail.
_quiet() {
  local log
  log="$(mktemp)"
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    _step "failed: $*"
    return 1
  fi
  rm -f "$log"
}

if [ ! -x "$VENV/bin/python" ]; then
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    _step "no $PYTHON on the PATH: install Python 3.11 or newer (or set PYTHON=/path/to/python3)"
    exit 1
  fi
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    _step "$("$PYTHON" --version 2>&1) is too old: pcgroups needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)"
    exit 1
  fi
  _step "creating ${VENV#"$ROOT"/} with $("$PYTHON" --version 2>&1) (first run only)"
  _quiet "$PYTHON" -m venv "$VENV"
  _step "updating pip in ${VENV#"$ROOT"/}"
  _quiet "$VENV/bin/python" -m pip install --upgrade pip
fi
EDITABLE_MODE=compat
STAMP="$VENV/.installed-${EXTRAS:-base}"
WANT="$( (cat "$ROOT/pyproject.toml"; echo "editable_mode=$EDITABLE_MODE") | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  if [ -n "$EXTRAS" ]; then SPEC="$ROOT[$EXTRAS]"; else SPEC="$ROOT"; fi
  case ",$EXTRAS," in
    ,,) _step "installing pcgroups into ${VENV#"$ROOT"/} (the library alone: nats-py)" ;;
    *,spark,*) _step "installing pcgroups[$EXTRAS] into ${VENV#"$ROOT"/} (pyspark: a minute or more)" ;;
    *) _step "installing pcgroups[$EXTRAS] into ${VENV#"$ROOT"/}" ;;
  esac
  _quiet "$VENV/bin/python" -m pip install --disable-pip-version-check \
    --config-settings "editable_mode=$EDITABLE_MODE" -e "$SPEC"
  echo "$WANT" > "$STAMP"
  _step "installed; ${VENV#"$ROOT"/}/bin/cg is the CLI"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
