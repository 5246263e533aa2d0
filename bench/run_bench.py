"""Writes BENCHMARKS.md: attn against PyTorch on the same shapes, measured alternately in one run.

    make && /usr/bin/python3 bench/run_bench.py [--threads 2] [--rounds 3] [--torch2 PYTHON] [--quick]

1. Compiles bench/peak.c and measures the fp32 FMA peak of the machine (AVX2 and, when present,
   AVX-512) with the same number of threads, and bench/triad.c, a STREAM-like triad that measures
   the memory bandwidth with the same number of threads (again before each round's decode rows,
   which are compared with the median of those passes: this virtual machine's bandwidth drifts).
2. For every shape, runs `attn bench --json` and bench/torch_bench.py (with OMP_NUM_THREADS,
   OPENBLAS_NUM_THREADS and glibc's malloc kept warm, so PyTorch runs at its best) one after the
   other, for --rounds rounds, and keeps the median of each side. The shapes are the attention
   forward and backward (compute-bound) and one decoding step against a KV cache
   (`attn bench --op decode`, memory-bound: H=32, Hkv=8, D=128, S in {4096, 32768}, f32, f16 and
   bf16 caches).
3. Writes BENCHMARKS.md (machine, date, commit, command, the tables with attn ms, torch ms, ratio,
   attn GFLOP/s and % of the peak of the instruction set used, the decode table with GB/s and % of
   the triad's bandwidth, and the targets met or missed), bench/results.json (every measurement)
   and bench/attention_gflops.png (GFLOP/s against sequence length; needs matplotlib, skipped
   without it).
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_json(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def try_json(cmd, env=None):
    """run_json, or {"error": why} when the command fails (PyTorch may be killed for memory)."""
    try:
        return run_json(cmd, env)
    except RuntimeError as e:
        return {"error": str(e)}


def failure(err):
    """How a failed PyTorch run shows in the tables."""
    return "killed (out of memory)" if "(-9)" in err else "failed"


def measure_peak(threads):
    exe = os.path.join(ROOT, "build", "bench_peak")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-pthread", os.path.join(ROOT, "bench", "peak.c"),
                    "-o", exe], check=True)
    return run_json([exe, str(threads)])


def measure_triad(threads):
    """The memory bandwidth (GB/s, STREAM's count: 12 bytes per element of a = b + s * c) with
    `threads` threads: bench/triad.c over three 256 MiB arrays, best of 10 passes."""
    exe = os.path.join(ROOT, "build", "bench_triad")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-pthread", os.path.join(ROOT, "bench", "triad.c"), "-o", exe], check=True)
    return run_json([exe, str(threads), "256", "10"])


def cache_bytes(level=3):
    """Size of the CPU's level-3 cache in bytes (0 if unknown)."""
    try:
        for d in sorted(os.listdir("/sys/devices/system/cpu/cpu0/cache")):
            base = os.path.join("/sys/devices/system/cpu/cpu0/cache", d)
            if open(os.path.join(base, "level")).read().strip() == str(level):
                size = open(os.path.join(base, "size")).read().strip()
                mult = {"K": 1024, "M": 1048576}.get(size[-1], 1)
                return int(size.rstrip("KM")) * mult
    except (OSError, ValueError):
        pass
    return 0


def measure_gemm(threads):
    """attn_linear on each ISA (the library's own GEMM) and cblas_sgemm, on the MHA's packed input
    projection and on a product with K=64 like the attention's own, as JSON rows."""
    exe = os.path.join(ROOT, "build", "bench_gemm")
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-O2", "-I" + os.path.join(ROOT, "include"), os.path.join(ROOT, "bench", "gemm.c"),
           os.path.join(ROOT, "build", "libattn.a")]
    blas = os.path.exists("/usr/include/x86_64-linux-gnu/cblas.h") or os.path.exists("/usr/include/cblas.h")
    if blas:
        cmd += ["-DHAVE_CBLAS", "-I/usr/include/x86_64-linux-gnu", "-lopenblas"]
    subprocess.run(cmd + ["-lm", "-lpthread", "-o", exe], check=True)
    rows = []
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads))
    for shape in ((1024, 2304, 768), (4096, 4096, 64)):
        r = subprocess.run([exe] + [str(x) for x in shape] + [str(threads)], capture_output=True, text=True, env=env,
                           check=True)
        rows += [json.loads(line) for line in r.stdout.splitlines()]
    return rows


def machine():
    model = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    isa = "AVX-512" if " avx512f" in flags else ("AVX2" if " avx2" in flags else "no AVX2")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"cpu": model, "cores": os.cpu_count(), "isa": isa, "kernel": platform.release(),
            "date": datetime.date.today().isoformat(), "commit": commit or "?", "l3_bytes": cache_bytes(3)}


