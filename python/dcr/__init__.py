"""dcr: bit-exact delta-compressed refit of model weights, from Python.

The trainer side (Registry, mapping classes, AffineTask, ResidualTask, Owner, OwnerAgent,
Coordinator) and the engine side (Receiver, ReceiverAgent) over the C++ library; tensors cross
through DLPack without copies (torch, NumPy with ml_dtypes for BF16, anything with __dlpack__).
The engine's own Python loader is recorded once at prewarm (dcr/_intercept.py) and compiled
into placement; after that no Python runs on the apply path. See docs/python.md.
"""

from __future__ import annotations

import math

from . import _dcr
from ._dcr import (  # noqa: F401  (the public names of the extension)
    __version__, Error, InvalidArgument, ShapeMismatch, DtypeMismatch, OutOfRange, CorruptPayload,
    TruncatedPayload, UnsupportedVersion, ReservedBitsSet, StalePayload, DuplicatePayload,
    UnknownTensor, UnsupportedLoaderPath, CommitConflict, TransportFailure, IoError,
    VerificationFailed, FencedAttempt, NotReady, Overflow, DeviceError, RegistryMismatch,
    ControlPlaneUnavailable, DeadlineExceeded,
    box, replicated, row_split, column_split, stacked, assign_owners, residual_owner,
    FileControlPlane, MemoryControlPlane, FilePayloadStore, MemoryPayloadStore, Coordinator,
    dtype_size,
)
EtcdControlPlane = getattr(_dcr, "EtcdControlPlane", None)   # None where built without libcurl
S3PayloadStore = getattr(_dcr, "S3PayloadStore", None)
from ._intercept import DenseSink, dtype_name, numpy_dtype, tensor_arg as _tensor_arg
from .checkpoint import apply, diff, inspect  # noqa: F401
from ._postload import PostLoad, PostLoadUnit  # noqa: F401

__all__ = [
    "__version__", "Error", "Registry", "box", "replicated", "row_split", "column_split", "stacked",
    "AffineTask", "ResidualTask", "Owner", "OwnerAgent", "Coordinator", "Receiver", "ReceiverAgent",
    "FileControlPlane", "MemoryControlPlane", "FilePayloadStore", "MemoryPayloadStore",
    "assign_owners", "residual_owner", "DenseSink", "diff", "apply", "inspect", "dtype_name",
    "PostLoad", "PostLoadUnit", "EtcdControlPlane", "S3PayloadStore",
]


def _args(tensors, names, what):
    tensors = list(tensors)
    return [_tensor_arg(t, f"{what}: shard '{n}'" if n else what)
            for t, n in zip(tensors, list(names) + [None] * (len(tensors) - len(names)))]


class Registry(_dcr.Registry):
    """The canonical tensors of a model: Registry([(name, dtype, shape), ...]), dtypes as names
    ("BF16"), torch dtypes or NumPy dtypes. Registry.from_safetensors(path) reads a file header;
    Registry.from_tensors({name: tensor}) takes names, dtypes and shapes of tensors."""

    def __init__(self, entries):
        super().__init__([(n, dtype_name(d), [int(e) for e in s]) for n, d, s in entries])

    @classmethod
    def from_tensors(cls, tensors, dtype=None):
        items = tensors.items() if hasattr(tensors, "items") else tensors
        return cls([(n, dtype if dtype is not None else t.dtype, tuple(t.shape)) for n, t in items])


def AffineTask(registry, shard, mapping, targets, dtype=None, delta_encodable=True):
    """A source shard mapped element-wise into canonical `targets` (names) through `mapping`."""
    if isinstance(targets, str):
        targets = [targets]
    return _dcr.AffineTask(registry, shard, mapping, list(targets),
                           None if dtype is None else dtype_name(dtype), delta_encodable)


