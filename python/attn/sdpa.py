"""sdpa.py - scaled dot-product attention on numpy arrays: attn_sdpa_fwd/bwd and the varlen pair.

Shapes follow PyTorch: q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), out (B, H, L, Dv),
lse (B, H, L), with H a multiple of Hkv (grouped-query attention). q is float32; k and v are
float32, float16, or bfloat16 bits (uint16 arrays with kv_dtype="bf16"). Any non-negative strides
are passed to the library as they are (numpy's byte strides divided by the item size); other
arrays are copied once.

Options (keyword-only, shared by forward and backward):
  causal          None, "top_left" (query i sees keys j <= i) or "bottom_right" (j <= i + S - L)
  mask            bool (True = blocked, nn.MultiheadAttention's convention) or float (added),
                  any shape that broadcasts to (B, H, L, S)
  key_padding_mask  bool (True = ignore the key) or float (added), broadcasting to (B, S)
  scale           None for 1/sqrt(D) (0 also means the default)
  dropout_p       dropout on the weights, drawn from the context's generator like F.dropout
  dropout_rng     None (the context's generator: torch's CPU dropout bit for bit, the backward then
                  needs dropout_state) or attn.Philox(seed, offset): a counter-based mask, the same
                  on every thread count and on the GPU, that the backward regenerates by itself
  window          None or (left, right): query i sees keys i+off-left .. i+off+right; None or -1
                  leaves a side unbounded
  alibi_slopes    None or H floats
  softcap         0 for none, else scores = softcap * tanh(scores / softcap)
  sinks           None or H floats: attention sinks (gpt-oss), one logit per query head that joins
                  each row's softmax without a value, as softmax over the row with the sink
                  appended and its column dropped; the row's weights sum to less than 1 and lse
                  includes the sink. -inf is no sink for that head. The backwards give its
                  gradient with return_dsinks=True
  kv_dtype        None (from k and v's dtype), "f32", "f16" or "bf16"
  ctx             a Context; None for this thread's default context
A fully masked row gives zeros and lse = -inf (PyTorch 1.13 gives NaN), or lse = the sink with sinks.
"""
import ctypes

import numpy as np

from . import _lib
from ._arrays import (F32, check_qkv, check_qkv_varlen, check_shape, choice, contiguous, elem_strides, fail,
                      fail_type, flag, integer, kv_views, mask_code, mask_view, ptr, real, view)
from ._lib import AttnError, fn
from .context import Philox, RngState, resolve


def _per_head(values, H, what, keep):
    """values (one float per query head) as a contiguous float32 array kept alive in keep."""
    a = contiguous(values, F32, what)
    if a.ndim != 1 or a.shape[0] != H:
        fail(_lib.ERR_BAD_SHAPE, "%s has shape %s, expected one value per query head (H=%d,)" % (what, a.shape, H))
    keep.append(a)
    return a


def _options(desc, H, causal, scale, dropout_p, window, alibi_slopes, softcap, sinks, keep):
    desc.causal = choice(causal, _lib.CAUSAL, "causal")
    desc.scale = 0.0 if scale is None else real(scale, "scale")
    desc.dropout_p = real(dropout_p, "dropout_p")
    if window is not None:
        try:
            left, right = window
        except (TypeError, ValueError):
            fail(_lib.ERR_INVALID_ARG, "window must be None or (left, right), not %r" % (window,))
        desc.use_window = 1
        desc.window_left = -1 if left is None else integer(left, "window[0]")
        desc.window_right = -1 if right is None else integer(right, "window[1]")
    if alibi_slopes is not None:
        slopes = _per_head(alibi_slopes, H, "alibi_slopes", keep)
        if not np.isfinite(slopes).all():
            fail(_lib.ERR_INVALID_ARG, "alibi_slopes must be finite")
        desc.alibi_slopes = slopes.ctypes.data
    desc.softcap = real(softcap, "softcap")
    if sinks is not None:  # any float: -inf is no sink, NaN and +inf make the head's rows NaN (attn.h)
        desc.sinks = _per_head(sinks, H, "sinks", keep).ctypes.data


