"""_call.py - the library's SDPA calls on torch tensors: descriptor, element types, dropout seeds.

What the custom ops of _ops.py run. The tensors go to the library as they are (data pointer and
element strides: transposed views and stride-0 broadcasts are not copied). Element types:
  - k and v: float32, float16 and bfloat16 as they are (attn_sdpa_desc.kv_dtype); float64 (or k and
    v of different types) are computed in float32.
  - q and out: float32 as they are. float16 and bfloat16 go to the library as they are when it
    accepts them (asked once per type with a one-query call, see native(); a call it still refuses
    runs again in float32, see typed()); until then they are converted to float32 and the result
    rounded back to the input's type. float64 is computed in float32 and returned as float64.
  - the gradients: dq in q's type, dk and dv in k's and v's (computed in float32 unless the library
    takes the type natively).
CUDA tensors go to libattn_cuda (_cuda.py) with the same descriptor: q, k, v and out of float32,
float16 or bfloat16 as they are (float64 computed in float32), masks and ALiBi slopes on the device,
the gradients in q's type (float32 when k or v differ from it); dropout there is the counter-based
Philox mask (ATTN_DROPOUT_RNG_PHILOX) keyed by the op's seed, which the backward regenerates, not
torch's CPU dropout stream: the same seed gives different masks on the CPU and the GPU. Attention
sinks are CPU-only for now: CUDA calls with sinks raise ATTN_ERR_UNSUPPORTED. Every check
the library cannot make itself (the tensors' extents) is made here, so the ops are safe to call
directly through torch.ops.attn.
"""
import contextlib
import ctypes
import os
import threading

import torch

from .. import _lib
from .._arrays import check_qkv, check_qkv_varlen, fail, fail_type, shape_str
from .._lib import AttnError, fn
from ..context import Context, _gomp_parallel, openmp_runtime
from ..sdpa import _options
from . import _cuda

CODES = {torch.float32: _lib.DTYPE_F32, torch.float16: _lib.DTYPE_F16, torch.bfloat16: _lib.DTYPE_BF16}
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CAUSAL_NAMES = {0: None, 1: "top_left", 2: "bottom_right"}
WEIGHT_MODES = (0, 1, 2)  # none, per head (B, H, L, S), averaged over the heads (B, L, S)

_local = threading.local()


_threads = {"torch": True}  # torch_threads(): run on torch's OpenMP threads where it has them
_runtime = []  # [the file of torch's OpenMP runtime, or None], found on first use


def torch_runtime():
    """The file of the OpenMP runtime torch runs its threads on (its ATen parallel backend is
    OpenMP and the runtime, loaded in this process, exports GOMP_parallel), else None."""
    if not _runtime:
        path = None
        if "parallel backend: OpenMP" in torch.__config__.parallel_info():
            path = openmp_runtime(prefer=os.path.dirname(torch.__file__))
            if path is not None and _gomp_parallel(path) is None:
                path = None
        _runtime.append(path)
    return _runtime[0]


def torch_threads(enabled=None):
    """Whether the CPU calls of attn.torch run on torch's own threads (the default, where torch
    runs them on an OpenMP runtime: its team, waiting after torch's last operation, takes each of
    attn's loops at once, instead of attn's threads sharing the cores with it), or on threads of
    attn's contexts. With `enabled`, sets it first (for every thread's calls from then on).
    Returns the setting in use: True only where torch's runtime was found (torch_runtime())."""
    if enabled is not None:
        _threads["torch"] = bool(enabled)
    return _threads["torch"] and torch_runtime() is not None


def context():
    """This thread's attn Context for the torch ops, with torch.get_num_threads() threads, run on
    torch's OpenMP threads (see torch_threads); made again when either changes. Results are
    identical for every count and either way."""
    n = max(1, torch.get_num_threads())
    omp = torch_runtime() if _threads["torch"] and n > 1 else None
    ctx = getattr(_local, "ctx", None)
    if ctx is None or ctx.threads != n or ctx.openmp != omp:
        ctx = _local.ctx = Context(threads=n, openmp=omp or False)
    return ctx


