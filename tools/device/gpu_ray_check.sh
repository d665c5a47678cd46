#!/usr/bin/env bash
# One leased-GPU call (device tool, from the repo root), after gpu_check.sh's parts and
# .gpu8/.gpu9 (Ray's wheel in two parts: prepare_gpu_carry.sh with RAY=1) were copied to
# /root/parts: `radserve serve` with `executor: ray` and two workers sharing the GPU
# (`ray.devices: ["gpu:0.5", "gpu:0.5"]`; RAY_DEVICES overrides), three 300-slice
# studies over REST (tools/device/serve_load.py), the GPU's compute processes sampled
# while they run (each Ray worker should hold a CUDA context of its own), /readyz with
# its workers. Dry run on a CPU host: RAY_DEVICES='["cpu:1", "cpu:1"]'.
set -u
. "$(dirname "$0")/gpu_install.sh"
DATA=/tmp/rsdata-ray
rm -rf $DATA && mkdir -p $DATA
cat > /tmp/radserve-ray.yaml <<YAML
executor: ray
ray: {address: local, devices: ${RAY_DEVICES:-["gpu:0.5", "gpu:0.5"]}, startup_timeout_s: 180}
YAML
for seed in $(seq 1 ${STUDIES:-3}); do
  [ -f /tmp/study-$seed.zip ] || { rs phantom --seed $seed --slices ${SLICES:-300} --out /tmp/phantom-$seed > /dev/null &&
  (cd /tmp/phantom-$seed/dicom && $PY -c "import shutil; shutil.make_archive('/tmp/study-$seed', 'zip', '.')"); } &
done; wait
step "phantoms ready: $(ls /tmp/study-*.zip | wc -l)"
setsid rs serve --config /tmp/radserve-ray.yaml --data-dir $DATA --port 8765 --plain-logs > "$OUT/ray-serve.log" 2>&1 &
KEY=$(rs keys create --role admin --config /tmp/radserve-ray.yaml --data-dir $DATA 2>/dev/null | grep -o 'rsk_[A-Za-z0-9_-]*' | head -1)
for _ in $(seq 1 ${READY_WAIT:-240}); do
  curl -sf -H "Authorization: Bearer $KEY" http://127.0.0.1:8765/readyz > /tmp/ray-readyz.json && break; sleep 0.5
done
step "ready: $(head -c 300 /tmp/ray-readyz.json)"
( while sleep 1; do nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null; done ) > /tmp/gpu-apps.txt &
SAMPLER=$!
SERVE_WAIT_S=${SERVE_WAIT_S:-150} $PY tools/device/serve_load.py "$KEY" /tmp/study-*.zip > "$OUT/ray-jobs.txt" 2>&1
kill $SAMPLER
{ echo "/readyz:"; cat /tmp/ray-readyz.json; echo; echo "GPU compute processes seen (pid, name, memory):";
  sort /tmp/gpu-apps.txt | uniq -c | sort -rn | head -10; } >> "$OUT/ray-jobs.txt"
tail -25 "$OUT/ray-jobs.txt"
pkill -f "radserve.cli" ; sleep 2; pkill -9 -f raylet; pkill -9 -f gcs_server
step done