def _rng(desc, dropout_rng):
    """The dropout's source into the descriptor: None (the context's generator) or a Philox."""
    if dropout_rng is None:
        return
    if not isinstance(dropout_rng, Philox):
        fail_type("dropout_rng must be None or attn.Philox(seed, offset), not %s" % type(dropout_rng).__name__)
    desc.dropout_rng = _lib.DROPOUT_RNG_PHILOX
    desc.dropout_seed, desc.dropout_offset = dropout_rng.seed, dropout_rng.offset


def _masks(desc, B, H, L, S, mask, key_padding_mask, keep):
    m, mp, mdt, ms = mask_view(mask, (B, H, L, S), "mask")
    if m is not None:
        keep.append(m)
        desc.mask, desc.mask_dtype = mp, mdt
        desc.mask_stride[:] = ms
    kp, kpp, kpdt, kps = mask_view(key_padding_mask, (B, S), "key_padding_mask")
    if kp is not None:
        keep.append(kp)
        desc.key_padding_mask, desc.key_padding_mask_dtype = kpp, kpdt
        desc.key_padding_mask_stride[:] = kps


def _describe(q, k, v, causal, mask, key_padding_mask, scale, dropout_p, window, alibi_slopes, softcap, sinks,
              kv_dtype):
    """Checks the arrays and fills an attn_sdpa_desc. Returns (desc, q, k, v, keep-alive list)."""
    q, qs = view(q, F32, "q")
    k, ks, v, vs, code = kv_views(k, v, kv_dtype)
    B, H, L, D, Hkv, S, _ = check_qkv(q, k, v)
    desc = _lib.SdpaDesc()
    fn("attn_sdpa_desc_init")(ctypes.byref(desc))
    desc.batch, desc.n_heads, desc.n_kv_heads, desc.len_q, desc.len_kv = B, H, Hkv, L, S
    desc.head_dim, desc.head_dim_v = D, v.shape[3]
    desc.q_stride[:], desc.k_stride[:], desc.v_stride[:] = qs, ks, vs
    desc.kv_dtype = code
    keep = []
    _masks(desc, B, H, L, S, mask, key_padding_mask, keep)
    _options(desc, H, causal, scale, dropout_p, window, alibi_slopes, softcap, sinks, keep)
    return desc, q, k, v, keep


def sdpa(q, k, v, *, causal=None, mask=None, key_padding_mask=None, scale=None, dropout_p=0.0, window=None,
         alibi_slopes=None, softcap=0.0, sinks=None, kv_dtype=None, return_lse=False, return_weights=None,
         dropout_rng=None, ctx=None):
    """Scaled dot-product attention forward (attn_sdpa_fwd).

    return_weights: None, "per_head" ((B, H, L, S) weights after dropout) or "average" ((B, L, S)).
    Returns out (B, H, L, Dv) float32; with return_lse and/or return_weights a tuple
    (out, lse, weights) of those asked for, in that order. With dropout, keep ctx.rng_state()
    from before the call to run sdpa_backward (not needed with dropout_rng=attn.Philox(...))."""
    ctx = resolve(ctx)
    return_lse = flag(return_lse, "return_lse")
    weights_mode = choice(return_weights, _lib.WEIGHTS, "return_weights")
    desc, q, k, v, keep = _describe(q, k, v, causal, mask, key_padding_mask, scale, dropout_p, window,
                                    alibi_slopes, softcap, sinks, kv_dtype)
    _rng(desc, dropout_rng)
    B, H, L, S, Dv = desc.batch, desc.n_heads, desc.len_q, desc.len_kv, desc.head_dim_v
    out = np.empty((B, H, L, Dv), dtype=F32)
    desc.o_stride[:] = elem_strides(out)
    lse = np.empty((B, H, L), dtype=F32) if return_lse else None
    desc.weights_mode = weights_mode
    weights = None
    if desc.weights_mode == 1:
        weights = np.empty((B, H, L, S), dtype=F32)
    elif desc.weights_mode == 2:
        weights = np.empty((B, L, S), dtype=F32)
    ctx.check(fn("attn_sdpa_fwd")(ctx.ptr, ctypes.byref(desc), ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse),
                                  ptr(weights)))
    if not return_lse and weights is None:
        return out
    return tuple(x for x, want in ((out, True), (lse, return_lse), (weights, weights is not None)) if want)


