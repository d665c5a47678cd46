#!/usr/bin/env bash
# One leased-GPU call (device tool, run from the repo root with `.whl` carried): train
# the lesion reference model on CUDA for what is left of a fixed time budget, saving the
# best weights to $OUT after every validation. Export, threshold tuning and bundling run
# afterwards on any machine: python -m radserve.training --model lesions --from-checkpoint
# (same --seed/--phantoms). Budget in seconds is $1 (default 540).
set -u
BUDGET=${1:-540}
T0=$(date +%s)
export PYTHONUNBUFFERED=1
[ -n "${SKIP_PIP:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nproc
  python3 -c "import torch, onnxruntime as ort; print('torch', torch.__version__, torch.cuda.is_available()); print('onnxruntime', ort.__version__, ort.get_available_providers())"
  python3 -c "from radserve.inference.providers import probe_host, choose_runtime; print(probe_host()); print(choose_runtime())"
} > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt"
ARGS="--model lesions --seed 0 --phantoms ${PHANTOMS:-160} --cache /tmp/cache"
timeout 300 python3 -m radserve.training $ARGS --workers 15 --prepare-only > "$OUT/prepare.log" 2>&1
echo "prepare rc=$? after $(( $(date +%s) - T0 )) s"
LEFT=$(( BUDGET - ($(date +%s) - T0) - 45 ))
MIN=$(python3 -c "print(round($LEFT / 60, 2))")
echo "training for $MIN min"
python3 -m radserve.training $ARGS --device ${DEVICE:-cuda} --batch ${BATCH:-64} --loader-workers 12 \
    --val-every ${VAL_EVERY:-2500} --threads 4 --minutes "$MIN" \
    --checkpoint "$OUT/lesions.pt" --train-only > "$OUT/train.log" 2>&1
echo "train rc=$? after $(( $(date +%s) - T0 )) s"
grep -E "s/step|step [0-9]+/|sampler|Error|error" "$OUT/train.log" | tail -40
