#!/usr/bin/env python3
"""PyTorch baselines of tools/bench/train_step.cc: the same models, batches, optimizer and
thread settings, timed the same way (median of N steps after 3 warm-up steps), in each of
PyTorch's usual ways to run them, so that tapegrad is compared with PyTorch's fastest.

Writes one JSON line per (model, dtype, threads, variant) that `train_step --pytorch_json=FILE`
reads; train_step takes the fastest variant of each row:
  {"model": "gpt", "dtype": "bf16", "threads": 2, "variant": "compile", "ms_per_step": 12.3,
   "torch": "2.15.0", "core_ns": [68.2, 70.1]}
A line without "variant" (files from before variants) is "eager". "core_ns" (with --core-probe,
the path of bazel-bin/tools/bench/core_round_trip) is the cache-line round trip between two CPUs
just before and just after the timed steps (tools/bench/core_latency.h): train_step compares a
row only with timings taken in the same placement of the VM's CPUs.

Variants (--variants, default all three; `--no-compile` drops compile, which takes a while):
  eager     today's models as written: the GPT's attention is F.scaled_dot_product_attention.
  composed  the GPT and the Llama ("eager_composed_attention"): attention composed from plain ops
            (q @ k^T * scale, causal mask, softmax, @ v), which on some CPUs beats the fused SDPA
            kernel (issue 32: bf16 SDPA on a CPU without AMX is 2.2x slower). Not run for the
            MLP and CNN, which have no attention.
  compile   torch.compile(model) (default mode, inductor) of the eager model, as users write it:
            forward and backward run compiled; zero_grad, GradScaler, clip_grad_norm_ and the
            fused AdamW step stay eager (the fused AdamW is already one kernel per dtype group).
            Compilation happens in the warm-up steps, which are not timed.

  py=$(tools/bench/setup_pytorch_venv.sh | tail -1)
  $py tools/bench/train_step_pytorch.py --threads 1 --out /tmp/pt.jsonl
  OMP_NUM_THREADS=1 bazel-bin/tools/bench/train_step --pytorch_json=/tmp/pt.jsonl

The step matches train/train_step.cc's TrainStep: zero_grad, forward under the precision (f16 and
bf16 through torch.autocast; f16 with a GradScaler, as tapegrad's "auto" scaler), backward,
clip_grad_norm_(1.0), AdamW (lr 1e-4, betas (0.9, 0.999), eps 1e-8, no weight decay; fused, as
tapegrad's). tapegrad's f16/bf16 rows keep f16/bf16 weights with f32 masters; PyTorch's autocast
keeps f32 weights and casts them per op: each side's usual recipe.
"""
import argparse
import itertools
import json
import math
import statistics
import subprocess
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def image_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def image_cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def composed_causal_attention(q, k, v):
    """F.scaled_dot_product_attention(q, k, v, is_causal=True) from plain ops, as a PyTorch user
    writes it without SDPA (nanoGPT's slow path): (B, H, T, D) -> (B, H, T, D)."""
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return att @ v


class Block(nn.Module):
    """nn/transformer.cc's TransformerBlock: pre-LN, causal attention, 4x GELU-tanh MLP."""

    def __init__(self, c, n_head, composed_attention=False):
        super().__init__()
        self.n_head = n_head
        self.composed_attention = composed_attention
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc0 = nn.Linear(c, 4 * c)
        self.fc1 = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        heads = lambda z: z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        if self.composed_attention:
            y = composed_causal_attention(heads(q), heads(k), heads(v))
        else:
            y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc1(F.gelu(self.fc0(self.ln2(x)), approximate="tanh"))


