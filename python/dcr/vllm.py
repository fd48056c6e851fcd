"""dcr.vllm: refit a vLLM engine in place through its own loader (docs/python.md, "vLLM").

Engine side: `WorkerExtension`, passed as `LLM(..., worker_extension_cls="dcr.vllm.WorkerExtension")`,
gives every worker a receiver over its rank's own sharded loader (`model.load_weights`) with the
engine's post-load step declared (`post_load_of`): prewarm, load, start, serve and stop are
worker methods called by name through `llm.collective_rpc("dcr_...", args=...)`. A serve call
runs inside the engine's RPC between scheduler steps, so no forward pass reads the weights
while they are written: that is the request gate (vLLM pauses generation for the call and
resumes it when the call returns).

Trainer side: `checkpoint_tensors(model)` gives a transformers or torch model's weights in the
checkpoint's names (transformers 5's fused expert tensors split back into per-expert tensors).
"""

from __future__ import annotations

import re

import dcr


# ---- engine side -----------------------------------------------------------------------------------

def post_load_of(model, model_config=None, rerun=True):
    """The vLLM post-load step of `model` as dcr.PostLoad units: one per module with a quant
    method (vLLM's `process_weights_after_loading` loop in model_loader/utils.py), its loader
    layout taken from vLLM's own reload metadata (recorded at model construction). Attention
    layers' deferred step is not run by dcr: a loader copy into them is refused. A model-level
    `process_weights_after_loading` hook is refused (dcr cannot scope it to changed tensors)."""
    from vllm.model_executor.layers.attention import is_deferred_attention_layer
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    from vllm.model_executor.model_loader.reload.meta import to_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    units, forbidden, refuse = [], [], []
    if hasattr(model, "process_weights_after_loading"):
        refuse.append((f"{type(model).__name__}.process_weights_after_loading",
                       "a model-level post-load hook dcr cannot re-run per tensor"))
    for name, module in model.named_modules():
        if is_deferred_attention_layer(module):
            forbidden.append((name, module, "the attention layer rewrites after loading (dcr does not run its step)"))
            continue
        qm = getattr(module, "quant_method", None)
        if not isinstance(qm, QuantizeMethodBase):
            continue
        info = LAYERWISE_INFO.get(module)
        if info is None:
            refuse.append((name, "vLLM kept no loader-layout metadata for it"))
            continue
        params, buffers = info.restore_metadata
        # vLLM's metadata holds weight loaders with the layer reference removed; put it back
        # (on copies, as vLLM's restore_layer_on_meta does on the layer).
        layout = {k: restore_layer_refs(to_meta_tensor(t), module) for k, t in {**params, **buffers}.items()}
        if not layout:
            continue

        moe = hasattr(qm, "moe_kernel")

        def step(m, qm=qm, moe=moe):
            # As at the first load: vLLM's MoE method takes a set-up kernel to mean "weight
            # update" and then skips the CPU prepack, so the probe and every re-run start
            # without one (a new kernel is built, as the engine built it).
            if hasattr(m, "_already_called_process_weights_after_loading"):
                delattr(m, "_already_called_process_weights_after_loading")
            if moe:
                qm.moe_kernel = None
            qm.process_weights_after_loading(m)
            if hasattr(m, "update_param_tp_status"):
                m.update_param_tp_status()

        # The MoE kernel and its quant config read the layer's w13/w2 parameters at every call
        # (vLLM's weight updates rely on it: they copy into the parameters and keep the kernel),
        # so they are declared transparent: the runtime parameters are all there is to see.
        units.append(dcr.PostLoadUnit(name, module, layout, step, rerun=rerun,
                                      what=f"{type(qm).__name__}.process_weights_after_loading",
                                      transparent=("moe_kernel", "moe_quant_config") if moe else ()))
    return dcr.PostLoad(model, units, refuse=refuse, forbidden=forbidden)


