#!/usr/bin/env python3
"""Independent reference for the optimizer traces pinned in sgd_test.cc and adam_test.cc.

Implements the PyTorch update formulas written in optim/sgd.h and optim/adam.h with plain Python
floats, rounding every tensor operation to the parameter's compute type (f32, or f16 for the
stored f16 parameter) with struct.pack, and prints the expected values as C++ literals:

    python3 tests/optim/reference_traces.py

A Python float operation on two f32 values, rounded once to f32, is the correctly rounded f32
result for + - * / and sqrt (double has more than 2*24+2 bits), so the reference reproduces
IEEE f32 arithmetic exactly. A fused multiply-add (Adam's, written fma in optim/adam.h) is
computed exactly with fractions and rounded once. Host scalars (1 - beta^t, lr /
bias_correction1, ...) are Python floats (double), rounded to f32 where they meet a tensor, as in
the C++ code.
"""
from fractions import Fraction
import math
import struct


def f32(x):
    return struct.unpack('f', struct.pack('f', x))[0]


def f16(x):
    return struct.unpack('e', struct.pack('e', x))[0]


def ident(x):
    return x


def _f32_neighbours(y):
    b = struct.unpack('<I', struct.pack('<f', y))[0]
    return [struct.unpack('<f', struct.pack('<I', n))[0] for n in (b - 1, b + 1) if 0 <= n < 1 << 32]


def fma(a, b, c, r):
    """a * b + c rounded once by r (f32 or ident: f64), exactly (no double rounding)."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    y = float(exact)  # correctly rounded to double
    if r is ident:
        return y
    candidates = [r(y)] + _f32_neighbours(r(y))
    # the nearest; a tie goes to the even significand
    return min(candidates, key=lambda x: (abs(Fraction(x) - exact),
                                          struct.unpack('<I', struct.pack('<f', x))[0] & 1))


P0 = [0.5, -1.25, 2.0]
STEPS = 10


def grad(k, j, r=f32):
    # The test's gradient: float(((k * 3 + j * 5) % 7) - 3) * (k < 4 ? 0.37f : 0.001f); the
    # gradients shrink after step 4 so that amsgrad's running maximum differs from exp_avg_sq.
    scale = r(0.37) if k < 4 else r(0.001)
    return r(float(((k * 3 + j * 5) % 7) - 3) * scale)


def sgd(lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    r = f32
    p = list(P0)
    buf = [None] * 3
    trace = []
    for k in range(STEPS):
        for j in range(3):
            g = grad(k, j)
            if weight_decay != 0:
                g = r(g + r(p[j] * r(weight_decay)))
            if momentum != 0:
                if buf[j] is None:
                    buf[j] = g
                else:
                    buf[j] = r(r(buf[j] * r(momentum)) + r(g * r(1 - dampening)))
                g = r(g + r(buf[j] * r(momentum))) if nesterov else buf[j]
            p[j] = r(p[j] - r(g * r(lr)))
        trace.append(list(p))
    return trace, buf


def adam(lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False,
         decoupled=False, r=f32, store=None, grad_round=None):
    """r: the compute rounding; store: the parameter's storage rounding (f16), if any."""
    store = store or r
    grad_round = grad_round or r
    p = [store(x) for x in P0]
    m = [0.0] * 3
    v = [0.0] * 3
    vmax = [0.0] * 3
    trace = []
    for k in range(STEPS):
        t = float(k + 1)
        bc1 = 1 - beta1 ** t
        bc2 = 1 - beta2 ** t
        step_size = lr / bc1
        bc2_sqrt = math.sqrt(bc2)
        for j in range(3):
            g = grad_round(grad(k, j))
            pj = p[j]
            if weight_decay != 0 and not decoupled:
                g = fma(r(weight_decay), pj, g, r)
            if weight_decay != 0 and decoupled:
                pj = r(pj * r(1 - lr * weight_decay))
            w = r(1 - beta1)  # torch's lerp of m towards g
            if abs(w) < 0.5:
                m[j] = fma(w, r(g - m[j]), m[j], r)
            else:
                m[j] = fma(-(1 - w), r(g - m[j]), g, r)
            v[j] = fma(r(g * r(1 - beta2)), g, r(v[j] * r(beta2)), r)
            vv = v[j]
            if amsgrad:
                vmax[j] = max(vmax[j], v[j])
                vv = vmax[j]
            denom = r(r(r(math.sqrt(vv)) / r(bc2_sqrt)) + r(eps))
            p[j] = store(r(pj - r(r(m[j] * r(step_size)) / denom)))
        trace.append(list(p))
    return trace, m, v, vmax


def literal(x, fmt, suffix):
    s = fmt % x
    if not any(c in s for c in '.en'):
        s += '.0'  # 2 -> 2.0 (2f is not a C++ literal)
    return s + suffix


def emit(name, rows, fmt='%.9g', suffix='f'):
    print('// %s' % name)
    print('{')
    for row in rows:
        print('    {' + ', '.join(literal(x, fmt, suffix) for x in row) + '},')
    print('}')


def main():
    t, buf = sgd(lr=0.1)
    emit('SGD lr=0.1', t)
    t, buf = sgd(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)
    emit('SGD lr=0.1 momentum=0.9 dampening=0.1 weight_decay=0.01', t)
    emit('  momentum_buffer', [buf])
    t, buf = sgd(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
    emit('SGD lr=0.1 momentum=0.9 nesterov weight_decay=0.01', t)
    emit('  momentum_buffer', [buf])
    t, m, v, _ = adam(lr=0.01)
    emit('Adam lr=0.01', t)
    emit('  exp_avg, exp_avg_sq', [m, v])
    t, m, v, vmax = adam(lr=0.01, weight_decay=0.001, amsgrad=True)
    emit('Adam lr=0.01 weight_decay=0.001 amsgrad', t)
    emit('  exp_avg, exp_avg_sq, max_exp_avg_sq', [m, v, vmax])
    t, m, v, _ = adam(lr=0.01, weight_decay=0.1, decoupled=True)
    emit('AdamW lr=0.01 weight_decay=0.1', t)
    emit('  exp_avg, exp_avg_sq', [m, v])
    t, _, _, _ = adam(lr=0.01, weight_decay=0.1, decoupled=True, store=f16, grad_round=f16)
    emit('AdamW f16 params and grads (f32 compute and state) lr=0.01 weight_decay=0.1', t)
    t, m, v, vmax = adam(lr=0.01, amsgrad=True, r=ident)
    emit('Adam f64 lr=0.01 amsgrad (grads: the f32 values widened)', t, fmt='%.17g', suffix='')
    emit('  exp_avg_sq, max_exp_avg_sq', [v, vmax], fmt='%.17g', suffix='')


if __name__ == '__main__':
    main()