def strides(t):
    """Element strides, 0 for dimensions of size 1 (never stepped): a mask's. q, k, v and out go
    with torch's strides as they are, which the library (libattn and libattn_cuda) reads as 0 on
    dimensions of size 1 itself."""
    return [0 if n == 1 else s for n, s in zip(t.shape, t.stride())]


# ---- checks -----------------------------------------------------------------------------------

def check_tensors(tensors):
    """q, k, v: strided torch tensors of a floating type (their extents: check_qkv)."""
    for t, what in zip(tensors, ("q", "k", "v")):
        check_tensor(t, what)


def check_tensor(t, what):
    if not isinstance(t, torch.Tensor):
        fail_type("%s must be a torch.Tensor, not %s" % (what, type(t).__name__))
    if t.layout != torch.strided:
        fail(_lib.ERR_UNSUPPORTED, "%s: %s tensors are not supported (strided ones are)" % (what, t.layout))
    if t.dtype not in FLOATS:
        fail(_lib.ERR_UNSUPPORTED, "%s: dtype %s is not float32, float16, bfloat16 or float64" % (what, t.dtype))


def check_broadcast(m, full, what):
    """m: a mask whose every dimension is 1 or the full extent."""
    if m.dim() != len(full) or any(a not in (1, b) for a, b in zip(m.shape, full)):
        fail(_lib.ERR_BAD_MASK, "%s of shape %s does not broadcast to %s dimension by dimension"
             % (what, shape_str(m.shape), shape_str(full)))
    if m.dtype not in (torch.bool, torch.float32):
        fail(_lib.ERR_BAD_MASK, "%s must be bool (True = blocked) or float32 (added), not %s" % (what, m.dtype))


def check_sinks(sinks, H):
    """sinks: None or a floating-point (H,) tensor, one logit per query head."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor) or sinks.dtype not in FLOATS:
        fail_type("sinks must be a float32, float16, bfloat16 or float64 tensor, not %s"
                  % (sinks.dtype if isinstance(sinks, torch.Tensor) else type(sinks).__name__))
    if tuple(sinks.shape) != (H,):
        fail(_lib.ERR_BAD_SHAPE, "sinks has shape %s, expected one value per query head (H=%d,)"
             % (shape_str(sinks.shape), H))


def check_devices(tensors):
    dev = tensors[0].device
    for t in tensors[1:]:
        if t is not None and t.device != dev:
            devices = {t.device for t in tensors if t is not None}
            fail(_lib.ERR_INVALID_ARG, "tensors on different devices: %s" % sorted(str(d) for d in devices))
    if dev.type not in ("cpu", "cuda"):
        fail(_lib.ERR_UNSUPPORTED, "tensors on %s: attn runs on the CPU (and on CUDA with libattn_cuda)" % dev)
    return dev


# ---- element types --------------------------------------------------------------------------

_native = {}


def native(ctx, q_dtype, kv_dtype, backward):
    """Whether the library takes q and out (and, for the backward, the gradients) of q_dtype with k
    and v of kv_dtype as they are: asked once per combination with a one-query, one-key call, which
    the library answers ATTN_ERR_UNSUPPORTED until it computes in that type."""
    if q_dtype == torch.float32:
        return True
    key = (ctx.isa, q_dtype, kv_dtype, backward)
    if key not in _native:
        D = 16
        t = torch.zeros((1, 1, 1, D), dtype=q_dtype)
        kv = torch.zeros((1, 1, 1, D), dtype=kv_dtype)
        lse = torch.zeros((1, 1, 1), dtype=torch.float32)
        desc = _lib.SdpaDesc()
        fn("attn_sdpa_desc_init")(ctypes.byref(desc))
        desc.batch = desc.n_heads = desc.n_kv_heads = desc.len_q = desc.len_kv = 1
        desc.head_dim = desc.head_dim_v = D
        for name in ("q_stride", "k_stride", "v_stride", "o_stride"):
            getattr(desc, name)[:] = [D, D, D, 1]
        desc.q_dtype = desc.out_dtype = desc.grad_dtype = CODES[q_dtype]
        desc.kv_dtype = CODES[kv_dtype]
        if backward:
            g = [torch.zeros_like(t), torch.zeros_like(kv), torch.zeros_like(kv)]
            status = fn("attn_sdpa_bwd")(ctx.ptr, ctypes.byref(desc), t.data_ptr(), kv.data_ptr(), kv.data_ptr(),
                                         t.data_ptr(), t.data_ptr(), lse.data_ptr(), None,
                                         g[0].data_ptr(), g[1].data_ptr(), g[2].data_ptr(), None)
        else:
            out = torch.zeros_like(t)
            status = fn("attn_sdpa_fwd")(ctx.ptr, ctypes.byref(desc), t.data_ptr(), kv.data_ptr(), kv.data_ptr(),
                                         out.data_ptr(), lse.data_ptr(), None)
        _native[key] = status == _lib.OK
    return _native[key]


def plan(ctx, q, k, v, backward):
    """The tensors as the library will read them and the type it computes q/out (and the
    gradients) in: (q, k, v, dtype). Conversions are made here and in typed()'s fallback."""
    if k.dtype != v.dtype or k.dtype not in CODES:
        k, v = k.float(), v.float()
    if q.dtype in (torch.float16, torch.bfloat16) and (not backward or k.dtype == q.dtype) \
            and native(ctx, q.dtype, k.dtype, backward):
        return q, k, v, q.dtype
    return (q if q.dtype == torch.float32 else q.float()), k, v, torch.float32