def attn_cmd(args, shape, isa):
    cmd = [args.attn, "bench", "--json", "--threads", str(args.threads), "--repeat", str(shape["repeat"]),
           "--isa", isa]
    if shape["op"] == "mha":
        cmd += ["--op", "mha", "--embed-dim", str(shape["E"]), "--heads", str(shape["H"]), "--len-q", str(shape["L"])]
    else:
        cmd += ["--heads", str(shape["H"]), "--len-q", str(shape["L"]), "--head-dim", str(shape["D"])]
    if shape["causal"]:
        cmd.append("--causal")
    if shape.get("backward"):
        cmd.append("--backward")
    if shape.get("no_check"):
        cmd.append("--no-check")
    if shape.get("blas"):
        cmd.append("--blas")
    if shape.get("dtype"):
        cmd += ["--dtype", shape["dtype"]]
    return cmd


def attn_decode_cmd(args, shape, isa):
    return [args.attn, "bench", "--op", "decode", "--json", "--threads", str(args.threads), "--repeat",
            str(shape["repeat"]), "--isa", isa, "--heads", str(shape["H"]), "--kv-heads", str(shape["Hkv"]),
            "--len-kv", str(shape["S"]), "--head-dim", str(shape["D"]), "--kv-dtype", shape["kv"]]


def torch_decode_cmd(python, shape):
    return [python, os.path.join(ROOT, "bench", "torch_bench.py"), "--op", "decode", "--heads", str(shape["H"]),
            "--kv-heads", str(shape["Hkv"]), "--len", str(shape["S"]), "--head-dim", str(shape["D"]),
            "--kv-dtype", shape["kv"], "--repeat", str(shape["torch_repeat"])]


def decode_shapes():
    """One query per head against a cache of S positions (the same shapes with --quick)."""
    return [{"op": "decode", "H": 32, "Hkv": 8, "D": 128, "S": S, "kv": kv, "repeat": 50 if S <= 4096 else 20,
             "torch_repeat": 7 if S <= 4096 else 5}
            for S in (4096, 32768) for kv in ("f32", "f16", "bf16", "q8_0", "q4_0")]


def has_torch_decode(shape):
    """PyTorch has no Q8_0 / Q4_0 cache: those rows are attn's alone."""
    return shape["kv"] not in ("q8_0", "q4_0")


def torch_cmd(python, shape, op):
    cmd = [python, os.path.join(ROOT, "bench", "torch_bench.py"), "--op", op, "--heads", str(shape["H"]),
           "--len", str(shape["L"]), "--repeat", str(shape["repeat"])]
    cmd += ["--embed-dim", str(shape["E"])] if op == "mha" else ["--head-dim", str(shape["D"])]
    if shape["causal"]:
        cmd.append("--causal")
    if shape.get("backward"):
        cmd.append("--backward")
    if shape.get("dtype"):
        cmd += ["--dtype", shape["dtype"]]
    return cmd


