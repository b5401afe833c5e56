#!/bin/bash
# Alternating A/B of `qshare bench cluster`: before the class-read change (d8bbfcd, checked
# out with its own native build at /tmp/ab-base) against main after the session's merges.
set -u
OUT=/work/main/docs/bench/cluster-ab-classes
paths() { echo "$1/services/common:$1/native/python:$1/services/node-agent:$1/services/api:$1/services/allocator:$1/services/preemptor"; }
run() { # tree label
  local load=$(cut -d' ' -f1 /proc/loadavg)
  (cd $1 && PYTHONPATH=$(paths $1) /work/main/.venv/bin/python -c "import sys; from qshare.cli import main; sys.argv=['qshare','bench','cluster','--json','$OUT/$2.json']; sys.exit(main())" > $OUT/$2.log 2>&1)
  echo "$2 rc=$? load $load -> $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/runs.txt
}
for i in 1 2 3 4; do run /tmp/ab-base before$i; run /work/main after$i; done
