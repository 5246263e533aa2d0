"""Writes demo_transcript.txt: what `attn demo` must print, produced by PyTorch itself.

Every step of the walkthrough is done here with torch, the way the chapter's code does it, and each
tensor is printed with torch's own formatter under the same caption the demo uses. The test
tests/demo_transcript.cmake compares the two texts line by line.

Run once with Debian's torch: /usr/bin/python3 tests/golden/gen_demo_transcript.py

torch's float32 products sum in an order that depends on the CPU's kernels, so a printed value whose
exact result lies near a rounding boundary can differ by one in the last printed place from machine
to machine. The last section's "concatenated @ W_o", row 0, column 1, is -6.89315015 in exact
arithmetic on the float32 inputs: torch's sums gave the float32 just below it in magnitude
(-6.8931499, printed -6.8931, as attn demo prints it) on the machine that wrote the committed file,
and the nearest float32 (-6.8931503, printed -6.8932) on an Ice Lake Xeon. Read the diff of a
regenerated file before committing it.
"""
import io
import math
import os
import sys

import torch
import torch.nn as nn

torch.set_num_threads(1)
out = io.StringIO()


def section(title):
    out.write(f"== {title} ==\n\n")


def show(caption, t):
    out.write(f"# {caption}\n{str(t.detach())}\n\n")


inputs = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                       [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])

out.write("attn demo: attention step by step, as in \"Build a Large Language Model (From Scratch)\", ch. 3.\n"
          "Each tensor is printed as PyTorch prints it, under a caption saying how PyTorch makes it.\n\n")

# 1 ------------------------------------------------------------------------------------------------
section("1. Self-attention without trainable weights (3.3)")
scores = inputs @ inputs.T
show("inputs: \"Your journey starts with one step\", one 3-d embedding per token", inputs)
s2 = inputs @ inputs[1]
show("attention scores of the query x^2 (\"journey\"): the dot products x^2 . x^j", s2)
show("attention weights of x^2 normalised by their sum: scores / scores.sum()", s2 / s2.sum())
w2 = torch.softmax(s2, dim=0)
show("attention weights of x^2 with softmax: torch.softmax(scores, dim=0)", w2)
show("context vector z^2: sum over j of weight_j * x^j", w2 @ inputs)
show("all attention scores: inputs @ inputs.T", scores)
weights = torch.softmax(scores, dim=-1)
show("all attention weights: torch.softmax(scores, dim=-1)", weights)
show("all context vectors: weights @ inputs", weights @ inputs)

# 2 ------------------------------------------------------------------------------------------------
section("2. Self-attention with trainable weights (3.4): torch.manual_seed(123), then W_query, W_key, "
        "W_value = torch.rand(3, 2) each")
torch.manual_seed(123)
W_query, W_key, W_value = torch.rand(3, 2), torch.rand(3, 2), torch.rand(3, 2)
queries, keys, values = inputs @ W_query, inputs @ W_key, inputs @ W_value
show("W_query", W_query)
show("W_key", W_key)
show("W_value", W_value)
query_2 = inputs[1] @ W_query
show("query_2 = x^2 @ W_query", query_2)
show("keys = inputs @ W_key", keys)
show("values = inputs @ W_value", values)
show("attention score w22 = query_2 . key_2", query_2.dot(keys[1]))
sc2 = query_2 @ keys.T
show("attention scores of query_2: query_2 @ keys.T", sc2)
aw2 = torch.softmax(sc2 / keys.shape[-1] ** 0.5, dim=-1)
show("attention weights of query_2: torch.softmax(scores / d_k**0.5, dim=-1) with d_k = 2", aw2)
show("context vector of x^2: weights @ values", aw2 @ values)
all_scores = queries @ keys.T
show("all attention scores: queries @ keys.T", all_scores)
all_w = torch.softmax(all_scores / keys.shape[-1] ** 0.5, dim=-1)
show("all attention weights", all_w)


class SelfAttention_v1(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x):
        keys, queries, values = x @ self.W_key, x @ self.W_query, x @ self.W_value
        attn_scores = queries @ keys.T
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values


torch.manual_seed(123)
show("all context vectors: SelfAttention_v1(3, 2) after torch.manual_seed(123)", SelfAttention_v1(3, 2)(inputs))


