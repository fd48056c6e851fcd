"""The package's contracts in one process: version, errors, registration checks, tensors through
DLPack, the loader conditions at prewarm, payload validation (nothing written on error), the
two apply paths agreeing, and an owner agent on two threads publishing the one-thread payloads."""
import os
import re
import threading

import ml_dtypes
import numpy as np
import pytest
import torch

import dcr
from conftest import ROOT

BF16 = ml_dtypes.bfloat16


def test_version_matches_the_library():
    text = open(os.path.join(ROOT, "meson.build")).read()
    assert dcr.__version__ == re.search(r"version : '([^']+)'", text).group(1)


def test_stubs_are_built():
    assert os.path.exists(os.path.join(os.path.dirname(dcr._dcr.__file__), "_dcr.pyi"))


def test_error_hierarchy_mirrors_the_codes():
    assert issubclass(dcr.ShapeMismatch, dcr.Error) and issubclass(dcr.ShapeMismatch, ValueError)
    assert dcr.RegistryMismatch.code == 21 and dcr.UnsupportedLoaderPath.code == 12
    assert dcr.Error.code == 0


def test_registration_errors_name_the_shard():
    reg = dcr.Registry([("w", "BF16", (4, 6)), ("b", torch.float32, (6,)), ("h", np.float16, (3,))])
    assert reg.tensor("b") == ("b", "F32", [6]) and reg.tensor("h")[1] == "F16"
    with pytest.raises(dcr.InvalidArgument, match="unknown dtype"):
        dcr.Registry([("w", "BF17", (4,))])
    with pytest.raises(dcr.InvalidArgument, match="duplicate tensor name"):
        dcr.Registry([("w", "BF16", (4,)), ("w", "BF16", (4,))])
    with pytest.raises(dcr.DtypeMismatch, match="'w@0'"):
        dcr.AffineTask(reg, "w@0", dcr.row_split([4, 6], 2, 0), "w", dtype="F16")
    with pytest.raises(dcr.ShapeMismatch, match="'b@0'"):
        dcr.AffineTask(reg, "b@0", dcr.row_split([4, 6], 2, 0), "b")
    with pytest.raises(dcr.UnknownTensor, match="'nope'"):
        dcr.AffineTask(reg, "x", dcr.replicated([6]), "nope")
    with pytest.raises(dcr.InvalidArgument):
        dcr.row_split([4, 6], 2, 2)


def test_registry_from_safetensors(tmp_path):
    from safetensors.numpy import save_file
    save_file({"a": np.zeros((2, 3), np.float32), "b": np.zeros(5, np.int64)}, tmp_path / "m.safetensors")
    reg = dcr.Registry.from_safetensors(str(tmp_path / "m.safetensors"))
    assert reg.entries() == [("a", "F32", [2, 3]), ("b", "I64", [5])]


def test_mappings_project_like_the_library():
    m = dcr.column_split([4, 6], 2, 1)
    assert m.local_size == 12 and m(0) == (0, 3) and m(3) == (0, 9)
    b = dcr.box([4, 6], [1, 2], [2, 3], [1, 0])  # transposed box
    assert b(1) == (0, 14)


def owner_and_shards():
    reg = dcr.Registry([("w", "BF16", (4, 6))])
    tasks = [dcr.AffineTask(reg, "w@0", dcr.row_split([4, 6], 2, 0), "w"),
             dcr.AffineTask(reg, "w@1", dcr.row_split([4, 6], 2, 1), "w")]
    return reg, dcr.Owner(reg, 0, tasks)


def test_shards_through_dlpack_are_checked_and_named():
    reg, owner = owner_and_shards()
    w = torch.randn(4, 6).to(torch.bfloat16)
    with pytest.raises(dcr.InvalidArgument, match="'w@1'.*not contiguous"):
        owner.initialize([w[:2], w.t().contiguous().t()[2:]])
    with pytest.raises(dcr.DtypeMismatch, match="'w@0'.*F32"):
        owner.initialize([w[:2].float(), w[2:]])
    with pytest.raises(dcr.ShapeMismatch, match="'w@1'"):
        owner.initialize([w[:2], w[2:3]])
    owner.initialize([w[:2], w[2:]])                               # torch
    owner.initialize([w[:2].view(torch.int16).numpy().view(BF16), w[2:]])  # NumPy BF16 (ml_dtypes)


class TinyModel(torch.nn.Module):
    def __init__(self, dtype=torch.bfloat16):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4, bias=False, dtype=dtype)


