"""Recording an engine's own Python loader at prewarm (dcr.Receiver uses this).

dcr runs the engine's load function on probe tensors, one per canonical tensor, and records
every final storage copy it makes: where it writes (address, dtype, extents, strides) and what
it reads, as a strided view of a probe (offset and strides in elements). Two runs, with probes
holding different values, must record the same copies (deterministic, no value-dependent
placement). The records go to the C++ receiver, which compiles them like any C++ loader and
checks the loader conditions there (non-overlapping views inside the probe, copy-or-skip, one
canonical element per destination element, casts make a tensor overwrite-only). After that the
loader is never called again: apply, restore and dense loads run in C++ on the parameters'
storage.

torch: a TorchDispatchMode sees every aten call the loader makes while it runs. `copy_` into a
tensor that is not a probe is a final storage copy (it is recorded and not performed); view
operations of probes run as usual (they are what locates the source); `_to_copy`/`clone` of a
probe view make a tracked temporary that may then be copied whole (a cast or a contiguous copy
before the final copy). Any other operation on probe values (arithmetic, reading a value, an
in-place write other than copy_) makes a copy from its result unplaceable, and is refused with
an error naming the tensor.

NumPy: there is no dispatch to intercept, so the loader receives an explicit sink and calls
`sink.copy(dst, src)` (src a view of the array it was given) and `sink.skip(name)`.
"""

from __future__ import annotations

import bisect
import math

from . import _dcr

# dtype names as safetensors spells them, for torch and NumPy dtypes.
_TORCH_NAMES = {
    "torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32",
    "torch.float64": "F64", "torch.float8_e4m3fn": "F8_E4M3", "torch.float8_e5m2": "F8_E5M2",
    "torch.int8": "I8", "torch.uint8": "U8", "torch.int16": "I16", "torch.uint16": "U16",
    "torch.int32": "I32", "torch.uint32": "U32", "torch.int64": "I64", "torch.uint64": "U64",
    "torch.bool": "BOOL",
}
_NUMPY_NAMES = {
    "bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "int8": "I8", "uint8": "U8",
    "int16": "I16", "uint16": "U16", "int32": "I32", "uint32": "U32", "int64": "I64",
    "uint64": "U64", "bool": "BOOL",
}
_SAFETENSORS = set(_TORCH_NAMES.values())
_WORDS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def dtype_name(dtype) -> str:
    """The safetensors name of a dtype given as a name, a torch dtype or a NumPy dtype."""
    if isinstance(dtype, str):
        if dtype.upper() in _SAFETENSORS:
            return dtype.upper()
        if dtype in _NUMPY_NAMES:
            return _NUMPY_NAMES[dtype]
        if dtype in _TORCH_NAMES:
            return _TORCH_NAMES[dtype]
        raise _dcr.InvalidArgument(f"unknown dtype {dtype!r}")
    text = str(dtype)
    if text in _TORCH_NAMES:
        return _TORCH_NAMES[text]
    name = getattr(dtype, "name", None)
    if name is None:  # a NumPy scalar type such as numpy.float32
        try:
            import numpy
            name = numpy.dtype(dtype).name
        except TypeError:
            name = None
    if name in _NUMPY_NAMES:
        return _NUMPY_NAMES[name]
    raise _dcr.InvalidArgument(f"dtype {dtype!r} is not one dcr moves")


def torch_dtype(name: str):
    import torch
    for k, v in _TORCH_NAMES.items():
        if v == name:
            return getattr(torch, k.split(".")[1])
    raise _dcr.InvalidArgument(f"no torch dtype for {name}")


def numpy_dtype(name: str):
    import numpy
    if name in ("BF16", "F8_E4M3", "F8_E5M2"):
        try:
            import ml_dtypes
        except ImportError as e:  # pragma: no cover - ml_dtypes is a dependency of the tests
            raise _dcr.InvalidArgument(f"NumPy {name} arrays need the ml_dtypes package") from e
        return numpy.dtype({"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
                            "F8_E5M2": ml_dtypes.float8_e5m2}[name])
    for k, v in _NUMPY_NAMES.items():
        if v == name:
            return numpy.dtype(k)
    raise _dcr.InvalidArgument(f"no NumPy dtype for {name}")


def _is_torch(t) -> bool:
    return type(t).__module__.startswith("torch")


