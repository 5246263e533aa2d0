"""Parity of `attn mha` with torch.nn.MultiheadAttention on many random configurations.

Each configuration builds a module after torch.manual_seed, gives its biases random values (so they
matter), saves the state_dict as safetensors and the inputs as .npy, runs `attn mha`, and compares
the output and the attention weights with PyTorch to 1e-5 relative, and every gradient (parameters by
state_dict name, query, key, value) with PyTorch autograd to 1e-4 relative. Options covered: bias,
add_bias_kv, add_zero_attn, kdim/vdim, batch_first, unbatched input, self-attention (one tensor),
shared key/value, bool and float attention masks (2-D and 3-D), --causal, bool and float key
padding masks, need_weights with averaged and per-head weights, and dropout in training mode.

Documented differences from torch 1.13, checked as such:
  * a fully masked query row is NaN in torch and gives zero weights and a zero context vector in
    attn: where the module returns NaN, the reference is a step-by-step torch re-implementation of
    the same forward with NaN softmax rows set to zero (stepwise_mha);
  * a float key_padding_mask beside a bool attn_mask is added by attn (torch 2.x semantics) where
    torch 1.13 ORs it into the bool mask, and float+float raises in 1.13: those combinations are
    compared against an explicit additive mask instead.

Run: /usr/bin/python3 tests/parity/mha_parity.py --attn build/attn [--configs N] [--seed S]
Exits 77 (skipped) when torch is not importable.
"""
import math
import os
import subprocess
import sys

import harness  # tests/parity/harness.py, beside this script

np, torch = harness.import_torch()
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tensorfile  # noqa: E402


def random_config(rng):
    H = rng.choice([1, 2, 3, 4])
    hd = rng.choice([1, 2, 3, 5, 8])
    E = H * hd
    c = dict(E=E, H=H,
             bias=rng.random() < 0.8,
             add_bias_kv=rng.random() < 0.3,
             add_zero_attn=rng.random() < 0.3,
             kdim=None, vdim=None,
             batch_first=rng.random() < 0.5,
             unbatched=rng.random() < 0.2,
             N=rng.choice([1, 2, 3]),
             L=rng.choice([1, 2, 3, 5, 7]),
             S=rng.choice([1, 2, 4, 6, 9]),
             form=rng.choice(["self", "self", "kv_same", "cross"]),
             need_weights=rng.random() < 0.8,
             average=rng.random() < 0.6,
             dropout=rng.choice([0.0, 0.0, 0.0, 0.1, 0.5]),
             mask=rng.choice(["none", "none", "bool2", "float2", "bool3", "float3", "causal"]),
             kpm=rng.choice(["none", "none", "bool", "float"]),
             allow_full_mask=rng.random() < 0.15)
    if c["form"] == "cross" and rng.random() < 0.4:
        c["kdim"] = rng.choice([1, 3, 5])
        c["vdim"] = rng.choice([2, 4, E])
    if c["form"] != "cross":
        c["S"] = c["L"]
    if c["unbatched"]:
        c["N"] = 1
    return c


def make_masks(c, gen):
    L, S, N, H = c["L"], c["S"], c["N"], c["H"]
    attn_mask = None
    if c["mask"] in ("bool2", "bool3"):
        shape = (L, S) if c["mask"] == "bool2" else (N * H, L, S)
        attn_mask = torch.rand(*shape, generator=gen) < 0.3
        if not c["allow_full_mask"]:
            attn_mask[..., 0] = False
    elif c["mask"] in ("float2", "float3"):
        shape = (L, S) if c["mask"] == "float2" else (N * H, L, S)
        attn_mask = torch.randn(*shape, generator=gen)
        if c["allow_full_mask"]:
            attn_mask[..., -1, :] = float("-inf")
    kpm = None
    if c["kpm"] == "bool":
        kpm = torch.rand(N, S, generator=gen) < 0.3
        if not c["allow_full_mask"]:
            kpm[:, 0] = False
    elif c["kpm"] == "float":
        kpm = torch.randn(N, S, generator=gen)
        if rng_bit(gen):
            kpm[:, -1] = float("-inf")
    if c["unbatched"] and kpm is not None:
        kpm = kpm[0]
    return attn_mask, kpm


