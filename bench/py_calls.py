"""Times one attention call through each Python entry point of attn beside PyTorch's, in one
process: what a decoding step costs from Python, the library call and what the binding adds.

    make && ATTN_LIBRARY=build/libattn.so PYTHON bench/py_calls.py [--lens 200,2000] [--heads 12]
        [--head-dim 64] [--threads 2] [--repeat 3000] [--package python]

PYTHON: an interpreter with torch >= 2.4 (transformers too for the two Hugging Face rows; without
it they are left out). --package: the directory holding the attn package (default: this
checkout's python/), so that another checkout's binding can be timed with the same script.

For every S in --lens: q (1, H, 1, D), k and v (1, H, S, D), float32, no gradient; each row is one
call, the median over --repeat calls after 50 of warm-up, in microseconds:
  library call      attn_sdpa_fwd through ctypes on a descriptor made once (the floor)
  _call             attn.torch._call.sdpa_forward: the ops' implementation (checks, descriptor,
                    outputs, the call)
  op                torch.ops.attn.sdpa_fwd: the same through torch's dispatcher
  at.sdpa           attn.torch.scaled_dot_product_attention
  attn.hf           attn.hf.attention_forward, as transformers calls it (output (1, 1, H, D))
  F.sdpa            torch.nn.functional.scaled_dot_product_attention
  transformers sdpa transformers' sdpa_attention_forward (the "sdpa" implementation)
Then the same calls each after a 256 x 256 torch.mm (the pair timed), as inside a model: at.sdpa
with attn's loops on torch's OpenMP threads (attn.torch.torch_threads(), the default where torch
runs on OpenMP) and on attn's own threads ("own"), and F.sdpa. Then a training call of the book's
size: q, k and v (1, 4, 8, 16) requiring gradients, causal, the forward and torch.autograd.grad of
q, k and v, through attn.torch.scaled_dot_product_attention and through
F.scaled_dot_product_attention; and a training step of the module, self-attention of
x (1, 256, 768) requiring gradients, forward (need_weights=False) and out.sum().backward(), through
attn.torch.MultiheadAttention(768, 12, batch_first=True) and nn.MultiheadAttention with the same
state_dict (median ms of --repeat / 50 steps; attn's also on its own threads).
"""
import argparse
import ctypes
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def median_us(fn, repeat):
    for _ in range(50):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lens", default="200,2000", help="key lengths S, comma-separated")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3000)
    ap.add_argument("--package", default=os.path.join(ROOT, "python"), help="directory holding the attn package")
    args = ap.parse_args()
    sys.path.insert(0, args.package)
    import torch
    import attn.torch as at
    from attn.torch import _call

    torch.set_num_threads(args.threads)
    try:
        import attn.hf
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError as exc:
        print("(no Hugging Face rows: %s)" % exc, file=sys.stderr)
        sdpa_attention_forward = None

    class Module:  # what the attention functions read from transformers' attention modules
        is_causal = True

    H, D = args.heads, args.head_dim
    lens = [int(x) for x in args.lens.split(",")]
    print("one decoding call, q (1, %d, 1, %d), k and v (1, %d, S, %d), float32, %d threads, torch %s; "
          "median us of %d calls" % (H, D, H, D, args.threads, torch.__version__, args.repeat))
    print("%-18s" % "row" + "".join("%12s" % ("S = %d" % S) for S in lens))
    rows = {}
    for S in lens:
        torch.manual_seed(0)
        q, k, v = torch.randn(1, H, 1, D), torch.randn(1, H, S, D), torch.randn(1, H, S, D)
        op_args = (q, k, v, None, None, 0, 0.0, 0.0, None, -1, -1, None, 0.0, 0, None)
        out, lse = torch.empty(1, H, 1, D), torch.empty(1, H, 1)
        desc, _keep = _call.describe(q, k, v, out, *op_args[3:8], *op_args[9:13], None)
        ctx, fwd = _call.context(), _call.fn("attn_sdpa_fwd")
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), None)
        cells = [("library call", lambda: ctx.check(fwd(ctx.ptr, ctypes.byref(desc), *ptrs))),
                 ("_call", lambda: _call.sdpa_forward(*op_args)),
                 ("op", lambda: torch.ops.attn.sdpa_fwd(*op_args)),
                 ("at.sdpa", lambda: at.scaled_dot_product_attention(q, k, v))]
        if sdpa_attention_forward is not None:
            cells.append(("attn.hf", lambda: attn.hf.attention_forward(Module(), q, k, v, None)))
        cells.append(("F.sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)))
        if sdpa_attention_forward is not None:
            cells.append(("transformers sdpa", lambda: sdpa_attention_forward(Module(), q, k, v, None)))
        for name, fn in cells:
            rows.setdefault(name, []).append(median_us(fn, args.repeat))
    for name, values in rows.items():
        print("%-18s" % name + "".join("%12.1f" % x for x in values))

    # Inside a model a call follows torch's own operations, after which torch's OpenMP team keeps
    # spinning: the same calls, each after a 256 x 256 matmul (the pair timed), with attn's loops
    # on torch's threads (attn.torch.torch_threads(), the default where torch runs on OpenMP) and
    # on attn's own.
    w = torch.randn(256, 256)
    print("each call after a 256 x 256 torch.mm (the pair timed; the mm alone %.1f us); attn.torch on "
          "torch's threads: %s" % (median_us(lambda: torch.mm(w, w), args.repeat), at.torch_threads()))
    print("%-18s" % "row" + "".join("%12s" % ("S = %d" % S) for S in lens))
    after = {}
    for S in lens:
        torch.manual_seed(0)
        q, k, v = torch.randn(1, H, 1, D), torch.randn(1, H, S, D), torch.randn(1, H, S, D)
        for name, on in (("at.sdpa", True), ("at.sdpa own", False)):
            at.torch_threads(on)
            after.setdefault(name, []).append(
                median_us(lambda: (torch.mm(w, w), at.scaled_dot_product_attention(q, k, v)), args.repeat))
        at.torch_threads(True)
        after.setdefault("F.sdpa", []).append(median_us(
            lambda: (torch.mm(w, w), torch.nn.functional.scaled_dot_product_attention(q, k, v)), args.repeat))
    for name, values in after.items():
        print("%-18s" % name + "".join("%12.1f" % x for x in values))

    q, k, v = (torch.randn(1, 4, 8, 16, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, 4, 8, 16)

    def step(sdpa):
        return lambda: torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), dout)
    print("forward + backward, q, k, v (1, 4, 8, 16), causal: at.sdpa %.1f us, F.sdpa %.1f us"
          % (median_us(step(at.scaled_dot_product_attention), args.repeat),
             median_us(step(torch.nn.functional.scaled_dot_product_attention), args.repeat)))

    ref = torch.nn.MultiheadAttention(768, 12, batch_first=True)
    mha = at.MultiheadAttention(768, 12, batch_first=True)
    mha.load_state_dict(ref.state_dict())
    x = torch.randn(1, 256, 768, requires_grad=True)

    def train(module):
        def run():
            module(x, x, x, need_weights=False)[0].sum().backward()
        return run
    steps = max(1, args.repeat // 50)
    at.torch_threads(False)
    own = median_us(train(mha), steps) / 1e3
    at.torch_threads(True)
    print("training step of MultiheadAttention(768, 12), x (1, 256, 768): attn %.2f ms (on attn's own threads "
          "%.2f), torch %.2f ms" % (median_us(train(mha), steps) / 1e3, own, median_us(train(ref), steps) / 1e3))


if __name__ == "__main__":
    main()
