"""What PyTorch prints for the cases of tests/nn/module_hooks_test.cc (module backward hooks,
forward hooks' always_call and prepend); the test quotes its output. Run it with the venv of
tools/bench/setup_pytorch_venv.sh: ~/.cache/tapegrad/torch-venv/bin/python
tests/nn/module_hooks_reference.py (PyTorch 2.15 printed the test's expectations)."""
import torch
ev=[]
class Scale(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.w = torch.nn.Parameter(torch.tensor([2.0, 3.0]))
    def forward(s, x): return x * s.w
m = Scale()
m.register_full_backward_pre_hook(lambda mod, go: (ev.append(("pre", go[0].tolist())), (go[0]*10,))[1])
def bh(mod, gi, go):
    ev.append(("bwd", None if gi[0] is None else gi[0].tolist(), go[0].tolist())); return (gi[0]+1,) if gi[0] is not None else None
m.register_full_backward_hook(bh)
m.w.register_post_accumulate_grad_hook(lambda p: ev.append(("acc_w", p.grad.tolist())))
x = torch.tensor([1.0, -1.0], requires_grad=True)
x.register_hook(lambda g: ev.append(("x_hook", g.tolist())))
y = m(x)
y.register_hook(lambda g: ev.append(("y_hook", g.tolist())))
(y * torch.tensor([1.0, 2.0])).sum().backward()
ev.append(("x.grad", x.grad.tolist()))
for e in ev: print(e)
print("---- input without grad")
ev.clear()
m.w.grad=None
y = m(torch.tensor([1.0, -1.0]))
y.sum().backward()
for e in ev: print(e)
print("---- bad return")
m2 = Scale(); m2.register_full_backward_hook(lambda mod, gi, go: (gi[0], gi[0]))
try: m2(torch.tensor([1.0,1.0], requires_grad=True)).sum().backward()
except Exception as ex: print("ERR", ex)
m3 = Scale(); m3.register_full_backward_pre_hook(lambda mod, go: (go[0], go[0]))
try: m3(torch.tensor([1.0,1.0], requires_grad=True)).sum().backward()
except Exception as ex: print("ERR", ex)
m4 = Scale(); m4.register_full_backward_hook(lambda mod, gi, go: (torch.ones(2),))
try: m4(torch.tensor([1.0,1.0])).sum().backward()
except Exception as ex: print("ERR", ex)
print("---- always_call")
ev.clear()
class Boom(torch.nn.Module):
    def forward(s, x): raise RuntimeError("boom")
b = Boom()
b.register_forward_hook(lambda mod, a, out: ev.append(("always", out)), always_call=True)
b.register_forward_hook(lambda mod, a, out: ev.append(("normal", out)))
try: b(torch.ones(1))
except Exception as ex: print("ERR", ex)
print(ev)
ev.clear()
s = Scale()
s.register_forward_hook(lambda mod, a, out: ev.append("first"))
s.register_forward_hook(lambda mod, a, out: ev.append("prepended"), prepend=True)
s(torch.ones(2)); print(ev)