def rng_bit(gen):
    return bool(torch.rand(1, generator=gen) < 0.5)


def stepwise_mha(m, q, k, v, key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True):
    """nn.MultiheadAttention's forward (torch 1.13 order of operations) written with torch ops, except
    that a fully masked softmax row gives zeros instead of NaN: attn's documented semantics. Used
    only where the module's own result has NaN; elsewhere the module itself is the reference."""
    E, H = m.embed_dim, m.num_heads
    hd = E // H
    batched = q.dim() == 3
    if batched and m.batch_first:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    if not batched:
        q, k, v = (t.unsqueeze(1) for t in (q, k, v))
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    L, N, _ = q.shape
    if m._qkv_same_embed_dim:
        Wq, Wk, Wv = m.in_proj_weight.chunk(3)
    else:
        Wq, Wk, Wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
    bq, bk, bv = m.in_proj_bias.chunk(3) if m.in_proj_bias is not None else (None, None, None)
    q, k, v = F.linear(q, Wq, bq), F.linear(k, Wk, bk), F.linear(v, Wv, bv)
    if attn_mask is not None and attn_mask.dim() == 2:
        attn_mask = attn_mask.unsqueeze(0)
    if m.bias_k is not None:
        k = torch.cat([k, m.bias_k.repeat(1, N, 1)])
        v = torch.cat([v, m.bias_v.repeat(1, N, 1)])
        attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
    q = q.contiguous().view(L, N * H, hd).transpose(0, 1)
    k = k.contiguous().view(k.shape[0], N * H, hd).transpose(0, 1)
    v = v.contiguous().view(v.shape[0], N * H, hd).transpose(0, 1)
    if m.add_zero_attn:
        k = torch.cat([k, torch.zeros(N * H, 1, hd)], dim=1)
        v = torch.cat([v, torch.zeros(N * H, 1, hd)], dim=1)
        attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
    S = k.shape[1]
    add = torch.zeros(N * H, L, S)
    for mk in (attn_mask,):
        if mk is not None:
            add = add + (torch.zeros(mk.shape).masked_fill(mk, float("-inf")) if mk.dtype == torch.bool else mk)
    if key_padding_mask is not None:
        kp = key_padding_mask
        kp = torch.zeros(kp.shape).masked_fill(kp, float("-inf")) if kp.dtype == torch.bool else kp
        add = add + kp.view(N, 1, 1, S).expand(N, H, 1, S).reshape(N * H, 1, S)
    scores = torch.bmm(q / math.sqrt(hd), k.transpose(1, 2)) + add
    w = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    if m.training and m.dropout > 0:
        w = F.dropout(w, p=m.dropout)
    ctx = torch.bmm(w, v).transpose(0, 1).contiguous().view(L * N, E)
    out = F.linear(ctx, m.out_proj.weight, m.out_proj.bias).view(L, N, E)
    weights = None
    if need_weights:
        weights = w.view(N, H, L, S)
        if average_attn_weights:
            weights = weights.sum(dim=1) / H
    if not batched:
        out = out.squeeze(1)
        weights = None if weights is None else weights.squeeze(0)
    elif m.batch_first:
        out = out.transpose(0, 1)
    return out, weights


def torch_forward(m, c, q, k, v, attn_mask, kpm):
    """The module's result with attn's mask semantics (see the module docstring)."""
    kw = dict(need_weights=c["need_weights"], average_attn_weights=c["average"])
    if c["mask"] == "causal":
        attn_mask = torch.triu(torch.ones(c["L"], c["S"], dtype=torch.bool), 1)
    float_kpm = kpm is not None and kpm.dtype != torch.bool
    if float_kpm and attn_mask is not None:
        # attn adds a float key padding mask to either mask kind; express that as one float mask
        fmask = attn_mask if attn_mask.dtype != torch.bool else \
            torch.zeros(attn_mask.shape).masked_fill(attn_mask, float("-inf"))
        N, H, L, S = c["N"], c["H"], c["L"], c["S"]
        fmask = fmask.reshape(-1, L, S).expand(N * H, L, S) + \
            (kpm.reshape(1, S) if c["unbatched"] else kpm).reshape(N, 1, 1, S).expand(N, H, 1, S).reshape(N * H, 1, S)
        attn_mask, kpm = fmask, None
    if c["dropout"] > 0:
        torch.manual_seed(c["dropout_seed"])
    with torch.no_grad():
        out, w = m(q, k, v, key_padding_mask=kpm, attn_mask=attn_mask, **kw)
        if torch.isnan(out).any() or (w is not None and torch.isnan(w).any()):
            c["stepwise"] = True
            if c["dropout"] > 0:
                torch.manual_seed(c["dropout_seed"])
            out, w = stepwise_mha(m, q, k, v, key_padding_mask=kpm, attn_mask=attn_mask, **kw)
    return out, w


