#!/usr/bin/env python3
"""The bandwidth-shaped refit benchmark (docs/benchmarks.md, "Refit across clusters").

Runs `dcr simulate` across processes with trainer and rollout nodes whose every cross-cluster
flow is shaped to --link-rate, for each transport case and stress change rate, plus the paper's
reference once (the full checkpoint through object storage on the same flows). Prints a
markdown table and writes every report to --out (JSON).

  scripts/bench-transports.py --dcr build/tools/dcr/dcr --size 1G --link-rate 10MB/s \\
      --rates 0.01,0.03,0.05 --cases file,relay1,relay4 --out bench.json

Cases: file (the filesystem payload store), s3 and s3-fanout (need DCR_S3_URL, e.g.
s3://bucket/prefix, and DCR_S3_ENDPOINT plus the AWS credential variables, as
scripts/with-s3.sh exports them), relay1 (the paper's single-root relay tree), relay4 (the
striped relay over 4 roots).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = {
    "file": lambda: ["--transport", "file"],
    "s3": lambda: ["--transport", os.environ["DCR_S3_URL"], "--s3-endpoint", os.environ["DCR_S3_ENDPOINT"]],
    "s3-fanout": lambda: ["--transport", os.environ["DCR_S3_URL"], "--s3-endpoint",
                          os.environ["DCR_S3_ENDPOINT"], "--s3-fanout"],
    "relay1": lambda: ["--transport", "relay", "--relay-roots", "1"],
    "relay4": lambda: ["--transport", "relay", "--relay-roots", "4"],
}


def simulate(dcr, common, extra, timeout):
    args = [dcr, "simulate", *common, *extra, "--json"]
    t0 = time.monotonic()
    run = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        sys.exit(f"bench-transports: {' '.join(args)} exited {run.returncode}\n{run.stderr[-4000:]}")
    report = json.loads(run.stdout)
    report["command"] = " ".join(args[1:])
    report["wall_seconds"] = time.monotonic() - t0
    return report


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dcr", default="build/tools/dcr/dcr")
    p.add_argument("--size", default="1G")
    p.add_argument("--link-rate", default="10MB/s")
    p.add_argument("--rates", default="0.01,0.03,0.05")
    p.add_argument("--cases", default="file,relay1,relay4")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--trainer-nodes", type=int, default=2)
    p.add_argument("--rollout-nodes", type=int, default=4)
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--out", default="")
    p.add_argument("--reference-from", default="",
                   help="take the reference from an earlier --out of the same settings instead of running it")
    a = p.parse_args()
    common = ["--size", a.size, "--steps", str(a.steps), "--verify", "last",
              "--trainer-tp", "2", "--trainer-dp", str(a.trainer_nodes),
              "--receiver-tp", str(a.rollout_nodes), "--trainer-nodes", str(a.trainer_nodes),
              "--rollout-nodes", str(a.rollout_nodes), "--link-rate", a.link_rate]
    results = []
    reference = None
    if a.reference_from:
        earlier = json.load(open(a.reference_from))
        if earlier["common"] != common:
            sys.exit("bench-transports: --reference-from was measured with other settings")
        reference = earlier["reference"]
    for rate in [float(r) for r in a.rates.split(",")]:
        for case in a.cases.split(","):
            extra = CASES[case]() + ["--change-rate", str(rate)]
            if reference is None:
                extra.append("--reference")
            r = simulate(a.dcr, common, extra, a.timeout)
            if reference is None:
                reference = r["reference"]
            if not r["all_bit_exact"]:
                sys.exit(f"bench-transports: {case} at {rate} was not bit-exact")
            # Steps after the first (warm caches); the median over them.
            steps = r["steps"][1:] or r["steps"]
            latency = statistics.median(s["seconds"]["refit"] for s in steps)
            transport = statistics.median(s["seconds"]["transport"] or 0 for s in steps)
            row = {"case": case, "rate": rate, "latency_seconds": latency,
                   "speedup": reference["seconds"] / latency,
                   "payload_bytes": statistics.median(s["payload_bytes"] for s in steps),
                   "bytes_crossing": statistics.median(s["bytes_crossing"] for s in steps),
                   "transport_seconds": transport,
                   "transport_share": transport / latency if latency > 0 else 0,
                   "report": r}
            results.append(row)
            print(f"{case:>10} {rate:5.3f}: {latency:7.3f} s  {row['speedup']:7.1f}x  "
                  f"payload {row['payload_bytes'] / 1e6:8.2f} MB  crossing {row['bytes_crossing'] / 1e6:8.2f} MB  "
                  f"lower bound {transport:6.3f} s ({100 * row['transport_share']:.0f}%)", file=sys.stderr)
    print(f"reference (full checkpoint through object storage): {reference['seconds']:.2f} s "
          f"(upload {reference['upload_seconds']:.2f} s, download {reference['download_seconds']:.2f} s), "
          f"{reference['bytes_crossing'] / 1e6:.0f} MB crossing\n")
    print("| case | change rate | latency (s) | speedup over reference | payload (MB) | crossing (MB) | crossing / payload | transport lower bound (s) | share of latency |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in results:
        print(f"| {row['case']} | {100 * row['rate']:.0f}% | {row['latency_seconds']:.3f} | {row['speedup']:.1f}x | "
              f"{row['payload_bytes'] / 1e6:.2f} | {row['bytes_crossing'] / 1e6:.2f} | "
              f"{row['bytes_crossing'] / max(row['payload_bytes'], 1):.2f} | {row['transport_seconds']:.3f} | "
              f"{100 * row['transport_share']:.0f}% |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"reference": reference, "results": results, "common": common}, f, indent=1)


if __name__ == "__main__":
    main()
