#!/usr/bin/env bash
# The test command (README "Run the tests"): sets up the venv + ComfyUI if needed, then runs pytest.
# STEADFAST_COMFYUI picks the tested row: 0.33.0 (default) or 0.8.0 (scripts/setup_env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
setup="$(bash scripts/setup_env.sh)"
eval "$(printf '%s\n' "$setup" | grep '^export ')"   # COMFYUI_PATH, STEADFAST_COMFYUI
PY="$(printf '%s\n' "$setup" | tail -n 1)"
export PYTHONDONTWRITEBYTECODE=1
echo "[steadfast-test] ComfyUI $STEADFAST_COMFYUI at $COMFYUI_PATH, $("$PY" -c 'import torch; print("torch", torch.__version__)')" >&2
exec "$PY" -m pytest "$@"
