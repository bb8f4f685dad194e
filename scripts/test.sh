#!/usr/bin/env bash
# The test command (README "Run the tests"): sets up the venv + ComfyUI if needed, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup_env.sh | tail -n 1)"
export PYTHONDONTWRITEBYTECODE=1
exec "$PY" -m pytest "$@"
