#!/usr/bin/env python3
"""attn's CUDA SDPA forward (and backward) beside PyTorch's SDPA backends, in one process, on one GPU.

    python3 bench/run_bench_cuda.py [--build build] [--quick] [--backward] [--rounds 20] [--json out.json]

For each shape of the targets (B*L = 16384 tokens, H*D = 2048, D in {64, 128}, L in {1024, 4096,
16384}, causal and not; bf16) it times attn_cuda_sdpa_fwd (libattn_cuda through ctypes, on torch's
current stream) and torch.nn.functional.scaled_dot_product_attention under each of FLASH_ATTENTION,
CUDNN_ATTENTION and EFFICIENT_ATTENTION: CUDA events around each call, the median of --rounds runs
after warm-up, inputs rotating over 4 sets. The header gives the device, driver, torch, the
measured bf16 GEMM rate (torch.matmul, 8192^3) and the device-to-device copy bandwidth. attn's output
is compared with FLASH_ATTENTION's once per shape. With --backward each shape also gets a row of
forward + backward per run (attn_cuda_sdpa_fwd with lse, then attn_cuda_sdpa_bwd; torch's SDPA
forward, then autograd's backward from the same dout) counted as 3.5 times the forward's flops, and
attn's dq compared with FLASH_ATTENTION's. Needs torch with CUDA and a GPU; without one it says so
and exits 2.
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
    return lib, _lib.SdpaDesc


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--quick", action="store_true", help="L in {1024, 4096} only")
    ap.add_argument("--backward", action="store_true", help="also forward + backward rows")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
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
    if lib.attn_cuda_ctx_create(None, ctypes.byref(ctx)) != 0:
        print("run_bench_cuda.py: attn_cuda_ctx_create failed", file=sys.stderr)
        return 1
    lib.attn_cuda_ctx_set_stream(ctx, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    rows = []
    print("%-34s %9s %9s %9s %9s  %s" % ("shape (bf16, TFLOP/s)", "attn", "flash", "cudnn", "efficient", "attn/flash"))
    for s in shapes(args.quick):
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(header=head, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
