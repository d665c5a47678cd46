#!/bin/bash
# 7 runs of the explicit pipeline bench, the precision order rotated (as sessions 24/25)
cd /work/main
OUT=/tmp/s29/pipe; mkdir -p $OUT
orders=("fp32 int8 bf16" "int8 bf16 fp32" "bf16 fp32 int8" "fp32 bf16 int8" "int8 fp32 bf16" "bf16 int8 fp32" "fp32 int8 bf16")
for i in 1 2 3 4 5 6 7; do
  o=(${orders[$((i-1))]})
  echo "== run $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) order: ${o[*]}" >> $OUT/pipeline-runs.log
  .venv/bin/radserve bench --syntax explicit --precision ${o[0]} --precision ${o[1]} --precision ${o[2]} \
     --baseline naive-ort --cache-dir /tmp/s29/cache --json $OUT/pipe-$i.json >> $OUT/pipeline-runs.log 2>&1
done
echo "== floor $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/pipeline-runs.log
.venv/bin/radserve bench --scenario floor --precision fp32 --precision int8 --precision bf16 --cache-dir /tmp/s29/cache --json $OUT/floor.json >> $OUT/floor.log 2>&1
echo "== done $(date -u +%H:%M:%S)" >> $OUT/pipeline-runs.log
