"""functional.py - the public attention functions of attn.torch, on the custom ops of _ops.py.

scaled_dot_product_attention   torch.nn.functional.scaled_dot_product_attention, same signature
                               and semantics, computed by attn
sdpa                           the same plus attn's options: bottom-right causal alignment,
                               sliding windows, ALiBi, soft-capping, attention sinks, the
                               log-sum-exp
sdpa_varlen                    packed variable-length batches (FlashAttention's varlen interface)

Masks follow torch's SDPA everywhere in attn.torch: a bool mask is True where a query may attend
(the opposite of attn's C convention), a float mask is added to the scores. This file only shapes
the arguments (broadcasting, grouped-query heads, the mask's polarity and dtype), with torch
operations that autograd and torch.compile follow; the ops check and compute.
"""
import math

import torch

from .. import _lib
from .._arrays import fail as _fail, fail_type as _fail_type, real as _real
from .._arrays import shape_str
from . import _ops
from ._call import FLOATS


def _shape(t):
    return shape_str(t.shape)


def _check_inputs(query, key, value, same_dtype):
    for t, what in ((query, "query"), (key, "key"), (value, "value")):
        if not isinstance(t, torch.Tensor):
            _fail_type("%s must be a torch.Tensor, not %s" % (what, type(t).__name__))
        if t.dim() < 2:
            _fail(_lib.ERR_BAD_SHAPE, "%s must have at least 2 dimensions (..., L, E), got shape %s"
                  % (what, _shape(t)))
        if t.dtype not in FLOATS:
            _fail(_lib.ERR_UNSUPPORTED, "%s: dtype %s is not float32, float16, bfloat16 or float64" % (what, t.dtype))
    if not query.device == key.device == value.device:
        _fail(_lib.ERR_INVALID_ARG, "query, key and value must be on the same device, got %s, %s and %s"
              % (query.device, key.device, value.device))
    if same_dtype and not query.dtype == key.dtype == value.dtype:
        _fail(_lib.ERR_INVALID_ARG, "query, key and value must have the same dtype, got %s, %s and %s"
              % (query.dtype, key.dtype, value.dtype))
    if key.dtype != value.dtype:
        _fail(_lib.ERR_INVALID_ARG, "key and value must have the same dtype, got %s and %s" % (key.dtype, value.dtype))
    if query.shape[-1] != key.shape[-1]:
        _fail(_lib.ERR_BAD_SHAPE, "query's last dimension (%d) differs from key's (%d)"
              % (query.shape[-1], key.shape[-1]))
    if key.shape[-2] != value.shape[-2]:
        _fail(_lib.ERR_BAD_SHAPE, "key has %d positions, value %d" % (key.shape[-2], value.shape[-2]))


def _heads(t):
    return t.shape[-3] if t.dim() >= 3 else 1


def _batch(query, key, value, enable_gqa):
    """The broadcast batch shape (query's heads last), and the number of key/value heads the
    library is given: Hkv dividing H with enable_gqa, 1 when key and value have one head to
    broadcast, else H."""
    def broadcast(a, b, c):  # torch.broadcast_shapes costs about 50 us a call: not for equal shapes
        return a if a == b == c else torch.broadcast_shapes(a, b, c)

    try:
        if enable_gqa:
            lead = broadcast(query.shape[:-3], key.shape[:-3], value.shape[:-3])
            bshape = tuple(lead) + (_heads(query),)
        else:
            bshape = tuple(broadcast(query.shape[:-2], key.shape[:-2], value.shape[:-2]))
    except RuntimeError as exc:
        _fail(_lib.ERR_BAD_SHAPE, "the batch dimensions of query %s, key %s and value %s do not broadcast (%s)"
              % (_shape(query), _shape(key), _shape(value), exc))
    H, hk, hv = (bshape[-1] if bshape else 1), _heads(key), _heads(value)
    if enable_gqa:
        if H % hk or H % hv:
            _fail(_lib.ERR_BAD_SHAPE, "enable_gqa: key's %d and value's %d heads must divide query's %d" % (hk, hv, H))
        return bshape, hk if hk == hv else H
    return bshape, 1 if hk == 1 and hv == 1 else H


