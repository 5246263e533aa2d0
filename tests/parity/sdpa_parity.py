"""Parity of `attn sdpa` with attention written in PyTorch ops, on many random configurations.

torch 1.13 has no F.scaled_dot_product_attention, so the reference is the textbook expression in
torch: scores = (q @ k^T) * scale + masks, softmax, F.dropout after torch.manual_seed(S), @ v, with
k and v repeat_interleave'd for grouped-query attention (PyTorch 2.x's enable_gqa semantics).
Covered: GQA/MQA, Dk != Dv, custom scales, top-left and bottom-right causal masks with L < S and
L > S, bool and float masks of every broadcast shape, bool and float key padding masks, dropout,
log-sum-exp, per-head and averaged weights. A fully masked row must give zeros (torch gives NaN).
Also local windows, ALiBi slopes and logit soft-capping (written as explicit masks and tanh in
torch), attention sinks (softmax over each row with the head's sink logit appended, its column
dropped, as Hugging Face's gpt-oss eager attention writes it) and half-precision k and v (torch's .half() / .bfloat16() rounding; products in float64).
Gradients (dq, dk, dv, a float mask's, summed over its broadcast dimensions, and the sinks') are compared with
autograd of the same reference in float64, to 1e-4 relative (1e-5 absolute: gradients that are
exactly 0 come out as float rounding noise); configurations with fully masked rows
(NaN gradients in torch) are left to the C tests.

Run: /usr/bin/python3 tests/parity/sdpa_parity.py --attn build/attn [--configs N]
Exits 77 (skipped) when torch is not importable.
"""
import os
import subprocess
import sys

import harness  # tests/parity/harness.py, beside this script

np, torch = harness.import_torch()
import torch.nn.functional as F  # noqa: E402

import masks  # noqa: E402
import tensorfile  # noqa: E402


def random_config(rng):
    Hkv = rng.choice([1, 2, 3])
    return dict(B=rng.choice([1, 2, 3]), H=Hkv * rng.choice([1, 1, 2, 4]), Hkv=Hkv,
                L=rng.choice([1, 2, 5, 8, 13]), S=rng.choice([1, 3, 5, 8, 17]),
                D=rng.choice([1, 2, 4, 7, 16]), Dv=None if rng.random() < 0.6 else rng.choice([1, 3, 8]),
                scale=None if rng.random() < 0.6 else rng.choice([0.1, 0.5, 1.0, 2.0]),
                causal=rng.choice([None, None, "tl", "br"]),
                mask=rng.choice([None, None, "bool", "float"]),
                mask_shape=rng.choice(["LS", "BHLS", "B1LS", "1HLS", "HLS", "L1", "1S", "BH1S"]),
                kpm=rng.choice([None, None, "bool", "float"]),
                dropout=rng.choice([0.0, 0.0, 0.0, 0.2, 0.5]),
                weights=rng.choice([None, "per_head", "average"]),
                lse=rng.random() < 0.5,
                window=None if rng.random() < 0.7 else (rng.choice([-1, 0, 1, 3]), rng.choice([-1, 0, 2, 5])),
                alibi=rng.random() < 0.2,
                softcap=0.0 if rng.random() < 0.75 else rng.choice([0.5, 2.0, 30.0]),
                sinks=rng.random() < 0.25,
                kv=rng.choice(["f32", "f32", "f32", "f16", "bf16"]))


def mask_shape(c):
    B, H, L, S = c["B"], c["H"], c["L"], c["S"]
    return {"LS": (L, S), "BHLS": (B, H, L, S), "B1LS": (B, 1, L, S), "1HLS": (1, H, L, S), "HLS": (H, L, S),
            "L1": (L, 1), "1S": (1, S), "BH1S": (B, H, 1, S)}[c["mask_shape"]]


def kv_values(c, t):
    """k or v as the values the call sees: rounded to float16 / bfloat16 for a half-precision run."""
    return {"f32": t, "f16": t.half(), "bf16": t.bfloat16()}[c["kv"]].double()