class TinyGpt(nn.Module):
    """nn::GptConfig::Tiny(65): 2 layers, 4 heads, 64 wide, context 64, tied head."""

    def __init__(self, vocab=65, block=64, n_layer=2, n_head=4, c=64, composed_attention=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(block, c)
        self.blocks = nn.ModuleList(
            Block(c, n_head, composed_attention) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(c)
        for name, p in self.named_parameters():
            if "ln" in name:
                continue
            if p.dim() == 1:
                nn.init.zeros_(p)
            else:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("proj.weight", "fc1.weight")) else 0.02
                nn.init.normal_(p, 0, std)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


class RmsNorm(nn.Module):
    """transformers' LlamaRMSNorm: the variance in f32, the normalised value back in x's dtype,
    then times the weight."""

    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaLayer(nn.Module):
    """nn/models/llama.cc's LlamaDecoderLayer: RMSNorm, rotary q and k, grouped-query causal
    attention, SwiGLU MLP, no biases."""

    def __init__(self, c, n_head, n_kv, inter, composed_attention=False):
        super().__init__()
        self.n_head, self.n_kv, self.d = n_head, n_kv, c // n_head
        self.composed_attention = composed_attention
        self.input_layernorm = RmsNorm(c)
        self.q_proj = nn.Linear(c, n_head * self.d, bias=False)
        self.k_proj = nn.Linear(c, n_kv * self.d, bias=False)
        self.v_proj = nn.Linear(c, n_kv * self.d, bias=False)
        self.o_proj = nn.Linear(n_head * self.d, c, bias=False)
        self.post_attention_layernorm = RmsNorm(c)
        self.gate_proj = nn.Linear(c, inter, bias=False)
        self.up_proj = nn.Linear(c, inter, bias=False)
        self.down_proj = nn.Linear(inter, c, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        h = self.input_layernorm(x)
        heads = lambda z, n: z.view(b, t, n, self.d).transpose(1, 2)
        q = heads(self.q_proj(h), self.n_head)
        k = heads(self.k_proj(h), self.n_kv)
        v = heads(self.v_proj(h), self.n_kv)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_head // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if self.composed_attention:
            y = composed_causal_attention(q, k, v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, c))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLlama(nn.Module):
    """train_llama's default: 2 layers, 64 wide, 4 query heads on 2 key/value heads, SwiGLU 192,
    rope_theta 1e4, untied head; N(0, 0.02) weights, as nn/models/llama.cc."""

    def __init__(self, vocab=65, block=64, n_layer=2, n_head=4, n_kv=2, c=64, inter=192,
                 composed_attention=False):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, c)
        self.layers = nn.ModuleList(
            LlamaLayer(c, n_head, n_kv, inter, composed_attention) for _ in range(n_layer))
        self.norm = RmsNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0, 0.02)
        d = c // n_head
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(block, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


DTYPES = {"f32": None, "f16": torch.float16, "bf16": torch.bfloat16}
# --variants names -> the "variant" field of the JSON lines.
VARIANTS = {"eager": "eager", "composed": "eager_composed_attention", "compile": "compile"}


def core_round_trip_ns(probe):
    """The probe binary's figure (None for "nan": one CPU), or None without a probe."""
    if not probe:
        return None
    value = float(subprocess.run([probe], check=True, capture_output=True, text=True).stdout)
    return None if math.isnan(value) else value


def measure(model, dtype, steps, make_loss, probe=None):
    """`model` holds the parameters the optimizer steps; `make_loss` may call a compiled wrapper
    of it (which shares those parameters). Returns ms/step and the core round trips (`probe`)
    just before and just after the timed steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    amp_dtype = DTYPES[dtype]
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == "f16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
            loss = make_loss()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        return loss.item()

    for _ in range(3):
        step()
    core_ns = [core_round_trip_ns(probe)]
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    core_ns.append(core_round_trip_ns(probe))
    return 1e3 * sorted(times)[len(times) // 2], core_ns


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per configuration")
    parser.add_argument("--models", default="mlp,cnn,gpt", help="mlp, cnn, gpt, llama")
    parser.add_argument("--dtypes", default="f32,f16,bf16")
    parser.add_argument("--variants", default="eager,composed,compile",
                        help="comma-separated subset of eager, composed (GPT only), compile")
    parser.add_argument("--no-compile", action="store_true",
                        help="drop compile from --variants (torch.compile takes a while)")
    parser.add_argument("--out", required=True, help="JSON lines file to write")
    parser.add_argument("--core-probe", default="",
                        help="path of tools/bench:core_round_trip: record the core round trip "
                             "around each timing (\"core_ns\")")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        parser.error(f"--variants={args.variants}: expected a comma-separated subset of "
                     f"{','.join(VARIANTS)}")
    if args.no_compile:
        variants = [v for v in variants if v != "compile"]

    gen = torch.Generator().manual_seed(0)
    images = torch.randn(128, 1, 28, 28, generator=gen)
    labels = torch.randint(0, 10, (128,), generator=gen)
    tokens = torch.randint(0, 65, (32, 65), generator=gen)
    x, y = tokens[:, :64].contiguous(), tokens[:, 1:].contiguous()
    with open(args.out, "w") as out:
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            rows = itertools.product(args.models.split(","), args.dtypes.split(","), variants)
            for name, dtype, variant in rows:
                language = name in ("gpt", "llama")
                if variant == "composed" and not language:
                    continue  # no attention to compose: the same as eager
                torch.manual_seed(1)
                if name == "gpt":
                    model = TinyGpt(composed_attention=variant == "composed")
                elif name == "llama":
                    model = TinyLlama(composed_attention=variant == "composed")
                else:
                    model = image_mlp() if name == "mlp" else image_cnn()
                if variant == "compile":
                    torch._dynamo.reset()  # a fresh compile per row, nothing cached from the last
                    run = torch.compile(model)
                else:
                    run = model
                if language:
                    loss = lambda: F.cross_entropy(run(x).flatten(0, 1), y.flatten())
                else:
                    loss = lambda: F.cross_entropy(run(images), labels)
                ms, core_ns = measure(model, dtype, args.steps, loss, args.core_probe)
                record = {"model": name, "dtype": dtype, "threads": threads,
                          "variant": VARIANTS[variant], "ms_per_step": ms,
                          "torch": torch.__version__}
                if args.core_probe:
                    record["core_ns"] = core_ns
                print(json.dumps(record), flush=True)
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
