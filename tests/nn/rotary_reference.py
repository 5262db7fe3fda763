#!/usr/bin/env python3
"""Prints what transformers' Llama rotary embedding gives for small cases, as the literals of
tests/nn/rotary_test.cc.

  ~/.cache/tapegrad/torch-venv/bin/python tests/nn/rotary_reference.py

Cases: inv_freq for head_dim 16 with rope_theta 10000 (default) and with Llama 3.1's
rope_scaling ("llama3", factor 8, low 1, high 4, original 8192, theta 500000, and original 16 so
that every branch is taken with 8 frequencies); cos/sin at positions 0..5; and
apply_rotary_pos_emb on q[b][h][t][d] = sin(0.3 b + 0.7 h + 1.1 t + 0.13 d) in f32 and bf16.
"""
import math

import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import (LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

HEAD_DIM, HEADS, T = 16, 2, 6


def config(theta, scaling):
    params = {"rope_theta": theta, "rope_type": "default"}
    if scaling is not None:
        params.update(rope_type="llama3", **scaling)
    return LlamaConfig(hidden_size=HEAD_DIM * HEADS, num_attention_heads=HEADS,
                       head_dim=HEAD_DIM, max_position_embeddings=131072, rope_parameters=params)


def emit(name, values):
    line = f"const std::vector<double> k{name} = {{"
    out = []
    for n, v in enumerate(values):
        item = repr(float(v)) + ("};" if n + 1 == len(values) else ",")
        if len(line) + 1 + len(item) > 100:
            out.append(line)
            line = "    " + item
        else:
            line += ("" if line.endswith("{") else " ") + item
    out.append(line)
    print("\n".join(out))


print(f"// torch {torch.__version__}, transformers {transformers.__version__}, "
      "tests/nn/rotary_reference.py")
cases = [
    ("Default", config(10000.0, None)),
    ("Llama3", config(500000.0, dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=8192))),
    ("Llama3Short", config(500000.0, dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=16))),
]
for name, cfg in cases:
    rope_type = cfg.rope_parameters["rope_type"]
    if rope_type == "default":
        inv, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        inv, _ = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
    emit(f"InvFreq{name}", inv.tolist())

cfg = cases[0][1]
rope = LlamaRotaryEmbedding(cfg)
q = torch.tensor([[[[math.sin(0.3 * b + 0.7 * h + 1.1 * t + 0.13 * d) for d in range(HEAD_DIM)]
                    for t in range(T)] for h in range(HEADS)] for b in range(2)])
positions = torch.arange(T)[None, :]
for dtype, name in [(torch.float32, "F32"), (torch.bfloat16, "Bf16")]:
    x = q.to(dtype)
    cos, sin = rope(x, positions)
    if dtype == torch.float32:
        emit("Cos", cos[0].flatten().tolist())
        emit("Sin", sin[0].flatten().tolist())
    rotated, _ = apply_rotary_pos_emb(x, x, cos, sin)
    emit(f"Rotated{name}", rotated.float().flatten().tolist())
