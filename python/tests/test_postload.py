"""Weights an engine rewrites after loading (dcr.PostLoad): permutations compiled into placement,
other rewrites re-run from a loader-layout copy, refusals at prewarm. Toy torch engines whose
post-load steps do what vLLM's do (transpose, interleave, prepack into hidden state, value
transforms), refit through payloads and checked bit for bit against a fresh engine."""
import pytest
import torch

import dcr


class Engine(torch.nn.Module):
    """A two-layer engine: `a` keeps its loaded weight, `b`'s post-load step is `kind`."""

    def __init__(self, kind):
        super().__init__()
        self.a = torch.nn.Linear(8, 6, bias=False, dtype=torch.bfloat16)
        self.b = torch.nn.Linear(6, 4, bias=False, dtype=torch.bfloat16)
        self.kind = kind
        for p in self.parameters():
            p.requires_grad_(False)
        self.layout = {"weight": self.b.weight.detach().to("meta")}

    def load_weights(self, weights):
        for name, w in weights:
            if name == "a.weight":
                self.a.weight.copy_(w)
            elif name == "b.weight":
                self.b.weight.copy_(w)

    def step(self, m):
        w = m.weight
        if self.kind == "transpose":        # a permutation into new storage
            m.weight = torch.nn.Parameter(w.t().contiguous(), requires_grad=False)
        elif self.kind == "interleave":     # rows interleaved in place
            m.weight.data.copy_(torch.cat([w[0::2], w[1::2]]))
        elif self.kind == "prepack":        # the weight emptied into hidden state
            packed = w.detach().clone()
            m.kernel = lambda x: x @ packed.t()
            m.weight = torch.nn.Parameter(torch.empty(0, dtype=w.dtype), requires_grad=False)
        elif self.kind == "scale":          # a value transform
            m.weight = torch.nn.Parameter(w * 2, requires_grad=False)

    def post_load(self, rerun=True):
        return dcr.PostLoad(self, [dcr.PostLoadUnit("b", self.b, self.layout, self.step, rerun=rerun)])

    def forward(self, x):
        h = self.a(x)
        if self.kind == "transpose":
            return h @ self.b.weight
        if self.kind == "interleave":
            w = self.b.weight
            return h @ torch.stack([w[i // 2] if i % 2 == 0 else w[2 + i // 2] for i in range(4)]).t()
        if self.kind == "prepack":
            return self.b.kernel(h)
        return h @ (self.b.weight / 2).t()


def weights(seed):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(6, 8, generator=g).to(torch.bfloat16),
            "b.weight": torch.randn(4, 6, generator=g).to(torch.bfloat16)}


def fresh(kind, w):
    e = Engine(kind)
    with torch.no_grad():
        e.load_weights(iter(w.items()))
        e.step(e.b)
    return e


def refit(kind, rerun=True):
    """Engine at weights(0), refit to weights(1) through payloads; returns (engine, receiver)."""
    w0, w1 = weights(0), weights(1)
    w1["b.weight"][1, 2] = w0["b.weight"][1, 2]      # some elements unchanged
    e = fresh(kind, w0)
    reg = dcr.Registry.from_tensors(w0)
    rx = dcr.Receiver(reg, e.load_weights, mode="weights", post_load=e.post_load(rerun)).prewarm()
    if rx.needs_dense_load():
        rx.load(w0)
    tasks = [dcr.AffineTask(reg, n, dcr.replicated(tuple(t.shape)), n) for n, t in w0.items()]
    owner = dcr.Owner(reg, 0, tasks, [])
    owner.set_overwrite_only(rx.overwrite_only_tensors())
    owner.initialize(list(w0.values()))
    rx.begin_attempt(0, 1)
    for p in owner.build_payloads(list(w1.values()), 0, 1):
        rx.apply_payload(p)
    rx.end_transition(1)
    return e, rx, w1


def assert_same_engine(e, ref):
    for (n, p), (_, q) in zip(e.named_parameters(), ref.named_parameters()):
        assert p.dtype == q.dtype and p.shape == q.shape, n
        assert torch.equal(p.view(torch.int16), q.view(torch.int16)), n
    x = torch.randn(3, 8).to(torch.bfloat16)
    assert torch.equal(e(x).view(torch.int16), ref(x).view(torch.int16))


@pytest.mark.parametrize("kind", ["transpose", "interleave"])
def test_permutations_are_compiled_into_placement(kind):
    e, rx, w1 = refit(kind)
    (unit,) = rx.post_load_report()
    assert unit["kind"] == "permutation" and unit["extra_bytes"] == 0
    assert rx.post_load_extra_bytes == 0
    assert not rx.needs_dense_load()
    assert "b.weight" not in rx.overwrite_only_tensors()   # XOR records stay exact
    assert_same_engine(e, fresh(kind, w1))


@pytest.mark.parametrize("kind", ["prepack", "scale"])
def test_other_rewrites_rerun_the_step_from_a_loader_layout_copy(kind):
    e, rx, w1 = refit(kind)
    (unit,) = rx.post_load_report()
    assert unit["kind"] == "rerun", unit
    assert unit["extra_bytes"] == 4 * 6 * 2 == rx.post_load_extra_bytes
    assert_same_engine(e, fresh(kind, w1))


def test_rerun_without_the_initial_dense_load_is_refused():
    e = fresh("prepack", weights(0))
    reg = dcr.Registry.from_tensors(weights(0))
    rx = dcr.Receiver(reg, e.load_weights, mode="weights", post_load=e.post_load()).prewarm()
    assert rx.needs_dense_load()
    with pytest.raises(dcr.NotReady, match="load"):
        dcr.ReceiverAgent("r", rx, dcr.MemoryControlPlane(), dcr.MemoryPayloadStore()).start(0)


@pytest.mark.parametrize("kind,why", [("prepack", "keeps state dcr cannot see.*kernel"),
                                      ("scale", "not the loader's elements")])
def test_a_step_that_cannot_be_rerun_is_refused_at_prewarm_naming_the_tensor(kind, why):
    e = fresh(kind, weights(0))
    before = e.b.weight.clone()
    reg = dcr.Registry.from_tensors(weights(0))
    with pytest.raises(dcr.UnsupportedLoaderPath, match=r"'b\.weight' \(b: .*" + why + ".*not allowed"):
        dcr.Receiver(reg, e.load_weights, mode="weights", post_load=e.post_load(rerun=False)).prewarm()
    assert torch.equal(e.b.weight, before)      # the engine is put back as it was


def test_a_step_that_fails_on_probes_is_refused():
    e = fresh("transpose", weights(0))

    def broken(m):
        raise RuntimeError("kernel unavailable")
    post = dcr.PostLoad(e, [dcr.PostLoadUnit("b", e.b, e.layout, broken)])
    with pytest.raises(dcr.UnsupportedLoaderPath, match=r"'b\.weight'.*failed on probe weights.*kernel unavailable"):
        dcr.Receiver(dcr.Registry.from_tensors(weights(0)), e.load_weights, mode="weights", post_load=post).prewarm()


def test_a_copy_into_storage_the_engine_replaced_is_refused():
    # The engine replaced b.weight after loading, but nobody declared its step: the loader
    # writes storage the model no longer holds.
    e = fresh("transpose", weights(0))
    stale = e.b.weight

    def loader(ws):
        for name, w in ws:
            if name == "a.weight":
                e.a.weight.copy_(w)
            else:
                stale.copy_(w.t())
    e.b.weight = torch.nn.Parameter(stale.t().contiguous(), requires_grad=False)
    post = dcr.PostLoad(e, [])
    with pytest.raises(dcr.UnsupportedLoaderPath, match=r"'b\.weight' writes storage the model no longer holds"):
        dcr.Receiver(dcr.Registry.from_tensors(weights(0)), loader, mode="weights", post_load=post).prewarm()
