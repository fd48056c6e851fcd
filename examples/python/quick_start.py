"""The README's Python quick start, runnable: a torch model refit in place through its own
load_state_dict, compiled at prewarm (one owner, one receiver, payloads handed over directly)."""
import torch, dcr
model = torch.nn.Sequential(torch.nn.Linear(8, 4, dtype=torch.bfloat16))
bf16_state_dict = {k: v.detach().clone() for k, v in model.state_dict().items()}
new_bf16_state_dict = {k: v + 1 for k, v in bf16_state_dict.items()}
reg = dcr.Registry.from_tensors(bf16_state_dict)
rx = dcr.Receiver(reg, model.load_state_dict).prewarm()  # the model's own loader, compiled
owner = dcr.Owner(reg, 0, [dcr.AffineTask(reg, n, dcr.replicated(t.shape), n) for n, t in bf16_state_dict.items()])
owner.initialize(list(bf16_state_dict.values()))
rx.begin_attempt(0, 1)
for p in owner.build_payloads(list(new_bf16_state_dict.values()), 0, 1):
    rx.apply_payload(p)                                   # C++ only: no Python per element
assert all(torch.equal(model.state_dict()[k], new_bf16_state_dict[k]) for k in reg.names()); print("readme ok")
