"""Parity of `attn sdpa --dtype bf16|f16` with PyTorch 2.x on bfloat16 and float16 tensors.

Two comparisons per random configuration (GQA, Dk != Dv, scales, top-left and bottom-right causal
masks, bool and float masks, key padding, local windows, ALiBi):
  1. the scalar reference (`--isa ref`) against PyTorch in float64 on the same rounded inputs
     (torch's .bfloat16() / .half()), rounded to the type at the end: they may differ by the two
     roundings only (2 u |x| + the type's smallest subnormal), forward and gradients;
  2. the fused kernels (`--isa auto`) against F.scaled_dot_product_attention on bfloat16 / float16
     tensors, forward and autograd's backward, PyTorch's own low-precision arithmetic: to a few
     units of the type relative to the largest element.
Masks are given to torch as one additive mask (ALiBi and float masks hold values exact in bfloat16,
so torch's rounding of the mask to the query's type changes nothing).

Run: PYTHON_WITH_TORCH2 tests/parity/sdpa_lowp_parity.py --attn build/attn [--configs N]
Exits 77 (skipped) without torch >= 2 and numpy.
"""
import os
import subprocess
import sys

import harness  # tests/parity/harness.py, beside this script

np, torch = harness.import_torch(min_major=2)
import torch.nn.functional as F  # noqa: E402

import masks  # noqa: E402
import tensorfile  # noqa: E402

TYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
UNIT = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}
TINY = {"bf16": 2.0 ** -133, "f16": 2.0 ** -24}


def random_config(rng):
    Hkv = rng.choice([1, 2, 3])
    D = rng.choice([8, 16, 31, 64])
    return dict(B=rng.choice([1, 2]), H=Hkv * rng.choice([1, 2, 4]), Hkv=Hkv, L=rng.choice([1, 5, 17, 64]),
                S=rng.choice([3, 17, 40, 100]), D=D, Dv=D if rng.random() < 0.7 else rng.choice([8, 24]),
                scale=None if rng.random() < 0.6 else rng.choice([0.25, 0.5]),
                causal=rng.choice([None, None, "tl", "br"]), mask=rng.choice([None, None, "bool", "float"]),
                kpm=rng.random() < 0.25, alibi=rng.random() < 0.2,
                window=None if rng.random() < 0.7 else (rng.choice([-1, 2, 9]), rng.choice([-1, 0, 4])),
                dtype=rng.choice(["bf16", "f16"]))


def additive_mask(c, mask, kpm):
    """Every masking option as one float64 (B, H, L, S) additive mask (-inf hides; its terms are
    exact in float64, so their order does not matter)."""
    add = masks.additive_mask(c, mask, kpm)
    return add + masks.alibi(c) if c["alibi"] else add


def torch_sdpa(c, q, k, v, add, dout, dtype):
    """F.scaled_dot_product_attention (or float64 math on the same values when dtype is float64),
    with autograd's gradients."""
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    G = c["H"] // c["Hkv"]
    if dtype == torch.float64:
        kk, vv = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
        scale = c["scale"] if c["scale"] is not None else 1.0 / c["D"] ** 0.5
        s = (q @ kk.transpose(-1, -2)) * torch.tensor(scale, dtype=torch.float32).double() + add
        out = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0) @ vv
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=add.to(dtype), scale=c["scale"], enable_gqa=G > 1)
    out.backward(dout.to(dtype))
    return out.detach(), q.grad, k.grad, v.grad


