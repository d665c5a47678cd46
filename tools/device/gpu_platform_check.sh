#!/usr/bin/env bash
# One leased-GPU call (device tool, from the repo root), after gpu_check.sh's parts and
# .gpu7 (prepare_gpu_carry.sh with NNUNET=1) were copied to /root/parts: what session
# 22's GPU check left unchecked, in the order of what matters most, inside one call's
# ${BUDGET_S:-540} s.
# 1. issue 18's 3D sliding window on the GPU: `bench --scenario nnunet --size full`,
#    radserve's imported 3d_fullres model through ONNX Runtime CUDA against
#    nnUNetPredictor on the same GPU (its own settings there: on the device, autocast);
# 2. `radserve serve` on the GPU with three 300-slice studies over REST and its GPU
#    /metrics lines (gpu_serve_check.sh);
# 3. the priority scenario (an URGENT study behind 20 routine ones), one round, if the
#    time left allows it.
set -u
T0=$(date +%s)
. "$(dirname "$0")/gpu_install.sh"
left() { echo $(( ${BUDGET_S:-540} - ($(date +%s) - T0) )); }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  echo "cores $(nproc)"
  $PY -c "import torch, onnxruntime as ort, nnunetv2, SimpleITK; print('torch', torch.__version__, torch.cuda.is_available(), 'onnxruntime', ort.__version__, ort.get_available_providers())"
} > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt"
step "nnunet scenario, ${NNUNET_SIZE:-full} size"
timeout "${NNUNET_S:-270}" rs bench --scenario nnunet --size "${NNUNET_SIZE:-full}" --json "$OUT/nnunet.json" \
  > "$OUT/nnunet.log" 2>&1
echo "nnunet rc=$?"; grep -v -E "^\s*$|onnxruntime:Default" "$OUT/nnunet.log" | tail -30
export SERVE_WAIT_S=120; STUDIES=3 PRIORITY_S=0 . "$(dirname "$0")/gpu_serve_check.sh"
if [ "$(left)" -gt 100 ]; then
  step "priority scenario, one round, $(left) s left"
  timeout $(( $(left) - 10 )) rs bench --scenario priority --routine 20 --repeats 1 \
    --cache-dir /tmp/bench-cache --json "$OUT/priority.json" > "$OUT/priority.log" 2>&1
  echo "priority rc=$?"; tail -25 "$OUT/priority.log"
fi
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
step "done, $(left) s of the budget left"