def ResidualTask(registry, name, inputs, outputs, convert):
    """A conversion from source shards to canonical tensors that must be built to be compared.

    inputs: (name, dtype, shape or element count) per source shard. outputs: canonical tensor
    names, or (name, [input indices it depends on]). convert(output, inputs, out) writes output
    `output` (an index into outputs) into `out`, from `inputs` (one array per input, 1-d, of the
    input's dtype where NumPy has it, else its unsigned words); `out` is the canonical tensor,
    shaped, of its dtype. Called only for outputs one of whose inputs changed; the arrays are
    valid during the call only."""
    ins = []
    for n, d, s in inputs:
        count = int(s) if isinstance(s, int) else math.prod(int(e) for e in s)
        ins.append((n, dtype_name(d), count))
    outs = [(o, []) if isinstance(o, str) else (o[0], [int(k) for k in o[1]]) for o in outputs]
    in_types = [_view_dtype(d) for _, d, _ in ins]
    out_meta = []
    for o, _ in outs:
        _, d, shape = registry.tensor(o)
        out_meta.append((_view_dtype(d), tuple(shape)))

    def call(output, arrays, out):
        views = [a.view(t) if t is not None else a for a, t in zip(arrays, in_types)]
        t, shape = out_meta[output]
        convert(output, views, (out.view(t) if t is not None else out).reshape(shape))

    return _dcr._ResidualTask(registry, name, ins, outs, call)


def _view_dtype(name):
    try:
        return numpy_dtype(name)
    except Error:
        return None


class Owner(_dcr.Owner):
    """Compares its shards with their trackers and emits the changes (see dcr::owner).
    Shards: tensors in task order; residual inputs flattened in residual task order."""

    def initialize(self, shards, residual_inputs=()):
        super().initialize(_args(shards, self.shards, "Owner.initialize"),
                           _args(residual_inputs, [], "Owner.initialize (residual input)"))

    def build_payloads(self, shards, base_version, target_version, attempt=0, residual_inputs=(),
                       policy="mixed", mode="changes", bucket_bytes=64 << 20):
        return super().build_payloads(_args(shards, self.shards, "Owner.build_payloads"),
                                      base_version, target_version, attempt,
                                      _args(residual_inputs, [], "Owner.build_payloads (residual input)"),
                                      policy, mode, bucket_bytes)

    def commit(self, shards, residual_inputs=()):
        super().commit(_args(shards, self.shards, "Owner.commit"),
                       _args(residual_inputs, [], "Owner.commit (residual input)"))


class OwnerAgent(_dcr.OwnerAgent):
    """The trainer side of the protocol for one Owner. OwnerAgent(owner, plane, store, ...);
    start(version), then serve(candidate, shards) once per optimizer step."""

    def __init__(self, owner, plane, store, **options):
        super().__init__(owner, plane, store, **options)
        self._owner = owner

    def serve(self, candidate, shards, residual_inputs=(), timeout=600.0):
        return super().serve(candidate, _args(shards, self._owner.shards, "OwnerAgent.serve"),
                             _args(residual_inputs, [], "OwnerAgent.serve (residual input)"), timeout)


