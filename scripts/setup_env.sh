#!/usr/bin/env bash
# Idempotent set-up of everything Steadfast's main job and tests need on a fresh machine, for one row of the
# tested range (docs/compatibility.md):
#
#   STEADFAST_COMFYUI   ComfyUI     torch                          venv (STEADFAST_VENV)     ComfyUI (COMFYUI_PATH)
#   0.33.0 (default)    0.33.0      2.11.0 + tv 0.26.0 + ta 2.11.0 ~/comfy/venv-0.33.0       ~/comfy/ComfyUI-0.33.0
#   0.8.0               0.8.0       2.14.1 + tv 0.29.1             ~/comfy/venv-0.8.0        ~/comfy/ComfyUI-0.8.0
#
# ComfyUI 0.33 imports torchaudio at start; the newest torchaudio on PyPI is 2.11.0, hence its torch row.
#   1. ComfyUI at COMFYUI_PATH, in this order: an existing checkout there (used as it is); `git clone` of the
#      pinned tag where the network allows it (STEADFAST_NO_CLONE=1 skips the try); the source snapshot in
#      ../shared/comfyui/ (STEADFAST_SNAPSHOTS) unpacked there. Otherwise one line says what is missing and how
#      to get it, and the script exits with status 3 (before any venv is made).
#   2. a Python venv with torch pinned (torchaudio where that ComfyUI needs it), ComfyUI's requirements,
#      requests, the pack's own dependencies and the test tools (pytest, ruff; comfy-sdk and comfy-api-proxy, pinned,
#      for `steadfast run` over the Comfy API v2 and its tests).
#   3. for the browser tests: playwright (pip) and Debian's chromium (apt-get, as root); a loud warning
#      where that is impossible (STEADFAST_NO_BROWSER=1 skips this step).
# Prints `export` lines for COMFYUI_PATH and STEADFAST_COMFYUI, then the venv's python path as its last line
# (scripts/test.sh and scripts/check.sh read both).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VER="${STEADFAST_COMFYUI:-0.33.0}"
case "$VER" in
  0.33.0) DEF_PINS="torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0" ;;
  0.8.0) DEF_PINS="torch==2.14.1 torchvision==0.29.1" ;;
  *) echo "[steadfast-setup] STEADFAST_COMFYUI=$VER is not a tested row: use 0.33.0 (default) or 0.8.0" >&2; exit 2 ;;
esac
VENV="${STEADFAST_VENV:-$HOME/comfy/venv-$VER}"
COMFY="${COMFYUI_PATH:-$HOME/comfy/ComfyUI-$VER}"
TORCH_PINS="${STEADFAST_TORCH_PINS:-$DEF_PINS}"
SNAPSHOTS="${STEADFAST_SNAPSHOTS:-$here/../shared/comfyui}"
PY="${STEADFAST_PYTHON:-python3}"
stamp="$VENV/.steadfast-setup-v2"

log() { printf '[steadfast-setup] %s\n' "$*" >&2; }

# 1. ComfyUI: existing checkout > git clone of the pinned tag > snapshot.
if [ ! -f "$COMFY/main.py" ]; then
  if command -v git >/dev/null && [ "${STEADFAST_NO_CLONE:-0}" != 1 ]; then
    log "ComfyUI not found at $COMFY; trying git clone of tag v$VER (set COMFYUI_PATH to use an existing one)"
    GIT_TERMINAL_PROMPT=0 timeout 120 git clone -q --depth 1 --branch "v$VER" \
      https://github.com/comfyanonymous/ComfyUI "$COMFY" >&2 2>/dev/null || { cloned="failed"; rm -rf "$COMFY"; }
  fi
fi
if [ ! -f "$COMFY/main.py" ] && [ -f "$SNAPSHOTS/ComfyUI-$VER.tar.gz" ]; then
  log "unpacking the ComfyUI $VER snapshot ($SNAPSHOTS/ComfyUI-$VER.tar.gz) into $COMFY"
  mkdir -p "$COMFY"
  tar -xzf "$SNAPSHOTS/ComfyUI-$VER.tar.gz" -C "$COMFY" --strip-components=1
fi
if [ ! -f "$COMFY/main.py" ]; then
  case "${cloned:-skipped}" in
    failed) how="git clone of v$VER failed (no network?)" ;;
    *) how="git clone not tried (STEADFAST_NO_CLONE=1 or no git)" ;;
  esac
  log "ERROR: ComfyUI $VER is missing: no checkout at $COMFY, $how, no snapshot $SNAPSHOTS/ComfyUI-$VER.tar.gz. Get it by one of: COMFYUI_PATH=<a ComfyUI $VER checkout>, network access to github.com for the clone, or ComfyUI-$VER.tar.gz in $SNAPSHOTS (or STEADFAST_SNAPSHOTS=<folder holding it>)"
  exit 3
fi

# 2. The venv.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv at $VENV"
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
want="$(cat "$here/pyproject.toml" "$COMFY/requirements.txt" 2>/dev/null | sha256sum | cut -c1-16) $TORCH_PINS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log "venv up to date ($VENV, ComfyUI $VER)"
else
  log "installing $TORCH_PINS (pinned first so nothing pulls another torch)"
  pip install $TORCH_PINS
  cons="$(mktemp)"; "$VENV/bin/python" -m pip freeze | grep -iE '^(torch|torchvision|torchaudio)==' > "$cons"
  if [ -f "$COMFY/requirements.txt" ]; then
    log "installing ComfyUI $VER's requirements (torch family as pinned) + requests"
    grep -vE '^\s*(torch|torchvision|torchaudio)\s*$' "$COMFY/requirements.txt" | grep -vE '^\s*#' \
      | grep -vE '^\s*$' > "$cons.req"
    pip install -c "$cons" -r "$cons.req" requests
  fi
  log "installing Steadfast's own dependencies and the test tools (with the Comfy API v2 client and proxy)"
  pip install -c "$cons" diffusers transformers peft safetensors pillow numpy pytest requests torchao ruff==0.17.6 \
    comfy-sdk==0.5.0 comfy-api-proxy==0.1.6
  rm -f "$cons" "$cons.req"
  echo "$want" > "$stamp"
fi
# ~/comfy/venv: the default row's venv, for tools that look there (kept only if it is ours to point).
if [ "$VENV" = "$HOME/comfy/venv-0.33.0" ] && { [ -L "$HOME/comfy/venv" ] || [ ! -e "$HOME/comfy/venv" ]; }; then
  ln -sfn "$VENV" "$HOME/comfy/venv"
fi

# 3. Browser tests: the real ComfyUI frontend in Debian's Chromium, driven by Playwright (no browser download).
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
printf 'export COMFYUI_PATH=%q\n' "$COMFY"
printf 'export STEADFAST_COMFYUI=%q\n' "$VER"
echo "$VENV/bin/python"
