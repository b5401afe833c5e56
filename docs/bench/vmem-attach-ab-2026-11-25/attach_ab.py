"""A/B of attach latency (qshare.bench.attach_scale) between two trees, rounds interleaved."""
import json, os, subprocess, sys
TREES = {"main (ABI 5, 2 descriptors)": "/tmp/wt-base", "branch (ABI 6, 3 descriptors)": "/work/wt-vmem"}
PP = "services/common:native/python:services/node-agent:services/api:services/allocator:services/preemptor"
CODE = "import json; from qshare.bench.attach_scale import measure; print(json.dumps(measure()))"
out = {k: [] for k in TREES}
for r in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
    for label, tree in TREES.items():
        env = dict(os.environ, PYTHONPATH=PP, QSHARE_SHM_DIR="/dev/shm")
        done = subprocess.run(["/work/main/.venv/bin/python", "-c", CODE], cwd=tree, env=env,
                              capture_output=True, text=True, check=True)
        out[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(label, r, out[label][-1], flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
