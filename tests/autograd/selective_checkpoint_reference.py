"""Reference values, op lists and error texts of tests/autograd/selective_checkpoint_test.cc
(development only; not run in CI):

    ~/.cache/tapegrad/torch-venv/bin/python tests/autograd/selective_checkpoint_reference.py

Each scenario builds the float64 graph of the C++ test of the same name under
torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...) with
create_selective_checkpoint_contexts, and prints: the ops the policy was asked about in the forward
("policy"), the ops each recomputation ran instead of taking a kept output ("recomputed", seen by
a dispatch mode entered below the selective-checkpoint mode, aten.detach left out: tapegrad has no
detach op), how many recomputations ran, the gradients (%r), or the error. ATen names are printed
as tapegrad's op names (mm -> matmul, ...).
"""

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (CheckpointPolicy, GraphExecGroup, checkpoint,
                                    create_selective_checkpoint_contexts)

NAMES = {
    "aten.mm.default": "matmul",
    "aten.sigmoid.default": "sigmoid",
    "aten.tanh.default": "tanh",
    "aten.mul.Tensor": "mul",
    "aten.add.Tensor": "add",
    "aten.exp.default": "exp",
    "aten.mul_.Tensor": "mul_",
}


def name(func):
    return NAMES.get(str(func), str(func))


class Log(TorchDispatchMode):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is not torch.ops.aten.detach.default:
            self.log.append(name(func))
        return func(*args, **(kwargs or {}))


def contexts(policy_or_list, recomputed, count, allow=False):
    """context_fn: the selective contexts, with a Log entered below the recompute one."""

    def context_fn():
        forward, recompute = create_selective_checkpoint_contexts(policy_or_list, allow)

        class Recompute:
            def __enter__(self):
                count.append(1)
                self.stack = contextlib.ExitStack()
                self.stack.enter_context(Log(recomputed))
                self.stack.enter_context(recompute)

            def __exit__(self, *exc):
                self.stack.close()

        return forward, Recompute()

    return context_fn


def values(n, s):
    return torch.tensor([((i * 7 + s) % 11 - 5) / 4 for i in range(n)], dtype=torch.float64)


def leaf(n, s, shape):
    return values(n, s).reshape(shape).requires_grad_()


def flat(t):
    return t.detach().reshape(-1).tolist()


def report(title, **kv):
    print(f"// {title}")
    for k, v in kv.items():
        print(f"//   {k} = {v!r}")


# KeepMatmul: PyTorch's documentation example, fn = sigmoid(mm(mm(x, y), y)) * y, mm kept.
def doc_example(x, y):
    return torch.sigmoid(torch.mm(torch.mm(x, y), y)) * y


for label, keep in [("KeepMatmul", [torch.ops.aten.mm.default]), ("RecomputeAll", [])]:
    x, y = leaf(9, 1, (3, 3)), leaf(9, 2, (3, 3))
    asked, recomputed, count = [], [], []

    def policy(ctx, op, *args, **kwargs):
        asked.append(name(op))
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    out = checkpoint(doc_example, x, y, use_reentrant=False,
                     context_fn=contexts(policy, recomputed, count))
    (out * values(9, 5).reshape(3, 3)).sum().backward()
    report(label, policy=asked, recomputed=recomputed, recomputations=len(count), x_grad=flat(x.grad),
           y_grad=flat(y.grad))

# TwoBranches: out = sigmoid(mm(x, w1)) + tanh(mm(y, w2)); grad for x, then for y (disjoint
# halves of the segment), without and with a GraphExecGroup, with nothing or mm kept.
def two_branches(x, y, w1, w2):
    return torch.sigmoid(torch.mm(x, w1)) + torch.tanh(torch.mm(y, w2))


for group in [False, True]:
    for keep in [[], [torch.ops.aten.mm.default]]:
        x, y = leaf(6, 1, (2, 3)), leaf(6, 2, (2, 3))
        w1, w2 = leaf(9, 3, (3, 3)), leaf(9, 4, (3, 3))
        recomputed, count = [], []
        out = checkpoint(two_branches, x, y, w1, w2, use_reentrant=False,
                         context_fn=contexts(keep, recomputed, count))
        title = f"TwoBranches group={group} keep={'mm' if keep else 'nothing'}"
        try:
            with GraphExecGroup() if group else contextlib.nullcontext():
                gx, = torch.autograd.grad(out.sum(), [x], retain_graph=True)
                gy, = torch.autograd.grad(out.sum(), [y], retain_graph=True)
            report(title, recomputed=recomputed, recomputations=len(count), x_grad=flat(gx),
                   y_grad=flat(gy))
        except RuntimeError as e:
            report(title, recomputed=recomputed, recomputations=len(count), error=str(e))

# OverlapInOneGroup: two backward calls of one group that need the same saved tensors.
x, y = leaf(9, 1, (3, 3)), leaf(9, 2, (3, 3))
out = checkpoint(doc_example, x, y, use_reentrant=False,
                 context_fn=contexts([torch.ops.aten.mm.default], [], []))
try:
    with GraphExecGroup():
        torch.autograd.grad(out.sum(), [x], retain_graph=True)
        torch.autograd.grad(out.sum(), [y], retain_graph=True)
except Exception as e:
    report("OverlapInOneGroup", error=str(e))

# KeptOutputModifiedInPlace: h = mm(x, y) kept, then h.mul_(2) inside the segment.
def mutating(x, y):
    h = torch.mm(x, y)
    h.mul_(2)
    return torch.exp(h) * y


for allow in [False, True]:
    x, y = leaf(9, 1, (3, 3)), leaf(9, 2, (3, 3))
    recomputed = []
    out = checkpoint(mutating, x, y, use_reentrant=False,
                     context_fn=contexts([torch.ops.aten.mm.default], recomputed, [], allow))
    try:
        out.sum().backward()
        report(f"KeptOutputModifiedInPlace allow={allow}", recomputed=recomputed,
               x_grad=flat(x.grad), y_grad=flat(y.grad))
    except RuntimeError as e:
        report(f"KeptOutputModifiedInPlace allow={allow}", error=str(e))

# Reference without checkpointing, for the gradients above.
x, y = leaf(9, 1, (3, 3)), leaf(9, 2, (3, 3))
(doc_example(x, y) * values(9, 5).reshape(3, 3)).sum().backward()
report("DocExampleWithoutCheckpoint", x_grad=flat(x.grad), y_grad=flat(y.grad))

try:
    checkpoint(doc_example, x, y, use_reentrant=True,
               context_fn=lambda: create_selective_checkpoint_contexts([]))
except ValueError as e:
    report("ReentrantRefusesContextFn", error=str(e))

# LastKeptOpIsNeverTaken: fn(v) = tanh(v) * v with the mul kept; the recomputation stops on the
# mul's saved inputs, before the mul, so its kept output is never taken: modifying it after the
# forward and backpropagating twice are both fine.
x = leaf(3, 1, (3,))
out = checkpoint(lambda v: torch.tanh(v) * v, x, use_reentrant=False,
                 context_fn=lambda: create_selective_checkpoint_contexts([torch.ops.aten.mul.Tensor]))
out.mul_(2)
out.sum().backward(retain_graph=True)
first = flat(x.grad)
out.sum().backward()
report("LastKeptOpIsNeverTaken", first=first, second=flat(x.grad))