def _digest(t):
    import hashlib
    import torch
    t = t.detach().contiguous()
    if t.numel() == 0:
        return "empty"
    w = t.view(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return hashlib.blake2b(w.numpy().tobytes(), digest_size=16).hexdigest()


def runtime_fingerprint(model):
    """What the engine computes with, bit for bit: a digest of every parameter and buffer it
    holds (runtime format), and, for every linear/embedding method whose weights vLLM keeps in
    storage no tensor shows (CPU oneDNN/SGL prepacking), a digest of its output on fixed
    inputs."""
    import torch
    out = {}
    for n, p in model.named_parameters():
        out["param:" + n] = [str(p.dtype), list(p.shape), _digest(p)]
    for n, b in model.named_buffers():
        out["buffer:" + n] = [str(b.dtype), list(b.shape), _digest(b)]
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for n, m in model.named_modules():
            if callable(getattr(m, "cpu_linear", None)):
                k = getattr(m, "input_size_per_partition", None) or getattr(m, "embedding_dim", None)
                if k is None:
                    continue
                dtype = next((p.dtype for p in m.parameters() if p.is_floating_point()), torch.bfloat16)
                if dtype not in (torch.bfloat16, torch.float16, torch.float32):
                    dtype = torch.bfloat16
                x = torch.randn(3, int(k), generator=g).to(dtype)
                w = getattr(m, "weight", None)
                out["kernel:" + n] = _digest(m.cpu_linear(x, w, getattr(m, "bias", None)))
    return out


class WorkerExtension:
    """vLLM worker extension: `worker_extension_cls="dcr.vllm.WorkerExtension"`. Methods are
    called through `llm.collective_rpc(name, args=...)` and run on every worker (TP rank)."""

    def _model(self):
        return self.model_runner.model

    def dcr_prewarm(self, entries, rerun=True, skip=(), tied=()):
        """Builds this rank's receiver over vLLM's own `load_weights` and the engine's post-load
        step, and prewarms it. entries: [(name, dtype, shape)] of the checkpoint. Returns the
        prewarm seconds, the post-load units and the bytes kept for re-run units."""
        model = self._model()
        cfg = getattr(self.model_runner, "model_config", None)
        registry = dcr.Registry([(n, d, tuple(s)) for n, d, s in entries])
        post = post_load_of(model, cfg, rerun=rerun)
        rx = dcr.Receiver(registry, model.load_weights, mode="weights",
                          skip=skip, tied=tied, post_load=post)
        rx.prewarm()
        self._dcr_registry, self._dcr_rx = registry, rx
        return {"rank": self._dcr_rank(), "prewarm_seconds": rx.prewarm_seconds,
                "units": rx.post_load_report(), "extra_bytes": rx.post_load_extra_bytes,
                "overwrite_only": rx.overwrite_only_tensors(), "entries": [list(e) for e in entries]}

    def _dcr_rank(self):
        return int(getattr(self, "rank", 0) or 0)

    def dcr_load(self, paths):
        """Dense load of the checkpoint files (safetensors) through the compiled loader: the
        committed version the receiver starts from (re-run units need it: the engine's own copy
        of their weights is opaque)."""
        from safetensors.torch import load_file
        tensors = {}
        for p in paths:
            tensors.update(load_file(p))
        self._dcr_rx.load({n: tensors[n] for n, _, _ in self._dcr_registry.entries()})
        return True

    def dcr_start(self, plane, store, name, version=0):
        """The ReceiverAgent of this rank (`name-rankN`). plane, store: see open_plane and
        open_store (a directory, or {"etcd": endpoint, "prefix": ...} / {"s3": url, "endpoint": ...})."""
        plane, store = open_plane(plane), open_store(store)
        self._dcr_agent = dcr.ReceiverAgent(f"{name}-rank{self._dcr_rank()}", self._dcr_rx, plane, store)
        self._dcr_keep = (plane, store)
        self._dcr_agent.start(version=version, restored=True)
        return True

    def dcr_serve(self, version, timeout=600.0):
        """Serves transitions until `version` is committed and held (inside the engine's RPC:
        generation is paused for the call). Re-runs the post-load step of changed units."""
        v = self._dcr_agent.serve_until(version, timeout)
        self._dcr_rx.sync()
        return {"version": v, "stats": self._dcr_rx.stats}

    def dcr_start_thread(self):
        self._dcr_agent.start_thread()
        return True

    def dcr_stop(self):
        agent = getattr(self, "_dcr_agent", None)
        if agent is not None:
            agent.stop()
        return True

    def dcr_apply(self, payloads, base_version, target_version):
        """Applies payload bytes directly (no protocol) and re-runs the post-load step of the
        changed units; returns the seconds of each part (the benchmark's refit latency)."""
        import time
        t0 = time.perf_counter()
        self._dcr_rx.begin_attempt(base_version, target_version)
        for p in payloads:
            self._dcr_rx.apply_payload(p)
        t1 = time.perf_counter()
        dcr.Receiver.__mro__[1].end_transition(self._dcr_rx, target_version)
        rerun = self._dcr_rx.sync()
        t2 = time.perf_counter()
        return {"apply_seconds": t1 - t0, "rerun_seconds": t2 - t1, "total_seconds": t2 - t0,
                "units_rerun": len(rerun)}

    def dcr_fingerprint(self):
        return runtime_fingerprint(self._model())

    def dcr_full_reload(self, paths):
        """vLLM's own full reload of every weight (load_weights + process_weights_after_loading,
        through its layerwise reload), for the benchmark baseline. Returns seconds."""
        import time
        from safetensors.torch import load_file
        tensors = {}
        for p in paths:
            tensors.update(load_file(p))
        t0 = time.perf_counter()
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()))
        return time.perf_counter() - t0


