#!/usr/bin/env bash
# Prepare the GPU protocol's device call (benchmarks/gpu_protocol.py) and the speed call's (benchmarks/gpu_speed.py,
# the same preparation): run HERE, in the repository root of the checkout the device tool sends, on a machine with
# network access. It
#   1. downloads the wheels ComfyUI 0.33.0 and the pack need that the device image ('cuda', Python 3.12, torch
#      2.11.0+cu130; /work/.library/device/KINDS.md) lacks, for cp312 manylinux x86_64, into .whl/;
#      comfy-kitchen is repacked without its CUDA/HIP binaries (235 MB unpacked, 58 MB as a wheel: over the
#      call's 64 MiB), so ComfyUI uses comfy-kitchen's triton/eager backends there (the protocol records this);
#   2. puts ComfyUI 0.33.0 (the snapshot in ../shared/comfyui, else a tarball of $COMFYUI_PATH) and the 'av'
#      stand-in (benchmarks/gpu_protocol_stubs) into .gpu/;
#   3. lists .whl/ and .gpu/ in git's info/exclude, checks that the travelling tree stays under 64 MiB, and prints
#      the device tool's `run` command and `carry` list.
# Usage: bash benchmarks/gpu_protocol_prepare.sh   (PYTHON=python3 by default; needs pip)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
COMFY_TGZ_SHARED=${COMFY_TGZ:-$ROOT/../shared/comfyui/ComfyUI-0.33.0.tar.gz}

exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
for pat in /.whl/ /.gpu/; do grep -qxF "$pat" "$exclude" 2>/dev/null || echo "$pat" >>"$exclude"; done

# name==version: what ComfyUI 0.33.0's requirements.txt and the pack need, absent from the device image.
# (av: the stand-in; kornia, spandrel, blake3, simpleeval, comfyui-frontend/templates/docs: optional at start.)
WHEELS=(
  comfy-kitchen==0.2.31 comfy-aimdo==0.4.13 torchsde==0.2.6 trampoline==0.1.2
  SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3
  pydantic==2.14.4 pydantic_core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
  diffusers==0.42.1 torchao==0.18.0
)
PLATFORMS=()
for n in 28 27 24 17 12; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)

mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d .whl "${WHEELS[@]}"

# comfy-kitchen without backends/{cuda,hip}/_C.abi3.so (RECORD lines dropped with them)
"$PY" - <<'EOF'
import glob, os, zipfile
drop = ("comfy_kitchen/backends/cuda/_C.abi3.so", "comfy_kitchen/backends/hip/_C.abi3.so")
(src,) = glob.glob(".whl/comfy_kitchen-*.whl")
with zipfile.ZipFile(src) as z:
    binaries = [n for n in z.namelist() if n in drop]
if binaries:  # same file name (pip checks it against the metadata's version)
    dst = src + ".tmp"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if item.filename in drop:
                continue
            data = zin.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                data = b"".join(l for l in data.splitlines(True) if not l.decode().split(",")[0] in drop)
            zout.writestr(item, data)
    os.replace(dst, src)
    print(f"repacked {os.path.basename(src)}: {os.path.getsize(src) / 2**20:.1f} MiB (CUDA/HIP binaries left out)")
EOF

mkdir -p .gpu
if [ -f "$COMFY_TGZ_SHARED" ]; then
  cp "$COMFY_TGZ_SHARED" .gpu/ComfyUI-0.33.0.tar.gz
else
  src=${COMFYUI_PATH:-$HOME/comfy/ComfyUI-0.33.0}
  tar czf .gpu/ComfyUI-0.33.0.tar.gz --exclude=.git --exclude=__pycache__ --exclude=custom_nodes/ComfyUI-Steadfast \
    -C "$(dirname "$src")" --transform "s|^$(basename "$src")|ComfyUI|" "$(basename "$src")"
fi
rm -rf .gpu/stubs && cp -r benchmarks/gpu_protocol_stubs .gpu/stubs

tree_bytes=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
carry_bytes=$(du -cb .whl .gpu | tail -1 | cut -f1)
total=$((tree_bytes + carry_bytes))
printf 'travelling tree %.1f MiB + carried .whl/.gpu %.1f MiB = %.1f MiB (limit 64 MiB)\n' \
  "$(echo "$tree_bytes / 1048576" | bc -l)" "$(echo "$carry_bytes / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)"
if [ "$total" -ge $((64 * 1048576)) ]; then echo "OVER the 64 MiB limit" >&2; exit 1; fi

cat <<'EOF'

device run (kind: leave out, or nvidia-h100-x1; timeout_s 600), carry [".whl", ".gpu"], command:

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; export PYTHONPATH=/tmp/site:$PWD/.gpu/stubs PYTHONUNBUFFERED=1 STEADFAST_CACHE=/tmp/sfcache PYTHONDONTWRITEBYTECODE=1; mkdir -p /tmp/cu && tar xzf .gpu/ComfyUI-0.33.0.tar.gz -C /tmp/cu && export COMFYUI_PATH=/tmp/cu/ComfyUI; nvidia-smi; python3 benchmarks/gpu_protocol.py --out $OUT --budget 540 2>&1 | tee $OUT/gpu_protocol.log

It returns $OUT/gpu_protocol.json, $OUT/gpu_protocol.md (the table) and $OUT/gpu_protocol.log.

The speed call (benchmarks/gpu_speed.py, issue 35; run it FIRST when a GPU is lent) travels the same way: the same
carry, the same first part, and its own last part:

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; export PYTHONPATH=/tmp/site:$PWD/.gpu/stubs PYTHONUNBUFFERED=1 STEADFAST_CACHE=/tmp/sfcache PYTHONDONTWRITEBYTECODE=1; mkdir -p /tmp/cu && tar xzf .gpu/ComfyUI-0.33.0.tar.gz -C /tmp/cu && export COMFYUI_PATH=/tmp/cu/ComfyUI; nvidia-smi; python3 benchmarks/gpu_speed.py --out $OUT --budget 540 2>&1 | tee $OUT/gpu_speed.log

It returns $OUT/gpu_speed.json, $OUT/gpu_speed.md (the table) and $OUT/gpu_speed.log.
EOF
