#!/usr/bin/env bash
# Set up the pinned venv (first run only) and run jaxserve's main job on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
PYBIN=$(bash scripts/setup.sh | tail -n 1)
exec "$PYBIN" -m jaxserve "$@"