def tiny_receiver(loader=None, dtype=torch.bfloat16, mode="state_dict"):
    reg = dcr.Registry([("lin.weight", "BF16", (4, 6))])
    m = TinyModel(dtype)
    return reg, m, dcr.Receiver(reg, loader or m.load_state_dict, mode=mode)


def test_loader_conditions_are_checked_at_prewarm():
    reg, m, _ = tiny_receiver()
    p = m.lin.weight

    def scaled(sd):
        with torch.no_grad():
            p.copy_(sd["lin.weight"] * 2)
    with pytest.raises(dcr.UnsupportedLoaderPath, match="'lin.weight'.*value transform"):
        dcr.Receiver(reg, scaled).prewarm()

    def broadcast(sd):
        p.copy_(sd["lin.weight"][0])
    with pytest.raises(dcr.UnsupportedLoaderPath, match="'lin.weight'.*overlapping"):
        dcr.Receiver(reg, broadcast).prewarm()

    def reads_values(sd):
        if sd["lin.weight"][0, 0].item() > 0:
            p.copy_(sd["lin.weight"])
    with pytest.raises(dcr.UnsupportedLoaderPath, match="reads the values of tensor 'lin.weight'"):
        dcr.Receiver(reg, reads_values).prewarm()

    def twice(sd):
        p[:2].copy_(sd["lin.weight"][:2])
        p[:2].copy_(sd["lin.weight"][2:])
    with pytest.raises(dcr.UnsupportedLoaderPath, match="lin.weight"):
        dcr.Receiver(reg, twice).prewarm()

    with pytest.raises(dcr.UnsupportedLoaderPath, match="neither copied nor skipped"):
        dcr.Receiver(reg, lambda sd: None).prewarm()

    def from_temporary(weights, sink):
        for name, w in weights:
            sink.copy(np.zeros((4, 6), BF16), w.copy())
    with pytest.raises(dcr.UnsupportedLoaderPath, match="temporary"):
        dcr.Receiver(reg, from_temporary, mode="sink").prewarm()


def test_casts_make_a_tensor_overwrite_only_and_views_are_placed():
    reg, m, rx = tiny_receiver(dtype=torch.float32)
    rx.prewarm()
    report = rx.placement_report()[0]
    assert report["overwrite_only"] and "cast BF16->F32" in report["reason"]
    # A vLLM-style loader: weight_loader copying transposed and cast views.
    reg2 = dcr.Registry([("w", "BF16", (6, 4))])
    store = torch.zeros(4, 6, dtype=torch.float32)

    def load_weights(weights):
        for name, w in weights:
            store.copy_(w.t().to(torch.float32))
    rx2 = dcr.Receiver(reg2, load_weights, mode="weights").prewarm()
    src = torch.randn(6, 4).to(torch.bfloat16)
    rx2.load({"w": src})
    assert torch.equal(store, src.t().float())


def payloads_for(reg, before, after, owner_id=0):
    tasks = [dcr.AffineTask(reg, "lin.weight", dcr.replicated([4, 6]), "lin.weight")]
    o = dcr.Owner(reg, owner_id, tasks)
    o.initialize([before])
    return o.build_payloads([after], 0, 1)


@pytest.mark.parametrize("path", ["compiled", "general"])
def test_apply_paths_match_a_dense_load(path):
    reg, m, rx = tiny_receiver()
    rx.prewarm()
    rx.path = path
    before = torch.randn(4, 6).to(torch.bfloat16)
    after = before.clone()
    after[1, 2] = -after[1, 2]
    after[3, 5] = float("nan")
    rx.load({"lin.weight": before})
    rx.begin_attempt(0, 1)
    assert [rx.apply_payload(p) for p in payloads_for(reg, before, after)] == ["applied"]
    assert torch.equal(m.lin.weight.detach().view(torch.int16), after.view(torch.int16))
    # The same payload again is dropped (an xor applied twice would undo it).
    assert rx.apply_payload(payloads_for(reg, before, after)[0]) == "duplicate"
    assert torch.equal(m.lin.weight.detach().view(torch.int16), after.view(torch.int16))


