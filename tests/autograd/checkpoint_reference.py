"""Reference event orders, values and error texts of tests/autograd/checkpoint_semantics_test.cc
(development only; not run in CI).

Each scenario below builds the same small float64 graph as the C++ test of the same name, with
non-reentrant checkpointing (torch.utils.checkpoint.checkpoint(..., use_reentrant=False), whose
defaults tapegrad follows: early stop on, determinism check of shape/dtype/device), and prints
the events, the gradients and PyTorch's error texts (tapegrad words its errors in its own style
but names the same counts and positions):

    /root/.cache/tapegrad/torch-venv/bin/python tests/autograd/checkpoint_reference.py

Event lines: "fwd <name>" / "bwd <name>" from the custom function Tag (saves its input, or
nothing when named "tail"), "x hook <grad>" from a tensor hook; a gradient prints as [v, ...]
with %g, "undef" when None.
"""

import torch
from torch.utils.checkpoint import checkpoint


def fmt(t):
    if t is None:
        return "undef"
    return "[" + ", ".join(f"{v:g}" for v in t.detach().reshape(-1).tolist()) + "]"


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def emit(name, events, values):
    print(f"// {name}")
    print("const std::vector<std::string> k" + name + "Events = {")
    for e in events:
        print(f'    "{e}",')
    print("};")
    for key, value in values.items():
        print(f"// {name}: {key} = {value!r}")
    print()


EVENTS = []


class Tag(torch.autograd.Function):
    """2 * x, logging its forward and backward; saves x unless named "tail"."""

    @staticmethod
    def forward(ctx, x, name):
        EVENTS.append(f"fwd {name}")
        ctx.name = name
        if name != "tail":
            ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        if ctx.name != "tail":
            ctx.saved_tensors
        EVENTS.append(f"bwd {ctx.name}")
        return g * 2, None


def early_stop():
    # a and b save a tensor each, tail saves none: the recomputation stops after b's save.
    EVENTS.clear()
    x = leaf([1.0])
    out = checkpoint(lambda x: Tag.apply(Tag.apply(Tag.apply(x, "a"), "b"), "tail"), x,
                     use_reentrant=False)
    out.sum().backward()
    emit("EarlyStop", EVENTS, {"x.grad": fmt(x.grad)})


def recomputation_that_saves_more():
    # y = x * x (2 saved); the recomputation also computes y * x (2 more): early stop, no error.
    calls = [0]

    def fn(x):
        calls[0] += 1
        y = x * x
        if calls[0] > 1:
            y = y * x
        return y

    x = leaf([1.5])
    checkpoint(fn, x, use_reentrant=False).sum().backward()
    emit("RecomputationThatSavesMore", [], {"x.grad": fmt(x.grad)})


def recomputation_that_saves_fewer():
    calls = [0]

    def fn(x):
        calls[0] += 1
        y = x * x
        if calls[0] == 1:
            y = y * x
        return y

    x = leaf([1.5])
    out = checkpoint(fn, x, use_reentrant=False)
    try:
        out.sum().backward()
    except Exception as e:  # CheckpointError
        emit("RecomputationThatSavesFewer", [], {"error": str(e).split("\n\n")[0]})


def recomputation_with_other_metadata():
    # reshape (a view, saves nothing) to [2, 3] in the forward, [3, 2] in the recomputation.
    calls = [0]

    def fn(x):
        calls[0] += 1
        r = x.reshape(2, 3) if calls[0] == 1 else x.reshape(3, 2)
        return r * r

    x = leaf([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    out = checkpoint(fn, x, use_reentrant=False)
    try:
        out.sum().backward()
    except Exception as e:
        emit("RecomputationWithOtherMetadata", [], {"error": str(e).split("\n\n")[0]})


class UnpackTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        ctx.saved_tensors
        ctx.saved_tensors
        return g * 2


def unpack_twice():
    x = leaf([1.0])
    out = checkpoint(lambda x: UnpackTwice.apply(x * 3), x, use_reentrant=False)
    try:
        out.sum().backward()
    except Exception as e:
        emit("UnpackTwice", [], {"error": str(e)})


class Inspect(torch.autograd.Function):
    """x * y; its backward records what the unpacked saved inputs are."""

    @staticmethod
    def forward(ctx, x, h):
        ctx.save_for_backward(x, h)
        return x * h

    @staticmethod
    def backward(ctx, g):
        x, h = ctx.saved_tensors
        for name, t in (("x", x), ("h", h)):
            gf = "-" if t.grad_fn is None else type(t.grad_fn).__name__.rstrip("0")
            EVENTS.append(f"{name} leaf={int(t.is_leaf)} requires_grad={int(t.requires_grad)} "
                          f"grad_fn={gf} {fmt(t)}")
        return g * h, g * x


def saved_inputs_keep_their_place():
    # The unpacked saved inputs are linked to the inputs' places in the graph (PyTorch gives new
    # tensor objects, `is` is False; tapegrad gives the inputs themselves).
    EVENTS.clear()
    x = leaf([2.0])
    h = x * 3
    out = checkpoint(lambda x, h: Inspect.apply(x, h), x, h, use_reentrant=False)
    out.sum().backward()
    emit("SavedInputsKeepTheirPlace", EVENTS, {"x.grad": fmt(x.grad)})


def double_backward_through_checkpoint():
    # y = x * x * x checkpointed; grad(create_graph) then backward of that gradient: the saved
    # inputs of the recomputed segment are x itself, so the second-order graph reaches x (and
    # its hook).
    EVENTS.clear()
    x = leaf([3.0])
    x.register_hook(lambda g: EVENTS.append(f"x hook {fmt(g)}"))
    y = checkpoint(lambda x: x * x * x, x, use_reentrant=False)
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    EVENTS.append(f"g {fmt(g)} requires_grad={int(g.requires_grad)}")
    g.backward()
    emit("DoubleBackwardThroughCheckpoint", EVENTS, {"x.grad": fmt(x.grad)})


def saved_tensor_hooks_copy_keeps_the_place():
    # Saved-tensor hooks that store copies (offloading): the unpacked copies of x and of x * x
    # still lead to x, so the second-order graph reaches x and its hook.
    EVENTS.clear()
    x = leaf([3.0])
    x.register_hook(lambda g: EVENTS.append(f"x hook {fmt(g)}"))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach().clone(), lambda t: t):
        y = x * x * x
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    EVENTS.append(f"g {fmt(g)} requires_grad={int(g.requires_grad)}")
    g.backward()
    emit("SavedTensorHooksCopyKeepsThePlace", EVENTS, {"x.grad": fmt(x.grad)})


if __name__ == "__main__":
    print(f"// torch {torch.__version__}")
    early_stop()
    recomputation_that_saves_more()
    recomputation_that_saves_fewer()
    recomputation_with_other_metadata()
    unpack_twice()
    saved_inputs_keep_their_place()
    double_backward_through_checkpoint()
    saved_tensor_hooks_copy_keeps_the_place()