def tensor_arg(t, what: str):
    """(array, words_only) for the C++ side: zero copies. NumPy arrays of dtypes DLPack cannot
    carry (ml_dtypes' bfloat16 and float8) travel as their unsigned words; so do torch float8."""
    if _is_torch(t):
        if t.device.type != "cpu":
            raise _dcr.InvalidArgument(f"{what}: tensor on {t.device}, dcr's Python package reads CPU tensors")
        t = t.detach()
        if "float8" in str(t.dtype):
            return (t.view(__import__("torch").uint8), True)
        return (t, False)
    dt = getattr(t, "dtype", None)
    if dt is not None and hasattr(t, "__array_interface__"):
        name = getattr(dt, "name", "")
        if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            if not t.flags.c_contiguous:
                raise _dcr.InvalidArgument(f"{what}: tensor is not contiguous (row-major); pass numpy.ascontiguousarray()")
            return (t.view(_WORDS[dt.itemsize]), True)
    return (t, False)


# ---- probes ------------------------------------------------------------------------------------

class _Probes:
    """One probe per canonical tensor, located by address."""

    def __init__(self, registry, framework: str, fill: int):
        self.framework = framework
        self.tensors = {}   # name -> probe
        self.ranges = []    # sorted (start, end, name, itemsize, dtype name)
        for name, dt, shape in registry.entries():
            probe = self._make(dt, shape, fill)
            start, itemsize = self._address(probe)
            n = math.prod(shape)
            self.tensors[name] = probe
            self.ranges.append((start, start + max(n, 1) * itemsize, name, itemsize, dt))
        self.ranges.sort()
        self.starts = [r[0] for r in self.ranges]

    def _make(self, dt, shape, fill):
        if self.framework == "torch":
            import torch
            p = torch.empty(shape, dtype=torch_dtype(dt))
            words = p.view(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[p.element_size()])
            if fill == 0:
                words.zero_()
            else:  # other values: a placement that depends on them shows as a difference
                words.copy_(torch.arange(1, words.numel() + 1, dtype=torch.int64) % 113 + 1)
            return p
        import numpy
        p = numpy.zeros(shape, dtype=numpy_dtype(dt))
        if fill:
            p.reshape(-1).view(_WORDS[p.itemsize])[:] = (numpy.arange(p.size) % 113 + 1)
        return p

    def _address(self, t):
        if self.framework == "torch":
            return t.data_ptr(), t.element_size()
        return t.__array_interface__["data"][0], t.itemsize

    def locate(self, address):
        """(name, itemsize, dtype name, start) of the probe holding `address`, or None."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0:
            start, end, name, itemsize, dt = self.ranges[i]
            if address < end:
                return name, itemsize, dt, start
        return None


class _Recording:
    def __init__(self):
        self.copies = []   # (tensor, dst address, dst dtype, extents, dst strides, src offset, src strides)
        self.skips = set()
        self.keep = []     # destinations, kept alive while the placement refers to them

    def key(self):
        return sorted(self.copies), sorted(self.skips)


def _contiguous_strides(shape):
    strides, s = [], 1
    for e in reversed(shape):
        strides.append(s)
        s *= e
    return list(reversed(strides))


# ---- torch -------------------------------------------------------------------------------------

def _torch_recorder(probes: _Probes, rec: _Recording):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    copy_ops = {aten.copy_.default}
    derive_ops = {aten._to_copy.default, aten.clone.default}

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.derived = {}   # data_ptr -> (out, name, offset, sizes, strides) of a probe view
            self.tainted = {}   # data_ptr -> (out, op, tensor name)

        def probe_of(self, t):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.numel() == 0:
                return None
            return probes.locate(t.data_ptr())

        def related(self, t):
            """The canonical tensor a value comes from, if any (probe view, derived, tainted)."""
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                return None
            p = self.probe_of(t)
            if p is not None:
                return p[0]
            d = self.derived.get(t.data_ptr())
            if d is not None:
                return d[1]
            x = self.tainted.get(t.data_ptr())
            return x[2] if x is not None else None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in copy_ops:
                self.record(args[0], args[1])
                return args[0]
            flat = [a for a in _flatten(args) + _flatten(list(kwargs.values())) if isinstance(a, torch.Tensor)]
            names = [n for n in (self.related(a) for a in flat) if n is not None]
            if names and func is aten._local_scalar_dense.default:
                raise _dcr.UnsupportedLoaderPath(
                    f"dcr loader: the loader reads the values of tensor '{names[0]}' ({func}): "
                    "its placement would depend on them")
            if names and func._schema.is_mutable:
                target = flat[0] if flat else None
                if target is not None and self.probe_of(target) is not None:
                    raise _dcr.UnsupportedLoaderPath(
                        f"dcr loader: the loader modifies its source tensor '{names[0]}' ({func})")
                raise _dcr.UnsupportedLoaderPath(
                    f"dcr loader: tensor '{names[0]}' is written with {func}; dcr records only "
                    "copy_ into a view of the destination")
            out = func(*args, **kwargs)
            if not names:
                return out
            first = flat[0]
            for o in _flatten(out if isinstance(out, (list, tuple)) else [out]):
                if not isinstance(o, torch.Tensor) or o.numel() == 0 or self.probe_of(o) is not None:
                    continue  # a view of a probe: located by address
                src_probe = self.probe_of(first)
                if func in derive_ops and src_probe is not None:
                    name, itemsize, dt, start = src_probe
                    self.derived[o.data_ptr()] = (o, name, (first.data_ptr() - start) // itemsize,
                                                  tuple(first.shape), tuple(first.stride()),
                                                  tuple(o.shape), tuple(o.stride()))
                else:
                    self.tainted[o.data_ptr()] = (o, str(func), names[0])
            return out

        def record(self, dst, src):
            if not isinstance(src, torch.Tensor):
                name = self.related(dst)
                if name is not None:
                    raise _dcr.UnsupportedLoaderPath(f"dcr loader: the loader overwrites its source tensor '{name}'")
                return  # a write of a constant into engine storage: not a canonical value
            if self.probe_of(dst) is not None:
                raise _dcr.UnsupportedLoaderPath(
                    f"dcr loader: the loader writes into its source tensor '{self.probe_of(dst)[0]}'")
            if src.numel() == 0:
                return  # an empty share: places nothing
            if dst.device.type != "cpu":
                name = self.related(src) or "?"
                raise _dcr.UnsupportedLoaderPath(
                    f"dcr loader: a copy of tensor '{name}' writes to {dst.device}; the Python "
                    "package places CPU storage only")
            shape = list(dst.shape)
            p = self.probe_of(src)
            if p is not None:
                name, itemsize, dt, start = p
                if src.dtype != torch_dtype(dt):
                    raise _dcr.UnsupportedLoaderPath(
                        f"dcr loader: a copy of tensor '{name}' reads it reinterpreted as {src.dtype}")
                view = src.expand(shape) if list(src.shape) != shape else src
                rec.copies.append((name, dst.data_ptr(), dtype_name(dst.dtype), tuple(shape),
                                   tuple(dst.stride()), (src.data_ptr() - start) // itemsize,
                                   tuple(view.stride())))
                rec.keep.append(dst)
                return
            d = self.derived.get(src.data_ptr())
            if d is not None:
                out, name, offset, sizes, strides, osizes, ostrides = d
                if src.dtype != dst.dtype and src.dtype != torch_dtype(_dtype_of(probes, name)):
                    raise _dcr.UnsupportedLoaderPath(
                        f"dcr loader: a copy of tensor '{name}' casts twice ({_dtype_of(probes, name)} -> "
                        f"{src.dtype} -> {dst.dtype})")
                if tuple(src.shape) == osizes and tuple(src.stride()) == ostrides and list(osizes) == shape:
                    rec.copies.append((name, dst.data_ptr(), dtype_name(dst.dtype), tuple(shape),
                                       tuple(dst.stride()), offset, strides))
                    rec.keep.append(dst)
                    return
                if (src.is_contiguous() and out.is_contiguous() and src.numel() == out.numel()
                        and dst.is_contiguous() and list(src.shape) == shape):
                    # The same elements in row-major order, seen with another shape.
                    rec.copies.append((name, dst.data_ptr(), dtype_name(dst.dtype), tuple(sizes),
                                       tuple(_contiguous_strides(sizes)), offset, strides))
                    rec.keep.append(dst)
                    return
                raise _dcr.UnsupportedLoaderPath(
                    f"dcr loader: a copy of tensor '{name}' reads part of a temporary copy of it; "
                    "copy from a view of the loaded tensor instead")
            x = self.tainted.get(src.data_ptr())
            if x is not None:
                raise _dcr.UnsupportedLoaderPath(
                    f"dcr loader: a copy of tensor '{x[2]}' writes the result of {x[1]}, a value "
                    "transform dcr cannot compile (only copies of views and dtype casts)")
            # A copy from a tensor that is none of the probes: not a canonical value.

    return Recorder()


def _dtype_of(probes, name):
    for r in probes.ranges:
        if r[2] == name:
            return r[4]
    return None


def _flatten(xs):
    out = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            out.extend(_flatten(x))
        else:
            out.append(x)
    return out


# ---- NumPy -------------------------------------------------------------------------------------

class RecordingSink:
    """The sink a NumPy loader is handed at prewarm: records copies, performs none."""

    def __init__(self, probes: _Probes, rec: _Recording):
        self._probes = probes
        self._rec = rec

    def copy(self, dst, src):
        src_addr = src.__array_interface__["data"][0]
        p = self._probes.locate(src_addr) if src.size else None
        if p is None:
            if src.size == 0:
                return
            raise _dcr.UnsupportedLoaderPath(
                "dcr loader: sink.copy() reads an array that is not a view of a tensor the loader "
                "was given (copy from a temporary)")
        name, itemsize, dt, start = p
        if tuple(dst.shape) != tuple(src.shape):
            raise _dcr.ShapeMismatch(
                f"dcr loader: a copy of tensor '{name}' has dst {tuple(dst.shape)} and src {tuple(src.shape)}")
        if src.dtype != numpy_dtype(dt):
            raise _dcr.UnsupportedLoaderPath(f"dcr loader: a copy of tensor '{name}' reads it as {src.dtype}")
        for s in src.strides:
            if s % itemsize:
                raise _dcr.UnsupportedLoaderPath(f"dcr loader: a copy of tensor '{name}' reads a misaligned view")
        if not dst.flags.writeable:
            raise _dcr.InvalidArgument(f"dcr loader: a copy of tensor '{name}' writes a read-only array")
        self._rec.copies.append((name, dst.__array_interface__["data"][0], dtype_name(dst.dtype),
                                 tuple(dst.shape), tuple(s // dst.itemsize for s in dst.strides),
                                 (src_addr - start) // itemsize, tuple(s // itemsize for s in src.strides)))
        self._rec.keep.append(dst)

    def skip(self, name):
        self._rec.skips.add(name)


class DenseSink:
    """A NumPy engine's own sink for a plain dense load (np.copyto, casting as NumPy does)."""

    def copy(self, dst, src):
        import numpy
        numpy.copyto(dst, src, casting="unsafe")

    def skip(self, name):
        pass


