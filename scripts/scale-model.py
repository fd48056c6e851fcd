#!/usr/bin/env python3
"""The refit latency model of docs/scaling.md, from the bandwidth-shaped benchmark's reports
(scripts/bench-transports.py --out), checked against measured runs and projected to the
paper's testbed.

Model, per transport case and change rate r, for a checkpoint of M bytes on flows of L bytes/s:
  latency     = t_fixed + T_transport
  T_transport = k * p(r) * M / L   p: payload bytes / checkpoint bytes (measured per rate)
                                   k: the busiest cross-cluster flow's bytes per payload byte
                                      (measured here; from the topology at another scale, see
                                      topology_factor)
  t_fixed     = what the transport lower bound does not cover (protocol round trips, the first
                chunk's construction, the last payload's apply): the median over the fitted runs
                of measured latency - measured transport lower bound, per case.
Pipelining hides construction and apply behind the transport as long as they keep up; the
projection prints the per-owner construction and per-receiver apply throughput that needs.

  scripts/scale-model.py fit.json [check.json ...] [--picture docs/images/scaling.png]
"""
import argparse
import json
import sys

PAPER = {  # the paper's testbed and figures (sections 8.5, 8.6; Table 4)
    "trainer_nodes": 8, "rollout_nodes": 8, "owners": 32, "receivers": 64,
    "link_rate": 5e9 / 8,
    "models": {"120B": 247.2e9, "1T": 2242e9},
    "figures": {("120B", 0.03, "relay"): 22.6, ("120B", 0.03, "s3"): 24.5,
                ("120B", 0.05, "relay"): 41.6, ("120B", 0.05, "s3"): 49.7,
                ("1T", 0.03, "relay"): 150.0},
    "reference": {"120B": 750.0, "1T": 87.5 * 60},
}


def topology_factor(case, trainer_nodes, rollout_nodes, receivers_per_node=1):
    """Busiest cross-cluster flow's bytes per payload byte for a case's topology."""
    if case in ("file", "s3"):  # every receiver downloads every payload through its node's flow
        return receivers_per_node
    if case == "s3-fanout":  # each rollout node downloads a 1/N share
        return max(1.0 / rollout_nodes, 1.0 / trainer_nodes)
    if case == "relay1":  # everything through the one root's flow
        return 1.0
    if case.startswith("relay"):  # striped over R roots (one flow each)
        roots = int(case[5:])
        return max(1.0 / roots, 1.0 / trainer_nodes)
    raise ValueError(case)