def typed(ctx, q, k, v, backward, call):
    """call(q, k, v, dtype) on what plan() gives; if the library then answers
    ATTN_ERR_UNSUPPORTED for a half type it took in native()'s probe (a shape its kernels for that
    type do not cover), once more in float32."""
    qc, kc, vc, dt = plan(ctx, q, k, v, backward)
    try:
        return call(qc, kc, vc, dt)
    except AttnError as exc:
        if dt == torch.float32 or exc.status != _lib.ERR_UNSUPPORTED:
            raise
    return call(qc.float(), kc, vc, torch.float32)


# ---- the descriptor ---------------------------------------------------------------------------

def _layout(desc, q, k, v, out, varlen):
    """Extents and strides: (B, H, L, D) tensors, or varlen (total, H, D) ones read as
    (0, head, token, dim)."""
    def st(t):
        s = t.stride()
        return (0, s[1], s[0], s[2]) if varlen else s
    desc.q_stride[:], desc.k_stride[:], desc.v_stride[:], desc.o_stride[:] = st(q), st(k), st(v), st(out)
    desc.q_dtype, desc.kv_dtype, desc.out_dtype = CODES[q.dtype], CODES[k.dtype], CODES[out.dtype]


def _host(t):
    """A per-head tensor (ALiBi slopes, sinks) as the library reads it: float32 in host memory."""
    return None if t is None else t.detach().to("cpu", torch.float32)


def describe(q, k, v, out, mask, key_padding_mask, causal, scale, dropout_p, window_left, window_right, alibi_slopes,
             softcap, sinks, varlen=False):
    """An attn_sdpa_desc for (B, H, L, D) tensors (or varlen ones: extents set by the caller).
    mask: None or (B|1, H|1, L|1, S|1), bool (True = blocked) or float32 (added);
    key_padding_mask: None or (B|1, S|1) likewise; alibi_slopes and sinks: None or (H,), passed to
    the library as float32 host arrays. Returns (desc, keep-alive list)."""
    desc = _lib.SdpaDesc()
    fn("attn_sdpa_desc_init")(ctypes.byref(desc))
    if not varlen:
        B, H, L, D = q.shape
        desc.batch, desc.n_heads, desc.n_kv_heads, desc.len_q, desc.len_kv = B, H, k.shape[1], L, k.shape[2]
        desc.head_dim, desc.head_dim_v = D, v.shape[3]
    _layout(desc, q, k, v, out, varlen)
    keep = []
    for m, field in ((mask, "mask"), (key_padding_mask, "key_padding_mask")):
        if m is not None:
            setattr(desc, field, m.data_ptr())
            setattr(desc, field + "_dtype", _lib.DTYPE_BOOL if m.dtype == torch.bool else _lib.DTYPE_F32)
            getattr(desc, field + "_stride")[:] = strides(m)
    if causal not in CAUSAL_NAMES:
        fail(_lib.ERR_INVALID_ARG, "causal must be 0 (none), 1 (top-left) or 2 (bottom-right), not %r" % (causal,))
    window = None if window_left == -1 and window_right == -1 else (window_left, window_right)
    _options(desc, desc.n_heads if not varlen else q.shape[1], CAUSAL_NAMES[causal], scale or None, dropout_p,
             window, _host(alibi_slopes), softcap, _host(sinks), keep)
    return desc, keep


