#!/usr/bin/env python3
"""Exact reference for tensor/float8.h (f32/f16/bf16 -> float8 e4m3fn / e5m2, and back).

Pure Python with fractions.Fraction: every float8 value is enumerated from the format's
definition, and each input is rounded to the nearest one, ties to the even code, with the
exponent unbounded at the top (a virtual code one ulp above the largest finite value stands for
"out of the format"). The saturation rules are those of CUDA's __nv_cvt_float_to_fp8
(cuda_fp8.hpp), which Transformer Engine's casts use:
  satfinite: overflow and +-inf -> +-max finite;  nosat: -> NaN 0x7f|sign (e4m3fn), inf 0x7c|sign
  (e5m2);  NaN -> 0x7f (sign cleared) in both modes.

  python3 tests/tensor/float8_reference.py                # prints the C++ tables of float8_test.cc
  python3 tests/tensor/float8_reference.py --check-torch  # compares with torch's .to(float8)
      [--cuda]                                            # ... with torch's CUDA casts
"""
import struct
import sys
from bisect import bisect_left
from fractions import Fraction

FORMATS = {  # name: (exponent bits, mantissa bits, has_inf)
    "kE4M3": (4, 3, False),
    "kE5M2": (5, 2, True),
}
MODES = ("kSatFinite", "kNoSat")
SOURCES = ("kF16", "kBF16")


def fp8_decode(fmt, code):
    """('nan', sign), ('inf', sign) or ('num', sign, Fraction magnitude) of a float8 code."""
    e_bits, m_bits, has_inf = FORMATS[fmt]
    sign = code >> 7
    e = (code >> m_bits) & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    bias = (1 << (e_bits - 1)) - 1
    e_max = (1 << e_bits) - 1
    if has_inf and e == e_max:
        return ("inf", sign) if m == 0 else ("nan", sign)
    if not has_inf and e == e_max and m == (1 << m_bits) - 1:
        return ("nan", sign)
    if e == 0:
        mag = Fraction(m) * Fraction(2) ** (1 - bias - m_bits)
    else:
        mag = Fraction((1 << m_bits) + m) * Fraction(2) ** (e - bias - m_bits)
    return ("num", sign, mag)


def finite_table(fmt):
    """Sorted (magnitude, code) of the non-negative finite codes plus the virtual overflow code."""
    table = []
    for code in range(0x80):
        d = fp8_decode(fmt, code)
        if d[0] == "num":
            table.append((d[2], code))
    table.sort()
    max_mag, max_code = table[-1]
    ulp = max_mag - table[-2][0]
    table.append((max_mag + ulp, max_code + 1))
    return table


TABLES = {fmt: finite_table(fmt) for fmt in FORMATS}


def fp8_encode(fmt, mode, value):
    """value: ('nan', s), ('inf', s) or ('num', s, Fraction magnitude). Returns the code."""
    table = TABLES[fmt]
    max_code = table[-2][1]
    overflow_code = 0x7C if FORMATS[fmt][2] else 0x7F
    if value[0] == "nan":
        return 0x7F
    sign = value[1] << 7
    if value[0] == "inf":
        return sign | (max_code if mode == "kSatFinite" else overflow_code)
    mag = value[2]
    mags = [t[0] for t in table]
    i = bisect_left(mags, mag)
    if i == len(table):
        code = max_code + 1  # beyond even the virtual code
    elif mags[i] == mag:
        code = table[i][1]
    else:
        lo, hi = table[i - 1], table[i]
        if mag - lo[0] < hi[0] - mag:
            code = lo[1]
        elif mag - lo[0] > hi[0] - mag:
            code = hi[1]
        else:
            code = lo[1] if lo[1] % 2 == 0 else hi[1]  # tie: the even code (even mantissa)
    if code > max_code:
        return sign | (max_code if mode == "kSatFinite" else overflow_code)
    return sign | code


def source_decode(src, bits):
    """Exact value of an f16 or bf16 bit pattern, in fp8_encode's input form."""
    e_bits, m_bits = (5, 10) if src == "kF16" else (8, 7)
    sign = bits >> 15
    e = (bits >> m_bits) & ((1 << e_bits) - 1)
    m = bits & ((1 << m_bits) - 1)
    bias = (1 << (e_bits - 1)) - 1
    if e == (1 << e_bits) - 1:
        return ("inf", sign) if m == 0 else ("nan", sign)
    if e == 0:
        return ("num", sign, Fraction(m) * Fraction(2) ** (1 - bias - m_bits))
    return ("num", sign, Fraction((1 << m_bits) + m) * Fraction(2) ** (e - bias - m_bits))


