#!/usr/bin/env python3
"""dcr simulate with trainer and rollout nodes on shaped cross-cluster flows and the reference:
every step bit-exact, and the flow accounting adds up (bytes per flow, bytes_crossing,
seconds.transport, the reference's bytes). Usage: simulate_flows.py DCR [simulate args...]"""
import json
import subprocess
import sys

dcr, extra = sys.argv[1], sys.argv[2:]
rate = 200e6
args = [dcr, "simulate", "--size", "8M", "--steps", "2", "--trainer-tp", "2", "--trainer-dp", "2",
        "--receiver-tp", "4", "--trainer-nodes", "2", "--rollout-nodes", "2",
        "--link-rate", "200MB/s", "--reference", "--json", *extra]
run = subprocess.run(args, capture_output=True, text=True, timeout=600)
if run.returncode != 0:
    sys.exit(f"simulate_flows: {' '.join(args)} exited {run.returncode}\n{run.stderr}")
report = json.loads(run.stdout)
problems = []
def check(ok, what):
    if not ok:
        problems.append(what)

check(report["all_bit_exact"], "not every step bit-exact")
check(report["link_rate"] == rate, f"link_rate {report['link_rate']}")
for step in report["steps"]:
    flows, n = step["flows"], step["step"]
    check(set(flows) == {"trainer-node-0", "trainer-node-1", "rollout-node-0", "rollout-node-1"},
          f"step {n}: flows {sorted(flows)}")
    check(step["bytes_crossing"] == sum(flows.values()), f"step {n}: bytes_crossing is not the flows' sum")
    up = flows.get("trainer-node-0", 0) + flows.get("trainer-node-1", 0)
    check(up >= step["payload_bytes"], f"step {n}: uploads {up} < payload bytes {step['payload_bytes']}")
    for node in ("rollout-node-0", "rollout-node-1"):  # two receivers each, every payload each
        check(flows.get(node, 0) >= 2 * step["payload_bytes"],
              f"step {n}: {node} carried {flows.get(node, 0)} < 2 x {step['payload_bytes']}")
    busiest = max(flows.values())
    check(abs(step["seconds"]["transport"] - busiest / rate) < 1e-9, f"step {n}: seconds.transport")
    check(step["speedup_over_reference"] > 0, f"step {n}: speedup_over_reference")
ref = report["reference"]
checkpoint = ref["checkpoint_bytes"]
# Uploads once, downloads once per rollout node; manifests add a few bytes.
check(3 * checkpoint <= ref["bytes_crossing"] <= 3 * checkpoint * 1.001,
      f"reference bytes_crossing {ref['bytes_crossing']} for a {checkpoint}-byte checkpoint")
check(ref["seconds"] >= ref["upload_seconds"] and ref["seconds"] >= ref["download_seconds"],
      "reference seconds")
# Each node's flow took its share at 200 MB/s at least (less one burst of 256 KiB).
check(ref["upload_seconds"] >= (checkpoint / 2 - 262144) / rate, "reference upload faster than its flows")
check(ref["download_seconds"] >= (checkpoint - 262144) / rate, "reference download faster than its flows")
if problems:
    sys.exit("simulate_flows: " + "; ".join(problems))
print(f"simulate_flows: ok ({len(report['steps'])} steps, reference {ref['seconds']:.3f} s)")
