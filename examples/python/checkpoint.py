"""Whole checkpoints from Python: dcr.diff, dcr.apply and dcr.inspect on safetensors files, as
`dcr diff/apply/inspect` do them. Writes two versions of a small checkpoint, diffs them, applies
the delta to the old one and checks the result equals the new one byte for byte.

    python examples/python/checkpoint.py [DIR]
"""

import os
import sys
import tempfile

import numpy as np
from safetensors.numpy import save_file

import dcr

d = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dcr-ckpt-")
rng = np.random.default_rng(0)
old = {"w": rng.standard_normal((256, 64)).astype(np.float16), "b": rng.standard_normal(64).astype(np.float32)}
new = {k: v.copy() for k, v in old.items()}
flat = new["w"].reshape(-1)
idx = rng.choice(flat.size, flat.size // 100, replace=False)
flat[idx] = (flat[idx] * np.float16(1.01)).astype(np.float16)
paths = {k: os.path.join(d, f"{k}.safetensors") for k in ("old", "new", "out")}
save_file(old, paths["old"])
save_file(new, paths["new"])

report = dcr.diff(paths["old"], paths["new"], os.path.join(d, "step.delta"))
print(f"diff: {report['changed_elements']} of {report['elements']} elements changed, delta {report['delta_bytes']} bytes")
# A delta names no tensors (its base does): alone, its items refer to tensors by id; given the
# base it applies to, inspect lists the tensors by name.
info = dcr.inspect(os.path.join(d, "step.delta"), paths["old"])
changed = [t["name"] for t in info["tensors"] if t["changed"]]
print("inspect:", changed, "changed;", len(info["payloads"]), "payload(s)")
dcr.apply(os.path.join(d, "step.delta"), paths["old"], out=paths["out"])
same = open(paths["out"], "rb").read() == open(paths["new"], "rb").read()
print("apply:", "result equals NEW byte for byte" if same else "MISMATCH")
try:
    dcr.apply(os.path.join(d, "step.delta"), paths["new"], out=os.path.join(d, "wrong.safetensors"))
    print("apply to the wrong base was not refused")
    same = False
except dcr.Error as e:
    print("apply to the wrong base refused:", type(e).__name__)
sys.exit(0 if same else 1)
