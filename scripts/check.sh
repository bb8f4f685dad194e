#!/usr/bin/env bash
# The main job (README "Check determinism"): headless ComfyUI determinism check, a thin call of `steadfast run`:
# the determinism_check workflow twice with ComfyUI's caches freed in between, then once after a server restart.
#   bash scripts/check.sh                      # embedded tiny SD1.5-architecture checkpoint, built on the fly
#   bash scripts/check.sh --ckpt /path/model.safetensors [--json report.json] [--pin pinned.json]
#   STEADFAST_COMFYUI=0.8.0 bash scripts/check.sh   # the other tested row (default 0.33.0)
set -euo pipefail
cd "$(dirname "$0")/.."
setup="$(bash scripts/setup_env.sh)"
eval "$(printf '%s\n' "$setup" | grep '^export ')"   # COMFYUI_PATH, STEADFAST_COMFYUI
PY="$(printf '%s\n' "$setup" | tail -n 1)"
exec "$PY" scripts/steadfast.py run example_workflows/api/determinism_check.json --runs 2 --free-between --restart "$@"
