#!/usr/bin/env python3
"""Saves tiny transformers LlamaForCausalLM, Qwen2ForCausalLM and MistralForCausalLM models
(grouped-query attention: 4 query heads on 2 key/value heads) with their outputs, for
tests/nn/llama_test.cc:

  ~/.cache/tapegrad/torch-venv/bin/python tests/nn/llama_reference.py

tests/nn/testdata/<family>_tiny/model.safetensors: the model's state_dict (transformers' names, f32);
expected.safetensors: for tokens[b][t] = (7 b + 5 t + 3) % 32 ([2, 6]) the logits, the loss
(cross-entropy of each position's next token, mean) and the loss's gradient of every parameter
("grad.<name>"). Seeded: rerunning writes the same files.
"""
import os

import torch
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")
SHAPE = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
             tie_word_embeddings=False, attn_implementation="eager")
# llama_tiny; qwen2_tiny (biases on q, k and v, none on o); mistral_tiny (no sliding window), each
# with the same shape.
FAMILIES = [
    ("llama_tiny", LlamaConfig, LlamaForCausalLM, {}),
    ("qwen2_tiny", Qwen2Config, Qwen2ForCausalLM, {"use_sliding_window": False}),
    ("mistral_tiny", MistralConfig, MistralForCausalLM, {"sliding_window": None}),
]


def save(name, config_class, model_class, extra):
    here = os.path.join(TESTDATA, name)
    torch.manual_seed(0)
    model = model_class(config_class(**SHAPE, **extra)).float()
    write(model, here)


def write(model, HERE):
    # Norm weights away from 1 and biases away from 0, so that a norm applied in the wrong place
    # or a missing bias shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    tokens = torch.tensor([[(7 * b + 5 * t + 3) % 32 for t in range(6)] for b in range(2)])
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 32),
                                             tokens[:, 1:].reshape(-1))
    loss.backward()
    os.makedirs(HERE, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(HERE, "model.safetensors"))
    expected = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        expected["grad." + name] = p.grad.contiguous()
    save_file(expected, os.path.join(HERE, "expected.safetensors"))
    print("saved", HERE, "loss", loss.item())


for family in FAMILIES:
    save(*family)
