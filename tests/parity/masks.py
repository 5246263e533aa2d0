"""masks.py - the masking of the sdpa parity scripts (sdpa_parity.py, sdpa_lowp_parity.py), written
in torch for the reference and as the options of `attn sdpa`: causal masks (top-left "tl",
bottom-right "br"), local windows, ALiBi, bool and float masks and key padding masks.

A configuration c holds B, H, L, S, causal (None, "tl" or "br"), window (None or (left, right),
-1: unbounded) and alibi (bool). Import it after harness.import_torch() (it needs torch).
"""
import numpy as np
import torch

import harness


def alibi_slopes(H):
    """The ALiBi slopes the scripts use: 2^-(h+1) for head h (exact in every type)."""
    return [2.0 ** -(h + 1) for h in range(H)]


def positions(c):
    """i (L, 1) and j (1, S), the query and key positions, and off: S - L with bottom-right causal
    alignment, else 0 (query i stands at key position i + off)."""
    L, S = c["L"], c["S"]
    return torch.arange(L).view(L, 1), torch.arange(S).view(1, S), S - L if c["causal"] == "br" else 0


def alibi(c):
    """ALiBi's float64 (1, H, L, S) term: -slope_h * |i + off - j|."""
    i, j, off = positions(c)
    slopes = torch.tensor(alibi_slopes(c["H"]), dtype=torch.float64).view(1, c["H"], 1, 1)
    return -slopes * (i + off - j).abs().double()


def additive(m):
    """A mask as float64 additive terms: a bool mask -inf where True (hidden), a float one itself."""
    if m.dtype == torch.bool:
        return torch.zeros(m.shape, dtype=torch.float64).masked_fill(m, float("-inf"))
    return m.double()


def additive_mask(c, mask, kpm):
    """The causal mask, the window, mask (broadcast to (B, H, L, S)) and the key padding mask kpm
    (B, S) (each None or bool or float) as one float64 (B, H, L, S) additive mask; not ALiBi."""
    B, H, L, S = c["B"], c["H"], c["L"], c["S"]
    i, j, off = positions(c)
    hidden = torch.zeros(L, S, dtype=torch.bool)
    if c["causal"]:
        hidden |= j > i + off
    if c["window"] is not None:
        left, right = c["window"]
        if left >= 0:
            hidden |= j < i + off - left
        if right >= 0:
            hidden |= j > i + off + right
    add = torch.zeros(B, H, L, S, dtype=torch.float64).masked_fill(hidden, float("-inf"))
    if mask is not None:
        add = add + additive(mask)
    if kpm is not None:
        add = add + additive(kpm).view(B, 1, 1, S)
    return add


def sdpa_args(tmp, c, mask, kpm):
    """The same as `attn sdpa`'s options: --scale (c["scale"] unless None), --causal or
    --causal-bottom-right, --window, --alibi (slopes saved in tmp), --mask and --key-padding-mask
    (saved in tmp as they are, bool or float32)."""
    args = []
    if c["scale"] is not None:
        args += ["--scale", repr(c["scale"])]
    if c["causal"] == "tl":
        args.append("--causal")
    elif c["causal"] == "br":
        args.append("--causal-bottom-right")
    if c["window"] is not None:
        args += ["--window", f"{c['window'][0]},{c['window'][1]}"]
    if c["alibi"]:
        harness.npy_arg(args, tmp, "--alibi", "slopes", np.array(alibi_slopes(c["H"]), dtype=np.float32))
    if mask is not None:
        harness.npy_arg(args, tmp, "--mask", "m", mask.numpy())
    if kpm is not None:
        harness.npy_arg(args, tmp, "--key-padding-mask", "p", kpm.numpy())
    return args
