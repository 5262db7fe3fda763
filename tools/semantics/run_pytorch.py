"""Runs oracle scenarios (JSON lines, tools/semantics/README.md) in PyTorch and prints each one's
events in the format tools/semantics:runner prints for tapegrad.

    python3 tools/semantics/run_pytorch.py scenarios.jsonl > pytorch_events.txt
"""
import functools
import json
import sys
import warnings

import torch
import torch.utils.checkpoint

# Every warning is an event (its text a comment), each time it is raised.
warnings.simplefilter("always")
CURRENT = [None]  # the running scenario's event list


def _record_warning(message, category, filename, lineno, file=None, line=None):
    CURRENT[0].append("warning")
    CURRENT[0].append("# " + str(message).splitlines()[0])


warnings.showwarning = _record_warning


# The named deliberate differences (docs/semantics.md, "The differential oracle"), applied here to
# PyTorch's events and noted in a comment line of the output.
SCALAR_ARITY = ("scalar-arity: PyTorch's tensor-by-number ops (x * 2.0, x.mul_(2.0), and the "
                "CopySlices over such an in-place op on a view) record the number as one more "
                "input whose grad_input is always None; tapegrad's MulScalar node has one input")


GRAD_ALIASING = ("grad-aliasing: PyTorch's AccumulateGrad keeps an incoming gradient as .grad "
                 "without a copy, so two leaves can hold views of one buffer and a later backward's "
                 "in-place accumulation into one changes the other; tapegrad's .grad never "
                 "aliases another's (run_pytorch.py clones them before the second backward)")


