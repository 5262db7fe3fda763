"""Reference event orders and values of tests/autograd/hook_semantics_test.cc (development only;
not run in CI).

This is how the literals pinned in that test were produced: each scenario below builds the same
small float64 graph as the C++ test of the same name, registers hooks that append a line to a
list of events (tensor hooks, node pre-/post-hooks, post-accumulate-grad hooks, multi-grad
hooks), runs one backward()/grad() call the way the test does, and prints the events and the
resulting gradients as C++ literals:

    /root/.cache/tapegrad/torch-venv/bin/python tests/autograd/hook_semantics_reference.py

Event lines: "<tensor> hook <grad>" (tensor hook), "<tensor> pre <grad_outputs[0]>" and
"<tensor> post" (pre-/post-hook of the tensor's grad_fn, or of a leaf's AccumulateGrad),
"<leaf> postacc <.grad>" (post-accumulate-grad hook), "multi [<grad>, ...]" (mode="all"),
"any <grad>" (mode="any"). A gradient prints as [v, ...] with %g, "undef" when None; dtype
scenarios prefix the dtype (f32/f64).
"""

import torch
from torch.autograd.graph import register_multi_grad_hook

DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16"}


def fmt(t):
    if t is None:
        return "undef"
    return "[" + ", ".join(f"{v:g}" for v in t.detach().reshape(-1).tolist()) + "]"


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


class Recorder:
    def __init__(self):
        self.events = []
        self.nodes = []  # a leaf's AccumulateGrad lives only while something holds it

    def tensor(self, t, name, scale=None):
        def hook(g):
            self.events.append(f"{name} hook {fmt(g)}")
            return None if scale is None else g * scale

        t.register_hook(hook)

    def node(self, node, name):
        self.nodes.append(node)
        node.register_prehook(lambda go: self.events.append(f"{name} pre {fmt(go[0])}"))
        node.register_hook(lambda gi, go: self.events.append(f"{name} post"))

    def postacc(self, t, name):
        t.register_post_accumulate_grad_hook(
            lambda p: self.events.append(f"{name} postacc {fmt(p.grad)}"))


def accumulator(t):
    return t.view_as(t).grad_fn.next_functions[0][0]


def emit(name, events, values):
    print(f"// {name}")
    print("const std::vector<std::string> k" + name + "Events = {")
    for e in events:
        print(f'    "{e}",')
    print("};")
    for key, value in values.items():
        print(f'// {name}: {key} = "{value}"')
    print()


def unneeded_leaf_graph(r):
    # loss = sum(a * b + c * 2), c = b * 3: the only path to a runs through MulBackward.
    a, b = leaf([1.0]), leaf([2.0])
    r.tensor(a, "a")
    r.tensor(b, "b")
    r.postacc(a, "a")
    r.postacc(b, "b")
    r.node(accumulator(b), "b.acc")
    prod = a * b
    c = b * 3
    r.tensor(c, "c")
    r.node(c.grad_fn, "c")
    loss = (prod + c * 2).sum()
    r.node(prod.grad_fn, "prod")
    return a, b, loss


def backward_inputs_skips_unneeded_leaf():
    r = Recorder()
    a, b, loss = unneeded_leaf_graph(r)
    loss.backward(inputs=[a])
    emit("BackwardInputsSkipsUnneededLeaf", r.events, {"a.grad": fmt(a.grad), "b.grad": fmt(b.grad)})


def grad_skips_unneeded_leaf():
    r = Recorder()
    a, b, loss = unneeded_leaf_graph(r)
    (ga,) = torch.autograd.grad(loss, [a])
    emit("GradSkipsUnneededLeaf", r.events,
         {"ga": fmt(ga), "a.grad": fmt(a.grad), "b.grad": fmt(b.grad)})


def non_leaf_graph(r):
    # loss = sum(h * h), h = x * 3; h's hook multiplies its gradient by 10.
    x = leaf([1.0, 2.0])
    r.tensor(x, "x")
    r.postacc(x, "x")
    r.node(accumulator(x), "x.acc")
    h = x * 3
    h.retain_grad()
    r.tensor(h, "h", scale=10)
    r.node(h.grad_fn, "h")
    loss = (h * h).sum()
    r.node(loss.grad_fn, "loss")
    return x, h, loss


def grad_stops_at_non_leaf_input():
    r = Recorder()
    x, h, loss = non_leaf_graph(r)
    (gh,) = torch.autograd.grad(loss, [h])
    emit("GradStopsAtNonLeafInput", r.events,
         {"gh": fmt(gh), "h.grad": fmt(h.grad), "x.grad": fmt(x.grad)})