def float32_bits_of_code(fmt, code):
    """The float the C++ decoder must return: exact value; NaN quiet with the code's sign and
    mantissa bits at the top of the payload."""
    d = fp8_decode(fmt, code)
    m_bits = FORMATS[fmt][1]
    sign = d[1] << 31
    if d[0] == "nan":
        return sign | 0x7FC00000 | ((code & ((1 << m_bits) - 1)) << (23 - m_bits))
    if d[0] == "inf":
        return sign | 0x7F800000
    return sign | struct.unpack("<I", struct.pack("<f", float(d[2])))[0]


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def outputs(src, fmt, mode):
    return bytes(fp8_encode(fmt, mode, source_decode(src, b)) for b in range(1 << 16))


def source_bits_of(src, value):
    """The f16/bf16 pattern holding `value` exactly (value as in fp8_encode), or None."""
    for bits in range(1 << 16):
        d = source_decode(src, bits)
        if d[0] == value[0] and d[1] == value[1] and (d[0] == "inf" or d[0] == "nan" or d[2] == value[2]):
            if d[0] == "nan" and (bits & 0x7FFF) not in (0x7E00, 0x7FC0):
                continue  # the canonical quiet NaN of each source type
            return bits
    return None


F = Fraction
CHOSEN = [  # (what, value)
    ("+0", ("num", 0, F(0))),
    ("-0", ("num", 1, F(0))),
    ("1", ("num", 0, F(1))),
    ("1+1/16: e4m3 tie 1|1.125 -> 1", ("num", 0, F(17, 16))),
    ("1+3/16: e4m3 tie 1.125|1.25 -> 1.25", ("num", 0, F(19, 16))),
    ("-1-3/16", ("num", 1, F(19, 16))),
    ("1+1/8: e5m2 tie 1|1.25 -> 1", ("num", 0, F(9, 8))),
    ("1+3/8: e5m2 tie 1.25|1.5 -> 1.5", ("num", 0, F(11, 8))),
    ("448: e4m3 max", ("num", 0, F(448))),
    ("464: e4m3 tie 448|480 -> 448", ("num", 0, F(464))),
    ("466: e4m3 just above the tie", ("num", 0, F(466))),
    ("-480: e4m3 overflow", ("num", 1, F(480))),
    ("57344: e5m2 max", ("num", 0, F(57344))),
    ("59392: e5m2 below the tie", ("num", 0, F(59392))),
    ("61440: e5m2 tie 57344|65536 -> overflow", ("num", 0, F(61440))),
    ("-61440", ("num", 1, F(61440))),
    ("65504: f16 max", ("num", 0, F(65504))),
    ("2^-6: e4m3 min normal", ("num", 0, F(1, 64))),
    ("2^-9: e4m3 min subnormal", ("num", 0, F(1, 512))),
    ("2^-10: e4m3 tie 0|2^-9 -> 0", ("num", 0, F(1, 1024))),
    ("-2^-10 -> -0", ("num", 1, F(1, 1024))),
    ("3*2^-11: e4m3 above half -> 2^-9", ("num", 0, F(3, 2048))),
    ("3*2^-10: e4m3 tie 2^-9|2^-8 -> 2^-8", ("num", 0, F(3, 1024))),
    ("2^-14: e5m2 min normal", ("num", 0, F(1, 2 ** 14))),
    ("2^-16: e5m2 min subnormal", ("num", 0, F(1, 2 ** 16))),
    ("2^-17: e5m2 tie 0|2^-16 -> 0", ("num", 0, F(1, 2 ** 17))),
    ("3*2^-18: e5m2 above half -> 2^-16", ("num", 0, F(3, 2 ** 18))),
    ("+inf", ("inf", 0)),
    ("-inf", ("inf", 1)),
    ("+NaN", ("nan", 0)),
    ("-NaN: sign cleared", ("nan", 1)),
]


