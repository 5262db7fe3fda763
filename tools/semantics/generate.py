"""Seeded random autograd scenarios for the differential oracle (tools/semantics/README.md).

    python3 tools/semantics/generate.py 0 2000 > scenarios.jsonl   # seeds 0..1999, one per line

Each scenario is one JSON object (the format of tools/semantics/README.md): f64 leaves, a few
elementwise ops over them, hooks of every kind the format has, and one backward (backward() or
grad() with inputs). The same seed always gives the same scenario (Python's random.Random).
"""
import json
import random
import sys

UNARY = ["tanh", "exp", "neg", "mul_scalar", "clone", "view", "narrow", "custom_double",
         "custom_dirty", "checkpoint", "module"]
BINARY = ["add", "sub", "mul"]


def scenario(seed):
    r = random.Random(seed)
    n = r.choice([1, 2, 3])
    leaves = []
    for i in range(r.randint(1, 3)):
        leaves.append({
            "name": "l%d" % i,
            "values": [round(r.uniform(-1, 1), 3) for _ in range(n)],
            "requires_grad": i == 0 or r.random() < 0.8,
        })
    names = [l["name"] for l in leaves]
    needs_grad = {l["name"]: l["requires_grad"] for l in leaves}
    module_view = {}  # a module's output, or a view of one (see below)
    view_depth = {l["name"]: 0 for l in leaves}  # 0: not a view; 2: a view of a view
    ops = []
    for k in range(r.randint(1, 6)):
        out = "t%d" % k
        kind = r.choice(UNARY + BINARY)
        if kind in BINARY:
            op = {"out": out, "op": kind, "args": [r.choice(names), r.choice(names)]}
        else:
            op = {"out": out, "op": kind, "args": [r.choice(names)]}
            arg = op["args"][0]
            if kind == "custom_dirty" and (
                    module_view.get(arg, False) or view_depth[arg] > 0 or
                    (arg in view_depth and arg.startswith("l") and r.random() < 0.9)):
                # In place on a view (tapegrad refuses a dirty view while recording, PyTorch
                # rebases its base) or on a module output with hooks (PyTorch refuses it): both
                # deliberate differences (docs/semantics.md); a leaf (both refuse) is kept rare.
                kind = op["op"] = "custom_double"
            if kind == "mul_scalar":
                op["scalar"] = r.choice([0.5, 2.0, -1.5])
            if kind == "checkpoint":
                op["reentrant"] = r.random() < 0.5
                if not op["reentrant"] and r.random() < 0.5:
                    # A selective policy: the ops of the segment whose outputs are kept.
                    op["keep"] = r.choice([["tanh"], ["mul"], ["tanh", "mul"], []])
            if kind == "module":
                # A module y = tanh(x) * 2 with backward pre-hooks / hooks that observe or scale.
                op["pre_scale"] = r.choice([None, 1.0, 3.0])
                op["hook_scale"] = r.choice([None, 1.0, 0.5])
        # In place on an op's output; on a view (view, narrow) it writes into the base (PyTorch's
        # CopySlices), refused for a view of a leaf that requires grad.
        # A module with backward hooks returns a custom function's output: PyTorch refuses an
        # in-place op on a view of it, tapegrad rebases it (a deliberate difference,
        # docs/semantics.md), so the generator does not write into one.
        into_module = kind in ("view", "narrow", "custom_dirty") and module_view.get(
            op["args"][0], False)
        module_view[out] = kind == "module" or into_module
        on_view = kind in ("view", "narrow")
        of_leaf = op["args"][0].startswith("l")  # an error in both libraries: kept rare
        if r.random() < ((0.05 if of_leaf else 0.3) if on_view else 0.15) and kind not in (
                "checkpoint", "module", "custom_dirty") and not into_module:
            op["inplace_mul"] = r.choice([2.0, -0.5])  # then out.mul_(c)
        ops.append(op)
        names.append(out)
        needs_grad[out] = any(needs_grad[a] for a in op["args"])
        view_depth[out] = view_depth[op["args"][0]] + 1 if kind in ("view", "narrow") else 0
    # The root: the sum of the last tensor that requires grad (l0 does), plus sometimes another
    # one's (two paths).
    root = [[n for n in names if needs_grad[n]][-1]]
    if len(names) > 2 and r.random() < 0.5:
        root.append(r.choice(names[:-1]))
    hooks = []
    for h in range(r.randint(0, 6)):
        kind = r.choice(["tensor", "tensor", "retain_grad", "post_acc", "node_pre", "node_post",
                         "callback", "multi_all", "multi_any", "nested", "callback_nested",
                         "raise"])
        if kind == "raise" and r.random() < 0.7:
            kind = "tensor"  # errors end the scenario: keep them rarer
        hook = {"kind": kind, "on": r.choice(names)}
        if kind in ("node_pre", "node_post") and view_depth[hook["on"]] >= 2:
            # A view of a view whose base an in-place op rewrote gets its grad_fn regenerated:
            # one as_strided node from the base in PyTorch, the chain of view ops in tapegrad (a
            # deliberate difference, docs/semantics.md); node hooks on one would see it.
            hook["kind"] = "tensor"
            hook["scale"] = 1.0
        if kind == "tensor":
            hook["scale"] = r.choice([1.0, 1.0, 2.0, -1.0])
        if kind in ("multi_all", "multi_any"):
            hook["with"] = r.choice(names)
        hooks.append(hook)
    grad_leaves = [l["name"] for l in leaves if l["requires_grad"]]
    roll = r.random()
    if roll < 0.5:
        backward = {"api": "backward"}
    elif roll < 0.6:
        backward = {"api": "backward_twice"}  # retain_graph, then a second backward
    elif roll < 0.7:
        k = r.randint(1, len(grad_leaves))
        backward = {"api": "backward_inputs", "inputs": r.sample(grad_leaves, k)}
    elif roll < 0.8:
        # grad() of the root with respect to GradientEdges of tensors that require grad.
        candidates = [n for n in names if needs_grad[n]]
        k = r.randint(1, min(2, len(candidates)))
        backward = {"api": "grad_edges", "inputs": r.sample(candidates, k)}
    else:
        k = r.randint(1, len(grad_leaves))
        backward = {"api": "grad", "inputs": r.sample(grad_leaves, k)}
    if backward["api"] in ("grad", "grad_edges"):
        # A multi_all hook over a leaf that grad() takes as an input: PyTorch raises ("A leaf
        # node was passed to _will_engine_execute_node ..."), tapegrad counts the leaf as reached
        # (a deliberate difference, docs/semantics.md); the generator leaves it out.
        leaf_inputs = set(backward["inputs"]) & {l["name"] for l in leaves}
        for hook in hooks:
            if hook["kind"] == "multi_all" and ({hook["on"], hook["with"]} & leaf_inputs):
                hook.clear()
                hook.update({"kind": "tensor", "on": sorted(leaf_inputs)[0], "scale": 1.0})
    return {"id": seed, "leaves": leaves, "ops": ops, "root": root, "hooks": hooks,
            "backward": backward}


def main():
    first, count = int(sys.argv[1]), int(sys.argv[2])
    for seed in range(first, first + count):
        print(json.dumps(scenario(seed), separators=(",", ":")))


if __name__ == "__main__":
    main()
