"""Times PyTorch on one attention shape and prints one JSON object; run by bench/run_bench.py.

Ops:
  core  the attention core as PyTorch code writes it: (q @ k^T) * scale, masked_fill of a causal
        mask made beforehand, softmax, @ v (torch 1.x has nothing faster)
  sdpa  torch.nn.functional.scaled_dot_product_attention (torch >= 2.0; its CPU flash kernel)
  mha   nn.MultiheadAttention forward, self-attention, need_weights=False, no grad, the faster of
        eval mode with batch_first=True (the fused fast path) and the regular path
  decode  one decoding step against a KV cache: q (B, H, 1, D) float32, k and v (B, Hkv, S, D)
        stored as --kv-dtype; grouped-query attention by viewing q as (B, Hkv, H/Hkv, D) against
        k and v as stored, (q @ k^T) * scale, softmax, @ v (no copies of the cache; repeating k
        and v with repeat_interleave, the other way to write it, copies them on every step and was
        7x slower here). float32 and bfloat16 caches are computed in their own type (for
        bfloat16, q is rounded to bfloat16 once beforehand). torch 1.13 has no CPU float16 matmul
        ("addmm_impl_cpu_" not implemented for 'Half'): then each step converts the cache with
        .float() and computes in float32, and "path" says so.
With --backward (core, sdpa) each run is the forward and autograd's backward of out given a fixed
dL/dout (q, k, v require gradients; their .grad are cleared between runs). --dtype bf16|f16 (core,
sdpa) makes q, k, v and dL/dout tensors of that type (default f32); for mha, the module (.to(dtype))
and its input.
The caller sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS and glibc's malloc variables before Python
starts, so torch sees them at import. Prints {"median_ms": best time, "median_of_runs_ms": ..., ...}:
the key median_ms holds PyTorch's best run after warm-up (see best_ms), its median is kept beside it.
"""
import argparse
import json
import os
import sys
import time

import torch


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_ms(fn, repeat):
    """PyTorch at its best: warm up until two consecutive runs agree within 10% (its (L, S)
    temporaries must stop page-faulting; at most 10 warm-ups), then time `repeat` runs and return
    the fastest (and the median, for the record)."""
    prev = timed(fn)
    for _ in range(10):
        t = timed(fn)
        if abs(t - prev) <= 0.1 * min(t, prev):
            break
        prev = t
    times = sorted(timed(fn) for _ in range(repeat))
    mid = len(times) // 2
    median = times[mid] if len(times) % 2 else 0.5 * (times[mid - 1] + times[mid])
    return 1e3 * times[0], 1e3 * median


def median_ms(fn, repeat):
    best, med = best_ms(fn, repeat)
    median_ms.last_median = med
    return best