class TiedModel(torch.nn.Module):
    """tie_word_embeddings: lm_head.weight is the embedding's Parameter, and the state dict (as
    a checkpoint saved from it) holds both names."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4, dtype=torch.bfloat16)
        self.lm_head = torch.nn.Linear(4, 8, bias=False, dtype=torch.bfloat16)
        self.lm_head.weight = self.embed.weight


TIED = [("embed.weight", "BF16", (8, 4)), ("lm_head.weight", "BF16", (8, 4))]


def test_shared_storage_is_refused_at_prewarm_unless_declared_tied():
    reg = dcr.Registry(TIED)
    m = TiedModel()
    # Undeclared: the loader writes both tensors into one storage; prewarm refuses, naming both.
    with pytest.raises(dcr.UnsupportedLoaderPath,
                       match=r"tensors '(embed|lm_head)\.weight' and '(embed|lm_head)\.weight' are "
                             r"written into the same storage.*does not declare them tied"):
        dcr.Receiver(reg, m.load_state_dict).prewarm()
    # Declared: accepted, both tensors overwrite-only.
    rx = dcr.Receiver(reg, m.load_state_dict, tied=[("embed.weight", "lm_head.weight")]).prewarm()
    reports = {r["tensor"]: r for r in rx.placement_report()}
    assert reports["embed.weight"]["overwrite_only"] and reports["lm_head.weight"]["overwrite_only"]
    assert sorted(rx.overwrite_only_tensors()) == ["embed.weight", "lm_head.weight"]
    # A refit through the tie is bit-exact: the trainer keeps both tensors bit-equal, and its
    # owner is told (as the protocol tells it) that they take overwrite records only.
    tasks = [dcr.AffineTask(reg, name, dcr.replicated([8, 4]), name) for name, _, _ in TIED]
    owner = dcr.Owner(reg, 0, tasks)
    owner.set_overwrite_only(rx.overwrite_only_tensors())
    before = torch.randn(8, 4).to(torch.bfloat16)
    after = before.clone()
    after[0, 1] = -after[0, 1]
    after[5] = after[5] * 3
    after[7, 3] = float("nan")
    owner.initialize([before, before.clone()])
    rx.load({"embed.weight": before, "lm_head.weight": before})
    assert torch.equal(m.embed.weight.detach().view(torch.int16), before.view(torch.int16))
    rx.begin_attempt(0, 1)
    payloads = owner.build_payloads([after, after.clone()], 0, 1)
    assert payloads and all(rx.apply_payload(p) == "applied" for p in payloads)
    assert m.lm_head.weight.data_ptr() == m.embed.weight.data_ptr()
    assert torch.equal(m.embed.weight.detach().view(torch.int16), after.view(torch.int16))


def test_bad_payloads_change_nothing():
    reg, m, rx = tiny_receiver()
    rx.prewarm()
    before = torch.randn(4, 6).to(torch.bfloat16)
    after = before + 1
    rx.load({"lin.weight": before})
    snapshot = m.lin.weight.detach().clone()
    other = dcr.Registry([("lin.weight", "BF16", (4, 6)), ("extra", "BF16", (2,))])
    foreign = payloads_for(other, before, after)[0]
    rx.begin_attempt(0, 1)
    with pytest.raises(dcr.RegistryMismatch):
        rx.apply_payload(foreign)
    good = payloads_for(reg, before, after)[0]
    with pytest.raises(dcr.CorruptPayload):
        rx.apply_payload(good[:-9] + bytes([good[-9] ^ 1]) + good[-8:])
    rx.begin_attempt(0, 1, 1)
    with pytest.raises(dcr.StalePayload):
        rx.apply_payload(good)  # built for attempt 0
    assert torch.equal(m.lin.weight.detach(), snapshot)


def test_residual_conversion_runs_only_when_an_input_changed():
    reg = dcr.Registry([("n", "BF16", (8,))])
    calls = []

    def convert(output, inputs, out):
        calls.append(output)
        out[...] = inputs[0].astype(BF16)
    task = dcr.ResidualTask(reg, "cast n", [("n_master", "F32", (8,))], ["n"], convert)
    o = dcr.Owner(reg, 0, [], [task])
    master = np.linspace(-1, 1, 8, dtype=np.float32)
    o.initialize([], [master])
    assert calls == [0]
    assert o.build_payloads([], 0, 1, residual_inputs=[master]) == []
    assert calls == [0]
    changed = master.copy()
    changed[3] = 5
    assert len(o.build_payloads([], 0, 1, residual_inputs=[changed])) == 1
    assert calls == [0, 0] and o.stats["residual_changed_elements"] == 1

    def broken(output, inputs, out):
        raise RuntimeError("no")
    bad = dcr.Owner(reg, 0, [], [dcr.ResidualTask(reg, "bad", [("m", "F32", (8,))], ["n"], broken)])
    with pytest.raises(dcr.Error, match="residual task 'bad'.*RuntimeError"):
        bad.initialize([], [master])


def test_inspect_names_the_changed_tensors_given_the_base(tmp_path):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(3)
    old = {"a": rng.standard_normal((4, 8)).astype(np.float32),
           "b": rng.standard_normal(16).astype(np.float16),
           "c": np.arange(6, dtype=np.int32)}
    new = {k: v.copy() for k, v in old.items()}
    new["a"][1, 2] += 1
    new["c"][5] = -1
    paths = {k: str(tmp_path / f"{k}.safetensors") for k in ("old", "new")}
    save_file(old, paths["old"])
    save_file(new, paths["new"])
    delta = tmp_path / "step.dcrdelta"
    dcr.diff(paths["old"], paths["new"], delta)
    # A delta alone names no tensor: items by id only.
    alone = dcr.inspect(delta)
    assert alone["kind"] == "delta" and alone["tensors"] is None
    assert alone["changed_tensors"] == 2 and alone["records"] == 2
    assert all(it["tensor"] is None for p in alone["payloads"] for it in p["items"])
    # With its base: every tensor by name, the changed ones marked; items named too.
    info = dcr.inspect(delta, paths["old"])
    assert [t["name"] for t in info["tensors"]] == ["a", "b", "c"]
    assert {t["name"] for t in info["tensors"] if t["changed"]} == {"a", "c"}
    assert {it["tensor"] for p in info["payloads"] for it in p["items"]} == {"a", "c"}
    assert info["tensors"][0]["dtype"] == "F32" and info["tensors"][0]["shape"] == [4, 8]
    # The same fields as `dcr inspect --json`, less nothing: the base only adds names.
    assert {k: v for k, v in info.items() if k not in ("tensors", "payloads", "metadata")} == \
        {k: v for k, v in alone.items() if k not in ("tensors", "payloads", "metadata")}
    # Another checkpoint is refused as the base, as apply refuses it.
    other = str(tmp_path / "other.safetensors")
    save_file({"a": old["a"]}, other)
    with pytest.raises(dcr.RegistryMismatch):
        dcr.inspect(delta, other)


def test_owner_agent_on_two_threads_publishes_the_one_thread_payloads():
    names = [f"w{i}" for i in range(6)]
    reg = dcr.Registry([(n, "BF16", (64, 64)) for n in names])
    gen = torch.Generator().manual_seed(3)
    before = [torch.randn(64, 64, generator=gen).to(torch.bfloat16) for _ in names]
    after = [t.clone() for t in before]
    for t in after:
        t.view(-1)[::7] *= 2

    class Weights(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for n in names:
                self.register_parameter(n, torch.nn.Parameter(torch.zeros(64, 64, dtype=torch.bfloat16),
                                                              requires_grad=False))

    reports = {}
    for threads in (1, 2):
        plane, store = dcr.MemoryControlPlane(), dcr.MemoryPayloadStore()
        coordinator = dcr.Coordinator(plane, store, reg, owners=[0])
        coordinator.initialize(0)
        model = Weights()
        rx = dcr.Receiver(reg, model.load_state_dict).prewarm()
        rx.load(dict(zip(names, before)))
        receiver = dcr.ReceiverAgent("r0", rx, plane, store)
        receiver.start(version=0)
        receiver.start_thread()
        owner = dcr.Owner(reg, 0, [dcr.AffineTask(reg, n, dcr.replicated([64, 64]), n) for n in names])
        owner.initialize(before)
        agent = dcr.OwnerAgent(owner, plane, store, bucket_bytes=2048, chunk_bytes=8192,
                               build_threads=threads)
        agent.start(version=0)
        result = {}
        t = threading.Thread(target=lambda: result.__setitem__("c", coordinator.run_transition("step 1", timeout=60)))
        t.start()
        reports[threads] = agent.serve("step 1", after, timeout=60)
        t.join()
        receiver.stop()
        assert result["c"]["committed"]
        for n, a in zip(names, after):
            assert torch.equal(getattr(model, n).view(torch.int16), a.view(torch.int16))
    keys = ["built", "payloads", "payload_bytes", "records", "manifest_digest", "change_digest"]
    assert {k: reports[2][k] for k in keys} == {k: reports[1][k] for k in keys}
    assert reports[1]["payloads"] > 2
    with pytest.raises(dcr.InvalidArgument, match="build_threads"):
        dcr.OwnerAgent(owner, dcr.MemoryControlPlane(), dcr.MemoryPayloadStore(), build_threads=0)
