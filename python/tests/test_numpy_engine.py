"""The NumPy vLLM-like engine refit across processes over the file store (TP=2 owners, TP=2
engine ranks), bit-exact with a dense load through the engine's own loader after every step."""
import json

import ml_dtypes  # noqa: F401  (BF16 NumPy arrays; fail loudly where it is missing)


def test_refit_across_processes(example, tmp_path):
    out = example("refit_numpy.py", "--steps", "4", "--workdir", str(tmp_path))
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    assert len(lines) == 8
    assert all(l["bit_exact"] and l["ack"] == "applied" for l in lines)
    assert all(l["gate"]["close"] == l["step"] and l["gate"]["open"] == l["step"] for l in lines)
    trainer = [json.loads(l) for l in open(tmp_path / "trainer-0.jsonl")] + \
              [json.loads(l) for l in open(tmp_path / "trainer-1.jsonl")]
    conversions = [l["conversions"] for l in trainer if l["conversions"]]
    # The final norm (a residual task, converted in Python) changes on even steps only: its
    # conversion runs at initialize and at steps 2 and 4, never on the odd steps.
    assert conversions == [1, 2, 2, 3]
