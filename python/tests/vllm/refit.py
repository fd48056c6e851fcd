"""The refit loop of the vllm suite: a transformers model trained with torch AdamW, published each
step in the checkpoint's names through an OwnerAgent, a vLLM engine refit through
dcr.vllm.WorkerExtension (its own loader and post-load step), a coordinator, over the file plane
and store; then a FRESH engine from the final checkpoint as the reference."""
import json
import os
import subprocess
import sys
import threading

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

import dcr  # noqa: E402
import dcr.vllm  # noqa: E402


def train_step(model, opt, gen, vocab):
    ids = torch.randint(3, vocab, (2, 12), generator=gen)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(out.loss)


def fresh(directory, tp):
    env = dict(os.environ)
    p = subprocess.run([sys.executable, os.path.join(HERE, "fresh_engine.py"), directory, str(tp)],
                       capture_output=True, text=True, timeout=900, env=env)
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line is not None, f"fresh engine failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    return json.loads(line[len("RESULT "):])


def run(config, workdir, tp=1, steps=3, lr=2e-3):
    """Returns a dict with everything the tests check."""
    model = harness.make_model(config)
    published = dcr.vllm.checkpoint_tensors(model, torch.bfloat16)
    names = list(published)
    paths0 = harness.write_checkpoint(model, os.path.join(workdir, "ck0"), published)
    entries = [(n, "BF16", tuple(t.shape)) for n, t in published.items()]
    reg = dcr.Registry(entries)

    llm = harness.engine(os.path.join(workdir, "ck0"), tp)
    tokens0 = harness.greedy(llm)
    pre = llm.collective_rpc("dcr_prewarm", args=(entries,))
    llm.collective_rpc("dcr_load", args=(paths0,))
    fp0 = llm.collective_rpc("dcr_fingerprint")
    tokens_loaded = harness.greedy(llm)

    plane_dir, store_dir = os.path.join(workdir, "plane"), os.path.join(workdir, "store")
    plane, store = dcr.FileControlPlane(plane_dir), dcr.FilePayloadStore(store_dir)
    coordinator = dcr.Coordinator(plane, store, reg, owners=[0])
    coordinator.initialize(0)
    tasks = [dcr.AffineTask(reg, n, dcr.replicated(tuple(published[n].shape)), n) for n in names]
    owner = dcr.Owner(reg, 0, tasks, [])
    owner.set_overwrite_only(sorted({n for r in pre for n in r["overwrite_only"]}))
    owner.initialize([published[n] for n in names])
    agent = dcr.OwnerAgent(owner, plane, store)
    agent.start(version=0)
    llm.collective_rpc("dcr_start", args=(plane_dir, store_dir, "rollout", 0))

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(1)
    history = []
    for step in range(1, steps + 1):
        loss = train_step(model, opt, gen, config.vocab_size)
        published = dcr.vllm.checkpoint_tensors(model, torch.bfloat16)
        shards = [published[n] for n in names]
        result = {}
        t_c = threading.Thread(target=lambda: result.__setitem__("c", coordinator.run_transition(f"step {step}")))
        t_o = threading.Thread(target=lambda: result.__setitem__("o", agent.serve(f"step {step}", shards)))
        t_c.start()
        t_o.start()
        served = llm.collective_rpc("dcr_serve", args=(step,))
        t_c.join()
        t_o.join()
        assert result["c"]["committed"], result["c"]
        history.append({"step": step, "loss": loss, "served": served})
    final_dir = os.path.join(workdir, f"ck{steps}")
    harness.write_checkpoint(model, final_dir, published)
    fp = llm.collective_rpc("dcr_fingerprint")
    tokens = harness.greedy(llm)
    llm.collective_rpc("dcr_stop")
    ref = fresh(final_dir, tp)
    return {"prewarm": pre, "fp0": fp0, "fp": fp, "tokens0": tokens0, "tokens_loaded": tokens_loaded,
            "tokens": tokens, "ref": ref, "history": history, "llm": llm}