# ---- dropout -----------------------------------------------------------------------------------

def generator(seed):
    """An attn_generator seeded with `seed` (a 0-d int64 tensor), as torch.manual_seed(seed)."""
    g = _lib.Generator()
    fn("attn_generator_seed")(ctypes.byref(g), int(seed) & 0xFFFFFFFFFFFFFFFF)
    return g


_NO_DROPOUT = contextlib.nullcontext()


def seeded(ctx, seed, dropout_p):
    """The context's generator set from `seed` for one forward call with dropout, then restored
    (a context manager; one that does nothing without dropout)."""
    return _NO_DROPOUT if dropout_p <= 0 else _seeded(ctx, seed)


@contextlib.contextmanager
def _seeded(ctx, seed):
    if seed is None:
        fail(_lib.ERR_INVALID_ARG, "dropout_p > 0 needs a seed")
    saved = ctx.rng_state()
    fn("attn_ctx_generator")(ctx.ptr)[0] = generator(seed)
    try:
        yield
    finally:
        ctx.set_rng_state(saved)


def dropout_state(seed, dropout_p):
    """The generator state the forward's dropout started from (byref keeps it alive), or None."""
    if dropout_p <= 0:
        return None
    if seed is None:
        fail(_lib.ERR_INVALID_ARG, "dropout_p > 0 needs a seed")
    return ctypes.byref(generator(seed))


# ---- (B, H, L, D) attention ---------------------------------------------------------------------

def _check_4d(q, k, v, mask, key_padding_mask, sinks):
    check_tensors((q, k, v))
    B, H, L, _, Hkv, S, _ = check_qkv(q, k, v)
    check_sinks(sinks, H)
    if Hkv == 0 or H % Hkv:
        fail(_lib.ERR_BAD_SHAPE, "q has %d heads, not a multiple of k's %d" % (H, Hkv))
    if mask is not None:
        check_broadcast(mask, (B, H, L, S), "mask")
    if key_padding_mask is not None:
        check_broadcast(key_padding_mask, (B, S), "key_padding_mask")
    return check_devices([q, k, v, mask, key_padding_mask])


def _empty_lse(q, sinks, shape):
    """The log-sum-exp of rows without keys: -inf, or the head's sink (shape (..., H, L))."""
    if sinks is None:
        return q.new_full(shape, float("-inf"), dtype=torch.float32)
    z = sinks.detach().to(q.device, torch.float32)
    return z.view(-1, 1).expand(shape[-2:]).expand(shape).contiguous()


