#!/usr/bin/env bash
# Idempotent set-up of everything Steadfast's main job and tests need on a fresh machine:
#   1. a Python venv (STEADFAST_VENV, default ~/comfy/venv) with torch pinned,
#   2. ComfyUI's requirements (without torchaudio) + requests + the pack's own deps + pytest,
#   3. ComfyUI itself at COMFYUI_PATH (default ~/comfy/ComfyUI): used where present, otherwise cloned
#      with git when the network allows it, otherwise reported (the ComfyUI tests then skip loudly),
#   4. for the browser tests: playwright (pip) and Debian's chromium (apt-get, as root); a loud warning
#      where that is impossible (STEADFAST_NO_BROWSER=1 skips this step).
# Prints the venv's python path as its last line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${STEADFAST_VENV:-$HOME/comfy/venv}"
COMFY="${COMFYUI_PATH:-$HOME/comfy/ComfyUI}"
TORCH_PINS="${STEADFAST_TORCH_PINS:-torch==2.14.1 torchvision==0.29.1}"
PY="${STEADFAST_PYTHON:-python3}"
stamp="$VENV/.steadfast-setup-v1"

log() { printf '[steadfast-setup] %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv at $VENV"
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }

if [ ! -d "$COMFY" ] || [ ! -f "$COMFY/main.py" ]; then
  if command -v git >/dev/null && [ "${STEADFAST_NO_CLONE:-0}" != 1 ]; then
    log "ComfyUI not found at $COMFY; trying git clone (set COMFYUI_PATH to use an existing one)"
    git clone --depth 1 https://github.com/comfyanonymous/ComfyUI "$COMFY" >&2 || log "clone failed: ComfyUI tests will be skipped"
  fi
fi

want="$(cat "$here/pyproject.toml" "$COMFY/requirements.txt" 2>/dev/null | sha256sum | cut -c1-16) $TORCH_PINS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log "venv up to date ($VENV)"
else
  log "installing $TORCH_PINS (pinned first so nothing pulls another torch)"
  pip install $TORCH_PINS
  cons="$(mktemp)"; "$VENV/bin/python" -m pip freeze | grep -iE '^(torch|torchvision)==' > "$cons"
  if [ -f "$COMFY/requirements.txt" ]; then
    log "installing ComfyUI requirements (without torchaudio) + requests"
    grep -vE '^\s*(torch|torchvision|torchaudio)\s*$' "$COMFY/requirements.txt" | grep -vE '^\s*#' | grep -vE '^\s*$' > "$cons.req"
    pip install -c "$cons" -r "$cons.req" requests
  fi
  log "installing Steadfast's own dependencies and the test tools"
  pip install -c "$cons" diffusers transformers peft safetensors pillow numpy pytest requests torchao
  rm -f "$cons" "$cons.req"
  echo "$want" > "$stamp"
fi
# Browser tests: the real ComfyUI frontend in Debian's Chromium, driven by Playwright (no browser download).
if [ "${STEADFAST_NO_BROWSER:-0}" != 1 ]; then
  if ! "$VENV/bin/python" -c "import playwright" 2>/dev/null; then
    log "installing playwright (Python package only; the browser is Debian's chromium)"
    pip install playwright || log "WARNING: pip install playwright failed: browser tests will SKIP"
  fi
  if [ ! -x "${STEADFAST_CHROMIUM:-/usr/bin/chromium}" ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
      log "installing Debian's chromium (apt-get)"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >&2 \
        || log "WARNING: apt-get install chromium failed: browser tests will SKIP"
    else
      log "WARNING: no chromium and no root apt-get here: browser tests will SKIP (install chromium, or set STEADFAST_CHROMIUM)"
    fi
  fi
fi
echo "$VENV/bin/python"