def shapes(quick):
    lens = [512, 1024, 2048, 4096] if quick else [256, 512, 1024, 2048, 4096, 8192]
    out = []
    for causal in (False, True):
        for L in lens:
            out.append({"op": "sdpa", "H": 12, "L": L, "D": 64, "E": 768, "causal": causal,
                        "repeat": 101 if L <= 512 else 21 if L <= 2048 else 3, "torch": L <= 8192})
    out.append({"op": "mha", "H": 12, "L": 1024, "D": 64, "E": 768, "causal": False, "repeat": 7, "torch": True})
    out.append({"op": "mha", "H": 12, "L": 2048, "D": 64, "E": 768, "causal": False, "repeat": 5, "torch": True})
    # the same module with its projections through CBLAS (use_blas = 1), for the section on BLAS
    out.append({"op": "mha", "H": 12, "L": 1024, "D": 64, "E": 768, "causal": False, "repeat": 7, "torch": False,
                "blas": True})
    for causal in (False, True):  # forward + backward
        for L in (1024, 4096):
            out.append({"op": "sdpa", "H": 12, "L": L, "D": 64, "E": 768, "causal": causal, "backward": True,
                        "repeat": 3 if L >= 4096 else 5, "torch": True})
    for backward in (False, True):  # bfloat16 q, k, v, out: attn and torch 2's SDPA on bf16 tensors
        for causal in (False, True):
            for L in (1024, 4096):
                out.append({"op": "sdpa", "H": 12, "L": L, "D": 64, "E": 768, "causal": causal, "backward": backward,
                            "dtype": "bf16", "repeat": 3 if L >= 4096 else (5 if backward else 21), "torch": False})
    if not quick:  # memory: attn only (PyTorch's (L, L) scores alone would take 12.9 GB)
        out.append({"op": "sdpa", "H": 12, "L": 16384, "D": 64, "E": 768, "causal": False, "repeat": 1,
                    "torch": False, "no_check": True, "memory": True})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", default=os.path.join(ROOT, "build", "attn"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--torch", default="/usr/bin/python3", help="Python with PyTorch (Debian's 1.13)")
    ap.add_argument("--torch2", default=None, help="optional Python with PyTorch 2.x (for F.scaled_dot_product_attention)")
    ap.add_argument("--quick", action="store_true", help="fewer shapes (for a fast look, not for BENCHMARKS.md)")
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: rewrite BENCHMARKS.md and the plot from bench/results.json")
    args = ap.parse_args()
    if args.report_only:
        with open(os.path.join(ROOT, "bench", "results.json")) as fh:
            saved = json.load(fh)
        args.rounds = saved.get("rounds", args.rounds)
        info, todo, dec = saved["machine"], saved["shapes"], saved["decode_shapes"]
        results = {int(k): v for k, v in saved["results"].items()}
        dec_results = {int(k): v for k, v in saved["decode_results"].items()}
        isas = ["auto", "avx2"] if info["isa"] == "AVX-512" else ["auto"]
        write_report(args, info, saved["peak"], todo, results, isas, saved["gemm"], saved["triad"], dec, dec_results)
        return
    if not os.path.exists(args.attn):
        sys.exit(f"{args.attn} not found: run `make` first")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads), **TORCH_ENV)
    info = machine()
    info["threads"] = args.threads
    info["torch"] = run_json([args.torch, "-c", "import json, torch; print(json.dumps({'v': torch.__version__}))"])["v"]
    if args.torch2:
        info["torch2"] = run_json([args.torch2, "-c", "import json, torch; print(json.dumps({'v': torch.__version__}))"])["v"]
    peak = measure_peak(args.threads)
    triad = measure_triad(args.threads)
    gemm = measure_gemm(args.threads)
    log(f"peak with {args.threads} threads: AVX2 {peak['avx2_gflops']} GFLOP/s, AVX-512 {peak['avx512_gflops']}; "
        f"triad {triad['gbps']} GB/s")
    isas = ["auto", "avx2"] if info["isa"] == "AVX-512" else ["auto"]
    todo = shapes(args.quick)
    results = {i: {} for i in range(len(todo))}
    dec = decode_shapes()
    dec_results = {i: {} for i in range(len(dec))}
    beside_decode = []  # the triad's GB/s just before each round's decode rows
    for rnd in range(args.rounds):
        for i, sh in enumerate(todo):
            if sh.get("memory") and rnd > 0:
                continue
            r = results[i]
            for isa in isas:  # attn and PyTorch alternate, shape by shape, round after round
                res = run_json(attn_cmd(args, sh, isa), env=env)
                r.setdefault("attn_" + isa, []).append(res)
                log(f"round {rnd + 1} {sh['op']} L={sh['L']}{' causal' if sh['causal'] else ''} attn[{isa}]: "
                    f"{res['median_ms']:.2f} ms {res['gflops']:.1f} GFLOP/s")
            if sh["torch"]:  # a shape PyTorch failed once is not run by it again
                op = "mha" if sh["op"] == "mha" else "core"
                if "torch_error" not in r:
                    res = try_json(torch_cmd(args.torch, sh, op), env=env)
                    if "error" in res:
                        r["torch_error"] = res["error"]
                        log(f"round {rnd + 1}   torch {op}: {failure(res['error'])}")
                    else:
                        r.setdefault("torch", []).append(res)
                        log(f"round {rnd + 1}   torch {res['torch']} {op}: {res['median_ms']:.2f} ms")
            # torch 2's SDPA on every SDPA shape, the bfloat16 ones (no PyTorch 1.13 run) included
            if args.torch2 and sh["op"] == "sdpa" and not sh.get("memory") and "torch2_error" not in r:
                res = try_json(torch_cmd(args.torch2, sh, "sdpa"), env=env)
                if "error" in res:
                    r["torch2_error"] = res["error"]
                    log(f"round {rnd + 1}   torch 2 sdpa: {failure(res['error'])}")
                elif "median_ms" in res:
                    r.setdefault("torch2", []).append(res)
                    log(f"round {rnd + 1}   torch {res['torch']} sdpa: {res['median_ms']:.2f} ms")
        if dec:
            beside_decode.append(measure_triad(args.threads)["gbps"])
            log(f"round {rnd + 1} triad {beside_decode[-1]} GB/s")
        for i, sh in enumerate(dec):
            r = dec_results[i]
            for isa in isas:
                res = run_json(attn_decode_cmd(args, sh, isa), env=env)
                r.setdefault("attn_" + isa, []).append(res)
                log(f"round {rnd + 1} decode S={sh['S']} {sh['kv']} attn[{isa}]: {res['median_ms']:.3f} ms "
                    f"{res['gbps']:.1f} GB/s")
            if not has_torch_decode(sh):
                continue
            res = run_json(torch_decode_cmd(args.torch, sh), env=env)
            r.setdefault("torch", []).append(res)
            log(f"round {rnd + 1}   torch {res['torch']} decode: {res['median_ms']:.3f} ms")
    if beside_decode:
        triad["start_gbps"], triad["beside_decode_gbps"] = triad["gbps"], beside_decode
        triad["gbps"] = statistics.median(beside_decode)
    with open(os.path.join(ROOT, "bench", "results.json"), "w") as fh:
        json.dump({"machine": info, "rounds": args.rounds, "peak": peak, "triad": triad, "gemm": gemm, "shapes": todo,
                   "results": {str(k): v for k, v in results.items()}, "decode_shapes": dec,
                   "decode_results": {str(k): v for k, v in dec_results.items()}}, fh, indent=1)
    write_report(args, info, peak, todo, results, isas, gemm, triad, dec, dec_results)