def sdpa_forward(q, k, v, mask, key_padding_mask, causal, scale, dropout_p, seed, window_left, window_right,
                 alibi_slopes, softcap, weights_mode, sinks):
    """attn_sdpa_fwd. Returns (out (B, H, L, Dv) of q's dtype, lse (B, H, L) float32, weights
    float32: (0,) for mode 0, (B, H, L, S) for 1, (B, L, S) for 2)."""
    dev = _check_4d(q, k, v, mask, key_padding_mask, sinks)
    if weights_mode not in WEIGHT_MODES:
        fail(_lib.ERR_INVALID_ARG, "weights_mode must be 0, 1 or 2, not %r" % (weights_mode,))
    B, H, L, _ = q.shape
    S, Dv = k.shape[2], v.shape[3]
    wshape = [(0,), (B, H, L, S), (B, L, S)][weights_mode]
    if 0 in (B, H, L, S):  # the library takes no empty extent: torch's answers
        out = q.new_zeros((B, H, L, Dv))
        return out, _empty_lse(q, sinks, (B, H, L)), q.new_zeros(wshape, dtype=torch.float32)
    if dev.type == "cuda":
        if weights_mode:
            fail(_lib.ERR_UNSUPPORTED, "the attention weights output is CPU-only: libattn_cuda does not write it")
        qc, kc, vc, odt = cuda_types(q, k, v)
        out = torch.empty((B, H, L, Dv), dtype=odt, device=dev)
        lse = torch.empty((B, H, L), dtype=torch.float32, device=dev)
        desc, keep = describe(qc, kc, vc, out, mask, key_padding_mask, causal, scale, dropout_p, window_left,
                              window_right, alibi_slopes, softcap, sinks)
        cuda_extras(desc, keep, dev, alibi_slopes, seed)
        _cuda.run("attn_cuda_sdpa_fwd", dev, desc, qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), out.data_ptr(),
                  lse.data_ptr())
        return out.to(q.dtype), lse, q.new_zeros(wshape, dtype=torch.float32)
    ctx = context()

    def call(qc, kc, vc, odt):
        out = torch.empty((B, H, L, Dv), dtype=odt)
        lse = torch.empty((B, H, L), dtype=torch.float32)
        weights = torch.empty(wshape, dtype=torch.float32)
        desc, keep = describe(qc, kc, vc, out, mask, key_padding_mask, causal, scale, dropout_p, window_left,
                              window_right, alibi_slopes, softcap, sinks)
        desc.weights_mode = weights_mode
        with seeded(ctx, seed, dropout_p):
            ctx.check(fn("attn_sdpa_fwd")(ctx.ptr, ctypes.byref(desc), qc.data_ptr(), kc.data_ptr(), vc.data_ptr(),
                                          out.data_ptr(), lse.data_ptr(), weights.data_ptr() if weights_mode else None))
        return _as(out, q.dtype), lse, weights

    return typed(ctx, q, k, v, False, call)


def _as(t, dtype):
    """t in dtype (t itself when it has it)."""
    return t if t.dtype == dtype else t.to(dtype)


def _dense(t, dtype):
    """t in dtype, contiguous (t itself when it is both)."""
    return _as(t, dtype).contiguous()


def _grad_buffers(qc, kc, vc, gdt):
    """The inputs laid out densely (the library writes each gradient at its input's strides) and
    the gradient buffers, on the inputs' device."""
    qc, kc, vc = qc.contiguous(), kc.contiguous(), vc.contiguous()
    return qc, kc, vc, [torch.empty(t.shape, dtype=gdt, device=t.device) for t in (qc, kc, vc)]


# ---- CUDA tensors (libattn_cuda) -----------------------------------------------------------------

def cuda_types(q, k, v):
    """q, k, v as libattn_cuda reads them and the type of out and the gradients: every float32,
    float16 and bfloat16 tensor as it is (float64 in float32); out and the gradients in q's type
    when k and v share it, else float32."""
    q, k, v = (t.float() if t.dtype == torch.float64 else t for t in (q, k, v))
    return q, k, v, q.dtype if k.dtype == v.dtype == q.dtype else torch.float32


def cuda_extras(desc, keep, dev, alibi_slopes, seed):
    """What differs on the GPU once describe() has run: the ALiBi slopes as a device array, and
    dropout drawn from Philox keyed by the op's seed (offset 0). Attention sinks are refused:
    libattn_cuda does not take them yet."""
    if desc.sinks:
        fail(_lib.ERR_UNSUPPORTED, "attention sinks are not supported on CUDA tensors yet (libattn_cuda does not "
             "take them); run this attention on the CPU")
    if alibi_slopes is not None:
        slopes = alibi_slopes.detach().to(dev, torch.float32).contiguous()
        keep.append(slopes)
        desc.alibi_slopes = slopes.data_ptr()
    if desc.dropout_p > 0:
        if seed is None:
            fail(_lib.ERR_INVALID_ARG, "dropout_p > 0 needs a seed")
        desc.dropout_rng = _lib.DROPOUT_RNG_PHILOX
        desc.dropout_seed, desc.dropout_offset = int(seed) & 0xFFFFFFFFFFFFFFFF, 0