def logits(c, qd, kd, mask, kpm):
    """cap(scale * q k^T) + ALiBi + window/causal/mask/padding terms, in float64 (B, H, L, S).
    kd: keys already repeated to H heads; mask: bool or float (a float one may require grad)."""
    scale = c["scale"] if c["scale"] is not None else 1.0 / qd.shape[-1] ** 0.5
    s = (qd @ kd.transpose(-1, -2)) * torch.tensor(scale, dtype=torch.float32).double()
    if c["softcap"]:
        s = c["softcap"] * torch.tanh(s / c["softcap"])
    if c["alibi"]:
        s = s + masks.alibi(c)
    return s + masks.additive_mask(c, mask, kpm)


def softmax(s, z):
    """The weights and log-sum-exp of the (B, H, L, S) scores s; with sinks z (H) as gpt-oss writes
    them: softmax over each row with z[h] appended, its column dropped."""
    if z is None:
        return torch.softmax(s, dim=-1), torch.logsumexp(s, dim=-1)
    B, H, L, _ = s.shape
    full = torch.cat([s, z.view(1, H, 1, 1).expand(B, H, L, 1)], dim=-1)
    return torch.softmax(full, dim=-1)[..., :-1], torch.logsumexp(full, dim=-1)


def reference(c, q, k, v, mask, kpm, z):
    H, Hkv = c["H"], c["Hkv"]
    k = kv_values(c, k).repeat_interleave(H // Hkv, dim=1)
    v = kv_values(c, v).repeat_interleave(H // Hkv, dim=1)
    w, lse = softmax(logits(c, q.double(), k, mask, kpm), None if z is None else z.double())
    w = w.float()
    w = torch.nan_to_num(w, nan=0.0)             # fully masked rows: zeros
    if c["dropout"] > 0:
        torch.manual_seed(c["seed"])
        w = F.dropout(w, p=c["dropout"])
    out = (w.double() @ v).float()
    return out, w, lse.float()


def reference_grads(c, q, k, v, mask, kpm, z, dout):
    """Autograd of sum(out * dout) through the reference computed in float64 (gradients with respect
    to the values k and v denote)."""
    B, H, Hkv, L, S = c["B"], c["H"], c["Hkv"], c["L"], c["S"]
    leaves = [q.double().requires_grad_(), kv_values(c, k).requires_grad_(), kv_values(c, v).requires_grad_()]
    fmask = mask.double().requires_grad_() if mask is not None and mask.dtype != torch.bool else None
    zd = z.double().requires_grad_() if z is not None else None
    qd, kd, vd = leaves
    kr, vr = kd.repeat_interleave(H // Hkv, dim=1), vd.repeat_interleave(H // Hkv, dim=1)
    w, _ = softmax(logits(c, qd, kr, fmask if fmask is not None else mask, kpm), zd)
    if c["dropout"] > 0:
        torch.manual_seed(c["seed"])
        keep = torch.empty(B, H, L, S).bernoulli_(1 - c["dropout"])  # F.dropout's draws
        w = w * keep.double() * float(torch.tensor(1.0) / torch.tensor(1 - c["dropout"], dtype=torch.float32))
    out = w @ vr
    out.backward(dout.double())
    g = {"q": leaves[0].grad, "k": leaves[1].grad, "v": leaves[2].grad}
    if fmask is not None:
        g["mask"] = fmask.grad
    if zd is not None:
        g["sinks"] = zd.grad
    return {name: t.float().numpy() for name, t in g.items()}


def run_config(idx, c, attn_bin, tmp):
    gen = torch.Generator().manual_seed(idx)
    Dv = c["Dv"] or c["D"]
    q = torch.randn(c["B"], c["H"], c["L"], c["D"], generator=gen)
    k = torch.randn(c["B"], c["Hkv"], c["S"], c["D"], generator=gen)
    v = torch.randn(c["B"], c["Hkv"], c["S"], Dv, generator=gen)
    mask = kpm = None
    if c["mask"] == "bool":
        mask = torch.rand(*mask_shape(c), generator=gen) < 0.25
    elif c["mask"] == "float":
        mask = torch.randn(*mask_shape(c), generator=gen)
        if idx % 5 == 0:
            mask.view(-1)[0] = float("-inf")
    if c["kpm"] == "bool":
        kpm = torch.rand(c["B"], c["S"], generator=gen) < 0.25
    elif c["kpm"] == "float":
        kpm = torch.randn(c["B"], c["S"], generator=gen)
    z = torch.randn(c["H"], generator=gen) * 2 if c["sinks"] else None
    c["seed"] = 77 + idx
    out, w, lse = reference(c, q, k, v, mask, kpm, z)
    args = [attn_bin, "sdpa"]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if name != "q" and c["kv"] == "f16":  # float16 arrays, as torch's .half() rounds them
            t = t.half()
        harness.npy_arg(args, tmp, f"--{name}", name, t.numpy())
    if c["kv"] == "bf16":  # numpy has no bfloat16: attn rounds the float32 arrays itself
        args += ["--kv-dtype", "bf16"]
    args += masks.sdpa_args(tmp, c, mask, kpm)
    if c["softcap"]:
        args += ["--softcap", repr(c["softcap"])]
    if z is not None:
        harness.npy_arg(args, tmp, "--sinks", "z", z.numpy())
    args += ["--out", os.path.join(tmp, "o.npy")]
    if c["dropout"] > 0:
        args += ["--dropout", repr(c["dropout"]), "--seed", str(c["seed"])]
    if c["lse"]:
        args += ["--lse-out", os.path.join(tmp, "l.npy")]
    if c["weights"]:
        args += ["--weights-out", os.path.join(tmp, "w.npy")]
        if c["weights"] == "average":
            args.append("--average-weights")
    fully_masked = bool(torch.isinf(lse).any())
    grads = None
    if not fully_masked and c["dropout"] < 1:
        dout = torch.randn(out.shape, generator=gen)
        grads = reference_grads(c, q, k, v, mask, kpm, z, dout)
        np.save(os.path.join(tmp, "do.npy"), dout.numpy())
        args += ["--grad-out", os.path.join(tmp, "do.npy"), "--grads-out", os.path.join(tmp, "g.safetensors")]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        return f"attn failed ({r.returncode}): {r.stderr.strip()}"
    problems = compare("out", np.load(os.path.join(tmp, "o.npy")), out.numpy(), 1e-5)
    if grads is not None:
        c["grads_checked"] = True
        got = tensorfile.read_safetensors(os.path.join(tmp, "g.safetensors"))
        if set(got) != set(grads):
            problems.append(f"gradients: names {sorted(got)} != {sorted(grads)}")
        for name in sorted(set(got) & set(grads)):
            g_attn, g_ref = got[name].astype(np.float64), grads[name]
            if g_attn.shape != g_ref.shape:
                problems.append(f"grad {name}: shape {g_attn.shape} != {g_ref.shape}")
                continue
            scale = max(float(np.abs(g_ref).max()), 1e-6)
            err = float(np.abs(g_attn - g_ref).max())
            if not err <= 1e-4 * scale + 1e-5:  # 1e-5: exactly-zero gradients come out as rounding noise
                problems.append(f"grad {name}: max error {err:.3g} (largest {scale:.3g})")
    if c["lse"]:
        problems += compare("lse", np.load(os.path.join(tmp, "l.npy")), lse.numpy(), 1e-5)
    if c["weights"] == "per_head":
        problems += compare("weights", np.load(os.path.join(tmp, "w.npy")), w.numpy(), 1e-5)
    elif c["weights"] == "average":
        problems += compare("weights", np.load(os.path.join(tmp, "w.npy")), (w.sum(1) / c["H"]).numpy(), 1e-5)
    return "; ".join(problems)


def compare(what, got, want, rtol):
    if got.shape != want.shape:
        return [f"{what}: shape {got.shape} != {want.shape}"]
    same_inf = np.isinf(want) & (got == want)
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf: masked out by same_inf
        err = np.where(same_inf, 0.0, np.abs(got.astype(np.float64) - want))
    bad = ~(err <= 1e-6 + rtol * np.abs(np.where(same_inf, 0, want)))
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, 1, 0)), want.shape)
        return [f"{what}: {int(bad.sum())} of {want.size} differ, e.g. at {i}: {got[i]!r} vs {want[i]!r}"]
    return []


def main():
    args = harness.command_line(configs=300, seed=7)
    failures = checked = 0
    for idx, c, tmp in harness.each_config(args, random_config):
        msg = run_config(idx, c, args.attn, tmp)
        checked += bool(c.get("grads_checked"))
        if msg:
            failures += 1
            print(f"FAIL config {idx}: {c}\n     {msg}")
    print(f"{args.configs} configurations ({checked} with gradients), {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
