#!/usr/bin/python3
# gen_print_fixtures.py - writes print_fixtures.txt: float32 tensors and the exact text PyTorch 1.13
# prints for them (str(tensor), default print options), checked by tests/test_print.c.
#
# Run with a Python that has torch:  /usr/bin/python3 tests/golden/gen_print_fixtures.py
#
# File format (line based, '#' lines are comments):
#   case NAME
#   kind tensor|parameter            parameter: repr(nn.Parameter(t)), "Parameter containing:\n..."
#   shape NDIM D0 D1 ...
#   suffix N                         then N lines, one suffix each (grad_fn=<...>, names=(...), ...)
#   data COUNT                       then the COUNT float32 values as 8-digit hex bit patterns, several
#                                    per line; "HEX*K" stands for K copies of HEX
#   expect N                         then the N lines of the expected text (no trailing newline)
#   end
#
# Tensors with more than 1000 elements are printed summarized; their hidden elements (which never
# reach the output) are mostly set to a sentinel value, which keeps the file small and checks that
# they are ignored when choosing the notation.
import itertools
import math
import os
import sys

import torch

torch.manual_seed(20240611)
torch.set_printoptions(profile="default")
torch.set_printoptions(sci_mode=None)

EDGE = 3
CASES = []


def f32(values):
    return torch.tensor(values, dtype=torch.float32)


def bits_of(t):
    flat = t.detach().reshape(-1).contiguous()
    return [int(v) & 0xFFFFFFFF for v in flat.view(torch.int32).tolist()]


def add(name, t, kind="tensor", suffixes=None, expected=None):
    if suffixes is None:
        suffixes = []
        if t.grad_fn is not None:
            suffixes.append("grad_fn=<{}>".format(type(t.grad_fn).__name__))
        elif t.requires_grad and kind != "parameter":
            suffixes.append("requires_grad=True")
        if t.has_names():
            suffixes.append("names={}".format(t.names))
    if expected is None:
        expected = repr(t) if kind == "parameter" else str(t)
    plain = t.detach()
    if plain.has_names():
        plain = plain.rename(None)
    assert plain.dtype == torch.float32
    CASES.append((name, kind, tuple(plain.shape), suffixes, bits_of(plain), expected))


def shown_mask(shape, summarize):
    """Boolean mask of the elements PyTorch shows (all of them unless summarized)."""
    mask = torch.zeros(shape, dtype=torch.bool)
    if not summarize:
        mask[...] = True
        return mask
    idx = []
    for n in shape:
        if n > 2 * EDGE:
            idx.append(list(range(EDGE)) + list(range(n - EDGE, n)))
        else:
            idx.append(list(range(n)))
    for ix in itertools.product(*idx):
        mask[ix] = True
    return mask


def hide(t, sentinel):
    """Sets the elements a summarized print never shows to `sentinel`."""
    t = t.clone()
    mask = shown_mask(tuple(t.shape), t.numel() > 1000)
    t[~mask] = sentinel
    return t


def lognormal(shape, lo, hi):
    """Random signs and magnitudes spread log-uniformly over [10**lo, 10**hi]."""
    e = torch.rand(shape, dtype=torch.float64) * (hi - lo) + lo
    s = torch.where(torch.rand(shape) < 0.5, -1.0, 1.0).double()
    return (s * torch.pow(10.0, e)).float()


def sprinkle(t, values, frac=0.2):
    t = t.clone().reshape(-1)
    n = t.numel()
    k = max(1, int(n * frac))
    pos = torch.randperm(n)[:k]
    for j, p in enumerate(pos.tolist()):
        t[p] = values[j % len(values)]
    return t


NAN, INF = float("nan"), float("inf")

# ---- 0-d tensors ----------------------------------------------------------------------------------
scalars = [0.0, -0.0, 1.0, -1.0, 2.0, 1.8524, -1.8524, 0.5, 0.1, 1e-4, 9.999e-5, 1e-5, 1e8, 1.0000001e8, 123456.0,
           1e10, -1e10, 3.4028235e38, -3.4028235e38, 1.4e-45, 1.17549435e-38, NAN, INF, -INF, 3.14159265, 1e-3,
           99999.5, 0.00015, 16777216.0, 16777217.0, 0.99999, 9.99995, -9.99995, 7.0, -123.0, 100000000.0, 1e9,
           2.5e-7, 65504.0, 1.0 / 3.0]