def med(rs, key="median_ms"):
    return statistics.median(x[key] for x in rs) if rs else None


def flops(sh):
    core = 4.0 * sh["H"] * sh["L"] * sh["L"] * sh["D"] * (0.5 if sh["causal"] else 1.0)
    if sh.get("backward"):
        return 3.5 * core  # the backward counted as 2.5 forwards
    return core + (8.0 * sh["L"] * sh["E"] ** 2 if sh["op"] == "mha" else 0.0)


def write_report(args, info, peak, todo, results, isas, gemm, triad, dec, dec_results):
    peak_of = {"auto": peak["avx512_gflops"] or peak["avx2_gflops"], "avx2": peak["avx2_gflops"]}
    if info["isa"] != "AVX-512":
        peak_of["auto"] = peak["avx2_gflops"]
    isa_label = {"auto": "AVX-512" if info["isa"] == "AVX-512" else "AVX2", "avx2": "AVX2"}
    lines = []
    w = lines.append
    w("# Benchmarks\n")
    w(f"Measured on {info['date']} at commit `{info['commit']}`: {info['cpu']} ({info['cores']} cores, {info['isa']}), "
      f"Linux {info['kernel']}, {info['threads']} threads for everything (attn, PyTorch and the peak).")
    w(f"Reference: PyTorch {info['torch']} (`/usr/bin/python3`, Debian's python3-torch, OpenBLAS)"
      + (f" and PyTorch {info['torch2']}" if info.get("torch2") else "") + ".\n")
    w("Rerun with `make && /usr/bin/python3 bench/run_bench.py` (options: `--threads`, `--rounds`, `--torch2 PYTHON`). "
      "Every shape is run by attn and by PyTorch one after the other, round after round "
      f"({args.rounds} rounds); each cell is the median over rounds. For attn that is the median of each run's "
      "timed repeats after one warm-up (101 for L ≤ 512, 21 up to 2048: a new process's threads may share one CPU "
      "for its first tens of milliseconds, until the scheduler spreads them, and short runs would time that); for PyTorch it is its *best* repeat after warming up until two runs agree "
      "(its (L, L) temporaries page-fault for a while on this virtual machine, so its medians swing 2-9×): "
      "the comparison is conservative for attn. Raw numbers: `bench/results.json`. Timings on a shared "
      "virtual machine vary by several percent between runs: read ratios measured here, not absolute times "
      "from elsewhere.\n")
    w(f"**FMA peak** (bench/peak.c, {info['threads']} threads, 12 independent FMA chains per thread): "
      f"AVX2 {peak['avx2_gflops']:.0f} GFLOP/s" + (f", AVX-512 {peak['avx512_gflops']:.0f} GFLOP/s" if peak["avx512_gflops"] else "")
      + ". attn picks its kernels at run time: on this machine `auto` means "
      + isa_label["auto"] + "; the AVX2 rows force `--isa avx2`. \"% peak\" is relative to the peak of the instruction "
      "set the row used.\n")
    w(f"**Memory bandwidth** (bench/triad.c, a STREAM-like triad a = b + s·c over three {triad['mib_per_array']} MiB "
      f"float32 arrays, {triad['threads']} threads, best of 10 passes, 12 bytes counted per element as STREAM does): "
      + (f"{triad['gbps']:.1f} GB/s, the median of the passes run just before each round's decode rows "
         f"({', '.join(f'{g:.1f}' for g in triad['beside_decode_gbps'])}; {triad['start_gbps']:.1f} at the run's start). "
         if triad.get("beside_decode_gbps") else f"{triad['gbps']:.1f} GB/s. ")
      + "The decode rows are measured against it.\n")
    w("GFLOP/s count 4·B·H·L·S·D for attention (halved when causal: only the unmasked half is work) and add "
      "8·B·L·E² for the four projections of the MHA module. PyTorch's attention core is `(q @ k^T) * scale`, "
      "`masked_fill` of a prepared causal mask, `softmax`, `@ v`; its MHA is `nn.MultiheadAttention` without "
      "gradients, the faster of its fused eval fast path and its regular path, `need_weights=False`.\n")
    plot = {}
    for backward in (False, True):
        table(w, info, todo, results, isas, isa_label, peak_of, plot, backward)
    bf16_table(w, info, todo, results, isas, isa_label, peak)
    decode_table(w, info, dec, dec_results, isas, isa_label, triad)
    mem = [(i, sh) for i, sh in enumerate(todo) if sh.get("memory")]
    for i, sh in mem:
        res = results[i]["attn_auto"][0]
        extra = res["peak_rss_mb"] - res["io_mb"]
        w(f"**Memory** at L=S={sh['L']}, H={sh['H']}, D={sh['D']} ({isa_label['auto']}): peak resident set "
          f"{res['peak_rss_mb']:.0f} MiB for {res['io_mb']:.0f} MiB of inputs and output, i.e. {extra:.1f} MiB beyond "
          f"them (program, libraries and scratch together); {res['median_ms'] / 1e3:.1f} s, {res['gflops']:.0f} GFLOP/s.\n")
    w(targets(todo, results, peak_of, isas, isa_label, dec, dec_results, triad) + bf16_targets(todo, results, isas,
                                                                                                isa_label, peak))
    write_tail(w, args, gemm, plot, lines, mha_blas_note(todo, results, isas, isa_label))


