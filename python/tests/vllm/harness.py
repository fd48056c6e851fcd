"""Shared pieces of the vllm suite: tiny random models written as safetensors, engines."""
import json
import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PROMPTS = [[1, 5, 9, 13, 2], [7, 3, 3, 8]]


def llama_config(tied=False, **kw):
    import transformers
    c = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=128,
             tie_word_embeddings=tied, torch_dtype="bfloat16", rms_norm_eps=1e-5,
             bos_token_id=1, eos_token_id=2)
    c.update(kw)
    return transformers.LlamaConfig(**c)


def moe_config(**kw):
    import transformers
    c = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
             num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True,
             max_position_embeddings=128, tie_word_embeddings=False, torch_dtype="bfloat16",
             bos_token_id=1, eos_token_id=2, mlp_only_layers=[])
    c.update(kw)
    return transformers.Qwen3MoeConfig(**c)


def make_model(config, seed=0):
    import torch
    import transformers
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)


def write_checkpoint(model, directory, tensors):
    """config.json + model.safetensors (the given checkpoint-named BF16 tensors)."""
    from safetensors.torch import save_file
    os.makedirs(directory, exist_ok=True)
    cfg = model.config.to_dict()
    cfg["torch_dtype"] = "bfloat16"
    cfg["dtype"] = "bfloat16"
    cfg["architectures"] = [type(model).__name__]
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(directory, "model.safetensors"),
              metadata={"format": "pt"})
    return [os.path.join(directory, "model.safetensors")]


def engine(directory, tp=1):
    from vllm import LLM
    kw = {}
    if tp > 1:
        kw = dict(tensor_parallel_size=tp, distributed_executor_backend="mp")
    return LLM(model=directory, skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
               gpu_memory_utilization=0.08, worker_extension_cls="dcr.vllm.WorkerExtension",
               max_model_len=128, max_num_seqs=4, **kw)


def greedy(llm, n=8):
    from vllm import SamplingParams
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]
