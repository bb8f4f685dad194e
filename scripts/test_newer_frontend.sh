#!/usr/bin/env bash
# The browser tests (tests/comfy/test_frontend.py) on the default row (ComfyUI 0.33.0) with a NEWER frontend than
# the one 0.33.0 pins (comfyui-frontend-package 1.49.6): STEADFAST_FRONTEND, default 1.53.10 (the 1.53 line that
# ComfyUI 0.37-0.38 pin; ComfyUI 0.33.0 accepts any frontend at least as new as its pin). It is installed with
# `pip install --target` into a folder of its own (STEADFAST_FRONTEND_DIR, default ~/comfy/frontend-<version>) that
# goes first on PYTHONPATH, so the server imports it; the 0.33.0 venv is left unchanged. Extra args go to pytest.
# CI (.ci/run) runs it as rows 3 (1.53.10) and 4 (the newest, FRONTEND_NEWEST there).
set -euo pipefail
cd "$(dirname "$0")/.."
FE="${STEADFAST_FRONTEND:-1.53.10}"
DIR="${STEADFAST_FRONTEND_DIR:-$HOME/comfy/frontend-$FE}"
setup="$(STEADFAST_COMFYUI=0.33.0 bash scripts/setup_env.sh)"
eval "$(printf '%s\n' "$setup" | grep '^export ')"   # COMFYUI_PATH, STEADFAST_COMFYUI
PY="$(printf '%s\n' "$setup" | tail -n 1)"
if [ ! -f "$DIR/.steadfast-ok" ]; then
  echo "[steadfast-test] installing comfyui-frontend-package==$FE into $DIR (not into the venv)" >&2
  "$PY" -m pip install -q --disable-pip-version-check --no-deps --upgrade --target "$DIR" \
    "comfyui-frontend-package==$FE"
  touch "$DIR/.steadfast-ok"
fi
export PYTHONPATH="$DIR${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1
got="$("$PY" -c 'import importlib.metadata as m; print(m.version("comfyui-frontend-package"))')"
[ "$got" = "$FE" ] || { echo "[steadfast-test] the server would import frontend $got, not $FE" >&2; exit 1; }
echo "[steadfast-test] ComfyUI $STEADFAST_COMFYUI at $COMFYUI_PATH with frontend $got (from $DIR)" >&2
exec "$PY" -m pytest tests/comfy/test_frontend.py "$@"