def table(w, info, todo, results, isas, isa_label, peak_of, plot, backward):
    if backward:
        w("## Attention forward + backward, B=1, H=12, D=64, L=S\n")
        w("One forward and one backward (dQ, dK, dV given dL/dout) per run, against PyTorch autograd on the same "
          "attention core (`out.backward(g)`; q, k, v require gradients). GFLOP/s count the backward as 2.5 "
          "forwards (3.5 × the forward's flops per run).\n")
    else:
        w("## Attention forward, B=1, H=12, D=64, L=S\n")
    hdr = "| shape | attn ms | torch ms | ratio | attn GFLOP/s | % peak |"
    if info.get("torch2"):
        hdr = "| shape | attn ms | torch ms | ratio | torch 2 SDPA ms | attn GFLOP/s | % peak |"
    w(hdr)
    w("|" + "---|" * (hdr.count("|") - 1))
    for i, sh in enumerate(todo):
        if sh.get("memory") or sh.get("dtype") or bool(sh.get("backward")) != backward:
            continue
        r = results[i]
        t_ms = med(r.get("torch", []))
        t2 = med(r.get("torch2", []))
        for isa in isas:
            a_ms = med(r["attn_" + isa])
            gf = flops(sh) / (a_ms * 1e6)
            name = (f"MHA E={sh['E']} H={sh['H']} L={sh['L']}{' CBLAS' if sh.get('blas') else ''}" if sh["op"] == "mha" else
                    f"L={sh['L']}{' causal' if sh['causal'] else ''}") + f" [{isa_label[isa]}]"
            t_cell = failure(r["torch_error"]) if "torch_error" in r else "–"
            row = f"| {name} | {a_ms:.2f} | {t_ms:.2f} | {t_ms / a_ms:.2f}× |" if t_ms else f"| {name} | {a_ms:.2f} | {t_cell} | – |"
            if info.get("torch2"):
                row += f" {t2:.2f} |" if t2 else (f" {failure(r['torch2_error'])} |" if "torch2_error" in r else " – |")
            row += f" {gf:.0f} | {100 * gf / peak_of[isa]:.0f}% |"
            w(row)
            if sh["op"] == "sdpa" and not backward:
                plot.setdefault((isa_label[isa], sh["causal"]), []).append((sh["L"], gf))
        if sh["op"] == "sdpa" and t_ms and not backward:
            plot.setdefault(("torch " + info["torch"], sh["causal"]), []).append((sh["L"], flops(sh) / (t_ms * 1e6)))
        if sh["op"] == "sdpa" and t2 and not backward:
            plot.setdefault(("torch " + info["torch2"] + " SDPA", sh["causal"]), []).append((sh["L"], flops(sh) / (t2 * 1e6)))
    w("")


PEAK_KEYS = {"FMA (256-bit)": "avx2_gflops", "FMA (512-bit)": "avx512_gflops", "vdpbf16ps": "bf16_dot_gflops",
             "tdpbf16ps": "amx_bf16_gflops"}


def instr_peak(res, peak):
    """The instruction a bf16 row's kernels used (attn bench reports it) and that instruction's peak
    from bench/peak.c in this run."""
    instr = res[0].get("peak_instr") if res else None
    return instr, (peak.get(PEAK_KEYS.get(instr)) if instr else None)


def bf16_pairs(todo):
    """(index of the bf16 row, index of the float32 row of the same shape) for every bf16 row."""
    for i, sh in enumerate(todo):
        if sh.get("dtype") != "bf16":
            continue
        for j, f in enumerate(todo):
            if (not f.get("dtype") and f["op"] == "sdpa" and f["L"] == sh["L"] and f["causal"] == sh["causal"]
                    and bool(f.get("backward")) == bool(sh.get("backward")) and not f.get("memory")):
                yield i, sh, j
                break
        else:
            yield i, sh, None


