"""Reference values of tests/autograd/views_test.cc (development only; not run in CI).

How the literals pinned in that test were produced: each scenario below builds the same small
float64 graph as the C++ test of the same name (a leaf, a clone of it as the base, views of the
base, an in-place op on a view or on the base), runs one backward() and prints the gradients,
the grad_fn names, the version counters and the events of hooks as C++ literals:

    /root/.cache/tapegrad/torch-venv/bin/python tests/autograd/views_reference.py

Event lines: "<tensor> hook <grad>" (a tensor hook). A gradient prints as [v, ...] with %g,
"undef" when None. grad_fn names drop PyTorch's "0" suffix (SliceBackward0 -> SliceBackward;
tapegrad remakes a view's grad_fn as the chain of its view ops, PyTorch as AsStridedBackward
or the view op, so only the base's CopySlices is compared).
"""

import torch


def fmt(t):
    if t is None:
        return "undef"
    return "[" + ", ".join(f"{v:g}" for v in t.detach().reshape(-1).tolist()) + "]"


def leaf(values, shape=None):
    t = torch.tensor(values, dtype=torch.float64)
    if shape is not None:
        t = t.reshape(shape)
    return t.requires_grad_(True)


def name(t):
    return "none" if t.grad_fn is None else type(t.grad_fn).__name__.rstrip("0")


def emit(scenario, values, events=None):
    print(f"// {scenario}")
    if events is not None:
        print("const std::vector<std::string> k" + scenario + "Events = {")
        for e in events:
            print(f'    "{e}",')
        print("};")
    for key, value in values.items():
        print(f'// {scenario}: {key} = "{value}"')
    print()


def slice_mul():
    a = leaf([1.0, 2.0, 3.0, 4.0])
    w = leaf([10.0, 20.0, 30.0, 40.0])
    x = a * 1
    v = x[1:3]
    v.mul_(2)
    (x * w).sum().backward()
    emit("SliceMul", {"a.grad": fmt(a.grad), "w.grad": fmt(w.grad), "x": fmt(x),
                      "x.grad_fn": name(x), "x.version": x._version, "v.version": v._version})


def select_add():
    a = leaf([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], (2, 3))
    b = leaf([0.5, -1.0, 2.0])
    x = a * 1
    r = x.select(0, 1)
    r.add_(b)
    (x * x).sum().backward()
    emit("SelectAdd", {"a.grad": fmt(a.grad), "b.grad": fmt(b.grad), "x": fmt(x)})


def transpose_mul_then_base():
    a = leaf([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], (2, 3))
    m = leaf([1.0, -1.0, 2.0, 0.5, 3.0, -2.0], (3, 2))
    c = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float64).reshape(2, 3)
    x = a * 1
    t = x.t()
    t.mul_(m)
    (x * c).sum().backward()
    emit("TransposeMulThenBase", {"a.grad": fmt(a.grad), "m.grad": fmt(m.grad), "x": fmt(x)})


def chain_of_two_views():
    a = leaf([float(i) for i in range(1, 13)], (3, 4))
    s = leaf([2.0, -3.0])
    x = a * 1
    v = x[1:3]
    u = v.select(1, 1)
    u.mul_(s)
    loss = (x * x).sum() + (v * 3).sum() + (u * u).sum()
    loss.backward()
    emit("ChainOfTwoViews", {"a.grad": fmt(a.grad), "s.grad": fmt(s.grad), "x": fmt(x),
                             "v.version": v._version})


def base_in_place_then_view():
    a = leaf([1.0, 2.0, 3.0, 4.0])
    w = leaf([10.0, 20.0])
    x = a * 1
    v = x[1:3]
    before = v._version
    x.mul_(3)
    (v * w).sum().backward()
    emit("BaseInPlaceThenView", {"a.grad": fmt(a.grad), "w.grad": fmt(w.grad), "v": fmt(v),
                                 "v.version before": before, "v.version": v._version})


def narrow_zero():
    a = leaf([1.0, 2.0, 3.0, 4.0, 5.0])
    x = a * 2
    x.narrow(0, -3, 2).zero_()
    (x * x).sum().backward()
    emit("NarrowZero", {"a.grad": fmt(a.grad), "x": fmt(x)})


