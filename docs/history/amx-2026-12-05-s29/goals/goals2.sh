#!/bin/bash
cd /work/main
OUT=/tmp/s29/goals
while ! grep -q "== done" $OUT/goals.log; do sleep 5; done
stamp() { echo "== $1 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/goals.log; }
stamp "load-default"
.venv/bin/python -m radserve.bench.load --spawn --rounds 2 --duration 10 --submissions 20 > $OUT/load-default.log 2>&1
for s in 0 1; do
  stamp "eta-seed-$s"
  .venv/bin/radserve bench --scenario eta --studies 24 --seed $s --json $OUT/eta-$s.json > $OUT/eta-$s.log 2>&1
done
stamp "done2"