def run_config(idx, c, attn_bin, tmp):
    gen = torch.Generator().manual_seed(1000 + idx)
    torch.manual_seed(idx)
    m = nn.MultiheadAttention(c["E"], c["H"], dropout=c["dropout"], bias=c["bias"], add_bias_kv=c["add_bias_kv"],
                              add_zero_attn=c["add_zero_attn"], kdim=c["kdim"], vdim=c["vdim"],
                              batch_first=c["batch_first"])
    m.train()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias") and p.dim() == 1:
                p.normal_(generator=gen)
    E, N, L, S = c["E"], c["N"], c["L"], c["S"]
    kd, vd = c["kdim"] or E, c["vdim"] or E

    def shape(length, width):
        if c["unbatched"]:
            return (length, width)
        return (N, length, width) if c["batch_first"] else (length, N, width)

    q = torch.randn(*shape(L, E), generator=gen)
    if c["form"] == "self":
        k = v = q
    elif c["form"] == "kv_same":
        k = v = torch.randn(*shape(S, E), generator=gen)
    else:
        k = torch.randn(*shape(S, kd), generator=gen)
        v = torch.randn(*shape(S, vd), generator=gen)
    attn_mask, kpm = make_masks(c, gen)
    c["dropout_seed"] = 5000 + idx
    t_out, t_w = torch_forward(m, c, q, k, v, attn_mask, kpm)
    grads = None
    if not c.get("stepwise"):  # gradients by autograd (fully masked rows give NaN there: not compared)
        grads = torch_grads(m, c, q, k, v, attn_mask, kpm, gen)

    files = {}
    state = {name: t.detach().numpy() for name, t in m.state_dict().items()}
    files["state"] = os.path.join(tmp, "state.safetensors")
    tensorfile.write_safetensors(files["state"], state)
    # make_masks gives no attn_mask with c["mask"] == "causal": attn is told --causal
    args = [attn_bin, "mha", "--state", files["state"], "--heads", str(c["H"])] + \
        harness.mha_args(tmp, c, q, k, v, attn_mask, kpm)
    if c["mask"] == "causal":
        args.append("--causal")
    if c["dropout"] > 0:
        args += ["--dropout", repr(c["dropout"]), "--seed", str(c["dropout_seed"])]
    out_path = os.path.join(tmp, "out.npy")
    args += ["--out", out_path]
    if grads is not None:
        np.save(os.path.join(tmp, "dy.npy"), grads["dy"])
        args += ["--grad-out", os.path.join(tmp, "dy.npy"), "--grads-out", os.path.join(tmp, "grads.safetensors")]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        return f"attn failed ({r.returncode}): {r.stderr.strip()}"
    problems = []
    a_out = np.load(out_path)
    problems += compare("output", a_out, t_out.numpy())
    if c["need_weights"]:
        problems += compare("weights", np.load(os.path.join(tmp, "w.npy")), t_w.numpy())
    if grads is not None:
        got = tensorfile.read_safetensors(os.path.join(tmp, "grads.safetensors"))
        want = {k: v for k, v in grads.items() if k != "dy"}
        if set(got) != set(want):
            problems.append(f"gradients: names {sorted(got)} != {sorted(want)}")
        for name in sorted(set(got) & set(want)):
            problems += compare_grad(name, got[name], want[name])
    return "; ".join(problems)


