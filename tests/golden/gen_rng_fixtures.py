#!/usr/bin/python3
"""Writes rng_fixtures.h: PyTorch's CPU generator outputs for tests/test_rng.c.

Run with a Python that has torch (CPU build without MKL, x86-64 with AVX2; the values were
produced with Debian's python3-torch 1.13):

    /usr/bin/python3 tests/golden/gen_rng_fixtures.py

Every expected value comes from torch itself. A fixture is a "case": manual_seed(seed), then a
list of steps (one torch call each, with its expected output as float32/float64 bit patterns),
then the next four raw 32-bit words of the generator, which pins the number of draws each case
consumed. Raw 32-bit words are read from torch with random_() on int64 tensors (see torch_u32)
and cross-checked against numpy's legacy-seeded MT19937.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rng_fixtures.h")

# Step kinds; keep in sync with the enum written into the header.
OPS = ["SEED", "SET_WORDS", "RAW_U32", "RAND_F64", "UNIFORM", "NORMAL", "BERNOULLI", "DROPOUT", "LINEAR",
       "XAVIER_UNIFORM", "XAVIER_NORMAL", "EMBEDDING"]
KINDS = ["MT", "RAND", "UNIFORM", "RAND_F64", "RANDN", "NORMAL", "NORMAL_CACHE", "BERNOULLI",
         "DROPOUT", "LINEAR", "MHA", "EMBEDDING"]


# ---- reading torch's generator -------------------------------------------------------------

def torch_u32(n):
    """The next n tempered 32-bit outputs of the default generator (consumes exactly n words).

    random_(0, 2**32 - 1) on int64 takes one word per element and returns it mod 2**32 - 1, which
    maps both 0 and 0xffffffff to 0; replaying the same words with random_(0, 2**31) (the low 31
    bits) tells those two apart."""
    state = torch.get_rng_state()
    a = torch.empty(n, dtype=torch.int64).random_(0, 2**32 - 1).numpy().astype(np.uint64)
    after = torch.get_rng_state()
    torch.set_rng_state(state)
    b = torch.empty(n, dtype=torch.int64).random_(0, 2**31).numpy().astype(np.uint64)
    assert torch.equal(after, torch.get_rng_state())
    u = np.where(a != 0, a, np.where(b == 0, 0, 0xFFFFFFFF)).astype(np.uint64)
    assert np.array_equal(u & 0x7FFFFFFF, b)
    return [int(v) for v in u]


def numpy_mt_u32(seed, n):
    bg = np.random.MT19937(0)
    bg._legacy_seeding(seed & 0xFFFFFFFF)
    return [int(v) for v in bg.random_raw(n)]


def f32_bits(t):
    a = np.ascontiguousarray(t.detach().numpy().astype(np.float32, copy=False)).ravel()
    return [int(v) for v in a.view(np.uint32)]


def f64_bits(t):
    a = np.ascontiguousarray(t.detach().numpy().astype(np.float64, copy=False)).ravel()
    return [int(v) for v in a.view(np.uint64)]


def fnv1a64(words):
    """FNV-1a (64-bit) over the little-endian bytes of 32-bit words; test_rng.c computes the same."""
    h = 0xCBF29CE484222325
    for w in words:
        for k in range(4):
            h = ((h ^ ((w >> (8 * k)) & 0xFF)) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# ---- cases -----------------------------------------------------------------------------------

cases = []


class Case:
    def __init__(self, kind, name, seed):
        self.kind, self.name, self.seed = kind, name, seed
        self.steps = []
        torch.manual_seed(seed)

    def step(self, op, n=0, i0=0, i1=0, i2=0, a=0.0, b=0.0, inp=None, want=None, want2=None, want64=None):
        self.steps.append(dict(op=op, n=n, i0=i0, i1=i1, i2=i2, a=float(a), b=float(b), inp=inp,
                               want=want, want2=want2, want64=want64))

    def step_hashed(self, op, n=0, i0=0, i1=0, i2=0, a=0.0, b=0.0, outs=()):
        """A step whose outputs are too large to store: only FNV-1a hashes (want64; LINEAR's bias: hash2)."""
        self.step(op, n=n, i0=i0, i1=i1, i2=i2, a=a, b=b, want64=[fnv1a64(f32_bits(outs[0]))])
        if len(outs) > 1:
            self.steps[-1]["hash2"] = [fnv1a64(f32_bits(outs[1]))]

    def done(self):
        self.next = torch_u32(4)
        cases.append(self)


def rng_case(kind, name, seed, op, n, a, b, fn):
    c = Case(kind, name, seed)
    c.step(op, n=n, a=a, b=b, want=f32_bits(fn()))
    c.done()


# 1. raw MT19937 streams (the first crosses the second twist at word 624), seeds with more than 32 bits
for seed, n in ((0, 640), (123, 64), (2**32 + 123, 32), (1, 32), (2**31 + 7, 32), (0xFFFFFFFF, 32),
                (0xDEADBEEF12345678, 32)):
    c = Case("MT", f"mt19937 seed={seed:#x} {n} words", seed)
    words = torch_u32(n)
    assert words == numpy_mt_u32(seed, n), seed
    c.step("RAW_U32", n=n, want=words)
    c.done()

# 2. torch.rand: sizes 1..40, then a few large ones
for n in range(1, 41):
    rng_case("RAND", f"rand({n})", 1000 + n, "UNIFORM", n, 0.0, 1.0, lambda: torch.rand(n))
for seed, n in ((0, 640), (2**32 + 5, 100)):
    rng_case("RAND", f"rand({n}) seed={seed}", seed, "UNIFORM", n, 0.0, 1.0, lambda: torch.rand(n))

# 3. uniform_(from, to): here the single FMA of the AVX2 kernel matters
b3 = 1 / math.sqrt(3)
for seed, n, lo, hi in ((0, 256, -0.37, 0.37), (123, 150, 2.0, 5.0), (1, 200, -b3, b3), (2, 100, -3.5, -1.25),
                        (3, 64, 0.0, 1e-3), (4, 64, -0.1, 0.3), (5, 50, -1e6, 1e6), (6, 5, 1.5, 1.5),
                        (7, 40, -1e-30, 2e-30)):
    rng_case("UNIFORM", f"uniform_({lo!r}, {hi!r}) n={n}", seed, "UNIFORM", n, lo, hi,
             lambda: torch.empty(n).uniform_(lo, hi))

# 4. float64 rand: 53 bits of random64 (first word high), also at an odd word offset
c = Case("RAND_F64", "rand(50, float64)", 7)
c.step("RAND_F64", n=50, want64=f64_bits(torch.rand(50, dtype=torch.float64)))
c.done()
c = Case("RAND_F64", "rand(3) then rand(9, float64)", 8)
c.step("UNIFORM", n=3, a=0.0, b=1.0, want=f32_bits(torch.rand(3)))
c.step("RAND_F64", n=9, want64=f64_bits(torch.rand(9, dtype=torch.float64)))
c.done()

# 5. randn: both paths (< 16 and >= 16) and the re-drawn overlapping last block
for n in list(range(1, 41)) + [64, 100, 257, 1000]:
    rng_case("RANDN", f"randn({n})", 2000 + n, "NORMAL", n, 0.0, 1.0, lambda: torch.randn(n))

# 6. normal_(mean, std): small path (double mean/std) and block path (float mean/std)
for seed, n, mean, std in ((0, 5, 0.3, 0.02), (5, 12, -1.0, 2.5), (6, 7, 0.1, 0.7), (0, 40, 0.3, 0.02),
                           (5, 50, -1.0, 2.5), (7, 300, 10.0, 3.0), (8, 5, 1.5, 0.0), (9, 20, 1.5, 0.0),
                           (10, 33, -0.1, 1e-3), (11, 15, 1e3, 1e-4)):
    rng_case("NORMAL", f"normal_({mean!r}, {std!r}) n={n}", seed, "NORMAL", n, mean, std,
             lambda: torch.empty(n).normal_(mean, std))

# 7. the cached Box-Muller value: survives calls and the >= 16 path, cleared by manual_seed
for seed, seq in ((11, [(3, 0, 1), (1, 0, 1), (20, 0, 1), (1, 0, 1), (2, 0, 1)]),
                  (12, [(1, 0, 1), (40, 0, 1), (1, 0, 1), (1, 0, 1)]),
                  (13, [(1, 2.0, 3.0), (1, -1.0, 0.5), (17, 0, 1), (3, 0.25, 2.0)]),
                  (14, [(1, 0, 1), "SEED", (2, 0, 1)]),
                  (15, [(5, 0, 1), "SEED", (16, 0, 1), (1, 0, 1)])):
    c = Case("NORMAL_CACHE", "randn sequence " + ",".join("seed" if s == "SEED" else str(s[0]) for s in seq), seed)
    for s in seq:
        if s == "SEED":
            torch.manual_seed(seed)
            c.step("SEED", i0=seed)
        else:
            n, mean, std = s
            c.step("NORMAL", n=n, a=mean, b=std, want=f32_bits(torch.empty(n).normal_(mean, std)))
    c.done()

# 8. bernoulli_(p), scalar p: two words per element for every p, 0 and 1 included
for i, p in enumerate((0.0, 0.1, 0.3, 0.5, 0.7, 1.0)):
    rng_case("BERNOULLI", f"bernoulli_({p}) n=64", 300 + i, "BERNOULLI", 64, p, 0.0,
             lambda: torch.empty(64).bernoulli_(p))

# 9. F.dropout(x, p, training=True): mixed-sign input (dropped negatives become -0)
torch.manual_seed(4242)
x40 = (torch.randn(40) * 2).contiguous()
for i, p in enumerate((0.0, 0.1, 0.3, 0.5, 0.7, 1.0)):
    c = Case("DROPOUT", f"F.dropout(x, {p}) n=40", 400 + i, )
    y = F.dropout(x40, p, True)
    c.step("DROPOUT", n=40, a=p, inp=f32_bits(x40), want=f32_bits(y))
    c.done()
c = Case("DROPOUT", "nn.Dropout(0.5)(ones(6,6)) seed=123", 123)
d = nn.Dropout(0.5)
d.train()
c.step("DROPOUT", n=36, a=0.5, inp=f32_bits(torch.ones(36)), want=f32_bits(d(torch.ones(6, 6))))
c.done()

# 10. nn.Linear: kaiming_uniform_(a=sqrt 5) weight, then the bias
for seed, (fin, fout, bias) in ((0, (3, 2, False)), (123, (3, 2, True)), (789, (16, 7, True)),
                                (1, (4, 12, False)), (2, (50, 3, True)), (3, (1, 5, True))):
    c = Case("LINEAR", f"nn.Linear({fin}, {fout}, bias={bias})", seed)
    lin = nn.Linear(fin, fout, bias=bias)
    c.step("LINEAR", n=fout * fin, i0=fin, i1=fout, i2=int(bias), want=f32_bits(lin.weight),
           want2=f32_bits(lin.bias) if bias else None)
    c.done()

# 11. nn.MultiheadAttention: out_proj's Linear first (its bias drawn, then zeroed), xavier_uniform_
#     on in_proj_weight or q/k/v_proj_weight, then xavier_normal_ on bias_k and bias_v.
for seed, (E, H, kw) in ((1, (4, 2, {})), (123, (4, 2, dict(bias=False))), (1, (8, 2, dict(add_bias_kv=True))),
                         (123, (32, 4, dict(add_bias_kv=True))), (1, (6, 3, dict(kdim=5, vdim=3))),
                         (123, (17, 1, dict(add_bias_kv=True, kdim=7, vdim=9)))):
    c = Case("MHA", f"nn.MultiheadAttention({E}, {H}, {kw})", seed)
    m = nn.MultiheadAttention(E, H, **kw)
    sd = m.state_dict()
    bias = kw.get("bias", True)
    c.step("LINEAR", n=E * E, i0=E, i1=E, i2=int(bias), want=f32_bits(sd["out_proj.weight"]))
    if "in_proj_weight" in sd:
        c.step("XAVIER_UNIFORM", n=3 * E * E, i0=3 * E, i1=E, want=f32_bits(sd["in_proj_weight"]))
    else:
        for name, fan_in in (("q", E), ("k", kw.get("kdim", E)), ("v", kw.get("vdim", E))):
            c.step("XAVIER_UNIFORM", n=E * fan_in, i0=E, i1=fan_in, want=f32_bits(sd[name + "_proj_weight"]))
    if bias:
        assert not sd["in_proj_bias"].any() and not sd["out_proj.bias"].any()
    if kw.get("add_bias_kv"):
        for name in ("bias_k", "bias_v"):
            c.step("XAVIER_NORMAL", n=E, i0=E, i1=E, want=f32_bits(sd[name]))
    c.done()

# 12. nn.Embedding: normal_ over every row, then row padding_idx zeroed
for seed, (num, dim, pad) in ((0, (6, 3, None)), (123, (3, 4, None)), (1, (6, 5, 2)), (2, (10, 8, 3)),
                              (3, (12, 16, 0))):
    c = Case("EMBEDDING", f"nn.Embedding({num}, {dim}, padding_idx={pad})", seed)
    emb = nn.Embedding(num, dim, padding_idx=pad)
    c.step("EMBEDDING", n=num * dim, i0=num, i1=dim, i2=-1 if pad is None else pad, want=f32_bits(emb.weight))
    c.done()


# 13. Large outputs, compared through their hashes: the AVX2 log/sincos polynomials and the FMA of
#     uniform_ differ from other roundings in only a small fraction of values, so many are needed.
for seed in range(10):
    c = Case("RANDN", f"randn(4099) seed={seed} [hash]", seed)
    c.step_hashed("NORMAL", n=4099, a=0.0, b=1.0, outs=[torch.randn(4099)])
    c.done()
c = Case("NORMAL", "normal_(0.5, 2.0) n=20000 [hash]", 31)
c.step_hashed("NORMAL", n=20000, a=0.5, b=2.0, outs=[torch.empty(20000).normal_(0.5, 2.0)])
c.done()
c = Case("UNIFORM", "uniform_(-0.37, 0.37) n=20000 [hash]", 32)
c.step_hashed("UNIFORM", n=20000, a=-0.37, b=0.37, outs=[torch.empty(20000).uniform_(-0.37, 0.37)])
c.done()
c = Case("LINEAR", "nn.Linear(512, 256, bias=True) [hash]", 33)
lin = nn.Linear(512, 256)
c.step_hashed("LINEAR", n=512 * 256, i0=512, i1=256, i2=1, outs=[lin.weight, lin.bias])
c.done()
c = Case("MHA", "nn.MultiheadAttention(64, 8, add_bias_kv=True) [hash]", 34)
m = nn.MultiheadAttention(64, 8, add_bias_kv=True)
sd = m.state_dict()
c.step_hashed("LINEAR", n=64 * 64, i0=64, i1=64, i2=1, outs=[sd["out_proj.weight"]])
c.step_hashed("XAVIER_UNIFORM", n=3 * 64 * 64, i0=3 * 64, i1=64, outs=[sd["in_proj_weight"]])
c.step_hashed("XAVIER_NORMAL", n=64, i0=64, i1=64, outs=[sd["bias_k"]])
c.step_hashed("XAVIER_NORMAL", n=64, i0=64, i1=64, outs=[sd["bias_v"]])
c.done()


# 14. normal_ with fewer than 16 elements computes z * std + mean in double, fused into one FMA in
#     the AVX2 build. Rounding that to float differs from two roundings only near a float tie, so
#     mean and std are chosen here to put z * std + mean right next to one.
def fma_sensitive_mean_std(seed, which):
    from fractions import Fraction as Fr
    torch.manual_seed(seed)
    z = torch.randn(2, dtype=torch.float64)[which].item()   # the exact double Box-Muller value
    for std in (0.7, 0.9, 1.1, 1.3, 2.7, 3.1, 0.55, 0.35):
        prod = z * std
        # ties near a value smaller than prod in magnitude, where prod's rounding error shows
        for target in (prod - math.copysign(1.0, prod), prod * 0.25, prod * 2.0**-10):
            f = np.float32(target)
            for k in range(8):
                tie = float(f) + float(np.spacing(f)) * (k + 0.5)   # halfway between two floats
                mean = tie - prod
                if Fr(prod) + Fr(mean) != Fr(tie):
                    continue
                two_roundings = np.float32(prod + mean)
                fused = np.float32(float(Fr(z) * Fr(std) + Fr(mean)))
                if fused != two_roundings:
                    return mean, std, fused, two_roundings
    raise RuntimeError(f"no FMA-sensitive mean/std for seed {seed}")


for seed, which in ((41, 0), (42, 1), (43, 0), (44, 1)):
    mean, std, fused, two_roundings = fma_sensitive_mean_std(seed, which)
    c = Case("NORMAL", f"normal_({mean!r}, {std!r}) n=2, element {which} needs the double FMA", seed)
    out = torch.empty(2).normal_(mean, std)
    got = np.float32(out[which].item())
    assert got == fused and got != two_roundings, (seed, got, fused, two_roundings)
    c.step("NORMAL", n=2, a=mean, b=std, want=f32_bits(out))
    c.done()


# 15. randn over chosen uniforms. The AVX2 sincos differs between roundings only for rare inputs:
#     of the 2^24 possible u2 = k * 2^-24, these are all the k for which computing the cos polynomial
#     without its two inner FMAs (first 3: the x - y*DP3 reduction without FMA) changes sin or cos.
#     A generator state whose next words are these k (each also used as the paired u1 = 1 - k*2^-24)
#     lets torch itself decide. (The other fusion choices in log/sincos change no input at all.)
SINCOS_RARE_K = [
    12582909, 12582912, 12582913, 962270, 1183958, 1254310, 1276341, 1281986, 1293837, 1323172, 1339923, 1366339,
    1442928, 1479374, 1525290, 1601985, 1622319, 1633699, 1637716, 1646822, 1668577, 1710163, 1720256, 1752209,
    1781503, 1781563, 1787367, 1787791, 1797299, 1812699, 1815041, 1817412, 1822060, 1824987, 1826047, 1837148,
    1840459, 1840591, 1851944, 1867075, 1879118, 1881349, 1882068, 1883748, 1884998, 1889815, 1896618, 1903950,
    1914905, 1925810, 1939647, 1955295, 1964362, 1973824, 1974629, 1984088, 2001323, 2006372, 2010841, 2013009,
    2016806, 2021364, 2027516, 2032171, 2043277, 2057000, 2057527, 2057698, 2060871, 2062965, 2072730, 2074770,
    2076413, 2086221, 2091321, 2093904, 2097806, 2100596, 2123295, 2127351, 2132632, 2134286, 2138914, 2145510,
    2158562, 2165142, 2169529, 2184788, 2184856, 2207583, 2207956, 2208123, 2210491, 2213300, 2215344, 2219897,
    2241992, 2256637, 2260155, 2284568, 2288672, 2298764, 2319588, 2328068, 2353380, 2356129, 2357357, 2364815,
    2374855, 2386260, 2387416, 2393213, 2397524, 2397973, 2402680, 2402794, 2410588, 2414907, 2448885, 2451713,
    2470182, 2479783, 2483341, 2545676, 2555943, 2561032, 2568149, 2594630, 2599991, 2601182, 2654519, 2676688,
    2688698, 2714930, 2789853, 2827965, 2850656, 3010346, 3012609, 5237026, 5441865, 5448614, 5463161, 5494179,
    5619270, 5681980, 5758106, 5762655, 5816623, 5842932, 5862881, 5864774, 5884415, 5904467, 5909690, 5964127,
    5975703, 5975867, 5977878, 5991603, 6002348, 6002541, 6004400, 6005640, 6009345, 6011721, 6012336, 6013753,
    6016022, 6034895, 6041836, 6053985, 6058479, 6061379, 6063176, 6068225, 6070991, 6072743, 6073422, 6082181,
    6085643, 6088456, 6090922, 6094614, 6098254, 6109209, 6137329, 6151447, 6152010, 6152259, 6158666, 6175308,
    6180485, 6200676, 6205145, 6211879, 6221820, 6226475, 6226614, 6239219, 6244670, 6250658, 6255175, 6255483,
    6255976, 6267034, 6273571, 6274262, 6275295, 6288012, 6288208, 6294704, 6294900, 6306161, 6307480, 6315878,
    6326173, 6326936, 6327737, 6338775, 6343272, 6343377, 6346387, 6346564, 6356437, 6361092, 6364903, 6368712,
    6377767, 6382236, 6402427, 6407604, 6424246, 6425422, 6430653, 6445583, 6445673, 6446335, 6469501, 6471395,
    6473703, 6479545, 6483865, 6484658, 6491990, 6496651, 6509490, 6513892, 6521533, 6537047, 6538829, 6541076,
    6548017, 6563871, 6569159, 6573567, 6580564, 6581720, 6591309, 6603498, 6605034, 6607045, 6618785, 6632568,
    6654371, 6671361, 6678445, 6684993, 6691983, 6701167, 6703882, 6708315, 6714490, 6717847, 6720031, 6723742,
    6739980, 6766289, 6788934, 6794295, 6824806, 6877641, 6954094, 7088733, 7119751, 7134298, 9664858, 9716125,
    9728531, 9732256, 9754947, 9757036, 9762323, 9867982, 9879621, 9894214, 9925002, 9990593, 10000869, 10026324,
    10069472, 10094533, 10095113, 10099571, 10119954, 10127981, 10141382, 10143032, 10148023, 10164414, 10180118, 10180232,
    10195958, 10203370, 10206020, 10209846, 10210668, 10228073, 10229067, 10250109, 10251368, 10265456, 10269957, 10281763,
    10296451, 10298344, 10305414, 10313249, 10314418, 10318319, 10343903, 10345796, 10363997, 10366705, 10372696, 10379365,
    10385583, 10398124, 10401617, 10409972, 10430020, 10437111, 10443470, 10445608, 10459617, 10463378, 10470721, 10473076,
    10474829, 10485106, 10488877, 10494663, 10501657, 10506499, 10515959, 10517169, 10527265, 10527522, 10528073, 10528805,
    10533803, 10534118, 10539635, 10547170, 10553360, 10553750, 10554207, 10558137, 10567635, 10575154, 10576880, 10582520,
    10587637, 10592409, 10593517, 10596191, 10596564, 10599099, 10603952, 10604464, 10608283, 10608505, 10610323, 10612217,
    10620938, 10639370, 10643611, 10645245, 10648763, 10658650, 10694343, 10694344, 10697914, 10756865, 10786581, 10794588,
    10796164, 10796165, 10803515, 10804536, 10835302, 10835303, 10843795, 10862655, 10862656, 10900617, 10921806, 10921807,
    10936090, 10956757, 10966977, 10989790, 11012093, 11057622, 11096243, 11103616, 11138812, 11139984, 11280376, 11284685,
    11308241, 11327611, 13838212, 13838213, 13857582, 13881138, 13881139, 13885447, 14025840, 14027011, 14062207, 14069580,
    14069581, 14108202, 14153730, 14176033, 14176034, 14198846, 14209066, 14209067, 14229734, 14244017, 14265206, 14303168,
    14322028, 14330521, 14361287, 14362308, 14362309, 14369659, 14371235, 14379242, 14379243, 14408959, 14467910, 14471480,
    14491699, 14511820, 14517060, 14517061, 14520578, 14520579, 14522212, 14526453, 14545869, 14546708, 14547095, 14553606,
    14557541, 14561359, 14566724, 14566725, 14569259, 14569260, 14569632, 14569633, 14572306, 14572307, 14573414, 14578186,
    14583303, 14583304, 14590669, 14611092, 14611616, 14611617, 14612073, 14612074, 14612463, 14618653, 14618654, 14626188,
    14626189, 14631705, 14631706, 14632020, 14636400, 14638558, 14640439, 14645877, 14649864, 14649865, 14659325, 14676946,
    14678631, 14680718, 14692747, 14700812, 14702445, 14702446, 14706206, 14706207, 14723775, 14728712, 14728713, 14735803,
    14755851, 14755852, 14764206, 14764207, 14780240, 14780241, 14847504, 14847505, 14851405, 14851406, 14852574, 14852575,
    14869372, 14884060, 14884061, 14914455, 14915714, 14915715, 14920833, 14937750, 14955155, 14955156, 14969865, 14980436,
    14985705, 14985706, 15017800, 15022791, 15024441, 15024442, 15034625, 15037842, 15071290, 15096351, 15096352, 15106275,
    15138855, 15153846, 15259600, 15297841, 15297842, 15337955, 15403500, 15433567, 15433568, 15476295, 15531154, 15555904,
    15616326,
]


def untemper(y):
    """Inverse of MT19937's output tempering: the state word that is output as y."""
    y ^= y >> 18
    y ^= (y << 15) & 0xEFC60000
    t = y
    for _ in range(5):
        t = y ^ ((t << 7) & 0x9D2C5680)
    y = t & 0xFFFFFFFF
    t = y
    for _ in range(3):
        t = y ^ (t >> 11)
    return t


def set_next_words(words, left):
    """Makes the default generator output `words` next (state[0..], next = 0, no twist before
    `left` draws). Layout of get_rng_state(): seed u64, left i32, seeded i32, next u64, state u64[624]."""
    st = torch.get_rng_state().numpy().copy()
    st[8:12] = np.frombuffer(np.int32(left).tobytes(), np.uint8)
    st[16:24] = np.frombuffer(np.uint64(0).tobytes(), np.uint8)
    for i, w in enumerate(words):
        st[24 + 8 * i:32 + 8 * i] = np.frombuffer(np.uint64(w).tobytes(), np.uint8)
    torch.set_rng_state(torch.from_numpy(st))


ks = SINCOS_RARE_K + SINCOS_RARE_K[:(-len(SINCOS_RARE_K)) % 8]
for part, (lo, hi) in enumerate(((0, 288), (288, len(ks)))):
    chunk = ks[lo:hi]
    words = []
    for b in range(0, len(chunk), 8):
        w = [untemper(k) for k in chunk[b:b + 8]]
        words += w + w                      # d[j] (u1 = 1 - d) and d[j + 8] (u2) share the word
    left = len(words) + 5
    c = Case("RANDN", f"randn({len(words)}) over chosen words, part {part + 1}: sincos roundings [hash]", 50 + part)
    set_next_words(words, left)
    assert torch_u32(len(words)) == [k for b in range(0, len(chunk), 8) for k in chunk[b:b + 8] * 2]
    set_next_words(words, left)
    c.step("SET_WORDS", n=len(chunk), i0=left, inp=chunk)
    c.step_hashed("NORMAL", n=len(words), a=0.0, b=1.0, outs=[torch.randn(len(words))])
    c.done()


# ---- the header ------------------------------------------------------------------------------
# All expected values live in two pools (rng_fx_u32, rng_fx_u64); steps refer to them by offset.

u32_pool, u64_pool = [], []


def pool_add(pool, vals):
    if vals is None:
        return -1
    off = len(pool)
    pool.extend(vals)
    return off


def c_pool(ctype, name, vals, width, per_line):
    if not vals:
        vals = [0]
    fmt = "0x%0" + str(width) + "x"
    wrap = (lambda t: t) if width == 8 else (lambda t: "UINT64_C(" + t + ")")
    lines = ["    " + ",".join(wrap(fmt % v) for v in vals[i:i + per_line]) + ","
             for i in range(0, len(vals), per_line)]
    return f"static const {ctype} {name}[{len(vals)}] = {{\n" + "\n".join(lines) + "\n};\n"


def c_double(v):
    return "0.0" if v == 0.0 and math.copysign(1, v) > 0 else v.hex()


step_rows, case_rows = [], []
n_values = 0
for c in cases:
    first = len(step_rows)
    for s in c.steps:
        offs = [pool_add(u32_pool, s["inp"]), pool_add(u32_pool, s["want"]), pool_add(u32_pool, s["want2"]),
                pool_add(u64_pool, s["want64"])]
        if s.get("hash2"):
            offs[2] = pool_add(u64_pool, s["hash2"])
            n_values += s["i1"]
        n_values += sum(len(s[k]) for k in ("want", "want2") if s[k] is not None)
        if s["want64"] is not None:
            n_values += s["n"] if s["want"] is None else len(s["want64"])
        step_rows.append(f"    {{RNG_FX_{s['op']}, {s['n']}, {s['i0']}, {s['i1']}, {s['i2']}, {c_double(s['a'])}, "
                         f"{c_double(s['b'])}, {offs[0]}, {offs[1]}, {offs[2]}, {offs[3]}}},\n")
    name = c.name.replace("\\", "\\\\").replace('"', '\\"')
    nxt = ", ".join("0x%08xu" % v for v in c.next)
    case_rows.append(f"    {{\"{name}\", RNG_FX_KIND_{c.kind}, UINT64_C({c.seed:#x}), {first}, {len(c.steps)}, "
                     f"{{{nxt}}}}},\n")
    n_values += 4

out = []
out.append("// rng_fixtures.h - generated by gen_rng_fixtures.py from torch %s; do not edit.\n" % torch.__version__)
out.append("// Expected outputs of PyTorch's default CPU generator: float32 values as uint32 bit patterns,\n"
           "// float64 values as uint64 bit patterns. See gen_rng_fixtures.py for what each case runs.\n")
out.append("#ifndef ATTN_RNG_FIXTURES_H\n#define ATTN_RNG_FIXTURES_H\n\n#include <stdint.h>\n\n")
out.append("enum { " + ", ".join(f"RNG_FX_{o} = {i}" for i, o in enumerate(OPS)) + " };\n")
out.append("enum { " + ", ".join(f"RNG_FX_KIND_{k} = {i}" for i, k in enumerate(KINDS)) + " };\n\n")
out.append("""// One torch call. n: elements produced. i0/i1/i2 by op: SEED i0 = seed; SET_WORDS: the next 2n raw
// words become input[0..8), input[0..8), input[8..16), input[8..16), ... (each group of 8 twice),
// read from state[0..2n) with next = 0 and left = i0 (no twist); LINEAR in, out, has_bias;
// XAVIER_UNIFORM fan_out, fan_in; XAVIER_NORMAL fan_in, fan_out; EMBEDDING num, dim, padding_idx
// (-1: none). a/b: from/to, mean/std or p. Offsets into the pools (-1: none): input = DROPOUT's x,
// want = the float32 output (LINEAR: the weight), want2 = LINEAR's bias (-1: not compared),
// want64 = RAND_F64's float64 output (in rng_fx_u64). Outputs too large to store have want = -1:
// want64 then indexes the FNV-1a-64 hash of the output's bit patterns (little-endian bytes), and
// want2 that of LINEAR's bias, both in rng_fx_u64.
typedef struct rng_fx_step {
    int op;
    int64_t n, i0, i1, i2;
    double a, b;
    int32_t input, want, want2, want64;
} rng_fx_step;

// manual_seed(seed), steps [first_step, first_step + n_steps), then next[] = the next four raw
// 32-bit words of the generator.
typedef struct rng_fx_case {
    const char *name;
    int kind;
    uint64_t seed;
    int first_step, n_steps;
    uint32_t next[4];
} rng_fx_case;

""")
out.append(c_pool("uint32_t", "rng_fx_u32", u32_pool, 8, 12))
out.append(c_pool("uint64_t", "rng_fx_u64", u64_pool, 16, 4))
out.append("\nstatic const rng_fx_step rng_fx_steps[] = {\n" + "".join(step_rows) + "};\n\n")
out.append("static const rng_fx_case rng_fx_cases[] = {\n" + "".join(case_rows) + "};\n")
out.append(f"#define RNG_FX_N_CASES {len(cases)}\n#define RNG_FX_N_VALUES {n_values}\n\n#endif\n")

with open(OUT, "w") as fh:
    fh.write("".join(out))
print(f"wrote {OUT}: {len(cases)} cases, {n_values} expected values, {os.path.getsize(OUT)} bytes", file=sys.stderr)
