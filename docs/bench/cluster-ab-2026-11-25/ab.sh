#!/bin/bash
# Alternating A/B of `qshare bench cluster`: base (ddf6ddb, session start) vs head (main).
set -u
OUT=/work/main/docs/bench/cluster-ab-2026-11-25
mkdir -p $OUT
paths() { echo "$1/services/common:$1/native/python:$1/services/node-agent:$1/services/api:$1/services/allocator:$1/services/preemptor"; }
run() { # tree label
  local load=$(cut -d' ' -f1 /proc/loadavg)
  (cd $1 && PYTHONPATH=$(paths $1) /work/main/.venv/bin/python -c "import sys; from qshare.cli import main; sys.argv=['qshare','bench','cluster','--json','$OUT/$2.json']; sys.exit(main())" > $OUT/$2.log 2>&1)
  echo "$2 rc=$? load $load -> $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/runs.txt
}
for i in 1 2; do run /tmp/base before$i; run /work/main after$i; done