def grad_non_leaf_and_leaf_below():
    r = Recorder()
    x, h, loss = non_leaf_graph(r)
    gh, gx = torch.autograd.grad(loss, [h, x])
    emit("GradNonLeafAndLeafBelow", r.events,
         {"gh": fmt(gh), "gx": fmt(gx), "h.grad": fmt(h.grad), "x.grad": fmt(x.grad)})


def backward_inputs_non_leaf():
    r = Recorder()
    x = leaf([1.0, 2.0])
    r.tensor(x, "x")
    r.postacc(x, "x")
    h = x * 3
    r.tensor(h, "h", scale=10)
    r.node(h.grad_fn, "h")
    loss = (h * h).sum()
    loss.backward(inputs=[h], retain_graph=True)
    first = {"h.grad": fmt(h.grad), "x.grad": fmt(x.grad), "h.retains_grad": str(h.retains_grad)}
    r.events.append("-- full backward")
    loss.backward()
    first.update({"h.grad after": fmt(h.grad), "x.grad after": fmt(x.grad)})
    emit("BackwardInputsNonLeaf", r.events, first)


def multi_grad_all():
    r = Recorder()
    a, b, u = leaf([1.0]), leaf([2.0]), leaf([3.0])
    r.tensor(a, "a")
    handle = register_multi_grad_hook(
        (a, b, u), lambda gs: r.events.append("multi [" + ", ".join(fmt(g) for g in gs) + "]"))
    r.tensor(b, "b")
    r.events.append("-- both")
    (a * 2 + b * 5).sum().backward()
    r.events.append("-- a only")
    a.sum().backward()
    loss = (a * 2 + b * 5).sum()
    r.events.append("-- backward inputs=[a]")
    loss.backward(inputs=[a], retain_graph=True)
    r.events.append("-- backward inputs=[b]")
    loss.backward(inputs=[b])
    handle.remove()
    r.events.append("-- removed")
    (a * 2 + b * 5).sum().backward()
    emit("MultiGradAll", r.events, {})


def multi_grad_any():
    r = Recorder()
    a, b = leaf([1.0]), leaf([2.0])
    r.tensor(a, "a")
    r.tensor(b, "b")
    handle = register_multi_grad_hook((a, b), lambda g: r.events.append(f"any {fmt(g)}"), mode="any")
    r.events.append("-- first")
    (a * 2 + b * 5).sum().backward()
    r.events.append("-- second")
    (a * 2 + b * 5).sum().backward()
    r.events.append("-- a only")
    (a * 7).sum().backward()
    handle.remove()
    r.events.append("-- removed")
    (a * 2 + b * 5).sum().backward()
    emit("MultiGradAny", r.events, {})


def multi_grad_non_leaf():
    r = Recorder()
    x = leaf([1.0, 2.0])
    p, q = x * 2, x * 3
    register_multi_grad_hook(
        (p, q), lambda gs: r.events.append("multi [" + ", ".join(fmt(g) for g in gs) + "]"))
    loss = (p * q).sum()
    r.events.append("-- grad p")
    torch.autograd.grad(loss, [p], retain_graph=True)
    r.events.append("-- grad x")
    torch.autograd.grad(loss, [x], retain_graph=True)
    r.events.append("-- backward inputs=[x]")
    loss.backward(inputs=[x], retain_graph=True)
    r.events.append("-- full")
    loss.backward()
    emit("MultiGradNonLeaf", r.events, {})


def multi_grad_reentrant():
    r = Recorder()
    a, b, c = leaf([1.0]), leaf([2.0]), leaf([7.0])
    register_multi_grad_hook(
        (a, b), lambda gs: r.events.append("multi [" + ", ".join(fmt(g) for g in gs) + "]"))
    register_multi_grad_hook((a, b), lambda g: r.events.append(f"any {fmt(g)}"), mode="any")

    def reenter(g):
        r.events.append("c hook: nested backward")
        with torch.enable_grad():
            (a * 3).sum().backward()
        r.events.append("c hook: nested backward returned")

    c.register_hook(reenter)
    (a * 2 + b * 5 + c).sum().backward()
    emit("MultiGradReentrant", r.events, {"a.grad": fmt(a.grad), "b.grad": fmt(b.grad)})