def torch_grads(m, c, q, k, v, attn_mask, kpm, gen):
    """Autograd of sum(out * dy) for a random dy: every parameter's gradient by state_dict name, the
    query's, and the key's / value's when they are tensors of their own."""
    leaves = {"query": q.clone().requires_grad_()}
    if k is q:
        kk = leaves["query"]
    else:
        kk = leaves["key"] = k.clone().requires_grad_()
    vv = kk if v is k else (leaves["query"] if v is q else None)
    if vv is None:
        vv = leaves["value"] = v.clone().requires_grad_()
    m.zero_grad(set_to_none=True)
    kw = dict(need_weights=False)
    if c["mask"] == "causal":
        attn_mask = torch.triu(torch.ones(c["L"], c["S"], dtype=torch.bool), 1)
    if kpm is not None and kpm.dtype != torch.bool and attn_mask is not None:
        return None  # the float+float combination is compared in the forward only
    if c["dropout"] > 0:
        torch.manual_seed(c["dropout_seed"])
    out, _ = m(leaves["query"], kk, vv, key_padding_mask=kpm, attn_mask=attn_mask, **kw)
    dy = torch.randn(out.shape, generator=gen)
    out.backward(dy)
    result = {"dy": dy.numpy()}
    for name, p in m.named_parameters():
        result[name] = p.grad.numpy() if p.grad is not None else np.zeros(p.shape, np.float32)
    for name, t in leaves.items():
        result[name] = t.grad.numpy()
    return result


def compare_grad(what, got, want):
    """Gradients agree to 1e-4 relative to the tensor's largest gradient (1e-5 absolute below: gradients that
    are exactly 0 in exact arithmetic come out as rounding noise on both sides)."""
    if got.shape != want.shape:
        return [f"grad {what}: shape {got.shape} != torch {want.shape}"]
    if np.isnan(got).any():
        return [f"grad {what}: attn produced NaN"]
    scale = max(float(np.abs(want).max()), 1e-6)
    err = float(np.abs(got.astype(np.float64) - want).max())
    return [] if err <= 1e-4 * scale + 1e-5 else [f"grad {what}: max error {err:.3g} (largest {scale:.3g})"]


def compare(what, got, want):
    """got must equal want to 1e-6 absolute + 1e-5 relative, and hold no NaN."""
    if got.shape != want.shape:
        return [f"{what}: shape {got.shape} != torch {want.shape}"]
    if got.dtype != np.float32:
        return [f"{what}: dtype {got.dtype}"]
    if np.isnan(got).any() or np.isnan(want).any():
        return [f"{what}: NaN in attn's result or in the reference"]
    w = want
    err = np.abs(got - w)
    bad = err > 1e-6 + 1e-5 * np.abs(w)
    if bad.any():
        i = np.unravel_index(np.argmax(err - 1e-5 * np.abs(w)), w.shape)
        return [f"{what}: {int(bad.sum())} of {w.size} differ, worst at {i}: {got[i]!r} vs {w[i]!r}"]
    return []


def main():
    args = harness.command_line(configs=300, seed=2024)
    failures = 0
    coverage = {}
    for idx, c, tmp in harness.each_config(args, random_config):
        msg = run_config(idx, c, args.attn, tmp)
        for key in ("bias", "add_bias_kv", "add_zero_attn", "batch_first", "unbatched", "need_weights",
                    "average"):
            coverage[f"{key}={c[key]}"] = coverage.get(f"{key}={c[key]}", 0) + 1
        for key in ("mask", "kpm", "form", "dropout"):
            coverage[f"{key}={c[key]}"] = coverage.get(f"{key}={c[key]}", 0) + 1
        coverage[f"kdim/vdim={'set' if c['kdim'] else 'E'}"] = coverage.get(
            f"kdim/vdim={'set' if c['kdim'] else 'E'}", 0) + 1
        if not c.get("stepwise") and c.get("grads_checked", True):
            coverage["gradients checked"] = coverage.get("gradients checked", 0) + 1
        if c.get("stepwise"):
            coverage["fully masked rows (stepwise reference)"] = coverage.get("fully masked rows (stepwise reference)", 0) + 1
        if msg:
            failures += 1
            print(f"FAIL config {idx}: {c}\n     {msg}")
    print("coverage: " + ", ".join(f"{k}:{v}" for k, v in sorted(coverage.items())))
    print(f"{args.configs} configurations, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
