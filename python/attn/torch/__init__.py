"""attn.torch - attn's attention as PyTorch operations (torch >= 2.4).

    import torch, attn.torch as at
    out = at.scaled_dot_product_attention(q, k, v, is_causal=True)          # as F.scaled_dot_product_attention
    out, lse = at.sdpa(q, k, v, causal="bottom_right", window=(4096, 0), softcap=50.0, return_lse=True)
    out = at.sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)  # packed batches
    mha = at.MultiheadAttention(512, 8, batch_first=True)                    # as nn.MultiheadAttention

Everything is differentiable (attn's fused backward) and traced by torch.compile(fullgraph=True)
without graph breaks: the computation is four torch.library custom ops, torch.ops.attn.sdpa_fwd,
sdpa_bwd, sdpa_varlen_fwd and sdpa_varlen_bwd, each with a fake-tensor implementation and the
forwards with autograd formulas. CPU tensors of float32, float16 and bfloat16 (passed as they are;
through float32 only where the library refuses the type) and float64 (computed in float32). CUDA
tensors run on libattn_cuda (attn/torch/_cuda.py) on torch's current stream. CPU calls run on a
context per thread with torch.get_num_threads() threads, which are torch's own OpenMP threads where
torch runs on OpenMP (torch_threads(): attn's loops as parallel regions of torch's team, not beside it).
"""
from . import _ops  # noqa: F401  (registers the custom ops)
from ._call import context, native, torch_threads
from .functional import scaled_dot_product_attention, sdpa, sdpa_varlen
from .mha import MultiheadAttention

__all__ = ["scaled_dot_product_attention", "sdpa", "sdpa_varlen", "MultiheadAttention", "context", "native", "torch_threads"]
