#!/usr/bin/env python3
"""tests/tool/checkpoint_tool.py: `dcr diff|apply|inspect|recover` on sharded Hugging Face
checkpoints, symbolic links, concurrent in-place applies and the command-line conventions, as a
user runs them (docs/tool.md).

    checkpoint_tool.py SCENARIO DCR

Scenarios: sharded-roundtrip, sharded-refusals, sharded-crash, symlinks, lock, conventions,
progress.
Exits 0 only if every step behaved as documented. Checkpoints are written here with numpy in the
safetensors format (8-byte header length, JSON header, data), sharded as the Hugging Face
writers shard them: model-0000i-of-0000n.safetensors and model.safetensors.index.json.
"""
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

SCENARIO, DCR = sys.argv[1], os.path.realpath(sys.argv[2])
INDEX = "model.safetensors.index.json"
SHARDS = 3


def fail(msg):
    print(f"FAIL ({SCENARIO}): {msg}", file=sys.stderr)
    sys.exit(1)


def run(*args, status=0, env=None, stdin=None):
    """Runs dcr with `args`; checks its exit status; returns (stdout, stderr)."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([DCR, *args], capture_output=True, text=True, env=e, stdin=stdin)
    if p.returncode != status:
        fail(f"dcr {' '.join(args)} exited {p.returncode}, expected {status}\n"
             f"stdout: {p.stdout}\nstderr: {p.stderr}")
    return p.stdout, p.stderr


def on_tty(*args, status=0, env=None):
    """Runs dcr with `args` and its stderr on a pseudo-terminal (stdout to a file); checks its
    exit status; returns (stdout, everything written to the terminal)."""
    e = dict(os.environ)
    e.update(env or {})
    master, slave = os.openpty()
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen([DCR, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=slave,
                             env=e)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last holder of the terminal's other end closed it
                break
            if not data:
                break
            chunks.append(data)
        os.close(master)
        p.wait()
        out.seek(0)
        stdout = out.read().decode()
    tty = b"".join(chunks).decode(errors="replace")
    if p.returncode != status:
        fail(f"dcr {' '.join(args)} on a terminal exited {p.returncode}, expected {status}\n"
             f"stdout: {stdout}\nterminal: {tty!r}")
    return stdout, tty


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, arr in tensors:
        raw = arr.tobytes()
        dtype = {"float32": "F32", "float16": "F16", "int32": "I32", "uint16": "BF16"}[str(arr.dtype)]
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def model(seed):
    """The tensors of a small model, grouped by shard: [(name, array), ...] per shard."""
    rng = np.random.default_rng(seed)
    shards = []
    for s in range(SHARDS):
        ts = []
        for layer in range(2):
            i = s * 2 + layer
            ts.append((f"model.layers.{i}.mlp.weight",
                       (rng.standard_normal((64, 96), dtype=np.float32) * 0.02)
                       .view(np.uint32).astype(np.uint32) >> 16))
            ts.append((f"model.layers.{i}.norm.weight", np.ones(96, dtype=np.float32)))
        ts = [(n, a.astype(np.uint16) if a.dtype == np.uint32 else a) for n, a in ts]
        shards.append(ts)
    shards[0].insert(0, ("model.embed_tokens.weight",
                         rng.standard_normal((128, 32)).astype(np.float16)))
    shards[-1].append(("model.step", np.array([7], dtype=np.int32)))
    return shards


def step(shards, rate, seed, skip_shard=None):
    """A copy of `shards` with a share `rate` of the elements of every shard but `skip_shard`
    changed."""
    rng = np.random.default_rng(seed)
    out = []
    for s, ts in enumerate(shards):
        new = []
        for name, a in ts:
            b = a.copy()
            if s != skip_shard:
                flat = b.reshape(-1)
                mask = rng.random(flat.size) < rate
                if b.dtype == np.uint16:
                    flat[mask] ^= 1
                elif b.dtype == np.int32:
                    flat[mask] += 1
                else:
                    flat[mask] = (flat[mask] * 1.01).astype(b.dtype)
            new.append((name, b))
        out.append(new)
    return out


def write_dir(path, shards, step_no, index_extra=None):
    os.makedirs(path, exist_ok=True)
    weight_map = {}
    total = 0
    for s, ts in enumerate(shards):
        fname = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        write_safetensors(os.path.join(path, fname), ts, {"format": "pt", "step": str(step_no)})
        for name, a in ts:
            weight_map[name] = fname
            total += a.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    if index_extra:
        index_extra(index)
    with open(os.path.join(path, INDEX), "w") as f:
        json.dump(index, f, indent=2)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write('{"model_type": "test"}\n')


def checkpoint_files(path):
    return sorted(n for n in os.listdir(path) if n.endswith(".safetensors") or n == INDEX)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def same_dir(a, b, names=None):
    """Whether the index and shards of a and b are equal byte for byte."""
    names = names or checkpoint_files(b)
    return checkpoint_files(a) == names and all(
        read(os.path.join(a, n)) == read(os.path.join(b, n)) for n in names)


def expect_only(path, names):
    got = sorted(os.listdir(path))
    if got != sorted(names):
        fail(f"{path} holds {got}, expected {sorted(names)}")


work = tempfile.mkdtemp(prefix="dcr-ckpt-tool-")
os.chdir(work)
try:
    old_shards = model(1)
    new_shards = step(old_shards, 0.05, 2, skip_shard=1)  # shard 2 of 3 unchanged
    write_dir("old", old_shards, 1)
    write_dir("new", new_shards, 2)
    all_files = sorted(os.listdir("old"))

    if SCENARIO == "sharded-roundtrip":
        out, _ = run("diff", "old", "new", "-o", "step.dcrdelta", "--json")
        report = json.loads(out)
        changed = report["changed_elements"]
        if changed == 0 or report["tensors"] != sum(len(s) for s in old_shards):
            fail(f"diff report {report}")
        if report["delta_bytes"] != os.path.getsize("step.dcrdelta"):
            fail("delta_bytes is not the delta's size")
        out, _ = run("inspect", "step.dcrdelta", "--json")
        info = json.loads(out)
        if info["kind"] != "sharded_delta" or info["shard_count"] != SHARDS \
                or info["records"] != changed or info["index"] != INDEX:
            fail(f"inspect: {info}")
        if [s["file"] for s in info["shards"]] != checkpoint_files("old")[:SHARDS]:
            fail("inspect does not name the shards in order")
        text, _ = run("inspect", "step.dcrdelta")
        if "shard model-00002-of-00003.safetensors" not in text:
            fail("inspect text does not name the shards")
        # Into a new directory: index and shards equal NEW's, byte for byte.
        out, _ = run("apply", "step.dcrdelta", "old", "-o", "out", "--json")
        if json.loads(out)["changed_elements"] != changed:
            fail("apply -o changed_elements")
        if not same_dir("out", "new"):
            fail("apply -o: OUT differs from NEW")
        expect_only("out", checkpoint_files("new"))
        # An existing empty directory is fine; a non-empty one is refused.
        os.mkdir("empty")
        run("apply", "step.dcrdelta", "old", "-o", "empty/")
        if not same_dir("empty", "new"):
            fail("apply -o into an empty directory")
        _, err = run("apply", "step.dcrdelta", "old", "-o", "out", status=1)
        if "not an empty directory" not in err:
            fail(f"apply -o onto a full directory: {err}")
        # In place: every shard and the index become NEW's; a second apply finds it done.
        shutil.copytree("old", "base")
        run("apply", "step.dcrdelta", "base", "--in-place")
        if not same_dir("base", "new"):
            fail("apply --in-place: BASE differs from NEW")
        expect_only("base", all_files)
        out, _ = run("apply", "step.dcrdelta", "base", "--in-place")
        if "already holds" not in out:
            fail(f"second in-place apply: {out}")
        out, _ = run("recover", "base", "--json")
        if json.loads(out)["journal_found"]:
            fail("recover found a journal after a finished apply")
        expect_only("base", all_files)
        # Identical directories give a delta that changes nothing.
        run("diff", "old", "old", "-o", "same.dcrdelta")
        run("apply", "same.dcrdelta", "old", "-o", "same")
        if not same_dir("same", "old"):
            fail("identical directories do not round trip")

    elif SCENARIO == "sharded-refusals":
        run("diff", "old", "new", "-o", "step.dcrdelta")
        # A base whose index places a tensor in another shard: wrong base, naming the index.
        shutil.copytree("old", "moved")
        idx = json.load(open("moved/" + INDEX))
        idx["weight_map"]["model.layers.0.norm.weight"] = "model-00002-of-00003.safetensors"
        json.dump(idx, open("moved/" + INDEX, "w"))
        _, err = run("apply", "step.dcrdelta", "moved", "-o", "out", status=4)
        if "moved/" + INDEX not in err or "model.layers.0.norm.weight" not in err:
            fail(f"a re-mapped index: {err}")
        # A base missing a shard: an I/O error naming the file.
        shutil.copytree("old", "missing")
        os.remove("missing/model-00003-of-00003.safetensors")
        _, err = run("apply", "step.dcrdelta", "missing", "-o", "out", status=7)
        if "missing/model-00003-of-00003.safetensors" not in err:
            fail(f"a missing shard: {err}")
        # A shard that is not the delta's base: wrong base, naming the shard file and tensor.
        shutil.copytree("old", "other")
        write_safetensors("other/model-00002-of-00003.safetensors",
                          step([old_shards[1]], 0.01, 9)[0], {"format": "pt", "step": "1"})
        _, err = run("apply", "step.dcrdelta", "other", "--in-place", status=4)
        if "other/model-00002-of-00003.safetensors" not in err or "wrong base" not in err:
            fail(f"a wrong shard: {err}")
        if read("other/model-00001-of-00003.safetensors") != \
                read("old/model-00001-of-00003.safetensors"):
            fail("a refused in-place apply changed a shard")
        expect_only("other", all_files)
        if os.path.exists("out"):
            fail("a refused apply left OUT")
        # A single-file delta and a directory do not mix.
        run("diff", "old/model-00001-of-00003.safetensors",
            "new/model-00001-of-00003.safetensors", "-o", "one.dcrdelta")
        _, err = run("apply", "one.dcrdelta", "old", "-o", "out", status=4)
        if "directory" not in err:
            fail(f"a single-file delta on a directory: {err}")
        _, err = run("apply", "step.dcrdelta", "old/model-00001-of-00003.safetensors", "-o",
                     "out.safetensors", status=4)
        if "sharded" not in err:
            fail(f"a sharded delta on a file: {err}")
        # Re-sharded NEW: refused by diff, naming the tensor.
        write_dir("resharded", new_shards, 2, index_extra=lambda i: i["weight_map"].update(
            {"model.step": "model-00001-of-00003.safetensors"}))
        _, err = run("diff", "old", "resharded", "-o", "x.dcrdelta", status=6)
        if "model.step" not in err or "re-shard" not in err:
            fail(f"re-sharded NEW: {err}")
        # An index that does not match its shard: bad input naming both.
        shutil.copytree("new", "liar")
        idx = json.load(open("liar/" + INDEX))
        idx["weight_map"]["model.extra"] = "model-00001-of-00003.safetensors"
        json.dump(idx, open("liar/" + INDEX, "w"))
        shutil.copytree("old", "liar-old")
        shutil.copy("liar/" + INDEX, "liar-old/" + INDEX)
        _, err = run("diff", "liar-old", "liar", "-o", "x.dcrdelta", status=6)
        if "model.extra" not in err or "model-00001-of-00003.safetensors" not in err:
            fail(f"an index that does not match its shard: {err}")
        # A shard name that leaves the directory: refused.
        shutil.copytree("old", "escape")
        idx = json.load(open("escape/" + INDEX))
        idx["weight_map"]["model.step"] = "../model-00003-of-00003.safetensors"
        json.dump(idx, open("escape/" + INDEX, "w"))
        _, err = run("diff", "escape", "new", "-o", "x.dcrdelta", status=6)
        if "not a file name" not in err:
            fail(f"an escaping shard name: {err}")
        # A damaged sharded delta: corrupt delta, nothing created.
        data = bytearray(read("step.dcrdelta"))
        for at in (12, 40, len(data) // 2, len(data) - 5):
            bad = bytearray(data)
            bad[at] ^= 0x5A
            open("bad.dcrdelta", "wb").write(bad)
            run("apply", "bad.dcrdelta", "old", "-o", "out", status=5)
            run("inspect", "bad.dcrdelta", status=5)
        open("bad.dcrdelta", "wb").write(data[:-100])
        run("apply", "bad.dcrdelta", "old", "-o", "out", status=5)
        if os.path.exists("out") or any(n.startswith(".out") for n in os.listdir(".")):
            fail("a failed apply left a directory behind")

    elif SCENARIO == "sharded-crash":
        run("diff", "old", "new", "-o", "step.dcrdelta", "--payload-records", "300")
        per_shard = ["base-hidden", "half-written", "written", "verified", "renamed-back"]
        cases = [("journal-written", 0), ("journal-committed", 0), ("index-written", 0)]
        cases += [(s, k) for s in per_shard for k in range(SHARDS)]
        for crash_step, shard in cases:
            for finish in ("recover", "apply"):
                shutil.rmtree("base", ignore_errors=True)
                shutil.copytree("old", "base")
                run("apply", "step.dcrdelta", "base", "--in-place", status=86,
                    env={"DCR_CRASH_AT": crash_step, "DCR_CRASH_SHARD": str(shard)})
                # Every shard present is old or new (or hidden as the working file).
                for n in checkpoint_files("old"):
                    p = os.path.join("base", n)
                    if os.path.exists(p) and read(p) not in (read("old/" + n), read("new/" + n)):
                        fail(f"after a crash at {crash_step} (shard {shard}) {n} is neither "
                             "old nor new")
                if finish == "recover":
                    out, _ = run("recover", "base", "--json")
                    r = json.loads(out)
                    if crash_step == "journal-written":
                        # Not committed: recovery leaves everything old.
                        if r["journal_found"] or not same_dir("base", "old"):
                            fail("recover after journal-written did not leave all old")
                        expect_only("base", all_files)
                        run("apply", "step.dcrdelta", "base", "--in-place")
                    elif not r["journal_found"]:
                        fail(f"recover after {crash_step} found no journal")
                else:
                    out, _ = run("apply", "step.dcrdelta", "base", "--in-place", "--json")
                    if crash_step != "journal-written" and not json.loads(out)["recovered"]:
                        fail(f"apply after {crash_step} did not report the recovery")
                if not same_dir("base", "new"):
                    fail(f"crash at {crash_step} (shard {shard}) then {finish}: not all new")
                expect_only("base", all_files)
        # A recovery that crashes is recovered the same way.
        shutil.rmtree("base")
        shutil.copytree("old", "base")
        run("apply", "step.dcrdelta", "base", "--in-place", status=86,
            env={"DCR_CRASH_AT": "half-written", "DCR_CRASH_SHARD": "0"})
        run("recover", "base", status=86,
            env={"DCR_CRASH_AT": "written", "DCR_CRASH_SHARD": "2"})
        run("recover", "base")
        if not same_dir("base", "new"):
            fail("a crashed recovery did not recover")
        expect_only("base", all_files)

    elif SCENARIO == "symlinks":
        # A Hugging Face cache: blobs, and a snapshot directory of links to them.
        run("diff", "old", "new", "-o", "step.dcrdelta")
        os.makedirs("cache/blobs")
        os.makedirs("cache/snapshots/abc")
        for n in os.listdir("old"):
            shutil.copy("old/" + n, "cache/blobs/" + n + ".blob")
            os.symlink("../../blobs/" + n + ".blob", "cache/snapshots/abc/" + n)
        snap = "cache/snapshots/abc"
        run("apply", "step.dcrdelta", snap, "-o", "out")
        if not same_dir("out", "new"):
            fail("apply -o through links differs from NEW")
        run("diff", snap, "new", "-o", "again.dcrdelta")
        _, err = run("apply", "step.dcrdelta", snap, "--in-place", status=1)
        for words in ("symbolic link", "-o", "cp --remove-destination"):
            if words not in err:
                fail(f"in place on links: '{words}' not in: {err}")
        for n in os.listdir("old"):
            if read("cache/blobs/" + n + ".blob") != read("old/" + n):
                fail("a refused in-place apply changed a blob")
            if not os.path.islink(os.path.join(snap, n)):
                fail("a refused in-place apply replaced a link")
        # One file: a link is read through, refused in place with the reason.
        os.symlink(os.path.realpath("old/model-00001-of-00003.safetensors"), "link.safetensors")
        run("diff", "old/model-00001-of-00003.safetensors",
            "new/model-00001-of-00003.safetensors", "-o", "one.dcrdelta")
        run("apply", "one.dcrdelta", "link.safetensors", "-o", "one.safetensors")
        if read("one.safetensors") != read("new/model-00001-of-00003.safetensors"):
            fail("apply -o through a link")
        _, err = run("apply", "one.dcrdelta", "link.safetensors", "--in-place", status=1)
        if "symbolic link" not in err or "-o" not in err:
            fail(f"in place on a link: {err}")
        # apply -o keeps the base's permission bits (files and shards).
        os.chmod("old/model-00001-of-00003.safetensors", 0o600)
        os.chmod("old/model-00002-of-00003.safetensors", 0o640)
        os.chmod("old/" + INDEX, 0o604)
        run("apply", "one.dcrdelta", "old/model-00001-of-00003.safetensors", "-o", "perm.safetensors")
        run("apply", "step.dcrdelta", "old", "-o", "perm")
        for path, mode in (("perm.safetensors", 0o600),
                           ("perm/model-00001-of-00003.safetensors", 0o600),
                           ("perm/model-00002-of-00003.safetensors", 0o640),
                           ("perm/" + INDEX, 0o604)):
            got = stat.S_IMODE(os.stat(path).st_mode)
            if got != mode:
                fail(f"{path} has mode {oct(got)}, the base's is {oct(mode)}")

    elif SCENARIO == "lock":
        run("diff", "old", "new", "-o", "step.dcrdelta")
        one_old = "old/model-00001-of-00003.safetensors"
        run("diff", one_old, "new/model-00001-of-00003.safetensors", "-o", "one.dcrdelta")
        os.makedirs("single")
        shutil.copy(one_old, "single/base.safetensors")
        shutil.copytree("old", "base")
        for target, delta, lock_dir in (("single/base.safetensors", "one.dcrdelta", "single"),
                                        ("base", "step.dcrdelta", "base")):
            # Another process holds the directory's lock (flock(1) takes the same flock(2)).
            holder = subprocess.Popen(["flock", lock_dir, "sleep", "3"])
            time.sleep(0.5)
            _, err = run("apply", delta, target, "--in-place", "--no-wait", status=8)
            if "another in-place apply or recover" not in err:
                fail(f"--no-wait while locked: {err}")
            _, err = run("recover", target, "--no-wait", status=8)
            start = time.monotonic()
            _, err = run("apply", delta, target, "--in-place")
            waited = time.monotonic() - start
            holder.wait()
            if "waiting" not in err or waited < 1.5:
                fail(f"the apply did not wait for the lock ({waited:.1f} s): {err}")
        if not same_dir("base", "new") or read("single/base.safetensors") != \
                read("new/model-00001-of-00003.safetensors"):
            fail("the applies after the lock did not finish")
        # Two applies at once: both succeed, one after the other, and the result is NEW.
        shutil.rmtree("base")
        shutil.copytree("old", "base")
        procs = [subprocess.Popen([DCR, "apply", "step.dcrdelta", "base", "--in-place"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(3)]
        for p in procs:
            if p.wait() != 0:
                fail(f"a concurrent apply failed: {p.stderr.read().decode()}")
        if not same_dir("base", "new"):
            fail("concurrent applies did not give NEW")
        expect_only("base", all_files)

    elif SCENARIO == "conventions":
        out, _ = run("--version")
        if not out.startswith("dcr ") or len(out.split()) != 2:
            fail(f"--version: {out}")
        out, _ = run("diff", "--help")
        if "level 3" not in out or "level 19" not in out:
            fail("diff --help does not say what higher levels do")
        one_old = "old/model-00001-of-00003.safetensors"
        one_new = "new/model-00001-of-00003.safetensors"
        run("diff", one_old, one_new, "-o", "one.dcrdelta")
        # Exit status per error class, and --json errors on stdout.
        cases = [
            (2, "usage", ["apply", "one.dcrdelta", one_old]),
            (4, "wrong_base", ["apply", "one.dcrdelta", "old/model-00002-of-00003.safetensors",
                               "-o", "x.safetensors"]),
            (6, "bad_input", ["diff", one_old, "old/config.json", "-o", "x.dcrdelta"]),
            (6, "bad_input", ["diff", one_old, "old/model-00002-of-00003.safetensors", "-o",
                              "x.dcrdelta"]),
            (7, "io_error", ["diff", one_old, "old/no-such.safetensors", "-o", "x.dcrdelta"]),
        ]
        data = bytearray(read("one.dcrdelta"))
        data[len(data) // 2] ^= 0x5A
        open("bad.dcrdelta", "wb").write(data)
        cases.append((5, "corrupt_delta", ["apply", "bad.dcrdelta", one_old, "-o", "x.safetensors"]))
        cases.append((5, "corrupt_delta", ["inspect", "bad.dcrdelta"]))
        for status, cls, args in cases:
            _, err = run(*args, status=status)
            if not err.startswith("dcr "):
                fail(f"{args}: no message on stderr: {err}")
            out, err2 = run(*args, "--json", status=status)
            try:
                j = json.loads(out)["error"]
            except (ValueError, KeyError):
                fail(f"{args} --json: stdout is not a JSON error: {out!r}")
            if j["status"] != status or j["class"] != cls or not j["message"]:
                fail(f"{args} --json: {j}")
            if j["message"] not in err2:
                fail(f"{args} --json: the message differs from stderr's")
        if os.path.exists("x.safetensors") or os.path.exists("x.dcrdelta"):
            fail("a failed command left its output")
        # An unfinished in-place apply (status 8) names the code once.
        shutil.copy(one_old, "base.safetensors")
        run("apply", "one.dcrdelta", "base.safetensors", "--in-place", status=86,
            env={"DCR_CRASH_AT": "journal-committed"})
        _, err = run("apply", "one.dcrdelta", "base.safetensors", "-o", "x.safetensors", status=8)
        if err.count("called out of protocol order") != 1:
            fail(f"the error code is not printed exactly once: {err}")
        run("recover", "base.safetensors")

    elif SCENARIO == "progress":
        # Every command with a progress line, on files and on directories: on a terminal the
        # line is drawn (and reaches 100%: the work planned at the start is all counted), -q and
        # --quiet leave the terminal silent, and a stderr that is not a terminal gets nothing.
        one_old = "old/model-00001-of-00003.safetensors"
        one_new = "new/model-00001-of-00003.safetensors"
        run("diff", one_old, one_new, "-o", "one.dcrdelta")
        run("diff", "old", "new", "-o", "step.dcrdelta")

        def fresh(kind):
            """A copy of OLD's first shard or of OLD's directory to apply to in place."""
            for p in ("base.safetensors", "base"):
                if os.path.isdir(p):
                    shutil.rmtree(p)
                elif os.path.exists(p):
                    os.remove(p)
            if kind == "file":
                shutil.copy(one_old, "base.safetensors")
                return "base.safetensors"
            shutil.copytree("old", "base")
            return "base"

        def check_result(kind, path):
            if kind == "file" and read(path) != read(one_new):
                fail(f"{path} is not NEW's first shard")
            if kind == "dir" and not same_dir(path, "new"):
                fail(f"{path} is not NEW")

        def outputs_gone():
            for p in ("out.safetensors", "out"):
                if os.path.isdir(p):
                    shutil.rmtree(p)
                elif os.path.exists(p):
                    os.remove(p)

        def expect_progress(tty, label, what):
            if f"{label}: " not in tty or "MB/s" not in tty:
                fail(f"{what}: no progress line on a terminal: {tty!r}")
            if "(100%)" not in tty:
                fail(f"{what}: the progress line never reached 100%: {tty!r}")
            if not tty.endswith("\r\x1b[K"):
                fail(f"{what}: the progress line was not erased at the end: {tty!r}")

        # (what, kind, command, its progress label, set up before each run, the result to check)
        cases = []
        for kind, delta, old_, new_ in (("file", "one.dcrdelta", one_old, one_new),
                                        ("dir", "step.dcrdelta", "old", "new")):
            out = "out.safetensors" if kind == "file" else "out"
            base = "base.safetensors" if kind == "file" else "base"

            def applied(kind=kind, delta=delta):
                run("apply", delta, fresh(kind), "--in-place")

            def crashed(kind=kind, delta=delta):
                run("apply", delta, fresh(kind), "--in-place", status=86,
                    env={"DCR_CRASH_AT": "half-written", "DCR_CRASH_SHARD": "0"})

            def crashed_before_hiding(kind=kind, delta=delta):
                run("apply", delta, fresh(kind), "--in-place", status=86,
                    env={"DCR_CRASH_AT": "journal-committed"})

            in_place = ["apply", delta, base, "--in-place"]
            cases += [
                (f"diff {kind}", kind, ["diff", old_, new_, "-o", "p.dcrdelta"],
                 "dcr diff: scanned", lambda: None, None),
                (f"apply -o {kind}", kind, ["apply", delta, old_, "-o", out],
                 "dcr apply: processed", outputs_gone, out),
                (f"apply --in-place {kind}", kind, in_place, "dcr apply: processed",
                 lambda kind=kind: fresh(kind), base),
                (f"apply --in-place {kind}, already applied", kind, in_place,
                 "dcr apply: processed", applied, base),
                (f"apply --in-place {kind} after a crash", kind, in_place,
                 "dcr apply: processed", crashed, base),
                (f"recover {kind}", kind, ["recover", base], "dcr recover: processed",
                 crashed, base),
                (f"recover {kind}, BASE not hidden yet", kind, ["recover", base],
                 "dcr recover: processed", crashed_before_hiding, base),
            ]
        for what, kind, args, label, setup, result in cases:
            setup()
            _, tty = on_tty(*args)
            expect_progress(tty, label, what)
            if result:
                check_result(kind, result)
            for quiet in ("--quiet", "-q"):
                setup()
                _, tty = on_tty(*args, quiet)
                if tty:
                    fail(f"{what} {quiet}: the terminal got {tty!r}")
                if result:
                    check_result(kind, result)
            for flags in ([], ["--quiet"]):
                setup()
                _, err = run(*args, *flags)
                if err:
                    fail(f"{what} {flags}: a stderr that is not a terminal got {err!r}")
        # --help names the option for every command with a progress line.
        for cmd in ("diff", "apply", "recover"):
            out, _ = run(cmd, "--help")
            if "--quiet" not in out:
                fail(f"{cmd} --help does not document --quiet")
    else:
        fail("unknown scenario")
finally:
    os.chdir("/")
    shutil.rmtree(work, ignore_errors=True)
print(f"ok: {SCENARIO}")