def _check_out(out, dout, lse, out_shape, lse_shape):
    for t, what in ((out, "out"), (dout, "dout")):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(out_shape):
            fail(_lib.ERR_BAD_SHAPE, "%s must have shape %s, got %s" % (
                what, shape_str(out_shape), shape_str(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__))
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != tuple(lse_shape) or lse.dtype != torch.float32:
        fail(_lib.ERR_BAD_SHAPE, "lse must be float32 of shape %s" % shape_str(lse_shape))


def _dsinks_buffer(sinks, want_dsinks, dev):
    """The sinks' gradient as the backward ops return it: zeros of the sinks' shape and dtype when
    asked for (filled by sinks_grad()), else an empty float32 tensor."""
    if not want_dsinks:
        return torch.zeros((0,), dtype=torch.float32, device=dev)
    if sinks is None:
        fail(_lib.ERR_INVALID_ARG, "the sinks' gradient needs the forward's sinks")
    return torch.zeros(sinks.shape, dtype=sinks.dtype, device=sinks.device)


def sinks_grad(ctx, desc, cu_q, cu_k, out_c, dout_c, lse_c, dsinks):
    """attn_sdpa_sinks_bwd into dsinks (from _dsinks_buffer), when it was asked for: out_c, dout_c
    and lse_c as the backward gave them to the library (packed with the offsets cu_q, cu_k)."""
    if dsinks.numel() == 0:
        return
    g = torch.empty(dsinks.shape, dtype=torch.float32)
    ctx.check(fn("attn_sdpa_sinks_bwd")(ctx.ptr, ctypes.byref(desc), None if cu_q is None else cu_q.data_ptr(),
                                        None if cu_k is None else cu_k.data_ptr(), out_c.data_ptr(),
                                        dout_c.data_ptr(), lse_c.data_ptr(), g.data_ptr()))
    dsinks.copy_(g)


def sdpa_backward(dout, q, k, v, out, lse, mask, key_padding_mask, causal, scale, dropout_p, seed, window_left,
                  window_right, alibi_slopes, softcap, want_dmask, sinks, want_dsinks):
    """attn_sdpa_bwd. Returns (dq, dk, dv, dmask, dsinks): gradients in q's, k's and v's dtypes;
    dmask float32 in the mask's shape when want_dmask (a float32 mask), dsinks (H,) in the sinks'
    dtype when want_dsinks (attn_sdpa_sinks_bwd: summed over the batch and the queries), else
    empty tensors."""
    dev = _check_4d(q, k, v, mask, key_padding_mask, sinks)
    B, H, L, _ = q.shape
    S, Dv = k.shape[2], v.shape[3]
    _check_out(out, dout, lse, (B, H, L, Dv), (B, H, L))
    if want_dmask and (mask is None or mask.dtype != torch.float32):
        fail(_lib.ERR_BAD_MASK, "the mask's gradient needs a float32 mask")
    dmask = torch.zeros(mask.shape if want_dmask else (0,), dtype=torch.float32, device=dev)
    dsinks = _dsinks_buffer(sinks, want_dsinks, dev)
    if 0 in (B, H, L, S):  # out is zero where there are no keys: so is every gradient
        return q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape), dmask, dsinks
    mask_c = mask.contiguous() if want_dmask else mask  # dmask is written at the mask's strides
    if dev.type == "cuda":
        qc, kc, vc, cdt = cuda_types(q, k, v)
        qc, kc, vc, (dq, dk, dv) = _grad_buffers(qc, kc, vc, cdt)
        out_c, dout_c, lse_c = _dense(out, cdt), _dense(dout, cdt), lse.contiguous()
        desc, keep = describe(qc, kc, vc, out_c, mask_c, key_padding_mask, causal, scale, dropout_p, window_left,
                              window_right, alibi_slopes, softcap, sinks)
        cuda_extras(desc, keep, dev, alibi_slopes, seed)
        desc.grad_dtype = CODES[cdt]
        _cuda.run("attn_cuda_sdpa_bwd", dev, desc, qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), out_c.data_ptr(),
                  dout_c.data_ptr(), lse_c.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                  dmask.data_ptr() if want_dmask else None)
        return _as(dq, q.dtype), _as(dk, k.dtype), _as(dv, v.dtype), dmask, dsinks
    ctx = context()

    def call(qc, kc, vc, cdt):
        qc, kc, vc, (dq, dk, dv) = _grad_buffers(qc, kc, vc, cdt)
        out_c, dout_c, lse_c = _dense(out, cdt), _dense(dout, cdt), lse.contiguous()
        desc, keep = describe(qc, kc, vc, out_c, mask_c, key_padding_mask, causal, scale, dropout_p, window_left,
                              window_right, alibi_slopes, softcap, sinks)
        desc.grad_dtype = CODES[cdt]
        state = dropout_state(seed, dropout_p)
        if want_dmask:
            dmask.zero_()
        ctx.check(fn("attn_sdpa_bwd")(ctx.ptr, ctypes.byref(desc), qc.data_ptr(), kc.data_ptr(), vc.data_ptr(),
                                      out_c.data_ptr(), dout_c.data_ptr(), lse_c.data_ptr(), state, dq.data_ptr(),
                                      dk.data_ptr(), dv.data_ptr(), dmask.data_ptr() if want_dmask else None))
        sinks_grad(ctx, desc, None, None, out_c, dout_c, lse_c, dsinks)
        return _as(dq, q.dtype), _as(dk, k.dtype), _as(dv, v.dtype), dmask, dsinks

    return typed(ctx, q, k, v, True, call)


