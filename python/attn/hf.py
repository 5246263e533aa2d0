"""hf.py - attn as an attention implementation of Hugging Face transformers (>= 5).

    import attn.hf
    attn.hf.register()                       # once per process
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="attn")   # or from_pretrained

register() adds "attn" to transformers' AttentionInterface (the attention function below) and to
its AttentionMaskInterface (transformers' own SDPA mask builder, so the model hands attn exactly
the masks it hands "sdpa": None where plain causal or full attention needs no mask, else a
(B, 1, L, S) bool mask with True = attend). Every model that dispatches through
AttentionInterface then runs its attention on attn's fused kernels, prefill and cached decoding
alike: causal masks, padding, grouped-query attention (the key/value heads are not repeated),
scaling, soft-capping (Gemma 2), sliding windows (in the mask transformers builds), attention
sinks (gpt-oss's s_aux), dropout in training, output_attentions (attn's weights, without
gradient). Training works: the attention is differentiable through attn's backward (the sinks
included).
"""
import torch

from . import _lib
from ._lib import AttnError
from .torch.functional import attention

NAME = "attn"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      softcap=None, sliding_window=None, **kwargs):
    """transformers' attention interface: query (B, H, L, D), key (B, Hkv, S, D), value
    (B, Hkv, S, Dv), attention_mask None, bool (True = attend) or float (added), broadcasting to
    (B, H, L, S); s_aux None or (H,) attention sinks (gpt-oss: softmax over each row with the
    head's sink appended, its column dropped). Returns ((B, L, H, Dv) output, (B, H, L, S) weights
    (the keys') with output_attentions, else None). sliding_window is already in the mask
    transformers builds for "attn" (as for "sdpa")."""
    if kwargs.get("position_bias") is not None:
        raise AttnError(_lib.ERR_UNSUPPORTED, "the attn attention implementation does not take position_bias")
    L = query.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # as transformers' sdpa: no mask means plain causal for a prefill (query i sees keys j <= i, the
    # mask builder returns None only where that top-left triangle is right) and full attention for one
    # new token
    causal = 1 if (L > 1 and attention_mask is None and is_causal) else 0
    mask = None
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            mask = attention_mask.logical_not()
        else:
            mask = attention_mask.float()
    want_weights = bool(kwargs.get("output_attentions", False))
    out, _, weights = attention(query, key, value, mask, None, causal=causal, scale=scaling, dropout_p=float(dropout),
                                softcap=softcap or None, weights_mode=1 if want_weights else 0,
                                sinks=kwargs.get("s_aux"))
    return out.transpose(1, 2).contiguous(), weights.to(query.dtype) if want_weights else None


def register(name=NAME):
    """Registers attention_forward as transformers attention implementation `name` (and
    transformers' SDPA mask builder for it); returns the name, for attn_implementation=name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


__all__ = ["register", "attention_forward", "NAME"]