# 3, 4, 5 --------------------------------------------------------------------------------------------
class SelfAttention_v2(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        keys, queries, values = self.W_key(x), self.W_query(x), self.W_value(x)
        attn_scores = queries @ keys.T
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values


section("3. SelfAttention_v2 with nn.Linear layers (3.4.2): torch.manual_seed(789); SelfAttention_v2(3, 2)")
torch.manual_seed(789)
sa_v2 = SelfAttention_v2(3, 2)
sa_v1 = SelfAttention_v1(3, 2)
with torch.no_grad():
    sa_v1.W_query.copy_(sa_v2.W_query.weight.T)
    sa_v1.W_key.copy_(sa_v2.W_key.weight.T)
    sa_v1.W_value.copy_(sa_v2.W_value.weight.T)
show("context vectors", sa_v2(inputs))
show("SelfAttention_v1 given v2's weights transposed (exercise 3.1): the same context vectors", sa_v1(inputs))

section("4. Hiding future words with causal attention (3.5), with SelfAttention_v2's weights")
queries, keys = sa_v2.W_query(inputs), sa_v2.W_key(inputs)
attn_scores = queries @ keys.T
attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
show("attention weights without a mask", attn_weights)
mask_simple = torch.tril(torch.ones(6, 6))
show("simple mask: torch.tril(torch.ones(6, 6))", mask_simple)
masked_simple = attn_weights * mask_simple
show("masked weights: weights * mask", masked_simple)
show("renormalised: masked / masked.sum(dim=-1, keepdim=True)", masked_simple / masked_simple.sum(dim=-1, keepdim=True))
masked = attn_scores.masked_fill(torch.triu(torch.ones(6, 6), diagonal=1).bool(), -torch.inf)
show("masked scores: scores.masked_fill(torch.triu(torch.ones(6, 6), diagonal=1).bool(), -torch.inf)", masked)
causal_w = torch.softmax(masked / keys.shape[-1] ** 0.5, dim=-1)
show("attention weights: torch.softmax(masked / d_k**0.5, dim=-1), equal to the renormalised ones", causal_w)
show("context vectors of causal attention", causal_w @ sa_v2.W_value(inputs))

section("5. Dropout (3.5.2): torch.manual_seed(123); dropout = torch.nn.Dropout(0.5)")
torch.manual_seed(123)
dropout = torch.nn.Dropout(0.5)
show("dropout(torch.ones(6, 6)): about half the entries zeroed, the rest scaled by 1/(1-0.5)", dropout(torch.ones(6, 6)))
torch.manual_seed(123)
show("torch.manual_seed(123); dropout(attention weights)", dropout(causal_w))


# 6 - 10 ---------------------------------------------------------------------------------------------
class CausalAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys, queries, values = self.W_key(x), self.W_query(x), self.W_value(x)
        attn_scores = queries @ keys.transpose(1, 2)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return self.dropout(attn_weights) @ values


class MultiHeadAttentionWrapper(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList([CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)
                                    for _ in range(num_heads)])

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        split = lambda t: t.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        keys, queries, values = split(self.W_key(x)), split(self.W_query(x)), split(self.W_value(x))
        attn_scores = queries @ keys.transpose(2, 3)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        self.last_weights = attn_weights
        attn_weights = self.dropout(attn_weights)
        context_vec = (attn_weights @ values).transpose(1, 2).contiguous().view(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)


batch = torch.stack((inputs, inputs), dim=0)
section("6. CausalAttention on a batch (3.5.3): batch = torch.stack((inputs, inputs), dim=0); "
        "torch.manual_seed(123); CausalAttention(3, 2, 6, 0.0)")
torch.manual_seed(123)
show("context vectors", CausalAttention(3, 2, 6, 0.0)(batch))

section("7. Stacking causal heads (3.6.1): torch.manual_seed(123); MultiHeadAttentionWrapper(3, 2, 6, 0.0, "
        "num_heads=2)")
torch.manual_seed(123)
show("context vectors: the two heads' outputs concatenated", MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)(batch))

section("8. Batched matrix multiplication over heads (3.6.2): a has shape (b, num_heads, num_tokens, "
        "head_dim) = (1, 2, 3, 4)")
a = torch.tensor([[[[0.2745, 0.6584, 0.2775, 0.8573], [0.8993, 0.0390, 0.9268, 0.7388], [0.7179, 0.7058, 0.9156, 0.4340]],
                   [[0.0772, 0.3565, 0.1479, 0.5331], [0.4066, 0.2318, 0.4545, 0.9737], [0.4606, 0.5159, 0.4220, 0.5786]]]])
