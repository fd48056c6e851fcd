"""vLLM refit figures (docs/benchmarks.md): dcr's in-place refit of a vLLM engine (apply through
the compiled placement + the engine's post-load step re-run for changed units) against vLLM's
own full reload of every weight (model_runner.reload_weights: load_weights +
process_weights_after_loading), in the same run, at 1% and 3% of the elements changed; prewarm
time; extra memory kept for re-run units. Usage: bench.py [--hidden N --layers N --moe]"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

import dcr  # noqa: E402
import dcr.vllm  # noqa: E402


def perturb(tensors, fraction, gen):
    out = {}
    for n, t in tensors.items():
        w = t.clone().view(torch.int16).reshape(-1)
        k = max(1, int(w.numel() * fraction))
        idx = torch.randperm(w.numel(), generator=gen)[:k]
        w[idx] = w[idx] ^ torch.randint(1, 64, (k,), generator=gen, dtype=torch.int16)
        out[n] = w.view(torch.bfloat16).reshape(t.shape)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--moe", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    kw = dict(hidden_size=a.hidden, intermediate_size=4 * a.hidden, num_hidden_layers=a.layers,
              num_attention_heads=a.hidden // 64, num_key_value_heads=max(1, a.hidden // 256), head_dim=64,
              vocab_size=a.vocab)
    cfg = harness.moe_config(**kw, moe_intermediate_size=a.hidden) if a.moe else harness.llama_config(**kw)
    model = harness.make_model(cfg)
    base = dcr.vllm.checkpoint_tensors(model, torch.bfloat16)
    names = list(base)
    work = tempfile.mkdtemp()
    paths = harness.write_checkpoint(model, os.path.join(work, "ck0"), base)
    entries = [(n, "BF16", tuple(t.shape)) for n, t in base.items()]
    reg = dcr.Registry(entries)
    llm = harness.engine(os.path.join(work, "ck0"))
    (pre,) = llm.collective_rpc("dcr_prewarm", args=(entries,))
    llm.collective_rpc("dcr_load", args=(paths,))
    total_bytes = sum(t.numel() * 2 for t in base.values())
    tasks = [dcr.AffineTask(reg, n, dcr.replicated(tuple(base[n].shape)), n) for n in names]
    gen = torch.Generator().manual_seed(3)
    result = {"model": "moe" if a.moe else "dense", "hidden": a.hidden, "layers": a.layers, "vocab": a.vocab,
              "weights_bytes": total_bytes, "prewarm_seconds": pre["prewarm_seconds"],
              "extra_bytes": pre["extra_bytes"],
              "units": {k: sum(1 for u in pre["units"] if u["kind"] == k) for k in ("permutation", "rerun")}}
    version = 0
    cur = base
    for fraction in (0.01, 0.03):
        dcr_t, full_t, apply_t, rerun_t, sizes = [], [], [], [], []
        for _ in range(a.repeat):
            owner = dcr.Owner(reg, 0, tasks, [])
            owner.initialize([cur[n] for n in names])
            nxt = perturb(cur, fraction, gen)
            payloads = owner.build_payloads([nxt[n] for n in names], version, version + 1)
            sizes.append(sum(len(p) for p in payloads))
            (r,) = llm.collective_rpc("dcr_apply", args=(payloads, version, version + 1))
            dcr_t.append(r["total_seconds"])
            apply_t.append(r["apply_seconds"])
            rerun_t.append(r["rerun_seconds"])
            version += 1
            cur = nxt
            p = harness.write_checkpoint(model, os.path.join(work, f"ck{version}"), cur)
            (s,) = llm.collective_rpc("dcr_full_reload", args=(p,))
            full_t.append(s)
        result[f"{int(fraction * 100)}%"] = {
            "dcr_refit_seconds": statistics.median(dcr_t), "dcr_apply_seconds": statistics.median(apply_t),
            "dcr_rerun_seconds": statistics.median(rerun_t), "vllm_full_reload_seconds": statistics.median(full_t),
            "payload_bytes": statistics.median(sizes)}
    # the full reload left the engine at `cur`; dcr's copies hold it too (same bits)
    print(json.dumps(result, indent=1))
    os._exit(0)


if __name__ == "__main__":
    main()
