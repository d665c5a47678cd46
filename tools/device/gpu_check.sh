#!/usr/bin/env bash
# One leased-GPU call (device tool, from the repo root): radserve on a CUDA GPU through
# onnxruntime-gpu, as a GPU site installs it. Prepared here, run once there.
#
# onnxruntime-gpu (255 MB) is over what one call carries (64 MiB with the tree), so it
# travels as an xz'd tar of its installed files split into ~40 MB parts, one part per
# call while the machine stays warm (each earlier call copies its part to /root/parts),
# the last part in `.gpu6` with this call; `.whl` holds radserve's dependencies missing
# from the device image (pure Python or cp312 wheels) and MONAI for the baseline. The
# CUDA 13 and cuDNN 9 libraries come from the image's nvidia-* wheels (PyTorch's), as
# `pip install onnxruntime-gpu[cuda,cudnn]` would put them beside it.
#
# What it checks, each into $OUT: the providers radserve probes and chooses (TensorRT is
# listed by the wheel, its libraries are not on the image), `radserve doctor`, the
# providers scenario (each model on the CPU provider vs CUDA at every precision), and the
# pipeline scenario on a 300-slice 512x512 CT: radserve on CUDA against the naive loop in
# PyTorch eager on the GPU, ONNX Runtime CUDA at batch 1, and MONAI on the GPU, with the
# label agreement the bench checks before it reports a ratio.
set -u
. "$(dirname "$0")/gpu_install.sh"

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  echo "cores $(nproc)"
  $PY -c "import torch, onnxruntime as ort; print('torch', torch.__version__, torch.version.cuda, torch.cuda.is_available()); print('onnxruntime', ort.__version__, ort.get_available_providers())"
  $PY -c "
import time, logging
logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
t = time.perf_counter()
from radserve.inference.providers import probe_host, choose_runtime
host = probe_host()
print('probe_host', round(time.perf_counter() - t, 2), 's:', host)
choice = choose_runtime(host)
print('chosen:', choice.providers, choice.device, 'threads', choice.intra_op_threads)
print('reason:', choice.reason)
"
} > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt"
if ! $PY -c "from radserve.inference.providers import probe_host as p; import sys; sys.exit('CUDAExecutionProvider' not in p().available_providers)" 2>/dev/null; then
  # not found through onnxruntime.preload_dlls: say so, and go on with the loader path
  export LD_LIBRARY_PATH=$(find "$SITE/nvidia" -maxdepth 3 -name lib -type d | tr '\n' ':')
  echo "CUDA provider not usable as installed; retrying with LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee -a "$OUT/host.txt"
  $PY -c "from radserve.inference.providers import probe_host; print(probe_host())" 2>&1 | tee -a "$OUT/host.txt"
fi
step "out of memory on the GPU (session 27: the recovery shrinks the CUDA arena too)"
# A 256 MiB arena limit: the batch of 8 (144 MiB of output alone) cannot run at once; it
# must run in parts with the same outputs as samples run alone, and the limit must hold
# for the next batch (tests/integration/test_session_out_of_memory.py does this on a CPU)
timeout 120 $PY -c "
import numpy as np, sys, logging
sys.path.insert(0, '.')
logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
from pathlib import Path
from tests.factories.onnx_models import conv_model, model_spec
from radserve.inference import ModelSession, choose_runtime
from radserve.inference.providers import probe_host
w = np.random.default_rng(0).normal(size=(8, 1, 3, 3)).astype(np.float32)
path = conv_model(Path('/tmp/oom-conv.onnx'), w, np.zeros(8, np.float32))
runtime = choose_runtime(probe_host(), gpu_mem_limit_bytes=256 * 2**20)
s = ModelSession(path, model_spec(batch_size=8, divisible_by=8, labels=7), runtime=runtime)
x = np.random.default_rng(1).normal(size=(8, 1, 768, 768)).astype(np.float32)
one = s.run(x[:1]); out = s.run(x)
print('providers', s.providers_in_use, 'batch_limit', s.batch_limit,
      'same', bool(np.array_equal(out[:1], one)), 'again', s.run(x).shape)
" > "$OUT/gpu_oom.txt" 2>&1; echo "gpu oom rc=$?"; tail -5 "$OUT/gpu_oom.txt"

step "doctor"
timeout 120 rs doctor > "$OUT/doctor.txt" 2>&1; echo "doctor rc=$?"
grep -i -E "cuda|tensorrt|cudnn|provider|runtime" "$OUT/doctor.txt" | head -20

step "providers scenario"
timeout 240 rs bench --scenario providers --json "$OUT/providers.json" > "$OUT/providers.log" 2>&1
echo "providers rc=$?"; tail -25 "$OUT/providers.log"

step "pipeline scenario"
timeout "${PIPELINE_S:-330}" rs bench --scenario pipeline --syntax explicit --slices 300 \
  --precision fp32 --precision fp16 --cache-dir /tmp/bench-cache \
  --json "$OUT/pipeline.json" > "$OUT/pipeline.log" 2>&1
echo "pipeline rc=$?"; tail -45 "$OUT/pipeline.log"
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
step done
