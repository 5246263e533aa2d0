"""Parity of `attn mha --dtype bf16|f16` with PyTorch 2.x's nn.MultiheadAttention(...).to(dtype) on the CPU.

For random configurations (bias, add_bias_kv, add_zero_attn, kdim/vdim, batch_first, unbatched inputs,
self-attention or separate key and value, bool masks, causal, key padding, weights averaged or per head),
the module made by torch in float32, then .to(torch.bfloat16) / .half(), its state saved as BF16 / F16
safetensors, inputs rounded to the type:
  1. the output (and the weights) of attn (`--isa auto` and `--isa ref`) against torch's forward on the
     same bfloat16 / float16 tensors, within a few units of the type relative to the largest element
     (torch rounds q, k, v, the heads' output and out as attn does; with need_weights it also rounds the
     scores and weights to the type, and its products are its own);
  2. the gradients of `--grad-out` (the parameters' in float32, the inputs' in the type) and those of
     autograd on torch's module (all in the type), each against autograd of the same module in float64
     on the same rounded values and inputs: attn's within max(12 u, twice torch's own error) of the
     largest element (the forward's roundings of q, k, v and the heads' output move the gradients by
     up to about 20 u of the largest on both sides where the backward's sums cancel).
The tolerances are in TOL (units of the type times the tensor's largest magnitude); the largest ratio
seen is printed.

Run: PYTHON_WITH_TORCH2 tests/parity/mha_lowp_parity.py --attn build/attn [--configs N]
Exits 77 (skipped) without torch >= 2 and numpy.
"""
import os
import subprocess
import sys

import harness  # tests/parity/harness.py, beside this script

np, torch = harness.import_torch(min_major=2)
from torch import nn  # noqa: E402

import tensorfile  # noqa: E402

TYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
UNIT = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}
# Tolerances in units of the type relative to the tensor's largest magnitude.
TOL = {"output": 4.0, "weights": 4.0, "grad": 12.0}  # grad: against float64, or twice torch's error


def random_config(rng):
    H = rng.choice([1, 2, 4])
    E = H * rng.choice([4, 8, 16])
    form = rng.choice(["self", "self", "kv"])
    kd = E if form == "self" or rng.random() < 0.6 else rng.choice([5, 12])
    vd = E if form == "self" or rng.random() < 0.6 else rng.choice([7, 12])
    L = rng.choice([1, 4, 9, 16])
    return dict(E=E, H=H, N=rng.choice([1, 2, 3]), L=L, S=L if form == "self" else rng.choice([3, 8, 20]),
                kdim=kd, vdim=vd, form=form, bias=rng.random() < 0.8, add_bias_kv=rng.random() < 0.3,
                add_zero_attn=rng.random() < 0.2, batch_first=rng.random() < 0.5, unbatched=rng.random() < 0.15,
                mask=rng.choice([None, None, "bool", "causal"]), kpm=rng.random() < 0.3,
                need_weights=rng.random() < 0.4, average=rng.random() < 0.5, dtype=rng.choice(["bf16", "f16"]))


def save_state(path, m, dtype):
    state = {}
    for name, t in m.state_dict().items():
        a = t.detach().float().numpy()
        state[name] = tensorfile.BF16(a) if dtype == "bf16" else a.astype(np.float16)
    tensorfile.write_safetensors(path, state)


def ratio(got, want, unit):
    """Largest |got - want| in units of the type times want's largest magnitude."""
    scale = max(float(np.abs(want).max()), 1e-30)
    return float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) / (unit * scale)