def fmt(t):
    if t is None:
        return "None"
    return "[ " + " ".join("%.17g" % v for v in t.detach().reshape(-1).tolist()) + " ]"


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class DirtyDouble(torch.autograd.Function):
    """Doubles its input in place and returns it (mark_dirty)."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Module(torch.nn.Module):
    """y = tanh(x) * 2, with the module backward hooks the op asks for."""

    def __init__(self, op, tag, ev):
        super().__init__()
        if op["pre_scale"] is not None:
            c = op["pre_scale"]
            def pre(mod, go, tag=tag, c=c):
                ev("module_pre", tag, " ".join(fmt(g) for g in go))
                return None if c == 1.0 else tuple(g * c if g is not None else None for g in go)
            self.register_full_backward_pre_hook(pre)
        if op["hook_scale"] is not None:
            c = op["hook_scale"]
            def hook(mod, gi, go, tag=tag, c=c):
                ev("module_hook", tag, " ".join(fmt(g) for g in gi), "|",
                   " ".join(fmt(g) for g in go))
                if c == 1.0 or gi[0] is None:
                    return None
                return tuple(g * c for g in gi)
            self.register_full_backward_hook(hook)

    def forward(self, x):
        return torch.tanh(x) * 2


def run(s, out):
    CURRENT[0] = out
    ev = lambda *parts: out.append(" ".join(str(p) for p in parts))
    aux = torch.tensor([1.5], dtype=torch.float64, requires_grad=True)  # for nested backwards
    t = {}
    scalar_node = {}  # tensors whose grad_fn is a tensor-by-number op (see SCALAR_ARITY)
    for leaf in s["leaves"]:
        t[leaf["name"]] = torch.tensor(leaf["values"], dtype=torch.float64,
                                       requires_grad=leaf["requires_grad"])
    try:
        for op in s["ops"]:
            a = [t[x] for x in op["args"]]
            kind = op["op"]
            if kind == "add": y = a[0] + a[1]
            elif kind == "sub": y = a[0] - a[1]
            elif kind == "mul": y = a[0] * a[1]
            elif kind == "tanh": y = torch.tanh(a[0])
            elif kind == "exp": y = torch.exp(a[0])
            elif kind == "neg": y = -a[0]
            elif kind == "mul_scalar": y = a[0] * op["scalar"]
            elif kind == "clone": y = a[0].clone()
            elif kind == "view": y = a[0].view(-1)
            elif kind == "narrow": y = a[0].narrow(0, 0, 1)
            elif kind == "custom_double": y = Double.apply(a[0])
            elif kind == "custom_dirty": y = DirtyDouble.apply(a[0])
            elif kind == "checkpoint":
                extra = {}
                if "keep" in op:
                    keep = [{"tanh": torch.ops.aten.tanh.default,
                             "mul": torch.ops.aten.mul.Tensor}[k] for k in op["keep"]]
                    extra["context_fn"] = functools.partial(
                        torch.utils.checkpoint.create_selective_checkpoint_contexts, keep)
                y = torch.utils.checkpoint.checkpoint(lambda v: torch.tanh(v) * v, a[0],
                                                      use_reentrant=op["reentrant"], **extra)
            elif kind == "module":
                y = Module(op, op["out"], ev)(a[0])
            else: raise ValueError(kind)
            if "inplace_mul" in op:
                y.mul_(op["inplace_mul"])
            t[op["out"]] = y
            # (a module without backward hooks ends in its "* 2")
            # (an in-place op on a view leaves the view a view node: its base gets the CopySlices)
            scalar_node[op["out"]] = (
                kind == "mul_scalar" or ("inplace_mul" in op and y._base is None) or (
                    kind == "module" and op["pre_scale"] is None and op["hook_scale"] is None))
            if kind == "custom_dirty":  # the input itself now has the function's node
                scalar_node[op["args"][0]] = False
            if "inplace_mul" in op and y._base is not None:
                # The write went into the base: its grad_fn is a CopySlices over the scalar op.
                for name, v in t.items():
                    if v is y._base:
                        scalar_node[name] = True
        callbacks = [0]
        for i, h in enumerate(s["hooks"]):
            x = t[h["on"]]
            tag = "%s#%d" % (h["on"], i)
            kind = h["kind"]
            if not x.requires_grad:
                ev("skip", tag)
                continue
            if kind == "tensor":
                scale = h["scale"]
                def hook(g, tag=tag, scale=scale):
                    ev("tensor_hook", tag, fmt(g))
                    return g * scale if scale != 1.0 else None
                x.register_hook(hook)
            elif kind == "callback":
                def hook(g, tag=tag):
                    ev("tensor_hook", tag, fmt(g))
                    torch.autograd.Variable._execution_engine.queue_callback(
                        lambda: ev("callback", tag))
                x.register_hook(hook)
            elif kind in ("multi_all", "multi_any"):
                other = t[h["with"]]
                if not other.requires_grad:
                    ev("skip", tag)
                    continue
                if kind == "multi_all":
                    torch.autograd.graph.register_multi_grad_hook(
                        (x, other), lambda gs, tag=tag: ev("multi_all", tag,
                                                          " ".join(fmt(g) for g in gs)))
                else:
                    torch.autograd.graph.register_multi_grad_hook(
                        (x, other), lambda g, tag=tag: ev("multi_any", tag, fmt(g)), mode="any")
            elif kind == "nested":
                def hook(g, tag=tag):
                    with torch.enable_grad():  # hooks run with grad mode off
                        (aux * aux).sum().backward()
                    ev("nested", tag, fmt(aux.grad))
                x.register_hook(hook)
            elif kind == "callback_nested":
                def hook(g, tag=tag):
                    def callback():
                        with torch.enable_grad():
                            (aux * aux).sum().backward()
                        ev("callback_nested", tag, fmt(aux.grad))
                    torch.autograd.Variable._execution_engine.queue_callback(callback)
                x.register_hook(hook)
            elif kind == "raise":
                def hook(g, tag=tag):
                    raise RuntimeError("hook " + tag + " raised")
                x.register_hook(hook)
            elif kind == "retain_grad":
                if x.is_leaf:
                    ev("skip", tag)
                    continue
                x.retain_grad()
            elif kind == "post_acc":
                if not x.is_leaf:
                    ev("skip", tag)
                    continue
                x.register_post_accumulate_grad_hook(lambda p, tag=tag: ev("post_acc", tag,
                                                                          fmt(p.grad)))
            elif kind in ("node_pre", "node_post"):
                if x.grad_fn is None:
                    ev("skip", tag)
                    continue
                if kind == "node_pre":
                    x.grad_fn.register_prehook(
                        lambda go, tag=tag: ev("node_pre", tag, " ".join(fmt(g) for g in go)))
                else:
                    def post(gi, go, tag=tag, scalar=scalar_node.get(h["on"], False)):
                        if scalar:  # the wrapped number's None, which tapegrad's node lacks
                            assert gi[-1] is None
                            gi = gi[:-1]
                            ev("#", "deliberate difference", SCALAR_ARITY)
                        ev("node_post", tag, " ".join(fmt(g) for g in gi))
                    x.grad_fn.register_hook(post)
        root = t[s["root"][0]].sum()
        for name in s["root"][1:]:
            root = root + t[name].sum()
        b = s["backward"]
        if b["api"] in ("backward", "backward_twice", "backward_inputs"):
            if b["api"] == "backward_twice":
                root.backward(retain_graph=True)
                grads = [t[l["name"]].grad for l in s["leaves"]]
                storages = [g.untyped_storage().data_ptr() for g in grads if g is not None]
                if len(storages) != len(set(storages)):
                    # PyTorch kept views of one gradient buffer as two leaves' .grad: the second
                    # backward's in-place accumulation into one would change the other.
                    ev("#", "deliberate difference", GRAD_ALIASING)
                    for l in s["leaves"]:
                        g = t[l["name"]].grad
                        if g is not None:
                            t[l["name"]].grad = g.clone()
                ev("second")
                root.backward()
            elif b["api"] == "backward_inputs":
                root.backward(inputs=[t[n] for n in b["inputs"]])
            else:
                root.backward()
            for leaf in s["leaves"]:
                ev("grad", leaf["name"], fmt(t[leaf["name"]].grad))
            for i, h in enumerate(s["hooks"]):
                x = t[h["on"]]
                if h["kind"] == "retain_grad" and not x.is_leaf and x.requires_grad:
                    ev("retained", "%s#%d" % (h["on"], i), fmt(x.grad))
        else:
            inputs = [t[n] for n in b["inputs"]]
            if b["api"] == "grad_edges":
                inputs = [torch.autograd.graph.get_gradient_edge(x) for x in inputs]
            res = torch.autograd.grad(root, inputs, allow_unused=True)
            for name, g in zip(b["inputs"], res):
                ev("result", name, fmt(g))
            for leaf in s["leaves"]:
                ev("grad", leaf["name"], fmt(t[leaf["name"]].grad))
    except Exception as e:  # an error is an event; its text (a comment line) is not compared
        ev("error")
        ev("#", str(e).splitlines()[0] if str(e) else type(e).__name__)


def main():
    with open(sys.argv[1]) as f:
        for line in f:
            s = json.loads(line)
            out = []
            run(s, out)
            print("### scenario %d" % s["id"])
            for e in out:
                print(e)


if __name__ == "__main__":
    main()