for i, v in enumerate(scalars):
    add("scalar_%d" % i, torch.tensor(v, dtype=torch.float32))
add("scalar_negnan", f32([NAN]).neg().reshape(()))
for i in range(12):
    add("scalar_rand_%d" % i, lognormal((), -12, 12))

# ---- 1-d tensors ----------------------------------------------------------------------------------
add("vec_len1", f32([0.25]))
add("vec_ints", f32([1.0, 2.0, 3.0]))
add("vec_ints_neg", f32([-1.0, 20.0, -300.0, 0.0]))
add("vec_zeros", torch.zeros(5))
add("vec_negzeros", f32([-0.0, 0.0, -0.0]))
add("vec_negzero_int", f32([-0.0, 1.0, 2.0]))
add("vec_negzero_fixed", f32([-0.0, 1.5, 2.25]))
add("vec_negzero_sci", f32([-0.0, 1.5e-7, 2.25]))
add("vec_all_nan", f32([NAN, NAN]))
add("vec_all_inf", f32([INF, -INF, NAN]))
add("vec_nan_zero", f32([NAN, 0.0, -0.0, INF]))
add("vec_int_nan", f32([1.0, NAN, -INF, 2.0]))
add("vec_int_wide_nan", f32([1000.0, NAN, -INF, 2.0]))
add("vec_fixed_nan", f32([1.5, NAN, -INF, 2.0]))
add("vec_sci_nan", f32([1.5e-9, NAN, -INF, 2.0]))
add("vec_sci_int", f32([1.0, 1001.0]))
add("vec_int_ratio_1000", f32([1.0, 1000.0]))
add("vec_int_1e8", f32([1e8, 1e6]))
add("vec_int_over_1e8", f32([1.0000001e8, 1e6]))
add("vec_fixed_ratio_1000", f32([0.5, 500.0]))
add("vec_fixed_ratio_over", f32([0.5, 500.5]))
add("vec_min_1e4", f32([1e-4, 0.05]))
add("vec_min_over_1e4", f32([1.0001e-4, 0.05]))
add("vec_round_up", f32([9.99995, 1.0, -9.99996]))
add("vec_round_ties", f32([0.03125, 0.15625, -0.46875, 2.5]))
add("vec_half_int", f32([0.5, 1.5, 2.5, -3.5]))
add("vec_pi", f32([3.14159265, -2.71828183, 1.41421356]))
add("vec_empty", torch.zeros(0))
for i, (lo, hi) in enumerate([(-1, 1), (-3, 0), (0, 3), (-5, -3), (3, 6), (-12, -6), (6, 12), (-40, 38), (-2, 2),
                              (7, 9), (-4, -2), (1, 4)]):
    for n in (1, 4, 9, 17):
        add("vec_mag_%d_%d" % (i, n), lognormal((n,), lo, hi))
for i, scale in enumerate([1e-9, 1e-6, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e7, 1e9, 1e12]):
    add("vec_randn_%d" % i, torch.randn(8) * scale)
for i, hi in enumerate([2, 10, 100, 1000, 100000, 10 ** 7, 10 ** 9]):
    add("vec_randint_%d" % i, torch.randint(-hi, hi, (10,)).float())
# Long rows: wrapping at linewidth 80 for every width.
for n in (10, 11, 12, 13, 25, 37, 64, 100, 200, 1000):
    add("vec_long_randn_%d" % n, torch.randn(n))
for n in (20, 40, 81, 150):
    add("vec_long_int_%d" % n, torch.arange(n, dtype=torch.float32) - 5)
    add("vec_long_sci_%d" % n, lognormal((n,), -9, 9))
    add("vec_long_big_%d" % n, torch.randn(n) * 1e4)
add("vec_long_nan", sprinkle(torch.randn(60), [NAN, INF, -INF]))
add("vec_long_int_nan", sprinkle(torch.randint(-9, 9, (60,)).float(), [NAN, INF, -INF]))
add("vec_long_int_wide", torch.randint(-99999999, 99999999, (30,)).float())

# ---- 2-d to 4-d tensors -----------------------------------------------------------------------------
shapes2 = [(1, 1), (1, 5), (5, 1), (2, 3), (3, 2), (4, 4), (6, 6), (7, 7), (3, 12), (10, 3), (2, 30), (30, 2),
           (8, 16), (25, 40)]