def bf16_table(w, info, todo, results, isas, isa_label, peak):
    rows = list(bf16_pairs(todo))
    if not rows:
        return
    w("## bfloat16 attention, B=1, H=12, D=64, L=S\n")
    w("q, k, v and out (and, with the backward, dL/dout and the gradients) in bfloat16 (`attn bench --dtype bf16`), "
      "beside attn's float32 row of the same shape from the tables above and PyTorch 2's "
      "`F.scaled_dot_product_attention` on bfloat16 tensors (`torch_bench.py --op sdpa --dtype bf16`, autograd for the "
      "backward). \"% peak\" is relative to the peak of the instructions the row's kernels computed the products "
      "with, as `attn bench` reports them, from bench/peak.c in this run: "
      + (f"vdpbf16ps {peak['bf16_dot_gflops']:.0f} GFLOP/s" if peak.get("bf16_dot_gflops") else
         "this CPU has no AVX512-BF16, so no bf16 dot-product peak") + ".\n")
    hdr = "| shape | attn bf16 ms | attn f32 ms | bf16 / f32 speed | torch 2 SDPA bf16 ms | ratio | GFLOP/s | instructions | % peak |"
    w(hdr)
    w("|" + "---|" * (hdr.count("|") - 1))
    for i, sh, j in rows:
        r = results[i]
        t2 = med(r.get("torch2", []))
        for isa in isas:
            a_ms = med(r["attn_" + isa])
            f_ms = med(results[j]["attn_" + isa]) if j is not None else None
            gf = flops(sh) / (a_ms * 1e6)
            instr, pk = instr_peak(r["attn_" + isa], peak)
            name = f"L={sh['L']}{' causal' if sh['causal'] else ''}{' fwd+bwd' if sh.get('backward') else ''} [{isa_label[isa]}]"
            row = f"| {name} | {a_ms:.2f} | " + (f"{f_ms:.2f} | {f_ms / a_ms:.2f}× |" if f_ms else "– | – |")
            row += (f" {t2:.2f} | {t2 / a_ms:.2f}× |" if t2 else
                    (f" {failure(r['torch2_error'])} | – |" if "torch2_error" in r else " – | – |"))
            row += f" {gf:.0f} | {instr or '–'} | " + (f"{100 * gf / pk:.0f}% |" if pk else "– |")
            w(row)
    w("")


def bf16_targets(todo, results, isas, isa_label, peak):
    """The bfloat16 targets: forward >= 1.7x attn's float32 forward, >= 1.5x torch 2 SDPA in bf16 and
    >= 70% of the bf16 dot-product peak; forward + backward >= 1.5x attn's float32 one."""
    out = []
    for i, sh, j in bf16_pairs(todo):
        if sh["L"] not in (1024, 4096) or j is None:
            continue
        r = results[i]
        for isa in isas:
            a = med(r["attn_" + isa])
            f = med(results[j]["attn_" + isa])
            name = f"bf16 {'forward+backward' if sh.get('backward') else 'forward'} L={sh['L']}" \
                   f"{' causal' if sh['causal'] else ''} [{isa_label[isa]}]"
            if sh.get("backward"):
                out.append(f"| {name}: ≥1.5× attn f32 | {f / a:.2f}× | {'yes' if f / a >= 1.5 else '**no**'} |")
                continue
            t2 = med(r.get("torch2", []))
            bf16_peak = peak.get("bf16_dot_gflops")
            pct = 100 * flops(sh) / (a * 1e6) / bf16_peak if bf16_peak else None
            ok = f / a >= 1.7 and t2 is not None and t2 / a >= 1.5 and pct is not None and pct >= 70
            out.append(f"| {name}: ≥1.7× attn f32, ≥1.5× torch 2 SDPA bf16, ≥70% of the bf16 dot peak | "
                       f"{f / a:.2f}×, " + (f"{t2 / a:.2f}×" if t2 else "no torch 2 time") + ", "
                       + (f"{pct:.0f}%" if pct is not None else "no bf16 dot-product instruction here")
                       + f" | {'yes' if ok else '**no**'} |")
    return "\n".join(out) + ("\n" if out else "")


def decode_table(w, info, dec, dec_results, isas, isa_label, triad):
    if not dec:
        return
    sh0 = dec[0]
    w(f"## Decoding against a KV cache, B=1, H={sh0['H']}, Hkv={sh0['Hkv']}, D={sh0['D']}, one query per head\n")
    w("One decoding step, `attn_kv_cache_attend` (`attn bench --op decode`): each query head against the S cached "
      "keys and values of its kv head, stored as float32, float16 or bfloat16, or quantised as q8_0 or q4_0 "
      "(ggml's Q8_0 and Q4_0: blocks of 32 values with a float16 scale, 34 and 18 bytes per 32 values, "
      "dequantised in registers) (the query and the arithmetic are float32, except for q8_0 and q4_0 on a CPU "
      "with AVX512-BF16 and VNNI, whose kernels round the query to int8 and the weights to bf16: attn.h, "
      "kv_dtype). attn ms is the median of the timed steps after one warm-up, checked against the scalar "
      "reference first (for those, within attn.h's bound). GB/s is the bytes of K and V read per step, B·Hkv·S·2·D·bytes(type) (scales included for the "
      "quantised types), over that time; \"% triad\" "
      "compares it with the measured memory bandwidth above. PyTorch computes the same step as "
      "`softmax((q @ kᵀ) · scale) @ v` with q viewed as (B, Hkv, H/Hkv, D), so each kv head serves its group of "
      "query heads without copies (`repeat_interleave` of k and v, the other way to write grouped-query attention, "
      "copies the cache on every step and is several times slower); float32 and bfloat16 caches are computed in their "
      "own type (q rounded to bfloat16 for the latter).\n")
    hdr = "| cache | K+V MiB | isa | attn ms | attn GB/s | % triad | torch ms | ratio |"
    w(hdr)
    w("|" + "---|" * (hdr.count("|") - 1))
    l3 = info.get("l3_bytes") or 0
    notes = set()
    for i, sh in enumerate(dec):
        r = dec_results[i]
        t = r.get("torch", [])
        t_ms = med(t)
        converted = any("float()" in x.get("path", "") for x in t)
        mark = " ¹" if converted else ""
        if converted:
            notes.add(1)
        nbytes = sh_bytes(sh)
        fits = 0 < nbytes <= l3
        if fits:
            notes.add(2)
        for isa in isas:
            a_ms = med(r["attn_" + isa])
            gbps = nbytes / (a_ms * 1e6)
            row = (f"| S={sh['S']} {sh['kv']}{' ²' if fits else ''} | {nbytes / 1048576:.0f} | {isa_label[isa]} | "
                   f"{a_ms:.3f} | {gbps:.1f} | {100 * gbps / triad['gbps']:.0f}% | ")
            row += f"{t_ms:.3f}{mark} | {t_ms / a_ms:.2f}× |" if t_ms else "– | – |"
            w(row)
    w("")
    if 1 in notes:
        w(f"¹ PyTorch {info['torch']} has no float16 matrix product on the CPU (`\"addmm_impl_cpu_\" not implemented "
          "for 'Half'`): its float16 step converts k and v with `.float()` and computes in float32, the conversion "
          "included in its time.\n")
    if 2 in notes:
        w(f"² K and V are no larger than the {l3 // 1048576} MiB L3 cache, and every timed step reads the same cache: "
          "these rows may read partly from L3 rather than from memory, and their % of the triad can pass 100%.\n")