# ---- running the loader ------------------------------------------------------------------------

def record(registry, loader, mode: str, skip, fill: int) -> _Recording:
    framework = "numpy" if mode == "sink" else "torch"
    probes = _Probes(registry, framework, fill)
    rec = _Recording()
    rec.skips.update(skip)
    items = list(probes.tensors.items())
    if mode == "sink":
        loader(iter(items), RecordingSink(probes, rec))
    else:
        import torch
        with torch.no_grad(), _torch_recorder(probes, rec):
            loader(dict(items) if mode == "state_dict" else iter(items))
    for name in rec.skips:
        if name not in probes.tensors:
            raise _dcr.UnknownTensor(f"dcr loader: skipped tensor '{name}' is not in the registry")
    return rec


def prewarm(rx, registry, loader, mode: str, skip=(), post_load=None):
    """Records the loader twice (different probe values), checks the two agree, hands the copies
    to the C++ receiver and compiles them. Returns the recording (it keeps destinations alive).
    post_load (dcr.PostLoad): the engine's post-load units, probed and compiled first
    (dcr/_postload.py)."""
    if mode not in ("state_dict", "weights", "sink"):
        raise _dcr.InvalidArgument(f"Receiver: mode {mode!r} (expected state_dict, weights or sink)")
    if post_load is not None:
        from . import _postload
        first, second = _postload.record_through(post_load, lambda fill: record(registry, loader, mode, skip, fill))
    else:
        first = record(registry, loader, mode, skip, 0)
        second = record(registry, loader, mode, skip, 1)
    if first.key() != second.key():
        a, b = first.key(), second.key()
        names = sorted({c[0] for c in set(a[0]) ^ set(b[0])} | (set(a[1]) ^ set(b[1])))
        raise _dcr.UnsupportedLoaderPath(
            f"dcr loader: the loader's copies of tensor '{names[0] if names else '?'}' differ "
            "between two runs on different values: placement must be deterministic and "
            "independent of the weights' values")
    if post_load is not None:
        first.copies = _postload.finish(post_load, first)
    rx._clear()
    for c in first.copies:
        rx._add_copy(*c)
    for name in sorted(first.skips):
        rx._add_skip(name)
    rx._prewarm()
    return first
