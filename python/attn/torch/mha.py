"""mha.py - MultiheadAttention: torch.nn.MultiheadAttention with its attention computed by attn.

A subclass of torch's module: the same constructor, parameters, initialisation and state_dict (a
state_dict loads both ways, and isinstance(m, nn.MultiheadAttention) holds); only forward differs.
The projections are torch's own (the same packed or separate weights, so the same numbers); the
scaled dot-product attention between them is attn's fused kernel (attn::sdpa_fwd, with attn's
backward for training): the masks go to it as they are (an (L, S) mask is not expanded per head
and batch, the key padding mask is not merged into it), and the heads are strided views of the
projections (no copies).
"""
import torch
import torch.nn.functional as F
from torch import nn

from .functional import attention


class MultiheadAttention(nn.MultiheadAttention):
    """Drop-in for torch.nn.MultiheadAttention (see its documentation): forward(query, key, value,
    key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True,
    is_causal=False) returns (attn_output, attn_output_weights or None) with torch's shapes.

    Differences, all documented in python/README.md: the returned weights carry no gradient (the
    output does); rows with every key masked give zeros, not NaN; dropout (training mode) draws its
    masks from attn's generator, seeded from torch's (reproducible under torch.manual_seed, not
    torch's own masks); nested tensors are not taken."""

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        is_batched = query.dim() == 3
        if self.batch_first and is_batched:  # as torch: keep `query is key` for the packed projection
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = (x.transpose(1, 0) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        out, weights = self._attend(query, key, value, key_padding_mask, need_weights, attn_mask,
                                    average_attn_weights, is_causal)
        if self.batch_first and is_batched:
            out = out.transpose(1, 0)
        return out, weights

    def _attend(self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal):
        """F.multi_head_attention_forward's steps on (L, N, E) inputs, the attention by attn."""
        H = self.num_heads
        is_batched = F._mha_shape_check(query, key, value, key_padding_mask, attn_mask, H)
        if not is_batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        L, N, E = query.shape
        S = key.shape[0]
        if E != self.embed_dim:
            raise AssertionError("was expecting embedding dimension of %d, but got %d" % (self.embed_dim, E))
        key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                             other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                             target_type=query.dtype)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (as torch.nn.MultiheadAttention)")
        causal = bool(is_causal) and key_padding_mask is None and not need_weights
        attn_mask = None if causal else F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None,
                                                          other_name="", target_type=query.dtype, check_other=False)

        if self._qkv_same_embed_dim:
            q, k, v = F._in_projection_packed(query, key, value, self.in_proj_weight, self.in_proj_bias)
        else:
            b = (None, None, None) if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
            q, k, v = F._in_projection(query, key, value, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight,
                                       *b)
        if attn_mask is not None:
            if attn_mask.dim() == 2 and tuple(attn_mask.shape) == (L, S):
                attn_mask = attn_mask.view(1, 1, L, S)
            elif attn_mask.dim() == 3 and tuple(attn_mask.shape) == (N * H, L, S):
                attn_mask = attn_mask.view(N, H, L, S)
            else:
                raise RuntimeError("attn_mask has shape %s; expected (L, S) = (%d, %d) or (N*num_heads, L, S) = "
                                   "(%d, %d, %d)" % (tuple(attn_mask.shape), L, S, N * H, L, S))
        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.repeat(1, N, 1)])
            v = torch.cat([v, self.bias_v.repeat(1, N, 1)])
            attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
            key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))

        hd = E // H
        q = q.view(L, N, H, hd).permute(1, 2, 0, 3)  # (N, H, L, hd): strided views
        k = k.view(k.shape[0], N, H, hd).permute(1, 2, 0, 3)
        v = v.view(v.shape[0], N, H, hd).permute(1, 2, 0, 3)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros((N, H, 1, hd))], dim=2)
            v = torch.cat([v, v.new_zeros((N, H, 1, hd))], dim=2)
            attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
            key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (N, k.shape[2]):
            raise AssertionError("expecting key_padding_mask shape of (%d, %d), but got %s"
                                 % (N, k.shape[2], tuple(key_padding_mask.shape)))

        mode = (2 if average_attn_weights else 1) if need_weights else 0
        out, _, weights = attention(q, k, v, None if attn_mask is None else attn_mask.float(),
                                    None if key_padding_mask is None else key_padding_mask.float(),
                                    causal=1 if causal else 0, dropout_p=self.dropout if self.training else 0.0,
                                    weights_mode=mode)
        out = out.permute(2, 0, 1, 3).reshape(L * N, E)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias).view(L, N, E)
        weights = weights.to(query.dtype) if need_weights else None
        if not is_batched:
            out = out.squeeze(1)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights
