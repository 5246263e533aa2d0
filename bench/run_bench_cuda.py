#!/usr/bin/env python3
"""attn's CUDA SDPA forward (and backward) beside PyTorch's SDPA backends, in one process, on one GPU.

    python3 bench/run_bench_cuda.py [--build build] [--quick] [--backward] [--decode | --decode-only] [--rounds 20]
                                    [--json out.json] [--plot out.png]
    python3 bench/run_bench_cuda.py --replot results.json --plot out.png   (no GPU needed)

For each shape of the targets (B*L = 16384 tokens, H*D = 2048, D in {64, 128}, L in {1024, 4096,
16384}, causal and not; bf16) it times attn_cuda_sdpa_fwd (libattn_cuda through ctypes, on torch's
current stream) and torch.nn.functional.scaled_dot_product_attention under each of FLASH_ATTENTION,
CUDNN_ATTENTION and EFFICIENT_ATTENTION: CUDA events around each call, the median of --rounds runs
after warm-up, inputs rotating over 4 sets. The header gives the device, driver, torch, the
measured bf16 GEMM rate (torch.matmul, 8192^3) and the device-to-device copy bandwidth. attn's output
is compared with FLASH_ATTENTION's once per shape. With --backward each shape also gets a row of
forward + backward per run (attn_cuda_sdpa_fwd with lse, then attn_cuda_sdpa_bwd; torch's SDPA
forward, then autograd's backward from the same dout) counted as 3.5 times the forward's flops, and
attn's dq compared with FLASH_ATTENTION's. With --decode it adds the decoding target's rows: one new
token against S cached keys (B=8, H=32, Hkv=8, D=128, S in {4096, 32768, 131072}, bf16), attn's
attn_cuda_sdpa_fwd (len_q 1, the kv heads shared by their groups) beside each backend's
scaled_dot_product_attention(..., enable_gqa=True), in GB/s of K and V read, attn's output compared
with FLASH_ATTENTION's (--decode-only: those rows alone). Needs torch with CUDA and a GPU; without
one it says so and exits 2.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def shapes(quick):
    out = []
    for D in (64, 128):
        for L in ((1024, 4096) if quick else (1024, 4096, 16384)):
            for causal in (False, True):
                out.append(dict(B=16384 // L, H=2048 // D, L=L, D=D, causal=causal))
    return out


def time_cuda(torch, fn, rounds, warmup=5):
    start = [torch.cuda.Event(enable_timing=True) for _ in range(rounds)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(rounds)]
    for i in range(warmup):
        fn(i)
    for i in range(rounds):
        start[i].record()
        fn(i)
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end))


def device_header(torch):
    p = torch.cuda.get_device_properties(0)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = time_cuda(torch, lambda i: torch.matmul(a, a), 10)
    gemm = 2 * 8192 ** 3 / (ms * 1e-3) / 1e12
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = time_cuda(torch, lambda i: y.copy_(x), 10)
    copy = 2 * x.numel() / (ms * 1e-3) / 1e9  # read + write
    return dict(device=p.name, cc="%d.%d" % (p.major, p.minor), sms=p.multi_processor_count,
                driver=torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None,
                torch=torch.__version__, cuda=torch.version.cuda, bf16_gemm_tflops=round(gemm, 1),
                copy_gbps=round(copy, 1))


def load_attn_cuda(build):
    from attn import _lib  # the descriptor's layout, defined once
    lib = ctypes.CDLL(os.path.join(build, "src", "cuda", "libattn_cuda.so"))
    lib.attn_cuda_ctx_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.attn_cuda_ctx_set_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.attn_cuda_ctx_last_error.restype = ctypes.c_char_p
    lib.attn_cuda_ctx_last_error.argtypes = [ctypes.c_void_p]
    lib.attn_cuda_sdpa_fwd.argtypes = [ctypes.c_void_p, ctypes.POINTER(_lib.SdpaDesc)] + [ctypes.c_void_p] * 5
    lib.attn_cuda_sdpa_bwd.argtypes = [ctypes.c_void_p, ctypes.POINTER(_lib.SdpaDesc)] + [ctypes.c_void_p] * 10
    lib.attn_cuda_sdpa_kernel_name.argtypes = [ctypes.c_void_p, ctypes.POINTER(_lib.SdpaDesc),
                                               ctypes.POINTER(ctypes.c_char_p)]
    lib.attn_sdpa_desc_init = _lib.lib.attn_sdpa_desc_init
    lib.attn_cuda_ctx_params_init.argtypes = [ctypes.c_void_p]
    return lib, _lib.SdpaDesc


class CtxParams(ctypes.Structure):
    """attn_cuda_ctx_params (attn_cuda.h), for the kernel choice."""
    _fields_ = [("device", ctypes.c_int), ("stream", ctypes.c_void_p), ("kernels", ctypes.c_int),
                ("deterministic", ctypes.c_int), ("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p),
                ("user", ctypes.c_void_p)]


KERNELS = {"auto": 0, "simple": 1, "sm80": 2, "sm90": 3}  # attn_cuda_kernels


def backward_row(torch, F, lib, ctx, d, sets, causal, flops, backends, rounds):
    """Forward + backward per run: attn's (lse kept for the backward) and each torch backend's."""
    q0 = sets[0][0]
    B, H, L, D = q0.shape
    out = [torch.empty_like(q0) for _ in sets]
    lse = [torch.empty(B, H, L, device="cuda", dtype=torch.float32) for _ in sets]
    grads = [[torch.empty_like(q0) for _ in range(3)] for _ in sets]
    dout = torch.randn_like(q0)
    d.grad_dtype = 3  # ATTN_DTYPE_BF16

    def run_attn(i):
        q, k, v = sets[i % 4]
        o, l, (dq, dk, dv) = out[i % 4], lse[i % 4], grads[i % 4]
        st = lib.attn_cuda_sdpa_fwd(ctx, ctypes.byref(d), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                    l.data_ptr())
        if st == 0:
            st = lib.attn_cuda_sdpa_bwd(ctx, ctypes.byref(d), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                        dout.data_ptr(), l.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), None)
        if st != 0:
            raise RuntimeError(lib.attn_cuda_ctx_last_error(ctx).decode())

    leaves = [[t.detach().clone().requires_grad_(True) for t in st] for st in sets]

    def run_torch(i):
        q, k, v = leaves[i % 4]
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(dout)

    res = {"attn": 3.5 * flops / (time_cuda(torch, run_attn, rounds) * 1e-3) / 1e12}
    for bname, be in backends:
        try:
            with torch.nn.attention.sdpa_kernel([be]):
                res[bname] = 3.5 * flops / (time_cuda(torch, run_torch, rounds) * 1e-3) / 1e12
        except RuntimeError as exc:
            res[bname] = None
            res[bname + "_error"] = str(exc).splitlines()[0]
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]):
        run_torch(0)
    run_attn(0)
    torch.cuda.synchronize()
    res["dq_max_abs_diff_vs_flash"] = float((grads[0][0].float() - leaves[0][0].grad.float()).abs().max())
    return res


def decode_rows(torch, F, lib, ctx, Desc, backends, rounds):
    """One decoding step (a new token per sequence) at each S: attn beside each backend, GB/s of K and V."""
    B, H, Hkv, D = 8, 32, 8, 128
    rows = []
    for S in (4096, 32768, 131072):
        nsets = 4 if S <= 32768 else 2  # 4.3 GB of K and V a set at S = 131072
        sets = [[torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)] for _ in range(nsets)]
        outs = [torch.empty_like(st[0]) for st in sets]
        d = Desc()
        lib.attn_sdpa_desc_init(ctypes.byref(d))
        d.batch, d.n_heads, d.n_kv_heads, d.len_q, d.len_kv, d.head_dim = B, H, Hkv, 1, S, D
        d.q_stride[:] = d.o_stride[:] = [H * D, D, D, 1]
        d.k_stride[:] = d.v_stride[:] = [Hkv * S * D, S * D, D, 1]
        d.q_dtype = d.kv_dtype = d.out_dtype = 3  # ATTN_DTYPE_BF16
        name = ctypes.c_char_p()
        lib.attn_cuda_sdpa_kernel_name(ctx, ctypes.byref(d), ctypes.byref(name))

        def run_attn(i):
            q, k, v = sets[i % nsets]
            st = lib.attn_cuda_sdpa_fwd(ctx, ctypes.byref(d), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                        outs[i % nsets].data_ptr(), None)
            if st != 0:
                raise RuntimeError(lib.attn_cuda_ctx_last_error(ctx).decode())

        gb = B * Hkv * S * D * 2 * 2 / 1e9
        res = dict(B=B, H=H, Hkv=Hkv, D=D, S=S, kernel=name.value.decode() if name.value else "?")
        res["attn"] = gb / (time_cuda(torch, run_attn, rounds) * 1e-3)
        for bname, be in backends:
            try:
                with torch.nn.attention.sdpa_kernel([be]):
                    ms = time_cuda(torch, lambda i: F.scaled_dot_product_attention(*sets[i % nsets], enable_gqa=True),
                                   rounds)
                res[bname] = gb / (ms * 1e-3)
            except RuntimeError as exc:  # a backend that refuses GQA or the shape
                res[bname] = None
                res[bname + "_error"] = str(exc).splitlines()[0]
        try:
            with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]):
                want = F.scaled_dot_product_attention(*sets[0], enable_gqa=True)
            run_attn(0)
            torch.cuda.synchronize()
            res["max_abs_diff_vs_flash"] = float((outs[0].float() - want.float()).abs().max())
        except RuntimeError:
            res["max_abs_diff_vs_flash"] = None
        rows.append(res)
        del sets, outs
        torch.cuda.empty_cache()
    return rows


def plot_png(result, path):
    """TFLOP/s against L, one panel per head dim, attn and each backend, forward solid and causal
    dashed (and forward + backward beside, when the rows have it). Returns False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("run_bench_cuda.py: matplotlib not found: no plot", file=sys.stderr)
        return False
    rows = result["rows"]
    passes = [("forward", lambda r: r)] + ([("forward + backward", lambda r: r["bwd"])] if rows and "bwd" in rows[0] else [])
    dims = sorted({r["D"] for r in rows})
    fig, axes = plt.subplots(len(passes), len(dims), figsize=(5 * len(dims), 3.6 * len(passes)), squeeze=False)
    colors = {"attn": "C3", "flash": "C0", "cudnn": "C2", "efficient": "C7"}
    for pi, (pname, get) in enumerate(passes):
        for di, D in enumerate(dims):
            ax = axes[pi][di]
            for name, color in colors.items():
                for causal in (False, True):
                    pts = sorted((r["L"], get(r).get(name)) for r in rows if r["D"] == D and r["causal"] == causal)
                    pts = [p for p in pts if p[1] is not None]
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker="o",
                                linestyle="--" if causal else "-", label=name + (" causal" if causal else ""))
            ax.set_xscale("log", base=2)
            ax.set_xlabel("L (B L = 16384, H D = 2048)")
            ax.set_ylabel("TFLOP/s")
            ax.set_title("%s, D = %d, bf16" % (pname, D))
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7, ncol=2)
    h = result["header"]
    fig.suptitle("%s: attn beside torch %s SDPA backends" % (h["device"], h["torch"]), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--quick", action="store_true", help="L in {1024, 4096} only")
    ap.add_argument("--backward", action="store_true", help="also forward + backward rows")
    ap.add_argument("--decode", action="store_true", help="also the decoding rows (B=8 H=32 Hkv=8 D=128)")
    ap.add_argument("--decode-only", action="store_true", help="the decoding rows alone")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--kernels", choices=sorted(KERNELS), default="auto",
                    help="attn's kernel choice (attn_cuda_kernels; sm90: the warpgroup-MMA forward)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="draw TFLOP/s against L into this PNG (needs matplotlib)")
    ap.add_argument("--replot", metavar="JSON", help="no run: draw --plot from the results of an earlier --json")
    args = ap.parse_args()
    if args.decode_only and args.plot and not args.replot:
        ap.error("--plot draws the prefill rows, which --decode-only leaves out")
    if args.replot:
        if not args.plot:
            print("run_bench_cuda.py: --replot needs --plot PNG", file=sys.stderr)
            return 2
        with open(args.replot) as f:
            return 0 if plot_png(json.load(f), args.plot) else 1
    try:
        import torch
    except ImportError:
        print("run_bench_cuda.py: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("run_bench_cuda.py: no GPU visible to torch (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    head = device_header(torch)
    print("# %(device)s (cc %(cc)s, %(sms)d SMs), torch %(torch)s, CUDA %(cuda)s, driver %(driver)s" % head)
    print("# measured: bf16 GEMM %(bf16_gemm_tflops)s TFLOP/s, copy %(copy_gbps)s GB/s" % head)
    lib, Desc = load_attn_cuda(args.build)
    ctx = ctypes.c_void_p()
    params = CtxParams()
    lib.attn_cuda_ctx_params_init(ctypes.byref(params))
    params.kernels = KERNELS[args.kernels]
    if lib.attn_cuda_ctx_create(ctypes.byref(params), ctypes.byref(ctx)) != 0:
        print("run_bench_cuda.py: attn_cuda_ctx_create failed", file=sys.stderr)
        return 1
    lib.attn_cuda_ctx_set_stream(ctx, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    rows = []
    prefill = [] if args.decode_only else shapes(args.quick)
    if prefill:
        print("%-34s %9s %9s %9s %9s  %s" % ("shape (bf16, TFLOP/s)", "attn", "flash", "cudnn", "efficient", "attn/flash"))
    for s in prefill:
        B, H, L, D, causal = s["B"], s["H"], s["L"], s["D"], s["causal"]
        sets = [[torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(4)]
        outs = [torch.empty_like(st[0]) for st in sets]
        d = Desc()
        lib.attn_sdpa_desc_init(ctypes.byref(d))
        d.batch, d.n_heads, d.n_kv_heads, d.len_q, d.len_kv, d.head_dim = B, H, H, L, L, D
        for f in ("q_stride", "k_stride", "v_stride", "o_stride"):
            getattr(d, f)[:] = [H * L * D, L * D, D, 1]
        d.causal = 1 if causal else 0
        d.q_dtype = d.kv_dtype = d.out_dtype = 3  # ATTN_DTYPE_BF16
        name = ctypes.c_char_p()
        lib.attn_cuda_sdpa_kernel_name(ctx, ctypes.byref(d), ctypes.byref(name))

        def run_attn(i):
            q, k, v = sets[i % 4]
            st = lib.attn_cuda_sdpa_fwd(ctx, ctypes.byref(d), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                        outs[i % 4].data_ptr(), None)
            if st != 0:
                raise RuntimeError(lib.attn_cuda_ctx_last_error(ctx).decode())

        flops = 4 * B * H * D * (L * (L + 1) / 2 if causal else L * L)
        res = dict(s, kernel=name.value.decode() if name.value else "?")
        res["attn"] = flops / (time_cuda(torch, run_attn, args.rounds) * 1e-3) / 1e12
        for bname, be in backends:
            try:
                with sdpa_kernel([be]):
                    ms = time_cuda(torch, lambda i: F.scaled_dot_product_attention(*sets[i % 4], is_causal=causal),
                                   args.rounds)
                res[bname] = flops / (ms * 1e-3) / 1e12
            except RuntimeError as exc:  # a backend that refuses the shape
                res[bname] = None
                res[bname + "_error"] = str(exc).splitlines()[0]
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            want = F.scaled_dot_product_attention(*sets[0], is_causal=causal)
        run_attn(0)
        torch.cuda.synchronize()
        res["max_abs_diff_vs_flash"] = float((outs[0].float() - want.float()).abs().max())
        if args.backward:
            res["bwd"] = backward_row(torch, F, lib, ctx, d, sets, causal, flops, backends, args.rounds)
        rows.append(res)
        fmt = lambda x: "%9.1f" % x if x is not None else "%9s" % "-"
        ratio = "%.2f" % (res["attn"] / res["flash"]) if res.get("flash") else "-"
        print("%-34s %s %s %s %s  %s" % ("B=%d H=%d L=%d D=%d%s" % (B, H, L, D, " causal" if causal else ""),
                                        fmt(res["attn"]), fmt(res["flash"]), fmt(res["cudnn"]), fmt(res["efficient"]),
                                        ratio))
    if args.backward:
        print("\n%-34s %9s %9s %9s %9s  %s" % ("fwd+bwd (bf16, TFLOP/s as 3.5x fwd)", "attn", "flash", "cudnn",
                                                "efficient", "attn/flash"))
        for res in rows:
            b = res["bwd"]
            fmt = lambda x: "%9.1f" % x if x is not None else "%9s" % "-"
            ratio = "%.2f" % (b["attn"] / b["flash"]) if b.get("flash") else "-"
            print("%-34s %s %s %s %s  %s" % ("B=%d H=%d L=%d D=%d%s" % (res["B"], res["H"], res["L"], res["D"],
                                                                         " causal" if res["causal"] else ""),
                                            fmt(b["attn"]), fmt(b["flash"]), fmt(b["cudnn"]), fmt(b["efficient"]), ratio))
    dec = []
    if args.decode or args.decode_only:
        dec = decode_rows(torch, F, lib, ctx, Desc, backends, args.rounds)
        print("\n%-34s %9s %9s %9s %9s  %s  %s" % ("decode (bf16, GB/s of K and V)", "attn", "flash", "cudnn", "efficient",
                                                    "attn/flash", "attn kernel"))
        for r in dec:
            fmt = lambda x: "%9.0f" % x if x is not None else "%9s" % "-"
            ratio = "%.2f" % (r["attn"] / r["flash"]) if r.get("flash") else "-"
            print("%-34s %s %s %s %s  %-10s  %s" % ("B=%d H=%d Hkv=%d D=%d S=%d" % (r["B"], r["H"], r["Hkv"], r["D"], r["S"]),
                                                  fmt(r["attn"]), fmt(r["flash"]), fmt(r["cudnn"]), fmt(r["efficient"]),
                                                  ratio, r["kernel"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(header=head, rows=rows, decode=dec), f, indent=1)
    if args.plot:
        plot_png(dict(header=head, rows=rows), args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