class DropSecond(torch.autograd.Function):
    # y = a * b; the backward gives a its gradient and b none.
    @staticmethod
    def forward(ctx, a, b):
        return a * b

    @staticmethod
    def backward(ctx, g):
        return g, None


def undefined_gradient_reaches_hooks():
    r = Recorder()
    a, b = leaf([1.0]), leaf([2.0])
    r.tensor(a, "a")
    r.tensor(b, "b")
    register_multi_grad_hook(
        (a, b), lambda gs: r.events.append("multi [" + ", ".join(fmt(g) for g in gs) + "]"))
    DropSecond.apply(a, b).sum().backward()
    emit("UndefinedGradientReachesHooks", r.events, {"a.grad": fmt(a.grad), "b.grad": fmt(b.grad)})


def root_gradient_dtype_cast():
    events = []
    values = {}
    for dtype in (torch.float64, torch.float16, torch.int64):
        x = torch.tensor([1.0, 2.0], dtype=torch.float32, requires_grad=True)
        y = x * 2
        y.register_hook(lambda g: events.append(f"y hook {DTYPES[g.dtype]} {fmt(g)}"))
        y.backward(torch.tensor([1, 3], dtype=dtype))
        values[f"x.grad ({dtype})"] = f"{DTYPES[x.grad.dtype]} {fmt(x.grad)}"
    x = torch.tensor([1.0, 2.0], dtype=torch.float32, requires_grad=True)
    (gx,) = torch.autograd.grad([(x * 2)], [x], [torch.tensor([0.5, 1.0], dtype=torch.float64)])
    values["grad gx"] = f"{DTYPES[gx.dtype]} {fmt(gx)}"
    try:
        (x * 2).backward(torch.ones(3, dtype=torch.float64))
    except RuntimeError as e:
        values["shape mismatch"] = str(e)
    emit("RootGradientDtypeCast", events, values)


def root_is_the_input():
    # The root itself requested: its tensor hooks run on the given gradient and nothing below.
    r = Recorder()
    x = leaf([1.0, 2.0])
    r.tensor(x, "x")
    y = x * 3
    r.tensor(y, "y", scale=2)
    r.node(y.grad_fn, "y")
    (gy,) = torch.autograd.grad(y, [y], torch.tensor([1.0, 5.0], dtype=torch.float64))
    r.events.append("-- backward inputs=[y]")
    y.backward(torch.tensor([1.0, 5.0], dtype=torch.float64), inputs=[y])
    emit("RootIsTheInput", r.events, {"gy": fmt(gy), "y.grad": fmt(y.grad), "x.grad": fmt(x.grad)})


def accumulate_grad_runs_first():
    # x's AccumulateGrad exists (hooked) before z's graph is recorded; once ready it runs before
    # z's MulBackward, which was created later than it.
    r = Recorder()
    x, z = leaf([1.0]), leaf([2.0])
    r.tensor(x, "x")
    r.tensor(z, "z")
    r.node(accumulator(x), "x.acc")
    c = z * 3
    r.node(c.grad_fn, "c")
    y = x * 2
    r.node(y.grad_fn, "y")
    (y * c).sum().backward()
    emit("AccumulateGradRunsFirst", r.events, {"x.grad": fmt(x.grad), "z.grad": fmt(z.grad)})


# ---- Rule 4: hooks added or removed while hooks run ---------------------------------------------
# PyTorch calls the hooks of one dict (a tensor's, a node's pre-/post-hooks, a leaf's
# post-accumulate-grad hooks) over a copy of its values taken when that dict's turn comes: a hook
# added meanwhile runs from the next backward on, a hook removed meanwhile still runs this time.


def hooks_changed_while_tensor_hooks_run():
    # y = a * 2: y's first hook removes the second and adds a fourth; two backward calls.
    events, handles = [], {}
    a = leaf([1.0])
    y = a * 2

    def h1(g):
        events.append(f"h1 {fmt(g)}")
        handles["h2"].remove()
        y.register_hook(lambda g: events.append(f"h4 {fmt(g)}"))

    y.register_hook(h1)
    handles["h2"] = y.register_hook(lambda g: events.append(f"h2 {fmt(g)}"))
    y.register_hook(lambda g: events.append(f"h3 {fmt(g)}"))
    y.sum().backward(retain_graph=True)
    events.append("--")
    y.sum().backward()
    emit("HooksChangedWhileTensorHooksRun", events, {})