def write_tail(w, args, gemm, plot, lines, blas_note):
    w("## What the library computes itself and what it hands to BLAS\n")
    w("The fused kernel computes its tile products with its own register-blocked microkernels: a BLAS call per "
      "(128 x 96) tile would need K and V packed and transposed for every call, and BLAS is slow at such sizes "
      "(the K=64 row below is a whole-matrix product with the attention's inner dimension). The projections "
      "are plain GEMMs; `bench/gemm.c` times them through `attn_linear` (the library's GEMM, `use_blas = 0`) and "
      "`cblas_sgemm` (OpenBLAS), same threads:\n")
    w("| product (M x N x K) | implementation | ms | GFLOP/s |")
    w("|---|---|---|---|")
    for g in gemm:
        w(f"| {g['M']} x {g['N']} x {g['K']} | {g['impl']} | {g['ms']:.2f} | {g['gflops']:.0f} |")
    w("\nOpenBLAS runs its own threads (`OPENBLAS_NUM_THREADS`), not the context's, and they busy-wait for a while "
      "after each call, competing with the context's threads for the same cores. So the library keeps every "
      "product on its own GEMM and threads by default (`use_blas = 0`); `use_blas = 1` sends the projections of "
      "AVX2 and portable contexts to CBLAS. The \"MHA ... CBLAS\" rows of the forward table time the module "
      "that way" + blas_note + ".\n")
    if plot_png(plot):
        w("![GFLOP/s against sequence length](bench/attention_gflops.png)\n")
    lines += kept_sections(args.out)
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines))
    log(f"wrote {args.out}")


def kept_sections(path):
    """The sections of `path` that other scripts or separate runs own, between "<!-- NAME: begin -->" and
    "<!-- NAME: end -->" (bench/run_bench_e2e.py's end-to-end table and the separate runs: dropout, bf16
    module, quantised decode, other machines, GPU, Python calls), kept as they are when this script
    rewrites the file: a section outside such markers is lost then."""
    if not os.path.exists(path):
        return []
    text = open(path).read()
    return [m.group(0) + "\n" for m in re.finditer(r"<!-- (\S+): begin -->.*?<!-- \1: end -->", text, re.S)]


def mha_blas_note(todo, results, isas, isa_label):
    """The MHA forward with and without CBLAS, in words (the rows of each run, not only the medians)."""
    parts = []
    for isa in isas:
        own = cblas = None
        for i, sh in enumerate(todo):
            if sh["op"] == "mha" and sh["L"] == 1024:
                runs = [x["median_ms"] for x in results[i]["attn_" + isa]]
                if sh.get("blas"):
                    cblas = runs
                else:
                    own = runs
        if own and cblas:
            fmt = lambda rs: ", ".join(f"{x:.1f}" for x in rs)
            parts.append(f"[{isa_label[isa]}] {fmt(cblas)} ms with CBLAS against {fmt(own)} ms without, run by run")
    return (": " + "; ".join(parts)) if parts else ""