# ---- packed variable-length batches -----------------------------------------------------------

def _describe_varlen(q, k, v, out, cu_q, cu_k, max_q, max_k, causal, scale, dropout_p, window_left, window_right,
                     alibi_slopes, softcap, sinks):
    desc, keep = describe(q, k, v, out, None, None, causal, scale, dropout_p, window_left, window_right, alibi_slopes,
                          softcap, sinks, varlen=True)
    lens_q, lens_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    desc.batch, desc.n_heads, desc.n_kv_heads = cu_q.shape[0] - 1, q.shape[1], k.shape[1]
    desc.len_q = int(max_q) if max_q else max(1, int(lens_q.max()))
    desc.len_kv = int(max_k) if max_k else max(1, int(lens_k.max()))
    desc.head_dim, desc.head_dim_v = q.shape[2], v.shape[2]
    return desc, keep


def _check_varlen(q, k, v, cu_q, cu_k, sinks):
    check_tensors((q, k, v))
    Tq, H, _, Tk, _, _ = check_qkv_varlen(q, k, v)
    check_sinks(sinks, H)
    offsets = []
    for c, what in ((cu_q, "cu_seqlens_q"), (cu_k, "cu_seqlens_k")):
        if not isinstance(c, torch.Tensor) or c.dim() != 1 or c.dtype not in (torch.int32, torch.int64):
            fail(_lib.ERR_INVALID_ARG, "%s must be a 1-d int32 or int64 tensor" % what)
        offsets.append(c.to("cpu", torch.int64).contiguous())
    cq, ck = offsets
    if cq.shape[0] < 2 or cq.shape != ck.shape:
        fail(_lib.ERR_BAD_SHAPE, "cu_seqlens_q and cu_seqlens_k must both hold batch + 1 >= 2 offsets, got %d and %d"
             % (cq.shape[0], ck.shape[0]))
    if int(cq[-1]) != Tq or int(ck[-1]) != Tk:
        fail(_lib.ERR_BAD_SHAPE, "cu_seqlens_q ends at %d and cu_seqlens_k at %d, but q has %d tokens and k %d"
             % (int(cq[-1]), int(ck[-1]), Tq, Tk))
    dev = check_devices([q, k, v])
    return dev, cq, ck


def varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, dropout_p, seed, window_left, window_right,
                   alibi_slopes, softcap, sinks):
    """attn_sdpa_varlen_fwd: out (total_q, H, Dv) of q's dtype, lse (H, total_q) float32."""
    dev, cq, ck = _check_varlen(q, k, v, cu_q, cu_k, sinks)
    if dev.type == "cuda":
        qc, kc, vc, odt = cuda_types(q, k, v)
        out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=odt, device=dev)
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=dev)
        desc, keep = _describe_varlen(qc, kc, vc, out, cq, ck, max_q, max_k, causal, scale, dropout_p, window_left,
                                      window_right, alibi_slopes, softcap, sinks)
        cuda_extras(desc, keep, dev, alibi_slopes, seed)
        _cuda.run("attn_cuda_sdpa_varlen_fwd", dev, desc, cq.data_ptr(), ck.data_ptr(), qc.data_ptr(), kc.data_ptr(),
                  vc.data_ptr(), out.data_ptr(), lse.data_ptr())
        return _as(out, q.dtype), lse
    ctx = context()

    def call(qc, kc, vc, odt):
        out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=odt)
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32)
        desc, keep = _describe_varlen(qc, kc, vc, out, cq, ck, max_q, max_k, causal, scale, dropout_p, window_left,
                                      window_right, alibi_slopes, softcap, sinks)
        with seeded(ctx, seed, dropout_p):
            ctx.check(fn("attn_sdpa_varlen_fwd")(ctx.ptr, ctypes.byref(desc), cq.data_ptr(), ck.data_ptr(),
                                                 qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), out.data_ptr(),
                                                 lse.data_ptr()))
        return _as(out, q.dtype), lse

    return typed(ctx, q, k, v, False, call)


def varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, dropout_p, seed, window_left,
                    window_right, alibi_slopes, softcap, sinks, want_dsinks):
    """attn_sdpa_varlen_bwd: (dq, dk, dv, dsinks) in q's, k's, v's and the sinks' dtypes, dsinks
    summed over every query of the batch when want_dsinks, else an empty tensor."""
    dev, cq, ck = _check_varlen(q, k, v, cu_q, cu_k, sinks)
    _check_out(out, dout, lse, (q.shape[0], q.shape[1], v.shape[2]), (q.shape[1], q.shape[0]))
    dsinks = _dsinks_buffer(sinks, want_dsinks, dev)
    if dev.type == "cuda":
        qc, kc, vc, cdt = cuda_types(q, k, v)
        qc, kc, vc, (dq, dk, dv) = _grad_buffers(qc, kc, vc, cdt)
        out_c, dout_c, lse_c = _dense(out, cdt), _dense(dout, cdt), lse.contiguous()
        desc, keep = _describe_varlen(qc, kc, vc, out_c, cq, ck, max_q, max_k, causal, scale, dropout_p, window_left,
                                      window_right, alibi_slopes, softcap, sinks)
        cuda_extras(desc, keep, dev, alibi_slopes, seed)
        desc.grad_dtype = CODES[cdt]
        _cuda.run("attn_cuda_sdpa_varlen_bwd", dev, desc, cq.data_ptr(), ck.data_ptr(), qc.data_ptr(), kc.data_ptr(),
                  vc.data_ptr(), out_c.data_ptr(), dout_c.data_ptr(), lse_c.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                  dv.data_ptr())
        return _as(dq, q.dtype), _as(dk, k.dtype), _as(dv, v.dtype), dsinks
    ctx = context()

    def call(qc, kc, vc, cdt):
        qc, kc, vc, (dq, dk, dv) = _grad_buffers(qc, kc, vc, cdt)
        out_c, dout_c, lse_c = _dense(out, cdt), _dense(dout, cdt), lse.contiguous()
        desc, keep = _describe_varlen(qc, kc, vc, out_c, cq, ck, max_q, max_k, causal, scale, dropout_p, window_left,
                                      window_right, alibi_slopes, softcap, sinks)
        desc.grad_dtype = CODES[cdt]
        state = dropout_state(seed, dropout_p)
        ctx.check(fn("attn_sdpa_varlen_bwd")(ctx.ptr, ctypes.byref(desc), cq.data_ptr(), ck.data_ptr(), qc.data_ptr(),
                                             kc.data_ptr(), vc.data_ptr(), out_c.data_ptr(), dout_c.data_ptr(),
                                             lse_c.data_ptr(), state, dq.data_ptr(), dk.data_ptr(), dv.data_ptr()))
        sinks_grad(ctx, desc, cq, ck, out_c, dout_c, lse_c, dsinks)
        return _as(dq, q.dtype), _as(dk, k.dtype), _as(dv, v.dtype), dsinks

    return typed(ctx, q, k, v, True, call)
