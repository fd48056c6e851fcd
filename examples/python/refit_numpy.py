"""Refit across processes with NumPy: a coordinator, two trainer ranks (TP=2 owners) and two
engine ranks of a vLLM-like engine, talking only through a file control plane and a file payload
store in one directory. Each role is this script with --role; without one it launches them all
and checks every engine's report: after every step its storage equals a dense load of the new
weights through the engine's own loader, bit for bit.

    python examples/python/refit_numpy.py [--steps 4] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import dcr
import toy_model as tm


def plane_and_store(workdir):
    return dcr.FileControlPlane(os.path.join(workdir, "plane")), dcr.FilePayloadStore(os.path.join(workdir, "store"))


def report(workdir, role, rank, line):
    with open(os.path.join(workdir, f"{role}-{rank}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def coordinator(args):
    reg = tm.registry()
    plane, store = plane_and_store(args.workdir)
    c = dcr.Coordinator(plane, store, reg, owners=[0, 1], min_receivers=tm.TP)
    c.initialize(0)
    for step in range(1, args.steps + 1):
        s = c.run_transition(f"step {step}", timeout=120)
        report(args.workdir, "coordinator", 0, {"step": step, "committed": s["committed"],
                                                "attempts": len(s["attempts"])})
        if not s["committed"]:
            return 1
    return 0


def trainer(args):
    """One trainer rank: its Owner, driven by the owner agent once per optimizer step."""
    reg = tm.registry()
    owner, shards, conversions = tm.trainer_rank(reg, args.rank)
    s, inputs = shards(0)
    owner.initialize(s, inputs)
    plane, store = plane_and_store(args.workdir)
    agent = dcr.OwnerAgent(owner, plane, store)
    agent.start(0, timeout=60)
    for step in range(1, args.steps + 1):
        s, inputs = shards(step)  # the optimizer step's published BF16 weights
        r = agent.serve(f"step {step}", s, inputs, timeout=120)
        report(args.workdir, "trainer", args.rank, {"step": step, "payload_bytes": r["payload_bytes"],
                                                    "records": r["records"], "conversions": len(conversions)})
    return 0


def engine(args):
    """One engine rank: its storage, its own loader compiled at prewarm, the receiver agent on
    its own thread with the request gate as callbacks. The check against a dense refit runs in
    the resume callback (gate_open), as an engine's health check before it serves again: the
    agent's thread waits for it, so the storage cannot move on to the next step while it is
    compared (the trainers do not wait for the engines; a check after wait_for() would race the
    next step's apply)."""
    reg = tm.registry()
    e = tm.Engine(args.rank)
    rx = dcr.Receiver(reg, e.load_weights, mode="sink").prewarm()
    rx.load(tm.canonical(0))  # the initial load, through the same loader
    gate = {"close": 0, "open": 0}
    agent = None

    def resume():
        gate["open"] += 1
        step = gate["open"]  # one pause and one resume per committed step
        ref = tm.Engine(args.rank)
        ref.load_weights(tm.canonical(step).items(), dcr.DenseSink())  # the dense refit
        diff = e.first_difference(ref)
        report(args.workdir, "engine", args.rank, {"step": step, "bit_exact": diff is None, "mismatch": diff,
                                                   "gate": dict(gate), "ack": agent.last_ack["state"]})

    plane, store = plane_and_store(args.workdir)
    agent = dcr.ReceiverAgent(f"engine{args.rank}", rx, plane, store,
                              gate_close=lambda: gate.__setitem__("close", gate["close"] + 1),
                              gate_open=resume)
    agent.start(0, restored=True)
    agent.start_thread()
    agent.wait_for(args.steps, timeout=120 * args.steps)
    agent.stop()
    return 0


def launch(args):
    workdir = args.workdir or tempfile.mkdtemp(prefix="dcr-numpy-")
    me = os.path.abspath(__file__)
    procs = [subprocess.Popen([sys.executable, me, "--role", role, "--rank", str(rank), "--steps",
                               str(args.steps), "--workdir", workdir])
             for role, rank in [("coordinator", 0), ("trainer", 0), ("trainer", 1), ("engine", 0), ("engine", 1)]]
    codes = [p.wait(timeout=600) for p in procs]
    lines = []
    for rank in range(tm.TP):
        with open(os.path.join(workdir, f"engine-{rank}.jsonl")) as f:
            lines += [json.loads(l) for l in f]
    ok = all(c == 0 for c in codes) and len(lines) == tm.TP * args.steps and all(l["bit_exact"] for l in lines)
    for l in lines:
        print(json.dumps(l))
    print("refit_numpy:", "bit-exact after every step" if ok else f"FAILED (exit codes {codes})")
    return 0 if ok else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--role", choices=["coordinator", "trainer", "engine"])
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--workdir")
    a = p.parse_args()
    sys.exit({"coordinator": coordinator, "trainer": trainer, "engine": engine, None: launch}[a.role](a))
