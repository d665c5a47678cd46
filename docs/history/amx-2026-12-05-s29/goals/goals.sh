#!/bin/bash
# issue 19's goals 2, 5, 6 and 7 on one quiet host, one after another
cd /work/main
OUT=/tmp/s29/goals; mkdir -p $OUT
stamp() { echo "== $1 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/goals.log; }
stamp "j2k"
.venv/bin/radserve bench --scenario j2k --slices 300 --repeats 3 --cache-dir /tmp/s29/cache --json $OUT/j2k.json > $OUT/j2k.log 2>&1
stamp "load"
.venv/bin/python -m radserve.bench.load --spawn --floor --only radserve --only "bare FastAPI" --rounds 2 --duration 10 --submissions 20 > $OUT/load.log 2>&1
stamp "cstore"
.venv/bin/radserve bench --scenario cstore --slices 300 --repeats 3 --cache-dir /tmp/s29/cache --json $OUT/cstore.json > $OUT/cstore.log 2>&1
stamp "priority"
.venv/bin/radserve bench --scenario priority --routine 20 --repeats 1 --cache-dir /tmp/s29/cache --json $OUT/priority.json > $OUT/priority.log 2>&1
stamp "done"