for shp in shapes2:
    name = "x".join(map(str, shp))
    add("mat_randn_" + name, torch.randn(shp))
    add("mat_int_" + name, torch.randint(-50, 50, shp).float())
for i, (lo, hi) in enumerate([(-8, -5), (-2, 2), (4, 9), (-20, 20)]):
    add("mat_mag_%d" % i, lognormal((4, 5), lo, hi))
add("mat_softmax", torch.softmax(torch.randn(4, 6) * 3, dim=-1))
add("mat_special", f32([[NAN, 1.0, -0.0], [INF, -INF, 2.5]]))
add("mat_int_special", f32([[NAN, 1.0, -0.0], [INF, -INF, 2.0]]))
add("mat_zeros", torch.zeros(3, 4))
add("mat_eye", torch.eye(4))
add("mat_causal", torch.triu(torch.full((5, 5), -INF), diagonal=1))
add("mat_wide_sci", lognormal((3, 20), -10, 10))
shapes3 = [(1, 1, 1), (2, 2, 2), (2, 3, 4), (3, 1, 5), (1, 4, 1), (4, 2, 3), (2, 5, 20), (7, 2, 2), (3, 3, 3)]
for shp in shapes3:
    name = "x".join(map(str, shp))
    add("t3_randn_" + name, torch.randn(shp))
    add("t3_int_" + name, torch.randint(-5, 5, shp).float())
add("t3_sci", lognormal((2, 3, 4), -7, 3))
shapes4 = [(1, 1, 1, 1), (2, 2, 2, 2), (1, 2, 3, 4), (2, 1, 3, 2), (2, 3, 2, 12), (3, 2, 2, 2)]
for shp in shapes4:
    name = "x".join(map(str, shp))
    add("t4_randn_" + name, torch.randn(shp))
    add("t4_int_" + name, torch.randint(0, 3, shp).float())
add("t4_mixed", sprinkle(lognormal((2, 2, 3, 3), -3, 3), [NAN, -0.0, INF]).reshape(2, 2, 3, 3))
for nd in range(5, 9):
    shp = tuple([2] * (nd - 3) + [1, 2, 3])
    add("t%d_randn" % nd, torch.randn(shp))
    add("t%d_ones" % nd, torch.ones([1] * nd))

# ---- empty tensors ------------------------------------------------------------------------------------
for shp in [(0,), (0, 3), (3, 0), (0, 0), (2, 0, 3), (1, 1, 0), (0, 1, 2, 3), (4, 3, 2, 0), (1, 0, 1, 0, 1)]:
    add("empty_" + "x".join(map(str, shp)), torch.zeros(shp))

# ---- summarized tensors (more than 1000 elements) ---------------------------------------------------
summ_shapes = [(1001,), (2000,), (100000,), (1, 1001), (1001, 1), (40, 30), (2, 600), (600, 2), (7, 150),
               (11, 10, 10), (3, 3, 112), (2, 3, 4, 50), (1, 2, 1, 600)]
sentinels = [1e30, NAN, 0.5, 1e-30, -INF, 3.0]
for i, shp in enumerate(summ_shapes):
    name = "x".join(map(str, shp))
    sent = sentinels[i % len(sentinels)]
    add("summ_randn_" + name, hide(torch.randn(shp), sent))
    add("summ_int_" + name, hide(torch.randint(-20, 20, shp).float(), sentinels[(i + 1) % len(sentinels)]))
    add("summ_mag_" + name, hide(lognormal(shp, -6, 6), sentinels[(i + 2) % len(sentinels)]))
# Summarized tensors whose shown part is large: one variant each.
add("summ_randn_7x7x7x7", hide(torch.randn(7, 7, 7, 7), 1e30))
add("summ_int_10x10x10x10", hide(torch.randint(-20, 20, (10, 10, 10, 10)).float(), 0.5))
add("summ_mag_6x6x6x6", hide(lognormal((6, 6, 6, 6), -6, 6), NAN))
add("summ_int_3x2x7x2x7x2", hide(torch.randint(-2, 2, (3, 2, 7, 2, 7, 2)).float(), 1e-30))
add("summ_special", hide(sprinkle(torch.randn(50, 50), [NAN, INF, -INF, -0.0], 0.3).reshape(50, 50), 2.0))
add("summ_full_1001", torch.randn(1001))
add("summ_full_40x30", lognormal((40, 30), -2, 2))
add("summ_full_7x7x7x3", torch.randint(-3, 3, (7, 7, 7, 3)).float())
add("summ_full_2x3x200", torch.randn(2, 3, 200) * 100)