KV_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def decode(a, result):
    """One query per head against a cache of S positions (see the module's docstring)."""
    B, H, S, D = a.batch, a.heads, a.len, a.head_dim
    Hkv = a.kv_heads or H
    if H % Hkv:
        raise SystemExit("--heads must be a multiple of --kv-heads")
    G, dt, scale = H // Hkv, KV_DTYPES[a.kv_dtype], D ** -0.5
    q = torch.randn(B, H, 1, D)
    k, v = torch.randn(B, Hkv, S, D).to(dt), torch.randn(B, Hkv, S, D).to(dt)

    def attend(qg, k, v):  # qg (B, Hkv, G, D): the G query heads that share a kv head
        s = (qg @ k.transpose(-1, -2)) * scale
        return (torch.softmax(s, dim=-1) @ v).view(B, H, 1, D)
    qn = q.to(dt).view(B, Hkv, G, D)
    qf = q.view(B, Hkv, G, D)
    with torch.no_grad():
        try:
            attend(qn, k, v)
            step, path = (lambda: attend(qn, k, v)), f"grouped q (B, Hkv, {G}, D) @ k^T, {dt} throughout"
        except RuntimeError as e:  # torch 1.13: no float16 matmul on the CPU
            step = lambda: attend(qf, k.float(), v.float())
            path = f"grouped q (B, Hkv, {G}, D) @ k^T in float32 after .float() of the {dt} cache each step ({e})"
        result["median_ms"] = median_ms(step, a.repeat)
    result.update({"path": path, "heads": H, "kv_heads": Hkv, "len_kv": S, "head_dim": D, "kv_dtype": a.kv_dtype,
                   "bytes": B * Hkv * S * 2 * D * k.element_size()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", choices=["core", "sdpa", "mha", "decode"], required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--len", type=int, default=1024, help="L = S; for decode, the cached positions S")
    ap.add_argument("--kv-heads", type=int, default=None, help="decode: Hkv (default H)")
    ap.add_argument("--kv-dtype", choices=list(KV_DTYPES), default="f32", help="decode: the cache's type")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--embed-dim", type=int, default=768)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--dtype", choices=list(KV_DTYPES), default="f32", help="core, sdpa: q, k, v (and dL/dout) type; mha: the module's")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    B, H, L, D, E = a.batch, a.heads, a.len, a.head_dim, a.embed_dim
    result = {"op": a.op, "torch": torch.__version__, "threads": torch.get_num_threads(), "backward": a.backward,
              "dtype": a.dtype}
    dt = KV_DTYPES[a.dtype]
    if a.op == "decode":
        decode(a, result)
        result["median_of_runs_ms"] = getattr(median_ms, "last_median", None)
        print(json.dumps(result))
        return 0
    if a.backward and a.op in ("core", "sdpa"):
        if a.op == "sdpa" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
            print(json.dumps({"error": f"torch {torch.__version__} has no scaled_dot_product_attention"}))
            return 0
        q, k, v = (torch.randn(B, H, L, D).to(dt).requires_grad_(True) for _ in range(3))
        g = torch.randn(B, H, L, D).to(dt)
        scale = D ** -0.5
        mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if a.causal else None

        def forward():
            if a.op == "sdpa":
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
            s = (q @ k.transpose(-1, -2)) * scale
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            return torch.softmax(s, dim=-1) @ v

        def step():
            for t in (q, k, v):
                t.grad = None
            forward().backward(g)
        result["median_ms"] = median_ms(step, a.repeat)
        result["median_of_runs_ms"] = getattr(median_ms, "last_median", None)
        print(json.dumps(result))
        return 0
    with torch.no_grad():
        if a.op in ("core", "sdpa"):
            q, k, v = (torch.randn(B, H, L, D).to(dt) for _ in range(3))
            if a.op == "sdpa":
                if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
                    print(json.dumps({"error": f"torch {torch.__version__} has no scaled_dot_product_attention"}))
                    return 0
                f = torch.nn.functional.scaled_dot_product_attention
                result["median_ms"] = median_ms(lambda: f(q, k, v, is_causal=a.causal), a.repeat)
            else:
                scale = D ** -0.5
                mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if a.causal else None

                def core():
                    s = (q @ k.transpose(-1, -2)) * scale
                    if mask is not None:
                        s = s.masked_fill(mask, float("-inf"))
                    return torch.softmax(s, dim=-1) @ v
                result["median_ms"] = median_ms(core, a.repeat)
        else:
            best = None
            for batch_first, train in ((True, False), (False, True)):
                m = torch.nn.MultiheadAttention(E, H, batch_first=batch_first).to(dt)
                m.train(train)
                x = (torch.randn(B, L, E) if batch_first else torch.randn(L, B, E)).to(dt)
                mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if a.causal else None
                t = median_ms(lambda: m(x, x, x, need_weights=False, attn_mask=mask), a.repeat)
                if best is None or t < best[0]:
                    best = (t, "eval, batch_first (fast path)" if not train else "regular path")
            result["median_ms"], result["path"] = best
    result["median_of_runs_ms"] = getattr(median_ms, "last_median", None)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