def targets(todo, results, peak_of, isas, isa_label, dec=(), dec_results=None, triad=None):
    out = ["## The targets, checked\n",
           "| target | measured | met |", "|---|---|---|"]

    def find(op, L, causal, backward=False):
        for i, sh in enumerate(todo):
            if (sh["op"] == op and sh["L"] == L and sh["causal"] == causal and not sh.get("memory")
                    and not sh.get("blas") and bool(sh.get("backward")) == backward and not sh.get("dtype")):
                return i, sh
        return None, None
    for isa in isas:
        for causal in (False, True):
            for L in (1024, 4096):
                i, sh = find("sdpa", L, causal)
                if sh is None:
                    continue
                a = med(results[i]["attn_" + isa])
                t = med(results[i].get("torch", []))
                pct = 100 * flops(sh) / (a * 1e6) / peak_of[isa]
                want_pct, want_ratio = (60, 4) if causal else (70, 2)
                label = f"L={L}{' causal' if causal else ''} [{isa_label[isa]}]: ≥{want_pct}% of peak, ≥{want_ratio}× torch"
                ok = pct >= want_pct and t / a >= want_ratio
                out.append(f"| {label} | {pct:.0f}% of peak, {t / a:.2f}× | {'yes' if ok else '**no**'} |")
        i, sh = find("mha", 1024, False)
        if sh is not None:
            a = med(results[i]["attn_" + isa])
            t = med(results[i]["torch"])
            out.append(f"| MHA E=768 H=12 L=1024 [{isa_label[isa]}]: ≥1.5× nn.MultiheadAttention | {t / a:.2f}× | "
                       f"{'yes' if t / a >= 1.5 else '**no**'} |")
        for causal in (False, True):
            for L in (1024, 4096):
                i, sh = find("sdpa", L, causal, backward=True)
                if sh is None:
                    continue
                a = med(results[i]["attn_" + isa])
                t = med(results[i].get("torch", []))
                pct = 100 * flops(sh) / (a * 1e6) / peak_of[isa]
                label = f"forward+backward L={L}{' causal' if causal else ''} [{isa_label[isa]}]: ≥50% of peak, ≥3× torch autograd"
                ok = pct >= 50 and t / a >= 3
                out.append(f"| {label} | {pct:.0f}% of peak, {t / a:.2f}× | {'yes' if ok else '**no**'} |")
        for i, sh in enumerate(dec):
            if sh["kv"] not in ("f32", "f16") or sh["S"] not in (4096, 32768) or (sh["H"], sh["Hkv"], sh["D"]) != (32, 8, 128):
                continue
            a = med(dec_results[i]["attn_" + isa])
            t = med(dec_results[i].get("torch", []))
            pct = 100 * sh_bytes(sh) / (a * 1e6) / triad["gbps"]
            label = f"decode H=32 Hkv=8 D=128 S={sh['S']} {sh['kv']} [{isa_label[isa]}]: ≥70% of the triad, ≥3× torch"
            ok = pct >= 70 and t is not None and t / a >= 3
            ratio = f"{t / a:.2f}×" if t else "no torch time"
            out.append(f"| {label} | {pct:.0f}% of the triad, {ratio} | {'yes' if ok else '**no**'} |")
        out += quant_decode_targets(dec, dec_results, isa, isa_label, triad)
    for i, sh in enumerate(todo):
        if sh.get("memory"):
            res = results[i]["attn_auto"][0]
            extra = res["peak_rss_mb"] - res["io_mb"]
            out.append(f"| memory at L=S=16384: ≤ inputs + outputs + 32 MiB | {extra:.1f} MiB over | "
                       f"{'yes' if extra <= 32 else '**no**'} |")
    return "\n".join(out) + "\n"


def quant_decode_targets(dec, dec_results, isa, isa_label, triad):
    """Decode at S=32768 with Q8_0 / Q4_0 caches: >= 1.7x / 2.8x the f16 cache's speed, each >= 70%
    of the triad counting the bytes the kernels read (scales included)."""
    rows = []
    at = {sh["kv"]: i for i, sh in enumerate(dec) if sh["S"] == 32768 and (sh["H"], sh["Hkv"], sh["D"]) == (32, 8, 128)}
    if "f16" not in at:
        return rows
    f16 = med(dec_results[at["f16"]]["attn_" + isa])
    for kv, want in (("q8_0", 1.7), ("q4_0", 2.8)):
        if kv not in at:
            continue
        sh = dec[at[kv]]
        a = med(dec_results[at[kv]]["attn_" + isa])
        pct = 100 * sh_bytes(sh) / (a * 1e6) / triad["gbps"]
        label = f"decode H=32 Hkv=8 D=128 S=32768 {kv} [{isa_label[isa]}]: ≥{want}× the f16 cache, ≥70% of the triad"
        ok = f16 / a >= want and pct >= 70
        rows.append(f"| {label} | {f16 / a:.2f}×, {pct:.0f}% of the triad | {'yes' if ok else '**no**'} |")
    return rows


def sh_bytes(sh):
    """Bytes of K and V one decoding step reads."""
    return sh["Hkv"] * sh["S"] * 2 * sh["D"] * {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}[sh["kv"]]


def plot_png(plot):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not found: no plot")
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for (name, causal), pts in sorted(plot.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linestyle="--" if causal else "-",
                label=f"{name}{' causal' if causal else ''}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length L = S (B=1, H=12, D=64)")
    ax.set_ylabel("GFLOP/s (causal: unmasked half)")
    ax.set_title("Attention forward")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "bench", "attention_gflops.png"), dpi=110)
    return True


if __name__ == "__main__":
    main()
