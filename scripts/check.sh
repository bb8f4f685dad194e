#!/usr/bin/env bash
# The main job (README "Check determinism"): headless ComfyUI determinism check, a thin call of `steadfast run`:
# the determinism_check workflow twice with ComfyUI's caches freed in between, then once after a server restart.
#   bash scripts/check.sh                      # embedded tiny SD1.5-architecture checkpoint, built on the fly
#   bash scripts/check.sh --ckpt /path/model.safetensors [--json report.json] [--pin pinned.json]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup_env.sh | tail -n 1)"
exec "$PY" scripts/steadfast.py run example_workflows/api/determinism_check.json --runs 2 --free-between --restart "$@"
