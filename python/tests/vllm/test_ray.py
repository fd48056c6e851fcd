"""The RL loop on Ray (examples/python/rl_ray.py): a local Ray head on 127.0.0.1 started by the
example, two trainer actors with owner agents, a vLLM rollout actor with the receiver agent, the
coordinator; over etcd and S3 (SeaweedFS) where scripts/with-etcd.sh and scripts/with-s3.sh
started them (the meson test does), else over the file plane and store."""
import json
import os
import subprocess
import sys

import ray  # noqa: F401  (CI fails loudly without it)

ROOT = os.environ.get("DCR_SOURCE_ROOT", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))


def test_rl_loop_on_ray_refits_the_rollout_engine_bit_exact(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", "rl_ray.py"), "--steps", "3",
                        "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, f"rl_ray.py failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    head, steps, summary = lines[0], lines[1:-1], lines[-1]
    assert head["owned"][0] > 0 and head["owned"][1] > 0          # both trainers own tensors
    if os.environ.get("DCR_ETCD_ENDPOINT") and os.environ.get("DCR_S3_ENDPOINT"):
        assert (head["plane"], head["store"]) == ("etcd", "s3")
    assert head["prewarm"]["units"]["rerun"] > 0 and head["prewarm"]["extra_bytes"] > 0
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["committed"] and s["version"] == s["step"] for s in steps)
    assert summary == {"summary": True, "bit_exact": True, "tokens_equal": True, "steps": 3}
