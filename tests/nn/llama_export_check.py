#!/usr/bin/env python3
"""Loads directories that tapegrad's train_llama --export_hf wrote in transformers and compares
their logits with those transformers computed from the checkpoint they were converted from
(tests/nn/llama_io_reference.py's expected.safetensors):

  bazel run -c opt //tools:train_llama -- --init_from=$PWD/tests/nn/testdata/hf_llama_gqa_llama3 \
      --steps=0 --export_hf=/tmp/llx/llama --export_dtype=f32
  ~/.cache/tapegrad/torch-venv/bin/python tests/nn/llama_export_check.py \
      /tmp/llx/llama=tests/nn/testdata/hf_llama_gqa_llama3 ...

Prints, for each EXPORT=SOURCE pair, the model class transformers chose, its dtype and the
largest |logit difference|; exits 1 when one is not 0 (the exported tensors are the source's
bits and config.json must describe the same model, rotary scaling included).
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

VOCAB = 48
TOKENS = torch.tensor([[(7 * b + 5 * t + 3) % VOCAB for t in range(7)] for b in range(2)])

failed = False
for pair in sys.argv[1:]:
    export, source = pair.split("=")
    model = AutoModelForCausalLM.from_pretrained(export, attn_implementation="eager").eval()
    expected = load_file(f"{source}/expected.safetensors")["logits"]
    with torch.no_grad():
        logits = model(TOKENS).logits
    diff = (logits.float() - expected.float()).abs().max().item()
    print(f"{export}: {type(model).__name__} {model.dtype}: max |logit difference| {diff}")
    failed |= diff != 0
sys.exit(1 if failed else 0)
