#!/usr/bin/env bash
# Sourced by the gpu_*.sh device checks: onnxruntime-gpu from its carried parts (see
# gpu_check.sh) into the image's Python beside PyTorch's CUDA 13 / cuDNN 9 wheels,
# radserve's missing dependencies from `.whl`, and `rs` as the radserve command.
export PYTHONUNBUFFERED=1
PY=python3
T0=$(date +%s)
step() { echo "== $(( $(date +%s) - T0 )) s: $*"; }

mkdir -p /root/parts && cp .gpu6/* /root/parts/ 2>/dev/null
if ! (cat /root/parts/ort.tar.xz.? | sha256sum | grep -q "$(cat /root/parts/ort.sha256)"); then
  echo "onnxruntime-gpu parts incomplete:"; ls -la /root/parts; exit 3
fi
SITE=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
$PY -m pip uninstall -y -q onnxruntime > /dev/null 2>&1
cat /root/parts/ort.tar.xz.? | xz -d | tar -x -C "$SITE" || exit 4
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 5
export PYTHONPATH=$PWD/src
printf '#!/bin/sh\nexec %s -c "import sys; sys.argv[0] = \x27radserve\x27; from radserve.cli import main; main()" "$@"\n' "$PY" > /usr/local/bin/rs
chmod +x /usr/local/bin/rs
step installed