class Receiver(_dcr._Receiver):
    """A serving rank whose loader is the engine's own Python load function.

    mode "state_dict": loader(dict of name -> torch tensor), e.g. model.load_state_dict;
    mode "weights": loader(iterator of (name, torch tensor)), e.g. a vLLM model's load_weights;
    mode "sink": loader(iterator of (name, NumPy array), sink), copying with sink.copy(dst, src)
    and declaring sink.skip(name) for tensors the rank does not hold.
    `skip`: canonical tensors the loader deliberately does not load.
    `tied`: pairs of canonical tensors the engine loads into one storage (tied weights, e.g.
    ("model.embed_tokens.weight", "lm_head.weight")); prewarm refuses any other shared storage.

    prewarm() runs the loader (twice, on probes) and compiles its copies; afterwards load(),
    apply_payload() and the ReceiverAgent write the engine's storage from C++ without calling the
    loader. The engine's storage must stay where it was at prewarm (prewarm again if it moves)."""

    def __init__(self, registry, loader, mode="state_dict", skip=(), tied=(), post_load=None):
        super().__init__(registry)
        for first, second in tied:
            self._add_tie(first, second)
        self._registry = registry
        self._loader = loader
        self._mode = mode
        self._skip = tuple(skip)
        self._post = post_load
        self._recording = None
        self._loaded = False
        self.prewarm_seconds = None

    def prewarm(self):
        """post_load (dcr.PostLoad): the engine's post-load step, probed per unit (see
        dcr/_postload.py): permutations are compiled into placement; other rewrites keep a
        loader-layout copy and re-run the step (sync()); what can be neither is refused here."""
        import time
        from . import _intercept
        t0 = time.perf_counter()
        self._recording = None
        self._loaded = False
        self._recording = _intercept.prewarm(self, self._registry, self._loader, self._mode, self._skip,
                                             self._post)
        self.prewarm_seconds = time.perf_counter() - t0
        return self

    def post_load_report(self):
        """Per post-load unit: module, kind (permutation / rerun), why, and the bytes of the
        loader-layout copy kept for it (0 for permutations)."""
        if self._post is None:
            return []
        out = []
        for u in self._post.units:
            kept = sum(t.numel() * t.element_size() for t in u.staging.values()) if u.kind == "rerun" else 0
            out.append({"module": u.name, "kind": u.kind, "reason": u.reason, "extra_bytes": kept})
        return out

    @property
    def post_load_extra_bytes(self):
        """Bytes of the loader-layout copies kept for re-run units (shared tensors once)."""
        return 0 if self._post is None else self._post.extra_bytes()

    def needs_dense_load(self):
        """True while re-run units' loader-layout copies hold no weights yet (after prewarm,
        before load()): the engine's runtime copy is opaque, so transitions are refused."""
        return self._post is not None and bool(self._post.rerun_units()) and not self._loaded

    def sync(self, force=False):
        """Re-runs the engine's post-load step for the re-run units whose loader-layout copy
        changed (after apply_payload/end_transition; the agents and load() call it)."""
        if self._post is None:
            return []
        if self.needs_dense_load():
            raise NotReady("Receiver.sync: the re-run units hold no weights; load() the committed version first")
        return self._post.sync(force)

    def end_transition(self, version):
        super().end_transition(version)
        self.sync()

    def load(self, weights):
        """Dense load (initial load, restore) of canonical tensors through the compiled loader:
        a mapping or iterable of (name, tensor), each tensor contiguous and canonical."""
        if self._recording is None:
            raise NotReady("Receiver.load: call prewarm() first")
        items = weights.items() if hasattr(weights, "items") else weights
        for name, t in items:
            self._load(name, _tensor_arg(t, f"Receiver.load: tensor '{name}'"))
        if self._post is not None:
            self._loaded = True
            self._post.sync()


class ReceiverAgent(_dcr.ReceiverAgent):
    """The engine side of the protocol for one Receiver. ReceiverAgent(name, receiver, plane,
    store, gate_close=callable, gate_open=callable); start(version), then start_thread() to serve
    every transition on its own thread (stop() ends it), or serve_until(version)."""

    def __init__(self, name, receiver, plane, store, **options):
        if getattr(receiver, "_post", None) is not None:
            # The engine's post-load step re-runs before generation resumes.
            user_open = options.get("gate_open")

            def gate_open():
                receiver._post.sync()
                if user_open is not None:
                    user_open()
            options["gate_open"] = gate_open
        super().__init__(name, receiver, plane, store, **options)
        self._receiver = receiver

    def start(self, version=0, restored=True, timeout=60.0):
        if restored and self._receiver.needs_dense_load():
            raise NotReady("ReceiverAgent.start: the receiver's re-run units hold no weights; "
                           "Receiver.load() the committed version first")
        super().start(version, restored, timeout)