show("a", a)
show("a @ a.transpose(2, 3)", a @ a.transpose(2, 3))
show("first head: a[0, 0, :, :] @ a[0, 0, :, :].T", a[0, 0, :, :] @ a[0, 0, :, :].T)
show("second head: a[0, 1, :, :] @ a[0, 1, :, :].T", a[0, 1, :, :] @ a[0, 1, :, :].T)

section("9. Multi-head attention with weight splits (3.6.2): torch.manual_seed(123); "
        "MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)")
torch.manual_seed(123)
show("context vectors", MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)(batch))

section("10. Multi-head attention on embedded tokens: torch.manual_seed(123) (the notebook leaves it "
        "unseeded), inputs = nn.Embedding(6, 3).weight, then MultiHeadAttention(3, 2, 6, 0, num_heads=2) "
        "from the same stream")
torch.manual_seed(123)
emb = torch.nn.Embedding(6, 3).weight.data
batches = torch.stack((emb, emb), dim=0)
mha = MultiHeadAttention(d_in=3, d_out=2, context_length=6, dropout=0, num_heads=2)
ctx10 = mha(batches)
show("inputs = nn.Embedding(6, 3).weight.data; batches = torch.stack((inputs, inputs), dim=0)", emb)
show("attention weights of both heads, after the causal mask", mha.last_weights)
show("context vectors", ctx10)

# 11 ----------------------------------------------------------------------------------------------
section("11. nn.MultiheadAttention against a from-scratch module: torch.manual_seed(1); query, key and value "
        "inputs = torch.rand(1, 8, 4) each")
torch.manual_seed(1)
q, k, v = torch.rand(1, 8, 4), torch.rand(1, 8, 4), torch.rand(1, 8, 4)
torch.manual_seed(1)
m = nn.MultiheadAttention(embed_dim=4, num_heads=2, dropout=0, bias=True, add_bias_kv=False, batch_first=True)
attn_mask = torch.triu(torch.ones(8, 8), diagonal=1).bool()
with torch.no_grad():
    o, w_avg = m(q, k, v, attn_mask=attn_mask)
    _, w_heads = m(q, k, v, attn_mask=attn_mask, average_attn_weights=False)
show("torch.manual_seed(1); nn.MultiheadAttention(4, 2, bias=True, batch_first=True): in_proj_weight, W_q, W_k, "
     "W_v stacked", m.in_proj_weight)
show("out_proj.weight", m.out_proj.weight)
show("output with attn_mask = torch.triu(torch.ones(8, 8), diagonal=1).bool()", o)
show("attention weights, averaged over the heads", w_avg)
show("from scratch: the weights of each head", w_heads)
show("from scratch: their mean over the heads, equal to PyTorch's averaged weights", w_heads.mean(dim=1))

# 12 ----------------------------------------------------------------------------------------------
section("12. Multi-head attention from raw matrices: torch.manual_seed(123) (the notebook leaves it unseeded); "
        "x = torch.randn(1, 4, 8); W_q, W_k, W_v, W_o = torch.randn(8, 8) each (K is x @ W_k)")
torch.manual_seed(123)
x = torch.randn(1, 4, 8)
W_q, W_k, W_v, W_o = (torch.randn(8, 8) for _ in range(4))
Q, K, V = x @ W_q, x @ W_k, x @ W_v
split_heads = lambda t: t.view(1, 4, 2, 4).transpose(1, 2)  # noqa: E731
Qh, Kh, Vh = split_heads(Q), split_heads(K), split_heads(V)
head_output = torch.softmax(Qh @ Kh.transpose(-2, -1) / math.sqrt(4), dim=-1) @ Vh
concat = head_output.transpose(1, 2).reshape(1, 4, 8)
show("x", x)
show("head_output = softmax(Qh @ Kh.transpose(-2, -1) / sqrt(head_dim), dim=-1) @ Vh for 2 heads of 4", head_output)
show("multihead attention output: the heads concatenated, head_output.transpose(1, 2).reshape(1, 4, 8)", concat)
show("with the output projection the notebook draws but does not apply: concatenated @ W_o", concat @ W_o)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_transcript.txt")
text = out.getvalue()
with open(path, "w") as fh:
    fh.write(text)
print(f"wrote {path}: {text.count(chr(10))} lines", file=sys.stderr)
