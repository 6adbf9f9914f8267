#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install the pinned requirements.
# Usage: source-free; prints the venv's python path on the last line. Re-runs are cheap: the venv is
# rebuilt only when requirements*.txt change.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
stamp=$(cat requirements.txt requirements-dev.txt requirements-xgrammar.txt requirements-reference.txt | sha256sum \
  | cut -c1-16)
if [ ! -f .venv/.stamp ] || [ "$(cat .venv/.stamp)" != "$stamp" ]; then
  echo "[setup] creating .venv with $($PY --version) (first run takes ~2-3 minutes)" >&2
  rm -rf .venv
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q -U pip >&2
  .venv/bin/python -m pip install -q -r requirements-dev.txt >&2
  .venv/bin/python -m pip install -q --no-deps -r requirements-xgrammar.txt >&2
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . >&2
  .venv/bin/python -m pip install -q --no-deps --target .venv/reference -r requirements-reference.txt >&2
  echo "$stamp" > .venv/.stamp
fi
echo "$PWD/.venv/bin/python"
