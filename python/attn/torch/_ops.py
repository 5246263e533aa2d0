"""_ops.py - attn's SDPA as torch.library custom ops: attn::sdpa_fwd / attn::sdpa_bwd and
attn::sdpa_varlen_fwd / attn::sdpa_varlen_bwd.

Each op has a fake-tensor implementation (shapes and dtypes only), so torch.compile and
torch.export trace them as single nodes without graph breaks, and each forward has an autograd
formula that calls its backward op (attn's fused backward, recomputing from the log-sum-exp).
The ops take attn's own conventions (what the public functions of functional.py translate to):
  q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), any strides;
  mask None or (B|1, H|1, L|1, S|1): bool with True = blocked, or float32 added to the scores;
  key_padding_mask None or (B|1, S|1), the same types;
  causal 0 (none), 1 (top-left), 2 (bottom-right); scale 0 for 1/sqrt(D);
  dropout_p with seed, a 0-d int64 tensor from which attn's generator draws the mask (the
  backward regenerates it from the same seed); window_left/right -1 for unbounded (both -1: no
  window); alibi_slopes None or (H,) float; softcap 0 for none;
  weights_mode 0 (none), 1 (per head, (B, H, L, S)) or 2 (averaged, (B, L, S)), after dropout;
  sinks None or (H,) float: one logit per query head joining each row's softmax without a value
  (gpt-oss's attention sinks; CPU tensors only for now).
Outputs: out (B, H, L, Dv) in q's dtype, lse (B, H, L) float32 (the sink included) and the
weights (the keys' only); lse and the weights carry no gradient (as torch's fused kernels'
logsumexp). Gradients: q, k, v, a float32 mask and the sinks when they require grad (the sinks'
from attn_sdpa_sinks_bwd, in their dtype); a key padding mask or ALiBi slopes that require grad
are refused rather than given a silent zero. The backward ops take want_dmask / want_dsinks and
return an empty tensor for a gradient not asked for.

The public functions reach the forward ops through forward() and varlen_forward(), which run
the op's implementation straight when nothing could see the difference (see _unwatched), and a
forward whose gradient is recorded through _Sdpa / _SdpaVarlen, autograd.Functions with the ops'
own setup and backward (which call the backward ops' implementations the same way): the
dispatcher's own cost, about 35 us a call on a 2-core Zen 3 with torch 2.15 (and 100 more for
torch.library's autograd wrapper), is as long as a short decoding step's attention.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _lib
from .._lib import AttnError
from . import _call


# ---- calls that need no dispatcher ----------------------------------------------------------------

try:  # what sees or transforms op calls; a torch without one of these always goes through the op
    _WATCHERS = (torch._C._len_torch_dispatch_stack, torch._C._is_torch_function_mode_enabled,
                 torch.compiler.is_compiling, torch.jit.is_tracing, torch._C._autograd._profiler_enabled)
    _TRANSFORMS = torch._C._functorch.peek_interpreter_stack
except AttributeError:  # pragma: no cover
    _WATCHERS = _TRANSFORMS = None


def _unwatched(tensors, recorded=False):
    """Whether an op call on `tensors` (None entries allowed) may run the op's implementation
    without the dispatcher, with the same result: plain tensors or parameters (no other subclass:
    fake, functional, distributed and other wrapper tensors take the op), none requiring a gradient
    in grad mode (no autograd node to record) unless `recorded` (the caller records it: _Sdpa,
    _SdpaVarlen), and nothing active that watches or transforms op calls: a torch dispatch or
    function mode (FakeTensorMode, FlopCounterMode, `with torch.device(...)`), torch.compile or
    TorchScript tracing, functorch transforms (vmap, grad), the profiler."""
    if _WATCHERS is None:
        return False
    dispatch_modes, function_mode, compiling, tracing, profiling = _WATCHERS
    if compiling():  # first: torch.compile traces this function and must stop here
        return False
    grad = torch.is_grad_enabled() and not recorded
    for t in tensors:
        if t is not None and ((type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter)
                              or (grad and t.requires_grad)):
            return False
    return not (dispatch_modes() or function_mode() or tracing() or profiling()) and _TRANSFORMS() is None


# ---- (B, H, L, D) --------------------------------------------------------------------------------

@torch.library.custom_op("attn::sdpa_fwd", mutates_args=())
def sdpa_fwd(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], key_padding_mask: Optional[Tensor],
             causal: int, scale: float, dropout_p: float, seed: Optional[Tensor], window_left: int,
             window_right: int, alibi_slopes: Optional[Tensor], softcap: float,
             weights_mode: int, sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    return _call.sdpa_forward(q, k, v, mask, key_padding_mask, causal, scale, dropout_p, seed, window_left,
                              window_right, alibi_slopes, softcap, weights_mode, sinks)


@sdpa_fwd.register_fake
def _(q, k, v, mask, key_padding_mask, causal, scale, dropout_p, seed, window_left, window_right, alibi_slopes,
      softcap, weights_mode, sinks):
    B, H, L, _ = q.shape
    S, Dv = k.shape[2], v.shape[3]
    wshape = [(0,), (B, H, L, S), (B, L, S)][weights_mode]
    return (q.new_empty((B, H, L, Dv)), q.new_empty((B, H, L), dtype=torch.float32),
            q.new_empty(wshape, dtype=torch.float32))


@torch.library.custom_op("attn::sdpa_bwd", mutates_args=())
def sdpa_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, mask: Optional[Tensor],
             key_padding_mask: Optional[Tensor], causal: int, scale: float, dropout_p: float, seed: Optional[Tensor],
             window_left: int, window_right: int, alibi_slopes: Optional[Tensor], softcap: float,
             want_dmask: bool, sinks: Optional[Tensor],
             want_dsinks: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _call.sdpa_backward(dout, q, k, v, out, lse, mask, key_padding_mask, causal, scale, dropout_p, seed,
                               window_left, window_right, alibi_slopes, softcap, want_dmask, sinks, want_dsinks)


def _fake_dsinks(q, sinks, want_dsinks):
    return sinks.new_empty(sinks.shape) if want_dsinks else q.new_empty((0,), dtype=torch.float32)


@sdpa_bwd.register_fake
def _(dout, q, k, v, out, lse, mask, key_padding_mask, causal, scale, dropout_p, seed, window_left, window_right,
      alibi_slopes, softcap, want_dmask, sinks, want_dsinks):
    dmask = q.new_empty(mask.shape if want_dmask else (0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dmask, _fake_dsinks(q, sinks, want_dsinks)


def _refuse_grads(ctx, indices_names):
    for i, name in indices_names:
        if ctx.needs_input_grad[i]:
            raise AttnError(_lib.ERR_UNSUPPORTED, "attn computes no gradient for %s; detach it (or, for a key "
                            "padding mask, pass it in the attention mask)" % name)


def _sdpa_setup(ctx, inputs, output):
    q, k, v, mask, kpm, causal, scale, dropout_p, seed, wl, wr, slopes, softcap, _, sinks = inputs
    out, lse, weights = output
    ctx.save_for_backward(q, k, v, out, lse, mask, kpm, seed, slopes, sinks)
    ctx.opts = (causal, scale, dropout_p, wl, wr, softcap)
    ctx.mark_non_differentiable(lse, weights)


def _sdpa_backward(ctx, dout, _dlse, _dweights):
    _refuse_grads(ctx, ((4, "the key padding mask"), (11, "the ALiBi slopes")))
    q, k, v, out, lse, mask, kpm, seed, slopes, sinks = ctx.saved_tensors
    causal, scale, dropout_p, wl, wr, softcap = ctx.opts
    want_dmask, want_dsinks = bool(ctx.needs_input_grad[3]), bool(ctx.needs_input_grad[14])
    args = (dout, q, k, v, out, lse, mask, kpm, causal, scale, dropout_p, seed, wl, wr, slopes, softcap, want_dmask,
            sinks, want_dsinks)
    unwatched = _unwatched((dout, q, k, v, out, lse, mask, kpm, seed, slopes, sinks))
    dq, dk, dv, dmask, dsinks = (_call.sdpa_backward if unwatched else torch.ops.attn.sdpa_bwd)(*args)
    return (dq, dk, dv, dmask if want_dmask else None) + (None,) * 10 + (dsinks if want_dsinks else None,)


sdpa_fwd.register_autograd(_sdpa_backward, setup_context=_sdpa_setup)


# ---- packed variable-length batches ---------------------------------------------------------------

@torch.library.custom_op("attn::sdpa_varlen_fwd", mutates_args=())
def sdpa_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                    max_seqlen_q: int, max_seqlen_k: int, causal: int, scale: float, dropout_p: float,
                    seed: Optional[Tensor], window_left: int, window_right: int, alibi_slopes: Optional[Tensor],
                    softcap: float, sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    return _call.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                dropout_p, seed, window_left, window_right, alibi_slopes, softcap, sinks)


@sdpa_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, dropout_p, seed, window_left,
      window_right, alibi_slopes, softcap, sinks):
    Tq, H, _ = q.shape
    return q.new_empty((Tq, H, v.shape[2])), q.new_empty((H, Tq), dtype=torch.float32)


@torch.library.custom_op("attn::sdpa_varlen_bwd", mutates_args=())
def sdpa_varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
                    cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: int, scale: float,
                    dropout_p: float, seed: Optional[Tensor], window_left: int, window_right: int,
                    alibi_slopes: Optional[Tensor], softcap: float, sinks: Optional[Tensor],
                    want_dsinks: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return _call.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 causal, scale, dropout_p, seed, window_left, window_right, alibi_slopes, softcap,
                                 sinks, want_dsinks)


@sdpa_varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, dropout_p, seed,
      window_left, window_right, alibi_slopes, softcap, sinks, want_dsinks):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _fake_dsinks(q, sinks, want_dsinks)


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, dropout_p, seed, wl, wr, slopes, softcap, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seed, slopes, sinks)
    ctx.opts = (max_q, max_k, causal, scale, dropout_p, wl, wr, softcap)
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, dout, _dlse):
    _refuse_grads(ctx, ((13, "the ALiBi slopes"),))
    q, k, v, out, lse, cu_q, cu_k, seed, slopes, sinks = ctx.saved_tensors
    max_q, max_k, causal, scale, dropout_p, wl, wr, softcap = ctx.opts
    want_dsinks = bool(ctx.needs_input_grad[15])
    args = (dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, dropout_p, seed, wl, wr, slopes, softcap,
            sinks, want_dsinks)
    unwatched = _unwatched((dout, q, k, v, out, lse, cu_q, cu_k, seed, slopes, sinks))
    dq, dk, dv, dsinks = (_call.varlen_backward if unwatched else torch.ops.attn.sdpa_varlen_bwd)(*args)
    return (dq, dk, dv) + (None,) * 12 + (dsinks if want_dsinks else None,)


sdpa_varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup)


# ---- the forwards as the public functions call them -------------------------------------------------

def _function(name, impl, setup, backward):
    """An autograd.Function `name` whose forward runs impl(*args), its context set up there by
    setup(ctx, args, output) (a setup_context staticmethod, torch 2's style, costs about 40 us a call
    more), and whose backward is `backward`."""
    def forward(ctx, *args):
        output = impl(*args)
        setup(ctx, args, output)
        return output
    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    return type(name, (torch.autograd.Function,), methods)


# attn::sdpa_fwd's and attn::sdpa_varlen_fwd's autograd formulas around their implementations: the
# forwards that need a gradient recorded, where nothing watches (torch.library's autograd wrapper
# adds about 100 us a call)
_Sdpa = _function("_Sdpa", _call.sdpa_forward, _sdpa_setup, _sdpa_backward)
_SdpaVarlen = _function("_SdpaVarlen", _call.varlen_forward, _varlen_setup, _varlen_backward)


def _needs_grad(tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def forward(q, k, v, mask, key_padding_mask, causal, scale, dropout_p, seed, window_left, window_right, alibi_slopes,
            softcap, weights_mode, sinks):
    """torch.ops.attn.sdpa_fwd(...); where _unwatched, its implementation called straight (through
    _Sdpa when a gradient is to be recorded)."""
    args = (q, k, v, mask, key_padding_mask, causal, scale, dropout_p, seed, window_left, window_right, alibi_slopes,
            softcap, weights_mode, sinks)
    tensors = (q, k, v, mask, key_padding_mask, seed, alibi_slopes, sinks)
    if not _unwatched(tensors, recorded=True):
        return torch.ops.attn.sdpa_fwd(*args)
    return _Sdpa.apply(*args) if _needs_grad(tensors) else _call.sdpa_forward(*args)


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, dropout_p, seed,
                   window_left, window_right, alibi_slopes, softcap, sinks):
    """torch.ops.attn.sdpa_varlen_fwd(...), as forward() calls sdpa_fwd."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, dropout_p, seed,
            window_left, window_right, alibi_slopes, softcap, sinks)
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k, seed, alibi_slopes, sinks)
    if not _unwatched(tensors, recorded=True):
        return torch.ops.attn.sdpa_varlen_fwd(*args)
    return _SdpaVarlen.apply(*args) if _needs_grad(tensors) else _call.varlen_forward(*args)