def _grad_layout(a, what):
    """a itself when a dense float32 array of the same strides can receive its gradient, else a
    contiguous copy. Returns (array, element strides, gradient buffer)."""
    g = np.empty_like(a, dtype=F32, order="K")
    if elem_strides(g) != elem_strides(a):
        a = np.ascontiguousarray(a)
        g = np.empty(a.shape, dtype=F32)
    return a, elem_strides(a), g


def _dropout_state(desc, dropout_state):
    if dropout_state is not None and not isinstance(dropout_state, RngState):
        fail_type("dropout_state must be an attn.RngState (ctx.rng_state()), not %s" % type(dropout_state).__name__)
    if desc.dropout_p > 0 and desc.dropout_rng != _lib.DROPOUT_RNG_PHILOX and dropout_state is None:
        fail(_lib.ERR_INVALID_ARG, "dropout_p > 0 needs dropout_state: ctx.rng_state() taken before the forward")
    return dropout_state._pointer() if dropout_state is not None else None


def sdpa_backward(q, k, v, out, dout, lse, *, causal=None, mask=None, key_padding_mask=None, scale=None,
                  dropout_p=0.0, window=None, alibi_slopes=None, softcap=0.0, sinks=None, kv_dtype=None,
                  dropout_state=None, return_dmask=False, return_dsinks=False, dropout_rng=None, ctx=None):
    """Gradients of a loss given dout = dL/dout (attn_sdpa_bwd), with the forward's options.

    out and lse are the forward's (sdpa(..., return_lse=True)). dropout_state: with dropout_p > 0,
    the ctx.rng_state() taken before the forward (the context's own generator is not touched);
    with dropout_rng=attn.Philox(...), the forward's Philox and no state.
    Returns (dq, dk, dv) as float32 (dk, dv with k and v's shapes whatever their dtype; with
    grouped-query attention the sum over the heads sharing a kv head); with return_dmask also the
    gradient of a float mask, in the mask's own shape (broadcast dimensions summed); with
    return_dsinks also the gradient of the sinks, (H,) float32 (attn_sdpa_sinks_bwd: summed over
    the batch and the queries), last."""
    ctx = resolve(ctx)
    return_dmask = flag(return_dmask, "return_dmask")
    return_dsinks = _want_dsinks(return_dsinks, sinks)
    desc, q, k, v, keep = _describe(q, k, v, causal, mask, key_padding_mask, scale, dropout_p, window,
                                    alibi_slopes, softcap, sinks, kv_dtype)
    _rng(desc, dropout_rng)
    B, H, L, Dv = desc.batch, desc.n_heads, desc.len_q, desc.head_dim_v
    q, qs, dq = _grad_layout(q, "q")
    k, ks, dk = _grad_layout(k, "k")
    v, vs, dv = _grad_layout(v, "v")
    desc.q_stride[:], desc.k_stride[:], desc.v_stride[:] = qs, ks, vs
    out, os_ = view(out, F32, "out")
    dout, ds = view(dout, F32, "dout")
    check_shape(out, (B, H, L, Dv), "out", ("B", "H", "L", "Dv"))
    check_shape(dout, (B, H, L, Dv), "dout", ("B", "H", "L", "Dv"))
    if os_ != ds:  # out and dout share o_stride
        out, dout = np.ascontiguousarray(out), np.ascontiguousarray(dout)
        os_ = elem_strides(out)
    desc.o_stride[:] = os_
    lse = contiguous(lse, F32, "lse")
    check_shape(lse, (B, H, L), "lse", ("B", "H", "L"))
    dmask = None
    if return_dmask:
        if mask is None or mask_code(mask, "mask") == _lib.DTYPE_BOOL:
            fail(_lib.ERR_BAD_MASK, "return_dmask needs a float mask")
        dmask = np.zeros(np.shape(mask), dtype=F32)
        _, dmp, _, dms = mask_view(dmask, (B, H, L, desc.len_kv), "dmask")
        if list(desc.mask_stride) != dms:  # the mask was a strided view: give it dmask's layout
            m = np.ascontiguousarray(np.asarray(mask, dtype=F32))
            keep.append(m)
            desc.mask = np.broadcast_to(m, (B, H, L, desc.len_kv)).ctypes.data
            desc.mask_stride[:] = dms
    state = _dropout_state(desc, dropout_state)
    ctx.check(fn("attn_sdpa_bwd")(ctx.ptr, ctypes.byref(desc), ptr(q), ptr(k), ptr(v), ptr(out), ptr(dout),
                                  ptr(lse), state, ptr(dq), ptr(dk), ptr(dv), ptr(dmask)))
    grads = (dq, dk, dv) + ((dmask,) if return_dmask else ())
    return (grads + (_dsinks(ctx, desc, None, None, out, dout, lse),)) if return_dsinks else grads