def open_plane(spec):
    """A control plane from a picklable spec: a directory (dcr.FileControlPlane) or
    {"etcd": "http://127.0.0.1:2379", "prefix": "/dcr"} (dcr.EtcdControlPlane)."""
    if isinstance(spec, dict) and "etcd" in spec:
        if dcr.EtcdControlPlane is None:
            raise dcr.InvalidArgument("dcr was built without libcurl: no etcd control plane")
        return dcr.EtcdControlPlane(spec["etcd"], spec.get("prefix", "/dcr"))
    return dcr.FileControlPlane(spec["dir"] if isinstance(spec, dict) else spec)


def open_store(spec):
    """A payload store from a picklable spec: a directory (dcr.FilePayloadStore) or
    {"s3": "s3://BUCKET/PREFIX/", "endpoint": "http://127.0.0.1:8333"} (dcr.S3PayloadStore;
    credentials from the environment)."""
    if isinstance(spec, dict) and "s3" in spec:
        if dcr.S3PayloadStore is None:
            raise dcr.InvalidArgument("dcr was built without libcurl/libcrypto: no S3 payload store")
        return dcr.S3PayloadStore(spec["s3"], spec.get("endpoint", ""))
    return dcr.FilePayloadStore(spec["dir"] if isinstance(spec, dict) else spec)


# ---- trainer side ----------------------------------------------------------------------------------

_FUSED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<which>gate_up_proj|down_proj)$")


def checkpoint_tensors(model, dtype=None):
    """{checkpoint name: tensor} of a transformers (or torch) model, contiguous, cast to `dtype`
    if given. transformers 5 keeps MoE experts fused (experts.gate_up_proj [E, 2I, H],
    experts.down_proj [E, H, I]); they are split back into the checkpoint's per-expert tensors
    (experts.{e}.gate_proj/up_proj/down_proj.weight). Tied weights appear once (the names
    state_dict() keeps after save_pretrained's dedup: lm_head.weight is dropped when tied)."""
    import torch
    sd = model.state_dict()
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    out = {}
    for name, t in sd.items():
        if tied and name == "lm_head.weight":
            continue
        m = _FUSED.match(name)
        if m is not None and t.dim() == 3:
            prefix = m.group("prefix")
            for e in range(t.shape[0]):
                if m.group("which") == "gate_up_proj":
                    inter = t.shape[1] // 2
                    out[f"{prefix}.{e}.gate_proj.weight"] = t[e, :inter]
                    out[f"{prefix}.{e}.up_proj.weight"] = t[e, inter:]
                else:
                    out[f"{prefix}.{e}.down_proj.weight"] = t[e]
            continue
        out[name] = t
    return {n: (t.detach().to(dtype) if dtype is not None else t.detach()).contiguous() for n, t in out.items()}
