#!/usr/bin/env python3
"""Saves tiny transformers checkpoints of the Llama family with save_pretrained, and the logits
transformers computes from them, for tests/nn/llama_io_test.cc:

  ~/.cache/tapegrad/torch-venv/bin/python tests/nn/llama_io_reference.py

tests/nn/testdata/hf_<name>/: what save_pretrained writes (config.json, model.safetensors or
model.safetensors.index.json and its shards; generation_config.json), and expected.safetensors
(read by the test only, never by the loader): for tokens[b][t] = (7 b + 5 t + 3) % 48 ([2, 7])
"logits" of the directory loaded back with from_pretrained in the checkpoint's dtype, and
"logits_f32", the logits of the same weights widened to f32 and run in f32.

- hf_llama_gqa_llama3: LlamaForCausalLM, f32, 4 query heads on 2 key/value heads, rope_scaling
  "llama3", rope_theta 500000, untied head, one file;
- hf_qwen2_bf16_sharded: Qwen2ForCausalLM (biases on q, k, v), bf16, tied head, multi-query
  attention (1 key/value head), head_dim 16 != hidden_size / heads, in three shards;
- hf_mistral_f16: MistralForCausalLM, f16, sliding_window 64 (longer than the tokens).

Check an export of tapegrad's against transformers with tests/nn/llama_export_check.py.
Seeded: rerunning writes the same files.
"""
import os

import torch
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")
VOCAB = 48
TOKENS = torch.tensor([[(7 * b + 5 * t + 3) % VOCAB for t in range(7)] for b in range(2)])
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
              max_position_embeddings=128, rms_norm_eps=1e-5, attn_implementation="eager")

CASES = [
    ("hf_llama_gqa_llama3", LlamaConfig, LlamaForCausalLM, torch.float32, None,
     dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
          rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 16})),
    ("hf_qwen2_bf16_sharded", Qwen2Config, Qwen2ForCausalLM, torch.bfloat16, "20KB",
     dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
          use_sliding_window=False,
          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    ("hf_mistral_f16", MistralConfig, MistralForCausalLM, torch.float16, None,
     dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
          sliding_window=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
]


def save(name, config_class, model_class, dtype, shard, extra):
    torch.manual_seed(0)
    config = config_class(**COMMON, **extra)
    model = model_class(config).float()
    with torch.no_grad():  # norms away from 1, biases away from 0: a misplaced one shows
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model = model.to(dtype).eval()
    here = os.path.join(TESTDATA, name)
    os.makedirs(here, exist_ok=True)
    for f in os.listdir(here):
        os.remove(os.path.join(here, f))
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(here, **kwargs)
    # The logits of the model as a user gets it back (from_pretrained keeps the rotary inverse
    # frequencies in f32; the model in memory above has had them cast to its dtype by .to()).
    loaded = model_class.from_pretrained(here, dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = loaded(TOKENS).logits
        wide = model_class(config).float().eval()
        wide.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        logits_f32 = wide(TOKENS).logits
    save_file({"logits": logits.contiguous(), "logits_f32": logits_f32.contiguous()},
              os.path.join(here, "expected.safetensors"))
    print("saved", here, sorted(os.listdir(here)))


for case in CASES:
    save(*case)
