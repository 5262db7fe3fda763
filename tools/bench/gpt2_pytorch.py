"""PyTorch baseline of the GPT-2 124M training benchmark (runs on the GPU machine only).

GPT-2 small (12 layers, 12 heads, width 768, vocab 50304, context 1024, tied embeddings, GELU
tanh, pre-LN) trained on random tokens: f32 model and master weights, bf16 autocast, fused AdamW
(lr 6e-4, betas 0.9/0.95, weight decay 0.1), F.scaled_dot_product_attention(is_causal=True).
For each mode (eager, torch.compile) and micro-batch it runs warm-up steps, then timed steps
between two cuda synchronizations, and prints one JSON line: tokens/s, ms/step, peak memory
(torch.cuda.max_memory_allocated) and MFU. A micro-batch that runs out of memory is reported as
such, and a last line per mode names the largest micro-batch that fit.

    python3 tools/bench/gpt2_pytorch.py --batches 4,16,32 --modes eager,compile
"""

import argparse
import gc
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 50304, 1024, 12, 12, 768
PEAK_BF16_FLOPS = 989e12  # H100 SXM dense bf16; the H200 has the same tensor cores and clocks


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.fc_proj = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one parameter
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2's init; residual projections scaled by depth
                std = 0.02 / math.sqrt(2 * LAYERS) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def run(mode, batch, args):
    """One (mode, micro-batch) measurement; returns its JSON record."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = GPT2().cuda()
    # N = all parameters, the tied embedding counted once (llm.c's MFU convention).
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), fused=True)
    step_model = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, VOCAB, (batch, args.seq), device="cuda")
    y = torch.randint(0, VOCAB, (batch, args.seq), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_model(x)
            loss = F.cross_entropy(logits.view(-1, VOCAB).float(), y.view(-1))
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):  # includes torch.compile's compilation
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    tokens_per_s = batch * args.seq / seconds
    # llm.c: 6 flops per parameter per token (forward + backward) plus 6 * L * C * T for the
    # attention scores and their weighted sum.
    flops_per_token = 6 * n_params + 6 * LAYERS * WIDTH * args.seq
    return {"mode": mode, "batch": batch, "seq": args.seq, "tokens_per_s": round(tokens_per_s),
            "ms_per_step": round(seconds * 1e3, 2),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "mfu": round(tokens_per_s * flops_per_token / PEAK_BF16_FLOPS, 4),
            "params": n_params, "loss": round(loss.item(), 4),
            "device": torch.cuda.get_device_name()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="4,16,32", help="micro-batch sizes, comma-separated")
    parser.add_argument("--modes", default="eager,compile", help="eager and/or compile")
    parser.add_argument("--seq", type=int, default=CONTEXT)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True  # f32 matmuls outside autocast (none expected)
    torch.backends.cudnn.allow_tf32 = True
    for mode in args.modes.split(","):
        largest = None
        for batch in sorted(int(b) for b in args.batches.split(",")):
            try:
                record = run(mode, batch, args)
                largest = batch
            except torch.cuda.OutOfMemoryError:
                record = {"mode": mode, "batch": batch, "seq": args.seq, "oom": True}
            print(json.dumps(record), flush=True)
            gc.collect()  # the failed run's model and optimizer state, before the next one
            torch.cuda.empty_cache()
            if record.get("oom"):
                break  # larger micro-batches need more memory still
        print(json.dumps({"mode": mode, "largest_batch_that_fits": largest}), flush=True)


if __name__ == "__main__":
    main()
