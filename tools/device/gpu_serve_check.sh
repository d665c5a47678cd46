#!/usr/bin/env bash
# One leased-GPU call (device tool, from the repo root, parts carried as for gpu_check.sh):
# `radserve serve` on a CUDA GPU as a site runs it. A server on loopback, a key, six
# 300-slice CT studies uploaded over REST (the last one STAT): each job's turnaround,
# /readyz's runtime, and the GPU lines of /metrics sampled while the studies run
# (nvidia-ml-py), /readyz appended. Then (PRIORITY_S > 60) the priority scenario: an URGENT study behind 20 routine ones
# against its solo turnaround (issue 19, goal 7) on the GPU.
set -u
. "$(dirname "$0")/gpu_install.sh"
DATA=/tmp/rsdata
mkdir -p $DATA
for seed in $(seq 1 ${STUDIES:-6}); do
  rs phantom --seed $seed --slices ${SLICES:-300} --out /tmp/phantom-$seed > /dev/null &&
  (cd /tmp/phantom-$seed/dicom && $PY -c "import shutil; shutil.make_archive('/tmp/study-$seed', 'zip', '.')") &
done; wait
step "phantoms ready: $(ls /tmp/study-*.zip | wc -l)"
setsid rs serve --data-dir $DATA --port 8765 --plain-logs > "$OUT/serve.log" 2>&1 &
for _ in $(seq 1 120); do curl -sf http://127.0.0.1:8765/healthz > /dev/null && break; sleep 0.5; done
step "serving"
KEY=$(rs keys create --role admin --data-dir $DATA 2>/dev/null | grep -o 'rsk_[A-Za-z0-9_-]*' | head -1)
[ -n "$KEY" ] || { echo "no key"; tail -20 "$OUT/serve.log"; exit 6; }
curl -s -H "Authorization: Bearer $KEY" http://127.0.0.1:8765/readyz > /tmp/readyz.json
$PY tools/device/serve_load.py "$KEY" /tmp/study-*.zip > "$OUT/serve_jobs.txt" 2>&1
{ echo "/readyz before the uploads:"; cat /tmp/readyz.json; } >> "$OUT/serve_jobs.txt"
cat "$OUT/serve_jobs.txt" | tail -40
step "served"
pkill -f "rs serve" ; pkill -f "radserve.cli" ; sleep 1
[ "${PRIORITY_S:-420}" -gt 60 ] || { step "priority scenario skipped: ${PRIORITY_S}s left"; return 0 2>/dev/null || exit 0; }
timeout ${PRIORITY_S:-420} rs bench --scenario priority --routine 20 --repeats ${PRIORITY_REPEATS:-3} --cache-dir /tmp/bench-cache --json "$OUT/priority.json" > "$OUT/priority.log" 2>&1
echo "priority rc=$?"; tail -25 "$OUT/priority.log"
step done