def run_attn(attn_bin, tmp, c, q, k, v, mask, kpm, dout, isa):
    args = [attn_bin, "sdpa", "--dtype", c["dtype"], "--isa", isa]
    for name, t in (("q", q), ("k", k), ("v", v), ("do", dout)):
        np.save(os.path.join(tmp, f"{name}.npy"), t.float().numpy())
    args += ["--q", os.path.join(tmp, "q.npy"), "--k", os.path.join(tmp, "k.npy"), "--v", os.path.join(tmp, "v.npy"),
             "--out", os.path.join(tmp, "o.npy"), "--grad-out", os.path.join(tmp, "do.npy"),
             "--grads-out", os.path.join(tmp, "g.safetensors")] + masks.sdpa_args(tmp, c, mask, kpm)
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"attn --isa {isa} failed ({r.returncode}): {r.stderr.strip()}")
    g = tensorfile.read_safetensors(os.path.join(tmp, "g.safetensors"))
    return np.load(os.path.join(tmp, "o.npy")), g["q"], g["k"], g["v"]


def close(name, got, want, rel_to_max, c):
    """Problems of got against want: |got - want| <= 2 u |want| + tiny + rel_to_max * max(max|want|, 1)
    (the inputs are of unit scale: a gradient that is exactly 0 in exact arithmetic comes out as
    rounding noise of that scale)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return [f"{name}: shape {got.shape} != {want.shape}"]
    bound = 2 * UNIT[c["dtype"]] * np.abs(want) + TINY[c["dtype"]] + rel_to_max * max(float(np.abs(want).max(initial=0)), 1.0)
    err = np.abs(got - want)
    if not np.all(err <= bound):
        i = int(np.argmax(err - bound))
        return [f"{name}: element {i} {got.flat[i]:.8g} vs {want.flat[i]:.8g} (error {err.flat[i]:.3g}, bound "
                f"{bound.flat[i]:.3g})"]
    return []


def run_config(idx, c, attn_bin, tmp):
    gen = torch.Generator().manual_seed(1000 + idx)
    B, H, Hkv, L, S, D, Dv = c["B"], c["H"], c["Hkv"], c["L"], c["S"], c["D"], c["Dv"]
    t = TYPES[c["dtype"]]
    q = torch.randn(B, H, L, D, generator=gen).to(t).double()   # the values the call sees
    k = torch.randn(B, Hkv, S, D, generator=gen).to(t).double()
    v = torch.randn(B, Hkv, S, Dv, generator=gen).to(t).double()
    dout = torch.randn(B, H, L, Dv, generator=gen).to(t).double()
    mask = kpm = None
    if c["mask"] == "bool":
        mask = torch.rand(B, H, L, S, generator=gen) < 0.2
    elif c["mask"] == "float":  # multiples of 1/8 in [-2, 2]: exact in bfloat16 and float16
        mask = (torch.randint(-16, 17, (B, H, L, S), generator=gen) / 8.0).float()
    if c["kpm"]:
        kpm = torch.rand(B, S, generator=gen) < 0.2
    add = additive_mask(c, mask, kpm)
    if bool(torch.isinf(add).all(dim=-1).any()):
        return None  # a fully masked row: torch's backward gives NaN there; left to the C tests
    problems = []
    want = [x.to(t).double() for x in torch_sdpa(c, q, k, v, add, dout, torch.float64)]
    got = run_attn(attn_bin, tmp, c, q, k, v, mask, kpm, dout, "ref")
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        problems += close(f"ref {name}", a, b.numpy(), 0.0, c)
    want = [x.double() for x in torch_sdpa(c, q, k, v, add, dout, t)]
    got = run_attn(attn_bin, tmp, c, q, k, v, mask, kpm, dout, "auto")
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        problems += close(f"fused {name}", a, b.numpy(), 8 * UNIT[c["dtype"]], c)
    return "; ".join(problems)


def main():
    a = harness.command_line(configs=120, seed=2)
    failures, ran = 0, 0
    for idx, c, tmp in harness.each_config(a, random_config):
        res = run_config(idx, c, a.attn, tmp)
        if res is None:
            continue
        ran += 1
        if res:
            failures += 1
            print(f"config {idx} {c}: {res}", file=sys.stderr)
    print(f"sdpa low-precision parity with torch {torch.__version__}: {ran - failures} passed, {failures} failed "
          f"({a.configs - ran} with fully masked rows left out)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
