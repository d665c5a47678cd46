#!/usr/bin/env bash
# Sourced by the gpu_*.sh device checks: onnxruntime-gpu from its carried parts (see
# gpu_check.sh) into the image's Python beside PyTorch's CUDA 13 / cuDNN 9 wheels,
# radserve's missing dependencies from `.whl`, and `rs` as the radserve command.
export PYTHONUNBUFFERED=1
PY=python3
T0=${T0:-$(date +%s)}
step() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
SITE=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export PYTHONPATH=$PWD/src
if [ -f /tmp/radserve-gpu-installed ]; then return 0 2>/dev/null || exit 0; fi  # sourced twice

mkdir -p /root/parts && cp .gpu6/* /root/parts/ 2>/dev/null
if ! (cat /root/parts/ort.tar.xz.? | sha256sum | grep -q "$(cat /root/parts/ort.sha256)"); then
  echo "onnxruntime-gpu parts incomplete:"; ls -la /root/parts; exit 3
fi
$PY -m pip uninstall -y -q onnxruntime > /dev/null 2>&1
cat /root/parts/ort.tar.xz.? | xz -d | tar -x -C "$SITE" || exit 4
# Ray's wheel in two parts (prepare_gpu_carry.sh with RAY=1), when carried
RAY_WHEEL=
if ls /root/parts/ray-*.whl.0 > /dev/null 2>&1; then
  RAY_WHEEL=/tmp/$(basename /root/parts/ray-*.whl.0 .0)
  cat /root/parts/ray-*.whl.? > "$RAY_WHEEL"
fi
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl \
  $(ls /root/parts/*.whl 2>/dev/null) $RAY_WHEEL || exit 5
# nnU-Net's SimpleITK (prepare_gpu_carry.sh with NNUNET=1; its wheels are in /root/parts)
if [ -f /root/parts/sitk.tar.xz ]; then xz -d < /root/parts/sitk.tar.xz | tar -x -C "$SITE" || exit 4; fi
printf '#!/bin/sh\nexec %s -c "import sys; sys.argv[0] = \x27radserve\x27; from radserve.cli import main; main()" "$@"\n' "$PY" > /usr/local/bin/rs
chmod +x /usr/local/bin/rs
touch /tmp/radserve-gpu-installed
step installed
