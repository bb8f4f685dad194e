#!/usr/bin/env bash
# The main job (README "Check determinism"): headless ComfyUI determinism check.
#   bash scripts/check.sh                      # embedded tiny SD1.5-architecture checkpoint, built on the fly
#   bash scripts/check.sh --ckpt /path/model.safetensors
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup_env.sh | tail -n 1)"
exec "$PY" scripts/check.py "$@"