def _want_dsinks(return_dsinks, sinks):
    return_dsinks = flag(return_dsinks, "return_dsinks")
    if return_dsinks and sinks is None:
        fail(_lib.ERR_INVALID_ARG, "return_dsinks needs the forward's sinks")
    return return_dsinks


def _dsinks(ctx, desc, cq, ck, out, dout, lse):
    """The sinks' gradient (attn_sdpa_sinks_bwd), (H,) float32, from the forward's out and lse and
    dout, laid out as desc says (packed with the offsets cq and ck, else cq = ck = None)."""
    dsinks = np.empty(desc.n_heads, dtype=F32)
    ctx.check(fn("attn_sdpa_sinks_bwd")(ctx.ptr, ctypes.byref(desc), ptr(cq), ptr(ck), ptr(out), ptr(dout), ptr(lse),
                                        ptr(dsinks)))
    return dsinks


# ---- variable-length packed batches ------------------------------------------------------------

def _describe_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, dropout_p,
                     window, alibi_slopes, softcap, sinks, kv_dtype):
    q, qs = view(q, F32, "q")
    k, ks, v, vs, code = kv_views(k, v, kv_dtype)
    Tq, H, D, Tk, Hkv, _ = check_qkv_varlen(q, k, v)
    cq = contiguous(cu_seqlens_q, np.int64, "cu_seqlens_q")
    ck = contiguous(cu_seqlens_k, np.int64, "cu_seqlens_k")
    if cq.ndim != 1 or ck.ndim != 1 or cq.shape[0] < 2 or cq.shape != ck.shape:
        fail(_lib.ERR_BAD_SHAPE, "cu_seqlens_q and cu_seqlens_k must both hold batch + 1 >= 2 offsets, got %d and %d"
             % (cq.size, ck.size))
    # the library checks that the offsets increase from 0; their last values must match the arrays
    if cq[-1] != Tq or ck[-1] != Tk:
        fail(_lib.ERR_BAD_SHAPE, "cu_seqlens_q ends at %d and cu_seqlens_k at %d, but q has %d tokens and k %d"
             % (cq[-1], ck[-1], Tq, Tk))
    desc = _lib.SdpaDesc()
    fn("attn_sdpa_desc_init")(ctypes.byref(desc))
    lens_q, lens_k = np.diff(cq), np.diff(ck)
    desc.batch, desc.n_heads, desc.n_kv_heads = cq.shape[0] - 1, H, Hkv
    desc.len_q = integer(max_seqlen_q, "max_seqlen_q") if max_seqlen_q is not None else max(1, int(lens_q.max()))
    desc.len_kv = integer(max_seqlen_k, "max_seqlen_k") if max_seqlen_k is not None else max(1, int(lens_k.max()))
    desc.head_dim, desc.head_dim_v = D, v.shape[2]
    # (token, head, dim) arrays read as (0, head, token, dim)
    desc.q_stride[:] = [0, qs[1], qs[0], qs[2]]
    desc.k_stride[:] = [0, ks[1], ks[0], ks[2]]
    desc.v_stride[:] = [0, vs[1], vs[0], vs[2]]
    desc.kv_dtype = code
    keep = [cq, ck]
    _options(desc, H, causal, scale, dropout_p, window, alibi_slopes, softcap, sinks, keep)
    return desc, q, k, v, cq, ck, keep


