#!/usr/bin/env python3
"""A chaos run of dcr simulate (--chaos SEED) and what it must show: every drawn kill fired and
was survived, the control-plane outage was injected, the corrupted payload was refused (fetched again, or
its attempt failed),
every step committed exactly once (the control plane's history: each version once, for its own
candidate) and bit-exact, each killed process was started again once per kill, and the schedule
printed before the run is the one the report holds.

Usage: simulate_chaos.py [DCR] simulate ARGS...   (DCR defaults to $DCR_TOOL, so that
scripts which call "$dcr simulate ..." can run this checker in dcr's place)."""
import json
import os
import re
import subprocess
import sys

argv = sys.argv[1:]
if argv and argv[0] != "simulate":
    dcr, argv = argv[0], argv[1:]
else:
    dcr = os.environ.get("DCR_TOOL", "")
if not dcr or not argv or argv[0] != "simulate" or "--chaos" not in argv:
    sys.exit("usage: simulate_chaos.py [DCR] simulate --chaos SEED ARGS...  (or DCR_TOOL=DCR)")
args = [dcr, *argv] + ([] if "--json" in argv else ["--json"])
run = subprocess.run(args, capture_output=True, text=True, timeout=900)
sys.stderr.write(run.stderr)
if run.returncode != 0:
    sys.exit(f"simulate_chaos: {' '.join(args)} exited {run.returncode}")
report = json.loads(run.stdout)
chaos = report["chaos"]
problems = []


def check(ok, what):
    if not ok:
        problems.append(what)


steps = report["steps"]
n_steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 3
check(len(steps) == n_steps, f"{len(steps)} steps reported, {n_steps} run")
for st in steps:
    n = st["step"]
    check(st["committed_once"] and st["bit_exact"], f"step {n}: not committed once and bit-exact")
    check(st["history"] is not None and st["history"]["candidate"] == f"step {n}",
          f"step {n}: history record {st['history']}")
history = report["history"]
check(history["exactly_once"] and history["versions"] == n_steps and history["commit_version"] == n_steps,
      f"history {history}")

roles = {"receiver", "owner", "coordinator"} | ({"relay-root"} if "relay" in argv else set())
check(set(chaos["roles"]) == roles, f"roles killed {sorted(chaos['roles'])}, expected {sorted(roles)}")
for role, r in chaos["roles"].items():
    check(r["planned"] == chaos["kills_per_role"] and r["fired"] == r["planned"] and r["survived"] == r["planned"],
          f"{role}: {r}")
check(chaos["kills_planned"] == chaos["kills_fired"] == chaos["kills_survived"] == len(roles) * chaos["kills_per_role"],
      "kills planned / fired / survived differ")
events = chaos["schedule"]
check(sorted(e["event"] for e in events if e["event"] != "kill") == ["commit-outage", "corrupt"],
      "not exactly one outage and one corrupted payload")
check(len({e["step"] for e in events}) == len(events) and all(e["step"] >= 2 for e in events),
      "two events on one step, or one on step 1")
for e in events:
    check(e["happened"] and e["survived"], f"step {e['step']}: {e['event']} {e}")
    if e["event"] == "corrupt":
        check(e["refetched"] > 0 or e["attempts"] >= 2,
              f"step {e['step']}: the corrupted payload was neither fetched again nor failed an attempt")
check(report["commit_outage_injected"], "the control-plane outage was not injected")
check(chaos["ok"], "chaos.ok is false")
check(len(chaos["attempts_per_step"]) == n_steps, "attempts_per_step")
# Every kill started its process again: per role, restarted instances == kills.
restarted = {}
for p in report["processes"]:
    if p["restarted"]:
        restarted[p["role"]] = restarted.get(p["role"], 0) + 1
for role, r in chaos["roles"].items():
    check(restarted.get(role, 0) == r["fired"], f"{role}: {restarted.get(role, 0)} restarts for {r['fired']} kills")
# The schedule printed on stderr before the run is the one reported.
printed = re.findall(r"^\s+step\s+(\d+)\s+(kill (\S+)/(\d+)|control-plane outage|corrupted payload)",
                     run.stderr, re.M)
expected = [(e["step"], e["event"], e.get("role"), e.get("id")) for e in events]
got = [(int(s), "kill" if k else ("commit-outage" if w.startswith("control") else "corrupt"),
        k or None, int(i) if i else None) for s, w, k, i in printed]
check(got[:len(expected)] == expected, f"printed schedule {got} differs from the report's {expected}")

for e in events:
    who = f" {e['role']}/{e['id']}" if e["event"] == "kill" else ""
    lost = e["seconds_lost"]
    print(f"step {e['step']:>3} {e['event']}{who}: {e['attempts']} attempt(s), "
          f"{'n/a' if lost is None else f'{lost:+.3f} s'} vs the clean median "
          f"{chaos['clean_period_median_seconds']}")
if problems:
    sys.exit("simulate_chaos: " + "\n  ".join(problems))
print(f"simulate_chaos: {n_steps} steps, {chaos['kills_survived']} kills survived, outage and corrupted payload survived")