def copy_into_slice():
    a = leaf([1.0, 2.0, 3.0, 4.0])
    src = leaf([7.0])
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    x = a * 1
    x[0:2].copy_(src)  # src broadcasts
    (x * w).sum().backward()
    emit("CopyIntoSlice", {"a.grad": fmt(a.grad), "src.grad": fmt(src.grad), "x": fmt(x)})


def relu_on_slice():
    a = leaf([-1.0, 2.0, -3.0, 4.0])
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    x = a * 1
    x[1:].relu_()
    (x * w).sum().backward()
    emit("ReluOnSlice", {"a.grad": fmt(a.grad), "x": fmt(x)})


def base_without_grad():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    a = leaf([5.0, 6.0])
    v = x[1:3]
    v2 = x[2:4]
    was = (x.requires_grad, v2.requires_grad)
    v.mul_(a)
    (x * x).sum().backward()
    emit("BaseWithoutGrad", {"a.grad": fmt(a.grad), "x": fmt(x), "x.grad_fn": name(x),
                             "before": was, "after": (x.requires_grad, v2.requires_grad)})


def hooks_around_in_place_on_view():
    events = []

    def rec(label):
        return lambda g: events.append(f"{label} hook {fmt(g)}")

    a = leaf([1.0, 2.0, 3.0, 4.0])
    w = torch.tensor([10.0, 20.0, 30.0, 40.0], dtype=torch.float64)
    x = a * 1
    x.register_hook(rec("x before"))
    x.retain_grad()
    v = x[1:3]
    v.register_hook(rec("v before"))
    v.retain_grad()
    v.mul_(2)
    x.register_hook(rec("x after"))
    v.register_hook(rec("v after"))
    loss = (x * w).sum() + (v * 3).sum()
    loss.backward()
    emit("HooksAroundInPlaceOnView",
         {"a.grad": fmt(a.grad), "x.grad": fmt(x.grad), "v.grad": fmt(v.grad)}, events)


def view_hook_then_base_in_place():
    events = []

    def rec(label):
        return lambda g: events.append(f"{label} hook {fmt(g)}")

    a = leaf([1.0, 2.0, 3.0, 4.0])
    w = torch.tensor([10.0, 20.0], dtype=torch.float64)
    x = a * 1
    v = x[1:3]
    v.register_hook(rec("v before"))
    x.mul_(2)
    v.register_hook(rec("v after"))
    (v * w).sum().backward()
    emit("ViewHookThenBaseInPlace", {"a.grad": fmt(a.grad)}, events)


def errors():
    a = leaf([1.0, 2.0, 3.0, 4.0])
    try:
        a[1:3].mul_(2)
    except RuntimeError as e:
        emit("LeafViewError", {"message": str(e).splitlines()[0]})
    x = a * 1
    v = x[1:3]
    y = v * v
    x.mul_(2)
    try:
        y.sum().backward()
    except RuntimeError as e:
        emit("SavedViewModified", {"message": str(e).splitlines()[0]})
    with torch.no_grad():
        nv = x[0:2]
    try:
        nv.mul_(a[0:2] * 1)
    except RuntimeError as e:
        emit("NoGradViewError", {"message": str(e).splitlines()[0]})



def split_outputs():
    a = leaf([1.0, 2.0, 3.0, 4.0])
    x = a * 1
    c = x.split(2)
    try:
        c[1].mul_(2)
    except RuntimeError as e:
        emit("SplitOutputInPlace", {"message": str(e).splitlines()[0]})
    x.mul_(2)
    try:
        (c[0] * 1).sum().backward()
    except RuntimeError as e:
        emit("SplitOutputAfterBaseInPlace", {"message": str(e).splitlines()[0]})


if __name__ == "__main__":
    print(f"// torch {torch.__version__}")
    slice_mul()
    select_add()
    transpose_mul_then_base()
    chain_of_two_views()
    base_in_place_then_view()
    narrow_zero()
    copy_into_slice()
    relu_on_slice()
    base_without_grad()
    hooks_around_in_place_on_view()
    view_hook_then_base_in_place()
    errors()
    split_outputs()