def has_varlen():
    """Whether the loaded library has attn_sdpa_varlen_fwd and attn_sdpa_varlen_bwd."""
    return _lib.has_symbol("attn_sdpa_varlen_fwd") and _lib.has_symbol("attn_sdpa_varlen_bwd")


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None, causal=None,
                scale=None, dropout_p=0.0, window=None, alibi_slopes=None, softcap=0.0, sinks=None, kv_dtype=None,
                return_lse=False, dropout_rng=None, ctx=None):
    """Attention over sequences packed end to end (FlashAttention's varlen interface,
    attn_sdpa_varlen_fwd): q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv); sequence b
    has queries cu_seqlens_q[b]:cu_seqlens_q[b+1] and keys cu_seqlens_k[b]:cu_seqlens_k[b+1]. Each
    sequence is attention on its own (causal masks, windows and ALiBi align within it; sinks are
    per head, shared by the sequences); no masks.
    Returns out (total_q, H, Dv), and lse (H, total_q) with return_lse."""
    ctx = resolve(ctx)
    desc, q, k, v, cq, ck, keep = _describe_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   causal, scale, dropout_p, window, alibi_slopes, softcap, sinks,
                                                   kv_dtype)
    _rng(desc, dropout_rng)
    Tq, H, Dv = q.shape[0], desc.n_heads, desc.head_dim_v
    out = np.empty((Tq, H, Dv), dtype=F32)
    os_ = elem_strides(out)
    desc.o_stride[:] = [0, os_[1], os_[0], os_[2]]
    lse = np.empty((H, Tq), dtype=F32) if return_lse else None
    ctx.check(fn("attn_sdpa_varlen_fwd")(ctx.ptr, ctypes.byref(desc), ptr(cq), ptr(ck), ptr(q), ptr(k), ptr(v),
                                         ptr(out), ptr(lse)))
    return (out, lse) if return_lse else out


def sdpa_varlen_backward(q, k, v, cu_seqlens_q, cu_seqlens_k, out, dout, lse, *, max_seqlen_q=None,
                         max_seqlen_k=None, causal=None, scale=None, dropout_p=0.0, window=None, alibi_slopes=None,
                         softcap=0.0, sinks=None, kv_dtype=None, dropout_state=None, return_dsinks=False,
                         dropout_rng=None, ctx=None):
    """Gradients of sdpa_varlen (attn_sdpa_varlen_bwd): out (total_q, H, Dv) and lse (H, total_q)
    from the forward, dout like out. Returns (dq, dk, dv) float32 with q, k, v's shapes; with
    return_dsinks also the sinks' gradient, (H,) float32 summed over every query of the batch."""
    ctx = resolve(ctx)
    return_dsinks = _want_dsinks(return_dsinks, sinks)
    desc, q, k, v, cq, ck, keep = _describe_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   causal, scale, dropout_p, window, alibi_slopes, softcap, sinks,
                                                   kv_dtype)
    _rng(desc, dropout_rng)
    Tq, H, Dv = q.shape[0], desc.n_heads, desc.head_dim_v
    q, qs, dq = _grad_layout(q, "q")
    k, ks, dk = _grad_layout(k, "k")
    v, vs, dv = _grad_layout(v, "v")
    desc.q_stride[:] = [0, qs[1], qs[0], qs[2]]
    desc.k_stride[:] = [0, ks[1], ks[0], ks[2]]
    desc.v_stride[:] = [0, vs[1], vs[0], vs[2]]
    out, os_ = view(out, F32, "out")
    dout, ds = view(dout, F32, "dout")
    check_shape(out, (Tq, H, Dv), "out", ("total_q", "H", "Dv"))
    check_shape(dout, (Tq, H, Dv), "dout", ("total_q", "H", "Dv"))
    if os_ != ds:
        out, dout = np.ascontiguousarray(out), np.ascontiguousarray(dout)
        os_ = elem_strides(out)
    desc.o_stride[:] = [0, os_[1], os_[0], os_[2]]
    lse = contiguous(lse, F32, "lse")
    check_shape(lse, (H, Tq), "lse", ("H", "total_q"))
    state = _dropout_state(desc, dropout_state)
    ctx.check(fn("attn_sdpa_varlen_bwd")(ctx.ptr, ctypes.byref(desc), ptr(cq), ptr(ck), ptr(q), ptr(k), ptr(v),
                                         ptr(out), ptr(dout), ptr(lse), state, ptr(dq), ptr(dk), ptr(dv)))
    return (dq, dk, dv, _dsinks(ctx, desc, cq, ck, out, dout, lse)) if return_dsinks else (dq, dk, dv)


__all__ = ["sdpa", "sdpa_backward", "sdpa_varlen", "sdpa_varlen_backward", "has_varlen", "AttnError"]
