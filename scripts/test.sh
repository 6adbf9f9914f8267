#!/usr/bin/env bash
# Set up the pinned venv (first run only) and run the whole test suite plus the linter.
set -euo pipefail
cd "$(dirname "$0")/.."
PYBIN=$(bash scripts/setup.sh | tail -n 1)
"$PYBIN" -m ruff check .
exec "$PYBIN" -m pytest -n 2 "$@"
