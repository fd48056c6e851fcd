"""A small Llama-shaped model for the NumPy examples: its canonical checkpoint, a TP=2 trainer's
shards, and a hand-written vLLM-like engine rank (fused qkv, fused gate_up, padded vocabulary,
fp32 copies of the norms) whose loader places weights through a sink.

Every process recomputes the weights of step s from the seed alone (as a trainer and a dense
reference would reload a checkpoint), so the roles agree without talking to each other.
"""

from __future__ import annotations

import numpy as np
import ml_dtypes

import dcr

BF16 = ml_dtypes.bfloat16
V, H, KV, I, LAYERS, TP = 100, 32, 16, 64, 2, 2
V_PADDED = 128  # the engine pads the vocabulary to a multiple of 64 per rank
RATE = 0.01     # share of elements an optimizer step changes


def canonical_shapes():
    s = {"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H), "model.norm.weight": (H,)}
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        s.update({p + "self_attn.q_proj.weight": (H, H), p + "self_attn.k_proj.weight": (KV, H),
                  p + "self_attn.v_proj.weight": (KV, H), p + "self_attn.o_proj.weight": (H, H),
                  p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                  p + "mlp.down_proj.weight": (H, I), p + "input_layernorm.weight": (H,),
                  p + "post_attention_layernorm.weight": (H,)})
    return s


def registry():
    return dcr.Registry([(n, "BF16", s) for n, s in sorted(canonical_shapes().items())])


def masters(step: int):
    """The trainer's fp32 master weights after `step` optimizer steps (step 0: initial)."""
    rng = np.random.default_rng(1234)
    w = {n: rng.standard_normal(s).astype(np.float32) for n, s in sorted(canonical_shapes().items())}
    for k in range(1, step + 1):
        r = np.random.default_rng(1000 + k)
        for n in sorted(w):
            if n == "model.norm.weight" and k % 2:
                continue  # the final norm changes on even steps only (its conversion is skipped)
            flat = w[n].reshape(-1)
            idx = r.choice(flat.size, max(1, int(flat.size * RATE)), replace=False)
            flat[idx] *= np.float32(1) + np.float32(0.05) * r.standard_normal(idx.size).astype(np.float32)
    return w


def canonical(step: int):
    """The published checkpoint of `step`: BF16 casts of the masters."""
    return {n: m.astype(BF16) for n, m in masters(step).items()}


# ---- trainer: TP=2 shards ------------------------------------------------------------------------

COLUMN = ("o_proj", "down_proj")
REPLICATED = ("layernorm",)


def _kind(name):
    if any(k in name for k in COLUMN):
        return "column"
    if any(k in name for k in REPLICATED):
        return "replicated"
    if name == "model.norm.weight":
        return "residual"
    return "row"


def _split(n, world, rank):
    base, extra = divmod(n, world)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


def trainer_rank(reg, rank: int):
    """The Owner of TP rank `rank`: its affine tasks, the residual task it owns (the final
    norm, an fp32 master cast to BF16 by a Python conversion), and a function giving its shards
    and residual inputs of a step."""
    shapes = canonical_shapes()
    replicated = [n for n in sorted(shapes) if _kind(n) == "replicated"]
    owners = dcr.assign_owners([(n, 2 * shapes[n][0], [0, 1]) for n in replicated])
    mine_replicated = {n for n, o in zip(replicated, owners) if o == rank}
    tasks, names = [], []
    for n in sorted(shapes):
        k = _kind(n)
        if k == "row":
            tasks.append(dcr.AffineTask(reg, f"{n}@tp{rank}", dcr.row_split(shapes[n], TP, rank), n))
        elif k == "column":
            tasks.append(dcr.AffineTask(reg, f"{n}@tp{rank}", dcr.column_split(shapes[n], TP, rank), n))
        elif k == "replicated" and n in mine_replicated:
            tasks.append(dcr.AffineTask(reg, n, dcr.replicated(shapes[n]), n))
        else:
            continue
        names.append((n, k))
    residual = []
    conversions = []
    if dcr.residual_owner("final_norm", [0, 1]) == rank:
        def convert(output, inputs, out):
            conversions.append(output)
            out[...] = inputs[0].astype(BF16)
        residual.append(dcr.ResidualTask(reg, "final_norm", [("norm_master", "F32", (H,))],
                                         ["model.norm.weight"], convert))

    def shards(step):
        m = masters(step)
        out = []
        for n, k in names:
            w = m[n].astype(BF16)
            if k == "row":
                b, e = _split(w.shape[0], TP, rank)
                out.append(np.ascontiguousarray(w[b:e]))
            elif k == "column":
                b, e = _split(w.shape[-1], TP, rank)
                out.append(np.ascontiguousarray(w[:, b:e]))
            else:
                out.append(w)
        inputs = [m["model.norm.weight"]] if residual else []
        return out, inputs

    owner = dcr.Owner(reg, rank, tasks, residual)
    return owner, shards, conversions


# ---- engine: one vLLM-like TP rank ---------------------------------------------------------------

class Engine:
    """Storage of one engine rank, laid out as a vLLM-like engine keeps it."""

    def __init__(self, rank: int):
        self.rank = rank
        q, kv, i = H // TP, KV // TP, I // TP
        self.params = {"embed": np.zeros((V_PADDED // TP, H), BF16),
                       "lm_head": np.zeros((V_PADDED // TP, H), BF16),
                       "norm": np.zeros((H,), np.float32)}
        for l in range(LAYERS):
            self.params.update({f"{l}.qkv": np.zeros((q + 2 * kv, H), BF16),
                                f"{l}.o": np.zeros((H, q), BF16),
                                f"{l}.gate_up": np.zeros((2 * i, H), BF16),
                                f"{l}.down": np.zeros((H, i), BF16),
                                f"{l}.ln1": np.zeros((H,), np.float32),
                                f"{l}.ln2": np.zeros((H,), np.float32)})

    def load_weights(self, weights, sink):
        """The engine's own loader: (name, canonical array) pairs, every final copy through the
        sink (a dense load passes dcr.DenseSink())."""
        r = self.rank
        q, kv, i = H // TP, KV // TP, I // TP
        for name, w in weights:
            if name in ("model.embed_tokens.weight", "lm_head.weight"):
                dst = self.params["embed" if "embed" in name else "lm_head"]
                b = r * (V_PADDED // TP)
                e = min(V, b + V_PADDED // TP)
                if e <= b:
                    sink.skip(name)
                else:
                    sink.copy(dst[: e - b], w[b:e])
                continue
            if name == "model.norm.weight":
                sink.copy(self.params["norm"], w)  # cast BF16 -> F32
                continue
            l = name.split(".")[2]
            if name.endswith("q_proj.weight"):
                sink.copy(self.params[f"{l}.qkv"][:q], w[r * q:(r + 1) * q])
            elif name.endswith("k_proj.weight"):
                sink.copy(self.params[f"{l}.qkv"][q:q + kv], w[r * kv:(r + 1) * kv])
            elif name.endswith("v_proj.weight"):
                sink.copy(self.params[f"{l}.qkv"][q + kv:], w[r * kv:(r + 1) * kv])
            elif name.endswith("o_proj.weight"):
                sink.copy(self.params[f"{l}.o"], w[:, r * q:(r + 1) * q])
            elif name.endswith("gate_proj.weight"):
                sink.copy(self.params[f"{l}.gate_up"][:i], w[r * i:(r + 1) * i])
            elif name.endswith("up_proj.weight"):
                sink.copy(self.params[f"{l}.gate_up"][i:], w[r * i:(r + 1) * i])
            elif name.endswith("down_proj.weight"):
                sink.copy(self.params[f"{l}.down"], w[:, r * i:(r + 1) * i])
            elif name.endswith("input_layernorm.weight"):
                sink.copy(self.params[f"{l}.ln1"], w)
            elif name.endswith("post_attention_layernorm.weight"):
                sink.copy(self.params[f"{l}.ln2"], w)
            else:
                raise KeyError(name)

    def first_difference(self, other: "Engine"):
        """The first parameter whose stored bytes differ from `other`'s (None: identical)."""
        for k in sorted(self.params):
            if self.params[k].tobytes() != other.params[k].tobytes():
                return k
        return None