def hooks_changed_while_leaf_hooks_run():
    # The same on a leaf's tensor hooks and its post-accumulate-grad hooks.
    events, handles = [], {}
    a = leaf([1.0])

    def t1(g):
        events.append(f"t1 {fmt(g)}")
        handles["t2"].remove()
        a.register_hook(lambda g: events.append(f"t3 {fmt(g)}"))

    def p1(p):
        events.append(f"p1 {fmt(p.grad)}")
        handles["p2"].remove()
        a.register_post_accumulate_grad_hook(lambda p: events.append(f"p3 {fmt(p.grad)}"))

    a.register_hook(t1)
    handles["t2"] = a.register_hook(lambda g: events.append(f"t2 {fmt(g)}"))
    a.register_post_accumulate_grad_hook(p1)
    handles["p2"] = a.register_post_accumulate_grad_hook(
        lambda p: events.append(f"p2 {fmt(p.grad)}"))
    (a * 2).sum().backward()
    events.append("--")
    (a * 2).sum().backward()
    emit("HooksChangedWhileLeafHooksRun", events, {})


def hooks_changed_while_node_hooks_run():
    # Node pre-hooks and post-hooks of y = a * 2's node.
    events, handles = [], {}
    a = leaf([1.0])
    y = a * 2
    n = y.grad_fn

    def pre1(go):
        events.append(f"pre1 {fmt(go[0])}")
        handles["pre2"].remove()
        n.register_prehook(lambda go: events.append(f"pre3 {fmt(go[0])}"))

    def post1(gi, go):
        events.append("post1")
        handles["post2"].remove()
        n.register_hook(lambda gi, go: events.append("post3"))

    n.register_prehook(pre1)
    handles["pre2"] = n.register_prehook(lambda go: events.append(f"pre2 {fmt(go[0])}"))
    n.register_hook(post1)
    handles["post2"] = n.register_hook(lambda gi, go: events.append("post2"))
    y.sum().backward(retain_graph=True)
    events.append("--")
    y.sum().backward()
    emit("HooksChangedWhileNodeHooksRun", events, {})


def multi_output_hook_order():
    # u, v = split(a * 1, 1): hooks u1, v1, u2 registered in that order; only u is used.
    events = []
    a = leaf([1.0, 2.0])
    u, v = torch.split(a * 1, 1)
    u.register_hook(lambda g: events.append(f"u1 {fmt(g)}"))
    v.register_hook(lambda g: events.append(f"v1 {fmt(g)}"))
    u.register_hook(lambda g: events.append(f"u2 {fmt(g)}"))
    (u * 3).sum().backward()
    emit("MultiOutputHookOrder", events, {"a.grad": fmt(a.grad)})


def multi_output_hooks_changed_by_another_output():
    # u's hook removes v's first hook and adds one to v: v's hooks run after u's and from a copy
    # taken then, so the new one runs and the removed one does not. (Registering the first hook
    # of another output of the node from there, e.g. of w, is undefined in PyTorch: it appends to
    # the node's vector of hooks while the engine iterates over it, and can crash. tapegrad runs
    # that output's hooks from the next backward on; hook_semantics_test pins it.)
    events, handles = [], {}
    a = leaf([1.0, 2.0, 3.0])
    u, v, _ = torch.split(a * 1, 1)

    def u1(g):
        events.append(f"u1 {fmt(g)}")
        handles["v1"].remove()
        v.register_hook(lambda g: events.append(f"v2 {fmt(g)}"))

    u.register_hook(u1)
    handles["v1"] = v.register_hook(lambda g: events.append(f"v1 {fmt(g)}"))
    loss = (u * 3 + v * 5).sum()
    loss.backward(retain_graph=True)
    events.append("--")
    loss.backward()
    emit("MultiOutputHooksChangedByAnotherOutput", events, {"a.grad": fmt(a.grad)})


if __name__ == "__main__":
    print(f"// torch {torch.__version__}")
    backward_inputs_skips_unneeded_leaf()
    grad_skips_unneeded_leaf()
    grad_stops_at_non_leaf_input()
    grad_non_leaf_and_leaf_below()
    backward_inputs_non_leaf()
    multi_grad_all()
    multi_grad_any()
    multi_grad_non_leaf()
    multi_grad_reentrant()
    undefined_gradient_reaches_hooks()
    root_gradient_dtype_cast()
    accumulate_grad_runs_first()
    root_is_the_input()
    hooks_changed_while_tensor_hooks_run()
    hooks_changed_while_leaf_hooks_run()
    hooks_changed_while_node_hooks_run()
    multi_output_hook_order()
    multi_output_hooks_changed_by_another_output()