def _as4(t, bshape, heads):
    """t (..., heads' or 1, X, Y) as (B, heads, X, Y): broadcasting is a stride-0 view, the leading
    dimensions merged (a copy only when they cannot be)."""
    lead = bshape[:-1]
    if len(lead) == 1 and t.dim() == 4 and t.shape[0] == lead[0] and t.shape[1] == heads:
        return t  # (B, heads, X, Y) already
    hd = _heads(t)
    if hd != heads:  # grouped heads of key or value spread to `heads` (enable_gqa with Hk != Hv)
        t = t.repeat_interleave(heads // hd, dim=-3) if t.dim() >= 3 else t
    t = t.expand(*lead, heads, t.shape[-2], t.shape[-1])
    return t.reshape(math.prod(lead), heads, t.shape[-2], t.shape[-1])


def _mask4(mask, bshape, L, S, what):
    """A mask broadcasting to bshape + (L, S) as (B|1, H|1, L|1, S|1) with torch's polarity
    turned into attn's (bool: True = blocked; float: float32, added)."""
    if not isinstance(mask, torch.Tensor):
        _fail_type("%s must be a torch.Tensor, not %s" % (what, type(mask).__name__))
    if mask.dtype == torch.bool:
        mask = mask.logical_not()
    elif mask.dtype.is_floating_point:
        mask = mask.float()
    else:
        _fail(_lib.ERR_BAD_MASK, "%s must be bool (True = attend) or floating point (added), not %s"
              % (what, mask.dtype))
    full = tuple(bshape) + (L, S)
    if mask.dim() > len(full) or any(a not in (1, b) for a, b in zip(mask.shape[::-1], full[::-1])):
        _fail(_lib.ERR_BAD_MASK, "%s of shape %s does not broadcast to %s" % (what, _shape(mask), shape_str(full)))
    mask = mask.reshape((1,) * (len(full) - mask.dim()) + tuple(mask.shape))
    if not bshape:
        return mask.reshape(1, 1, mask.shape[-2], mask.shape[-1])
    lead, n = mask.shape[:len(bshape) - 1], len(bshape) - 1
    if any(x != 1 for x in lead):
        mask = mask.expand(*bshape[:-1], *mask.shape[n:])
        B = math.prod(bshape[:-1])
    else:
        B = 1
    return mask.reshape(B, *mask.shape[n:])


def _seed(dropout_p):
    """A seed for attn's dropout generator, drawn from torch's default generator (so runs repeat
    under torch.manual_seed), or None without dropout."""
    if not 0.0 <= dropout_p < 1.0:
        _fail(_lib.ERR_INVALID_ARG, "dropout_p must be in [0, 1), got %r" % (dropout_p,))
    if dropout_p == 0.0:
        return None
    return torch.randint(0, 2 ** 62, (), dtype=torch.int64)


def _window(window):
    if window is None:
        return -1, -1
    try:
        left, right = window
    except (TypeError, ValueError):
        _fail(_lib.ERR_INVALID_ARG, "window must be None or (left, right), not %r" % (window,))
    return (-1 if left is None else int(left)), (-1 if right is None else int(right))


def _causal_code(causal):
    if isinstance(causal, str) and causal in ("top_left", "bottom_right"):
        return _lib.CAUSAL[causal]
    if causal is None or causal is False:
        return 0
    if causal is True:
        return 1
    _fail(_lib.ERR_INVALID_ARG, "causal must be None, True, 'top_left' or 'bottom_right', not %r" % (causal,))


def _sinks(sinks):
    """sinks as the ops take them: None or a tensor (its shape and dtype are checked there)."""
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        _fail_type("sinks must be None or a torch.Tensor of one value per query head, not %s" % type(sinks).__name__)
    return sinks


def attention(q, k, v, mask=None, key_padding_mask=None, causal=0, scale=None, dropout_p=0.0, window=None,
              alibi_slopes=None, softcap=None, weights_mode=0, sinks=None):
    """The op on (B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv) tensors with masks already in attn's
    form (see _ops.py), sinks None or (H,). Returns (out, lse, weights). scale None: 1/sqrt(D); 0 is
    a scale of zero."""
    scale = None if scale is None else _real(scale, "scale")
    dropout_p = _real(dropout_p, "dropout_p")
    softcap = None if softcap is None else _real(softcap, "softcap")
    if scale is not None and scale == 0.0:
        q, scale = q * 0.0, 1.0  # the library reads a zero scale as "the default"
    wl, wr = _window(window)
    return _ops.forward(q, k, v, mask, key_padding_mask, causal, 0.0 if scale is None else float(scale),
                        float(dropout_p), _seed(dropout_p), wl, wr, alibi_slopes,
                        0.0 if softcap is None else float(softcap), weights_mode, _sinks(sinks))


def sdpa(query, key, value, attn_mask=None, *, causal=None, scale=None, dropout_p=0.0, enable_gqa=False, window=None,
         alibi_slopes=None, softcap=None, sinks=None, return_lse=False):
    """Scaled dot-product attention with attn's options, differentiable and traceable by
    torch.compile.

    query (..., L, E), key (..., S, E), value (..., S, Ev); the leading dimensions broadcast as in
    torch's SDPA, the one before L being the heads. key and value share a dtype; query may differ
    (float32 queries on float16/bfloat16 keys and values, say).
      attn_mask     bool (True = attend) or float (added), broadcasting to (..., L, S)
      causal        None, True / "top_left" (query i sees keys j <= i) or "bottom_right"
                    (j <= i + S - L, the alignment of a KV cache)
      scale         None for 1/sqrt(E)
      dropout_p     dropout on the weights (always applied when > 0, as torch's SDPA), drawn by
                    attn's generator from a seed taken from torch's default generator
      enable_gqa    key and value may have fewer heads than query, dividing them
      window        None or (left, right): query i sees keys i+off-left .. i+off+right, off = 0 or
                    S - L as the causal alignment; None or -1 leaves a side unbounded
      alibi_slopes  None or (H,) slopes: adds -slope[h] * |i + off - j| (no gradient)
      softcap       None, or scores -> softcap * tanh(scores / softcap) before masks and ALiBi
      sinks         None or (H,) attention sinks (gpt-oss): one logit per query head that joins
                    each row's softmax without a value, as softmax over the row with the sink
                    appended and its column dropped (the row's weights then sum to less than 1);
                    differentiable (its gradient in its dtype); -inf is no sink. CPU only for now
      return_lse    also return the natural-log log-sum-exp (..., L), float32, without gradient
                    (the sink included)
    Fully masked rows give zeros (and lse -inf, or the sink). Returns out (..., L, Ev) in query's
    dtype, or (out, lse)."""
    _check_inputs(query, key, value, same_dtype=False)
    return _sdpa(query, key, value, attn_mask, causal, scale, dropout_p, enable_gqa, window, alibi_slopes, softcap,
                 sinks, return_lse)


def _sdpa(query, key, value, attn_mask, causal, scale, dropout_p, enable_gqa, window, alibi_slopes, softcap, sinks,
          return_lse):
    """sdpa() on inputs that passed _check_inputs."""
    bshape, hkv = _batch(query, key, value, enable_gqa)
    L, S, Ev = query.shape[-2], key.shape[-2], value.shape[-1]
    H = bshape[-1] if bshape else 1
    q4 = _as4(query, bshape, H)
    k4, v4 = _as4(key, bshape, hkv), _as4(value, bshape, hkv)
    m4 = None if attn_mask is None else _mask4(attn_mask, bshape, L, S, "attn_mask")
    out, lse, _ = attention(q4, k4, v4, m4, None, _causal_code(causal), scale, dropout_p, window, alibi_slopes, softcap,
                            sinks=sinks)
    if len(bshape) != 2:  # else out is (B, H, L, Ev) already
        out = out.reshape(*bshape, L, Ev)
    return (out, lse.reshape(*bshape, L)) if return_lse else out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention computed by attn: the same arguments,
    shapes, broadcasting and mask semantics (bool True = attend, float added; is_causal is the
    top-left lower triangle and excludes attn_mask), output in the inputs' dtype. Rows with no key
    to attend to give zeros, as torch 2.x's CPU kernels. Dropout masks are attn's own draws (see
    sdpa)."""
    if attn_mask is not None and is_causal:
        _fail(_lib.ERR_INVALID_ARG, "attn_mask must not be given with is_causal=True")
    _check_inputs(query, key, value, same_dtype=True)
    return _sdpa(query, key, value, attn_mask, "top_left" if is_causal else None, scale, dropout_p, enable_gqa, None,
                 None, None, None, False)


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, *, causal=None, scale=None,
                dropout_p=0.0, window=None, alibi_slopes=None, softcap=None, sinks=None, return_lse=False):
    """Attention over sequences packed end to end (FlashAttention's varlen interface):
    q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv); sequence b has queries
    cu_seqlens_q[b]:cu_seqlens_q[b+1] and keys cu_seqlens_k[b]:cu_seqlens_k[b+1] (int32 or int64
    offsets). Each sequence is attention of its own: causal masks, windows and ALiBi align within
    it; sinks (H,) are per head, as in sdpa, their gradient summed over every query. max_seqlen_*:
    the longest sequence (None: computed from the offsets, outside a compiled graph's trace).
    Returns out (total_q, H, Dv), or (out, lse) with lse (H, total_q)."""
    for t, what in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            _fail(_lib.ERR_BAD_SHAPE, "%s must be a 3-d tensor (total, heads, dim)" % what)
    scale = None if scale is None else _real(scale, "scale")
    dropout_p = _real(dropout_p, "dropout_p")
    softcap = None if softcap is None else _real(softcap, "softcap")
    if scale is not None and scale == 0.0:
        q, scale = q * 0.0, 1.0
    wl, wr = _window(window)
    out, lse = _ops.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q or 0), int(max_seqlen_k or 0),
                                   _causal_code(causal), 0.0 if scale is None else float(scale), float(dropout_p),
                                   _seed(dropout_p), wl, wr, alibi_slopes, 0.0 if softcap is None else float(softcap),
                                   _sinks(sinks))
    return (out, lse) if return_lse else out
