#!/usr/bin/env python3
"""protocol-timeline.py REPORT.json [REPORT2.json ...] -o OUT.png: draws the stage timeline of
one step of `dcr simulate --json` runs (owner build and compress+put spans, receiver apply
spans, prepare-to-commit window), one panel per report, and prints the overlap figures:
the step latency (prepare to commit) against its busiest stage (the largest per-process busy
time of owner construction or receiver apply)."""
import argparse, json, sys

def busiest(step):
    best = ("", 0.0)
    for o in step.get("owner_timelines", []):
        b = sum(s["end"] - s["begin"] for s in o["timeline"] if s["stage"] == "build")
        c = sum(s["end"] - s["begin"] for s in o["timeline"] if s["stage"] == "compress+put")
        for name, v in ((f"owner {o['owner']} build", b), (f"owner {o['owner']} compress+put", c)):
            if v > best[1]: best = (name, v)
    for r in step.get("receiver_timelines", []):
        a = sum(s["end"] - s["begin"] for s in r["timeline"] if s["stage"] == "apply")
        if a > best[1]: best = (f"{r['receiver']} apply", a)
    return best

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("reports", nargs="+")
    ap.add_argument("-o", "--out")
    ap.add_argument("--step", type=int, default=-1, help="index into steps (default: last)")
    ap.add_argument("--labels", nargs="*")
    a = ap.parse_args()
    panels = []
    for k, path in enumerate(a.reports):
        d = json.load(open(path))
        st = d["steps"][a.step]
        name, busy = busiest(st)
        latency = st["seconds"]["refit"]
        label = a.labels[k] if a.labels and k < len(a.labels) else path
        print(f"{label}: step {st['step']} latency {latency:.3f} s, busiest stage {name} "
              f"{busy:.3f} s, ratio {latency / busy if busy else float('nan'):.2f}")
        panels.append((label, st, latency, name, busy))
    if not a.out:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.8 * len(panels)), squeeze=False)
    colors = {"build": "#4c72b0", "compress+put": "#dd8452", "apply": "#55a868"}
    for ax, (label, st, latency, name, busy) in zip(axes[:, 0], panels):
        t0 = st["begin_unix"]
        rows = []
        for o in st.get("owner_timelines", []):
            rows.append((f"owner {o['owner']}", o["timeline"]))
        for r in st.get("receiver_timelines", []):
            rows.append((r["receiver"], r["timeline"]))
        for y, (row, spans) in enumerate(rows):
            for s in spans:
                ax.barh(y, s["end"] - s["begin"], left=s["begin"] - t0, height=0.35 if s["stage"] == "compress+put" else 0.7,
                        color=colors.get(s["stage"], "gray"))
        ax.axvline(0, color="k", lw=0.8)
        ax.axvline(st["end_unix"] - t0, color="k", lw=0.8, ls="--")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([r for r, _ in rows], fontsize=8)
        ax.set_title(f"{label}: step {st['step']}, prepare to commit {latency:.2f} s "
                     f"(busiest stage: {name}, {busy:.2f} s)", fontsize=9)
        ax.set_xlabel("seconds since the attempt was prepared")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    fig.legend(handles, list(colors.keys()), loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)

if __name__ == "__main__":
    main()