def print_tables():
    print("// clang-format off")
    print("// Generated by tests/tensor/float8_reference.py; paste its output over this block.")
    for fmt in FORMATS:
        print(f"constexpr uint32_t {fmt}DecodedBits[256] = {{")
        for row in range(0, 256, 8):
            print("    " + " ".join(f"0x{float32_bits_of_code(fmt, c):08x}u," for c in range(row, row + 8)))
        print("};")
    print("constexpr ExhaustiveCase kExhaustive[] = {")
    for src in SOURCES:
        for fmt in FORMATS:
            for mode in MODES:
                h = fnv1a64(outputs(src, fmt, mode))
                print(f"    {{Source::{src}, Format::{fmt}, Fp8Saturation::{mode}, 0x{h:016x}ull}},")
    print("};")
    print("constexpr ChosenCase kChosen[] = {")
    for src in SOURCES:
        for what, value in CHOSEN:
            bits = source_bits_of(src, value)
            if bits is None:
                continue  # not exact in this source type (e.g. 65504 in bf16)
            for fmt in FORMATS:
                for mode in MODES:
                    code = fp8_encode(fmt, mode, value)
                    print(f'    {{Source::{src}, Format::{fmt}, Fp8Saturation::{mode}, 0x{bits:04x}, 0x{code:02x}, "{what}"}},')
    print("};")
    print("// clang-format on")


def check_torch(device):
    """Compares torch's .to(float8) with this reference over every f16 and bf16 input. torch
    2.15 (checked on CPU) saturates e4m3fn (overflow and +-inf -> +-448, as satfinite) but not
    e5m2 (-> +-inf, as nosat), and keeps the sign of a NaN where CUDA's cast clears it; any other
    difference is reported as unexpected."""
    import numpy as np
    import torch

    dtypes = {"kE4M3": torch.float8_e4m3fn, "kE5M2": torch.float8_e5m2}
    sources = {"kF16": torch.float16, "kBF16": torch.bfloat16}
    all_ok = True
    for src, sdt in sources.items():
        x = torch.from_numpy(np.arange(1 << 16, dtype=np.uint16).view(np.int16)).view(sdt).to(device)
        for fmt, fdt in dtypes.items():
            got = x.to(fdt).view(torch.uint8).cpu().numpy().tolist()
            for mode in MODES:
                ref = outputs(src, fmt, mode)
                diffs = [b for b in range(1 << 16) if got[b] != ref[b]]
                nan_sign = [b for b in diffs if source_decode(src, b)[0] == "nan" and got[b] == (0x7F | (b >> 15 << 7))]
                print(f"{src} -> {fmt} {device}: torch differs from {mode} at {len(diffs)} inputs, "
                      f"{len(nan_sign)} of them NaN inputs where torch keeps the sign")
            torch_mode = "kSatFinite" if fmt == "kE4M3" else "kNoSat"
            ref = outputs(src, fmt, torch_mode)
            unexplained = [b for b in range(1 << 16) if got[b] != ref[b]
                           and not (source_decode(src, b)[0] == "nan" and got[b] == (0x7F | (b >> 15 << 7)))]
            if unexplained:
                print(f"  UNEXPECTED vs {torch_mode}: inputs {[hex(b) for b in unexplained[:10]]}")
            all_ok &= not unexplained
    for fmt, fdt in dtypes.items():
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(device).view(fdt)
        vals = codes.to(torch.float32).view(torch.int32).cpu().numpy().view(np.uint32).tolist()
        bad = 0
        for c in range(256):
            ref = float32_bits_of_code(fmt, c)
            if (ref & 0x7FFFFFFF) > 0x7F800000:
                bad += not ((vals[c] & 0x7FFFFFFF) > 0x7F800000)
            else:
                bad += vals[c] != ref
        print(f"{fmt} decode {device} vs torch: {bad} of 256 codes differ (NaN compared as NaN)")
        all_ok &= bad == 0
    print(f"torch {torch.__version__} on {device}: e4m3fn = satfinite, e5m2 = nosat, except NaN sign: "
          + ("confirmed" if all_ok else "NOT confirmed"))
    return 0 if all_ok else 1


if __name__ == "__main__":
    if "--check-torch" in sys.argv[1:]:
        sys.exit(check_torch("cuda" if "--cuda" in sys.argv[1:] else "cpu"))
    print_tables()
