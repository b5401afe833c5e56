"""A/B of the interposer's allocation path: the library before the graph/pool accounting
(d447bf4) and after (main), alternated in one sitting, through the same probe and fake driver."""
import json, statistics, sys, tempfile
from pathlib import Path
from qshare.bench.hook import probe
from qshare.bench.testnode import FAKE_UUID, test_node, vgpu_env, LP_VGPU
from qshare.native_build import INTERPOSER

BEFORE = "/work/wt-before/native/build/libqshare-cuda.so"
PAIRS, ROUNDS = 100_000, 7
GIB = 1 << 30
out = {"pairs_per_run": PAIRS, "rounds": ROUNDS, "runs": {}}
with tempfile.TemporaryDirectory() as tmp, test_node(Path(tmp), FAKE_UUID, 16 * GIB) as seg:
    d = Path(tmp)
    for r in range(ROUNDS):
        for kind in ("plain", "async"):
            for side, lib in (("direct", None), ("before", BEFORE), ("after", str(INTERPOSER))):
                env = vgpu_env(d, seg, None if lib is None else LP_VGPU)
                if lib is not None:
                    env["LD_PRELOAD"] = lib
                ns = float(probe(env, ["init", f"allocbench {PAIRS} {kind}"])["allocbench"]["ns_per_pair"])
                out["runs"].setdefault(f"{kind}/{side}", []).append(ns)
out["median_ns_per_pair"] = {k: statistics.median(v) for k, v in out["runs"].items()}
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out["median_ns_per_pair"], indent=1))