# ---- suffixes: grad_fn, requires_grad, names; parameters ------------------------------------------
x = torch.randn(3, 4, requires_grad=True)
w = torch.randn(4, 5, requires_grad=True)
add("grad_leaf", x)
add("grad_mm", x @ w)
add("grad_mul", x * 2)
add("grad_add", x + 1)
add("grad_softmax", torch.softmax(x, dim=-1))
add("grad_sum", x.sum())
add("grad_mean", (x @ w).mean())
add("grad_t", x.t())
add("grad_view", x.view(2, 6))
add("grad_tanh", torch.tanh(x))
xl = torch.randn(2, 25, requires_grad=True)
add("grad_long_mul", xl * 3)
add("grad_long_leaf", xl)
add("grad_vec_wrap", torch.randn(9, requires_grad=True) * 1000)
add("grad_vec_nowrap", torch.randn(5, requires_grad=True) * 2)
add("grad_vec_edge", torch.randn(7, requires_grad=True) * 10)
for n in range(5, 12):
    add("grad_vec_len_%d" % n, torch.randn(n, requires_grad=True) + 0)
add("grad_sci", lognormal((2, 3), -8, 4).requires_grad_() * 1)
add("grad_summ", hide(torch.randn(40, 40), 1e30).requires_grad_() * 1)
add("grad_empty", torch.zeros(0, 3, requires_grad=True))
add("grad_empty_vec", torch.zeros(0, requires_grad=True))
add("grad_empty_mul", torch.zeros(2, 0, 5, requires_grad=True) * 2)
add("grad_scalar_leaf", torch.tensor(1.5, requires_grad=True))
add("named_2d", torch.randn(2, 3).refine_names("N", "C"))
add("named_grad", torch.randn(2, 3, requires_grad=True).refine_names("N", "C"))
add("named_long", torch.randn(3, 8, requires_grad=True).refine_names("batch", "features"))
add("named_empty", torch.zeros(0, 3, requires_grad=True).refine_names("N", "C"))
for i, shp in enumerate([(4, 3), (3,), (2, 2, 2), (0, 3), (8,), (1, 12), (40, 30), ()]):
    t = torch.randn(shp) if len(shp) != 2 or shp[0] != 40 else hide(torch.randn(shp), 1e30)
    add("param_%d" % i, torch.nn.Parameter(t), kind="parameter")
add("param_long", torch.nn.Parameter(torch.randn(2, 10) * 100), kind="parameter")
add("param_int", torch.nn.Parameter(torch.ones(2, 2)), kind="parameter")


def hex_tokens(bits):
    out = []
    i = 0
    while i < len(bits):
        j = i
        while j < len(bits) and bits[j] == bits[i]:
            j += 1
        run = j - i
        if run >= 3:
            out.append("%08x*%d" % (bits[i], run))
        else:
            out.extend("%08x" % bits[i] for _ in range(run))
        i = j
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "print_fixtures.txt")
    names = set()
    lines = ["# print_fixtures.txt - float32 tensors and their exact PyTorch %s str() text." % torch.__version__,
             "# Generated by gen_print_fixtures.py; the format is described there."]
    for name, kind, shape, suffixes, bits, expected in CASES:
        assert name not in names, name
        names.add(name)
        assert all("\n" not in s for s in suffixes)
        lines.append("case " + name)
        lines.append("kind " + kind)
        lines.append("shape %d%s" % (len(shape), "".join(" %d" % d for d in shape)))
        lines.append("suffix %d" % len(suffixes))
        lines.extend(suffixes)
        lines.append("data %d" % len(bits))
        toks = hex_tokens(bits)
        for i in range(0, len(toks), 12):
            lines.append(" ".join(toks[i:i + 12]))
        exp = expected.split("\n")
        lines.append("expect %d" % len(exp))
        lines.extend(exp)
        lines.append("end")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("%s: %d cases, %d bytes" % (path, len(CASES), os.path.getsize(path)), file=sys.stderr)


if __name__ == "__main__":
    main()