def parameters(row):
    rep = row["report"]
    steps = rep["steps"][1:] or rep["steps"]
    s = steps[len(steps) // 2]
    ckpt = rep["checkpoint_bytes"]
    owners = sum(1 for p in rep["processes"] if p["role"] == "owner" and not p["restarted"])
    busiest = max(s["flows"].values())
    sec = s["seconds"]
    return {
        "case": row["case"], "rate": row["rate"], "checkpoint": ckpt, "owners": owners,
        "link_rate": rep["link_rate"], "p": s["payload_bytes"] / ckpt,
        "k": busiest / s["payload_bytes"], "c": (ckpt / owners) / max(sec["build"], 1e-9),
        "a": s["payload_bytes"] / max(sec["apply"], 1e-9), "latency": sec["refit"],
        "trainer_nodes": rep["trainer_nodes"], "rollout_nodes": rep["rollout_nodes"],
    }


def transport_seconds(prm, M, L, k=None):
    return (prm["k"] if k is None else k) * prm["p"] * M / L


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fit")
    ap.add_argument("check", nargs="*")
    ap.add_argument("--picture", default="")
    a = ap.parse_args()
    fit = json.load(open(a.fit))
    model, residuals = {}, {}
    for row in fit["results"]:
        prm = parameters(row)
        prm["transport"] = transport_seconds(prm, prm["checkpoint"], prm["link_rate"])
        model[(prm["case"], prm["rate"])] = prm
        residuals.setdefault(prm["case"], []).append(prm["latency"] - prm["transport"])
    fixed = {case: sorted(v)[len(v) // 2] for case, v in residuals.items()}
    for prm in model.values():
        prm["t_fixed"] = fixed[prm["case"]]
    print("## Fitted (measured) parameters\n")
    print("| case | rate | p (payload / checkpoint) | k (busiest flow / payload) | transport lower bound (s) | measured (s) | t_fixed (s, per case) | model (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (case, rate), prm in sorted(model.items()):
        print(f"| {case} | {100 * rate:.0f}% | {100 * prm['p']:.2f}% | {prm['k']:.2f} | {prm['transport']:.3f} | "
              f"{prm['latency']:.3f} | {prm['t_fixed']:.3f} | {prm['t_fixed'] + prm['transport']:.3f} |")
    if a.check:
        print("\n## Check against other measured runs (other size and link rate)\n")
        print("| run | case | rate | checkpoint (MB) | link (MB/s) | predicted (s) | measured (s) | error |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for path in a.check:
            for row in json.load(open(path))["results"]:
                prm = model.get((row["case"], row["rate"]))
                if prm is None:
                    continue
                got = parameters(row)
                lat = prm["t_fixed"] + transport_seconds(prm, got["checkpoint"], got["link_rate"])
                print(f"| {path.split('/')[-1]} | {row['case']} | {100 * row['rate']:.0f}% | {got['checkpoint'] / 1e6:.0f} | "
                      f"{got['link_rate'] / 1e6:.0f} | {lat:.3f} | {got['latency']:.3f} | {100 * (lat / got['latency'] - 1):+.0f}% |")
    print("\n## Projection to the paper's testbed (8 trainer + 8 rollout nodes, one 5 Gbps flow each)\n")
    print("| model | rate | case | k | payload (GB) | transport lower bound (s) | latency (s) | reference (s, paper) | speedup | paper (s) | construction needed (GB/s per owner, 32) | apply needed (GB/s per receiver) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    points = []
    for (case, rate), prm in sorted(model.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        k = topology_factor(case, PAPER["trainer_nodes"], PAPER["rollout_nodes"], receivers_per_node=1)
        for name, M in PAPER["models"].items():
            transport = transport_seconds(prm, M, PAPER["link_rate"], k=k)
            latency = prm["t_fixed"] + transport
            paper_case = "relay" if case.startswith("relay") else "s3"
            paper = PAPER["figures"].get((name, rate, paper_case))
            ref = PAPER["reference"][name]
            points.append({"model": name, "M": M, "case": case, "rate": rate, "latency": latency, "paper": paper})
            print(f"| {name} | {100 * rate:.0f}% | {case} | {k:.3f} | {prm['p'] * M / 1e9:.2f} | {transport:.1f} | "
                  f"{latency:.1f} | {ref:.0f} | {ref / latency:.0f}x | {paper if paper else ''} | "
                  f"{M / PAPER['owners'] / transport / 1e9:.1f} | {prm['p'] * M / transport / 1e9:.2f} |")
    if a.picture:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.2))
        sizes = [m for m in (30e9, 63.2e9, 120e9, 247.2e9, 500e9, 1000e9, 2242e9)]
        for (case, rate), prm in sorted(model.items()):
            if rate != 0.03:
                continue
            k = topology_factor(case, PAPER["trainer_nodes"], PAPER["rollout_nodes"])
            ys = [prm["t_fixed"] + transport_seconds(prm, M, PAPER["link_rate"], k=k) for M in sizes]
            ax.plot([m / 1e9 for m in sizes], ys, marker=".", label=f"dcr {case} (model, 3%)")
        # The reference at line rate: 8 trainer nodes upload M/8 each, then each rollout node
        # downloads M through its flow.
        ax.plot([m / 1e9 for m in sizes], [m / PAPER["link_rate"] * (1 + 1 / 8) for m in sizes], "k--",
                label="full checkpoint at line rate (model)")
        for name, v in PAPER["reference"].items():
            ax.plot(PAPER["models"][name] / 1e9, v, "ks", markersize=6,
                    label="paper: full checkpoint" if name == "120B" else None)
        for (name, rate, case), v in PAPER["figures"].items():
            if rate == 0.03:
                ax.plot(PAPER["models"][name] / 1e9, v, "x", markersize=9, color="red" if case == "relay" else "purple",
                        label=f"paper {case} 3%" if name == "120B" else None)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("checkpoint (GB, BF16)")
        ax.set_ylabel("refit latency (s)")
        ax.set_title("Refit latency against model size, 8+8 nodes, 5 Gbps flows")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.picture, dpi=130)
        print(f"\n(picture: {a.picture})", file=sys.stderr)


if __name__ == "__main__":
    main()