def run_config(idx, c, attn_bin, tmp, worst):
    dt, u = TYPES[c["dtype"]], UNIT[c["dtype"]]
    gen = torch.Generator().manual_seed(2000 + idx)
    torch.manual_seed(idx)
    kdim = None if c["kdim"] == c["E"] else c["kdim"]
    vdim = None if c["vdim"] == c["E"] else c["vdim"]
    m = nn.MultiheadAttention(c["E"], c["H"], bias=c["bias"], add_bias_kv=c["add_bias_kv"],
                              add_zero_attn=c["add_zero_attn"], kdim=kdim, vdim=vdim, batch_first=c["batch_first"])
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias") and p.dim() == 1:
                p.normal_(generator=gen)
    m = m.to(dt).eval()
    E, N, L, S = c["E"], c["N"], c["L"], c["S"]

    def shape(length, width):
        if c["unbatched"]:
            return (length, width)
        return (N, length, width) if c["batch_first"] else (length, N, width)

    q = torch.randn(*shape(L, E), generator=gen).to(dt)
    if c["form"] == "self":
        k = v = q
    else:
        k = torch.randn(*shape(S, c["kdim"]), generator=gen).to(dt)
        v = torch.randn(*shape(S, c["vdim"]), generator=gen).to(dt)
    attn_mask = None
    if c["mask"] == "bool":
        attn_mask = torch.rand(L, S, generator=gen) < 0.25
    elif c["mask"] == "causal":
        attn_mask = torch.triu(torch.ones(L, S, dtype=torch.bool), 1)
    kpm = None
    if c["kpm"]:
        kpm = torch.rand(*((S,) if c["unbatched"] else (N, S)), generator=gen) < 0.25
    # fully masked rows: torch gives NaN on some paths, attn zeros; leave every row a visible key
    if attn_mask is not None:
        attn_mask[:, 0] = False
    if kpm is not None:
        kpm[..., 0] = False

    leaves = {"query": q.clone().requires_grad_()}
    kk = leaves["query"] if k is q else leaves.setdefault("key", k.clone().requires_grad_())
    vv = kk if v is k else leaves.setdefault("value", v.clone().requires_grad_())
    out, w = m(leaves["query"], kk, vv, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=c["need_weights"],
               average_attn_weights=c["average"])
    dy = torch.randn(out.shape, generator=gen).to(dt)
    out.backward(dy)
    grads = {name: p.grad.float().numpy() for name, p in m.named_parameters()}
    grads.update({name: t.grad.float().numpy() for name, t in leaves.items()})
    # the same in float64 on the same (rounded) values: how far torch's own low-precision gradients are
    m64 = nn.MultiheadAttention(c["E"], c["H"], bias=c["bias"], add_bias_kv=c["add_bias_kv"],
                                add_zero_attn=c["add_zero_attn"], kdim=kdim, vdim=vdim, batch_first=c["batch_first"])
    m64.load_state_dict({name: t.double() for name, t in m.state_dict().items()})
    m64 = m64.double()
    l64 = {name: t.detach().double().requires_grad_() for name, t in leaves.items()}
    k64 = l64["query"] if k is q else l64["key"]
    v64 = k64 if v is k else l64["value"]
    o64, _ = m64(l64["query"], k64, v64, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=False)
    o64.backward(dy.double())
    g64 = {name: p.grad.numpy() for name, p in m64.named_parameters()}
    g64.update({name: t.grad.numpy() for name, t in l64.items()})

    state_path = os.path.join(tmp, "state.safetensors")
    save_state(state_path, m, c["dtype"])
    args = [attn_bin, "mha", "--state", state_path, "--heads", str(c["H"]), "--dtype", c["dtype"]] + \
        harness.mha_args(tmp, c, q, k, v, attn_mask, kpm)
    np.save(os.path.join(tmp, "dy.npy"), dy.float().numpy())
    args += ["--grad-out", os.path.join(tmp, "dy.npy"), "--grads-out", os.path.join(tmp, "grads.safetensors")]
    problems = []
    for isa in ("auto", "ref"):
        out_path = os.path.join(tmp, "out.npy")
        r = subprocess.run(args + ["--isa", isa, "--out", out_path], capture_output=True, text=True)
        if r.returncode != 0:
            return f"attn --isa {isa} failed ({r.returncode}): {r.stderr.strip()}"
        checks = [("output", np.load(out_path), out.detach().float().numpy())]
        if c["need_weights"]:
            checks.append(("weights", np.load(os.path.join(tmp, "w.npy")), w.detach().float().numpy()))
        got = tensorfile.read_safetensors(os.path.join(tmp, "grads.safetensors"))
        if set(got) != set(grads):
            problems.append(f"gradients: names {sorted(got)} != {sorted(grads)}")
        checks += [(name, got[name], grads[name]) for name in sorted(set(got) & set(grads))]
        for name, a, t in checks:
            if a.shape != t.shape:
                problems.append(f"{isa} {name}: shape {a.shape} != torch {t.shape}")
                continue
            if not np.isfinite(a).all():
                problems.append(f"{isa} {name}: not finite")
                continue
            kind = name if name in TOL else "grad"
            rr = ratio(a, t, u)
            if kind == "grad":  # both against float64 on the same values; attn no farther than torch
                rr, rt = ratio(a, g64[name], u), ratio(t, g64[name], u)
                worst["grad vs torch's own error"] = max(worst.get("grad vs torch's own error", 0.0), rr / max(rt, 1.0))
                if rr > max(TOL["grad"], 2 * rt):
                    problems.append(f"{isa} {c['dtype']} {name}: {rr:.2f} u of the largest from float64 (torch: "
                                    f"{rt:.2f} u)")
                worst[kind] = max(worst.get(kind, 0.0), rr)
                continue
            worst[kind] = max(worst.get(kind, 0.0), rr)
            if rr > TOL[kind]:
                problems.append(f"{isa} {c['dtype']} {name}: {rr:.2f} u of the largest > {TOL[kind]}")
    return "; ".join(problems)


def main():
    a = harness.command_line(configs=120, seed=7)
    failures, worst = 0, {}
    for i, c, tmp in harness.each_config(a, random_config):
        msg = run_config(i, c, a.attn, tmp, worst)
        if msg:
            failures += 1
            print(f"config {i} {c}: {msg}")
    print(f"{a.configs} configurations, {failures} failed; largest error in units of the type x the largest element: "
          + ", ".join(f"{k} {v:.2f}" for k, v in sorted(worst.items())))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
