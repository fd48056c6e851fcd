#!/usr/bin/env python3
"""Interop of dcr's safetensors reader and writer with the reference implementation.

    reference_files.py INTEROP

1. The reference `safetensors` package writes files holding every dtype dcr supports (raw bytes
   through its low-level serializer, since numpy has no BF16 or FP8), with and without metadata;
   `INTEROP check` reads them with dcr's reader and must find exactly the expected bytes.
2. Rewritten by dcr's writer in the same tensor order, a reference file with at most one metadata
   key comes out byte for byte the same (header JSON, padding, layout).
3. `INTEROP write` writes a file with dcr's writer; the reference package reads it back
   (`deserialize` for raw bytes of every dtype, `safe_open` for metadata and numpy dtypes) and
   must find exactly the bytes dcr wrote.

Exits non-zero, loudly, if the reference package (or numpy) is missing: this test never skips.
"""
import ctypes
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import safetensors
    from safetensors import deserialize, safe_open
except ImportError as e:  # fail, never skip
    sys.exit(f"reference_files.py: the reference 'safetensors' package and numpy are required "
             f"(pip install safetensors numpy): {e}")

# safetensors header name -> (TensorSpec dtype name, bytes per element)
DTYPES = {
    "BOOL": ("bool", 1), "U8": ("uint8", 1), "I8": ("int8", 1),
    "F8_E5M2": ("float8_e5m2", 1), "F8_E4M3": ("float8_e4m3fn", 1),
    "I16": ("int16", 2), "U16": ("uint16", 2), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I32": ("int32", 4), "U32": ("uint32", 4), "F32": ("float32", 4),
    "F64": ("float64", 8), "I64": ("int64", 8), "U64": ("uint64", 8),
}
NUMPY = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
         "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
         "F64": np.float64, "I64": np.int64, "U64": np.uint64}


def fail(msg):
    sys.exit(f"reference_files.py: FAIL: {msg}")


def reference_serialize(tensors, metadata):
    """Serializes {name: (dtype, shape, bytes)} with the reference package's raw-bytes API."""
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
        keep, specs = [], {}
        for name, (dt, shape, data) in tensors.items():
            buf = ctypes.create_string_buffer(data, max(len(data), 1))
            keep.append(buf)
            specs[name] = safetensors.TensorSpec(dtype=DTYPES[dt][0], shape=list(shape),
                                                 data_ptr=ctypes.addressof(buf),
                                                 data_len=len(data))
        return bytes(safetensors.serialize(specs, metadata))
    plain = {name: {"dtype": dt, "shape": list(shape), "data": data}
             for name, (dt, shape, data) in tensors.items()}
    return bytes(safetensors.serialize(plain, metadata))


def random_tensors(rng, prefix):
    tensors = {}
    for dt, (_, size) in DTYPES.items():
        for shape in ([2, 3, 5], [7]):
            n = 1
            for e in shape:
                n *= e
            data = bytes(rng.getrandbits(1) if dt == "BOOL" else rng.getrandbits(8)
                         for _ in range(n * size))
            tensors[f"{prefix}.{dt.lower()}.r{len(shape)}"] = (dt, shape, data)
    tensors[f"{prefix}.scalar"] = ("F32", [], bytes(rng.getrandbits(8) for _ in range(4)))
    tensors[f"{prefix}.empty"] = ("BF16", [0, 3], b"")
    return tensors


def expected_json(tensors, metadata):
    return {"metadata": metadata,
            "tensors": {name: {"dtype": dt, "shape": shape, "hex": data.hex()}
                        for name, (dt, shape, data) in tensors.items()}}


def reference_to_dcr(interop, work):
    rng = random.Random(7)
    for case, metadata in (("meta", {"format": "pt", "step": "42", "note": "\u00e9t\u00e9"}),
                           ("onekey", {"format": "pt"}), ("nometa", None)):
        tensors = random_tensors(rng, case)
        path = os.path.join(work, f"reference_{case}.safetensors")
        with open(path, "wb") as f:
            f.write(reference_serialize(tensors, metadata))
        expected = os.path.join(work, f"reference_{case}.json")
        with open(expected, "w") as f:
            json.dump(expected_json(tensors, metadata), f)
        r = subprocess.run([interop, "check", path, expected], capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            fail(f"dcr's reader disagrees with the reference writer on {path}: {r.stderr}")
        if metadata is None or len(metadata) <= 1:  # the reference orders metadata keys freely
            again = path + ".dcr"
            r = subprocess.run([interop, "rewrite", path, again], capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"dcr could not rewrite {path}: {r.stderr}")
            with open(path, "rb") as a, open(again, "rb") as b:
                if a.read() != b.read():
                    fail(f"dcr's writer does not reproduce the reference writer's {path} exactly")
            print(f"reference_files.py: dcr's writer reproduces {os.path.basename(path)} byte for byte")


def dcr_to_reference(interop, work):
    path = os.path.join(work, "dcr.safetensors")
    expected_path = os.path.join(work, "dcr.json")
    r = subprocess.run([interop, "write", path, expected_path], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"dcr's writer failed: {r.stderr}")
    with open(expected_path) as f:
        expected = json.load(f)
    with open(path, "rb") as f:
        raw = f.read()
    got = dict(deserialize(raw))
    if set(got) != set(expected["tensors"]):
        fail(f"the reference reader sees tensors {sorted(got)}, dcr wrote {sorted(expected['tensors'])}")
    for name, want in expected["tensors"].items():
        t = got[name]
        if t["dtype"] != want["dtype"] or list(t["shape"]) != want["shape"]:
            fail(f"{name}: reference reads {t['dtype']} {t['shape']}, dcr wrote {want['dtype']} "
                 f"{want['shape']}")
        if bytes(t["data"]).hex() != want["hex"]:
            fail(f"{name}: the reference reader gets other bytes than dcr wrote")
    with safe_open(path, framework="numpy") as f:
        if f.metadata() != expected["metadata"]:
            fail(f"metadata: reference reads {f.metadata()}, dcr wrote {expected['metadata']}")
        checked = 0
        for name, want in expected["tensors"].items():
            if want["dtype"] not in NUMPY:
                continue
            array = f.get_tensor(name)
            if array.dtype != NUMPY[want["dtype"]] or list(array.shape) != want["shape"]:
                fail(f"{name}: safe_open gives {array.dtype} {array.shape}")
            if array.tobytes().hex() != want["hex"]:
                fail(f"{name}: safe_open gives other bytes than dcr wrote")
            checked += 1
    print(f"reference_files.py: the reference reader reads dcr's {len(got)} tensors bit-exact "
          f"({checked} also through safe_open/numpy)")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: reference_files.py INTEROP")
    interop = os.path.abspath(sys.argv[1])
    print(f"reference safetensors {getattr(safetensors, '__version__', '?')}, numpy {np.__version__}")
    with tempfile.TemporaryDirectory(prefix="dcr-interop-") as work:
        reference_to_dcr(interop, work)
        dcr_to_reference(interop, work)
    print("ok")


if __name__ == "__main__":
    main()
