"""End-to-end generation with a GPT-2-small-shaped model: transformers on the CPU under the "eager",
"sdpa" and "attn" attention implementations, and the C GPT-2 (examples/gpt2_model.c), in one run.

    make && PYTHON bench/run_bench_e2e.py [--threads 2] [--prompt 128] [--new 128] [--rounds 3]
                                          [--out BENCHMARKS.md | --no-write]

PYTHON: an interpreter with torch >= 2 and transformers (the C side needs only `make`).

1. The model: GPT2LMHeadModel(GPT2Config()), i.e. 12 layers, E = 768, 12 heads, vocabulary 50257,
   context 1024, tied head (124M parameters), with transformers' own random initialisation after
   torch.manual_seed(--seed), saved with save_pretrained (float32) in a temporary directory, which
   every row then loads: the same weights everywhere.
2. The prompt: --prompt token ids drawn at random (seeded); --new tokens generated greedily.
3. Every round runs each row in turn (eager, sdpa, attn, C), --rounds rounds; a cell is the median
   over the rounds. transformers' rows time, in one process, on torch.set_num_threads(--threads):
     prefill  model(prompt, use_cache=True, logits_to_keep=1) and the argmax of its logits;
     decode   the --new - 1 later steps, model(one token, cache) and the argmax each;
     generate model.generate(prompt, max_new_tokens=min_new_tokens=--new, do_sample=False), whole.
   The C row runs `example_gpt2_model --model DIR --prompt IDS --tokens N --threads T --json`, whose
   prefill and decode are timed the same way (the model's loading excluded); its "generate" is
   their sum. Tokens per second: the prompt's tokens over the prefill; the decode steps over the
   decode; the new tokens over the whole generation.
4. Checks: every row's greedy tokens are compared with eager's (a row that differs says so). The
   memory bandwidth is measured first (bench/triad.c, as bench/run_bench.py does, same threads):
   decoding reads every weight once per token, so the section gives the C row's decode as GB/s of
   weights read and as a share of that bandwidth.
5. Writes the section between the markers below in BENCHMARKS.md (the other sections are left as
   they are; bench/run_bench.py keeps this one when it rewrites the file), with the machine, the
   date, the command, the versions and the load average before and after the run.

The "attn" row needs `import attn.hf; attn.hf.register()` (python/, with build/libattn.so); when
that fails the row says it is unavailable and why.
"""
import argparse
import datetime
import inspect
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

from run_bench import measure_triad  # bench/run_bench.py, beside this file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- run_bench_e2e.py: begin -->", "<!-- run_bench_e2e.py: end -->"
IMPLS = ("eager", "sdpa", "attn")
WEIGHT_BYTES = 4 * 124439808  # GPT-2 small's parameters (the tied head once), float32
KV_BYTES_PER_TOKEN = 4 * 2 * 12 * 768  # keys and values of 12 layers of E = 768, float32


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def machine():
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "date": datetime.date.today().isoformat(), "commit": commit or "?"}


def register_attn():
    """None when "attn" is registered with transformers, else why not."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("ATTN_LIBRARY", os.path.join(ROOT, "build", "libattn.so"))
    try:
        import attn.hf
        attn.hf.register()
    except Exception as exc:  # ImportError on a tree without attn.hf, or the library missing
        return f"{type(exc).__name__}: {exc}"
    return None


def hf_row(torch, model, ids, new):
    """One round of a transformers row: prefill, decode and generate() timings and the tokens."""
    x = torch.tensor([ids])
    # the cache's keyword: `cache` in recent transformers, `past_key_values` before
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model(input_ids=x, use_cache=True, logits_to_keep=1)
        tok = out.logits[0, -1].argmax()
        prefill = time.perf_counter() - t0
        tokens, past = [int(tok)], getattr(out, kw)
        t0 = time.perf_counter()
        for _ in range(new - 1):
            out = model(input_ids=tok.view(1, 1), use_cache=True, **{kw: past})
            past = getattr(out, kw)
            tok = out.logits[0, -1].argmax()
            tokens.append(int(tok))
        decode = time.perf_counter() - t0
        t0 = time.perf_counter()
        g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)
        generate = time.perf_counter() - t0
    return {"prefill_s": prefill, "decode_s": decode, "generate_s": generate, "tokens": tokens,
            "generate_tokens": g[0, len(ids):].tolist()}


def c_row(exe, model_dir, ids, new, threads):
    cmd = [exe, "--model", model_dir, "--prompt", ",".join(map(str, ids)), "--tokens", str(new), "--threads",
           str(threads), "--json", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{exe} failed ({r.returncode}): {r.stderr.strip()}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"prefill_s": out["prefill_s"], "decode_s": out["decode_s"], "generate_s": out["prefill_s"] + out["decode_s"],
            "tokens": out["tokens"], "isa": out["isa"]}


def write_section(path, text):
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    block = f"{BEGIN}\n{text.rstrip()}\n{END}\n"
    if BEGIN in old and END in old:
        new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END) + "\n?", lambda _: block, old, flags=re.S)
    else:
        new = old.rstrip("\n") + "\n\n" + block
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(new)
    os.replace(tmp, path)


def report(args, info, versions, rows, unavailable, load, triad):
    P, N = args.prompt, args.new
    w = []
    w.append("## End to end: generating with a GPT-2-small-shaped model\n")
    w.append(f"Measured on {info['date']} at commit `{info['commit']}`: {info['cpu']} ({info['cores']} cores), "
             f"Linux {info['kernel']}, {args.threads} threads for every row; load average {load[0]:.2f} before the run "
             f"and {load[1]:.2f} after it (other work on the same cores lowers every row). {versions}.\n")
    w.append(f"Rerun with `make && PYTHON bench/run_bench_e2e.py --threads {args.threads} --prompt {P} --new {N} "
             f"--rounds {args.rounds}` (PYTHON with torch >= 2 and transformers). GPT2LMHeadModel(GPT2Config()) "
             "(12 layers, E = 768, 12 heads, vocabulary 50257, context 1024, 124M parameters, float32) with random "
             "weights, saved once and loaded by every row; a prompt of "
             f"{P} random token ids, {N} new tokens chosen greedily. transformers' rows: prefill = "
             "`model(prompt, use_cache=True, logits_to_keep=1)` and the argmax, decode = the later steps "
             "`model(token, cache)` and the argmax, generate = `model.generate(max_new_tokens=min_new_tokens="
             f"{N}, do_sample=False)` whole. The C row: `build/examples/example_gpt2_model` (examples/gpt2_model.c) "
             "timed the same way, its generate the sum of the two (loading excluded). Each cell is the median over "
             f"{args.rounds} rounds, the rows run in turn in every round. \"Tokens\" compares each row's greedy ids with "
             "eager's.\n")
    w.append("| row | prefill tokens/s | decode tokens/s | decode ms/token | generate new tokens/s | tokens |")
    w.append("|---|---|---|---|---|---|")
    ref = rows.get("eager", [{}])[0].get("tokens")
    for name in (*IMPLS, "C"):
        label = "C GPT-2 (attn" + (f", {rows[name][0]['isa']} kernels" if name == "C" and rows.get(name) else "") + ")" \
            if name == "C" else f"transformers, attn_implementation=\"{name}\""
        if name in unavailable:
            w.append(f"| {label} | unavailable: {unavailable[name]} | – | – | – | – |")
            continue
        rs = rows[name]
        pre = statistics.median(P / r["prefill_s"] for r in rs)
        dec = statistics.median((N - 1) / r["decode_s"] for r in rs)
        gen = statistics.median(N / r["generate_s"] for r in rs)
        same = all(r["tokens"] == ref for r in rs) and all(r.get("generate_tokens", ref) == ref for r in rs)
        w.append(f"| {label} | {pre:.0f} | {dec:.1f} | {1e3 / dec:.1f} | {gen:.1f} | "
                 f"{'same as eager' if same else 'DIFFER from eager'} |")
    w.append("")
    c = rows.get("C")

    def against(what, a, b):  # medians' ratios of rows a and b
        ratio = lambda key, n: statistics.median(n / r[key] for r in a) / statistics.median(n / r[key] for r in b)
        w.append(f"{what}: prefill {ratio('prefill_s', P):.2f}×, decode {ratio('decode_s', N - 1):.2f}×, whole "
                 f"generation {ratio('generate_s', N):.2f}×.\n")

    if rows.get("attn") and rows.get("sdpa") and "attn" not in unavailable:
        against('transformers under "attn" against "sdpa" (only the attention differs)', rows["attn"], rows["sdpa"])
    if c and rows.get("eager"):
        against("The C GPT-2 against eager transformers", c, rows["eager"])
    if c:
        gbps = WEIGHT_BYTES / 1e9 * statistics.median((N - 1) / r["decode_s"] for r in c)
        w.append(f"Each decoding step reads every weight once: {WEIGHT_BYTES / 1e6:.0f} MB in float32 (and the KV "
                 f"cache, at most {KV_BYTES_PER_TOKEN * (P + N) / 1e6:.0f} MB here). At its median the C row reads {gbps:.1f} GB/s of "
                 f"weights, {100 * gbps / triad:.0f}% of the {triad:.1f} GB/s a STREAM-like triad (bench/triad.c, "
                 f"{args.threads} threads) measured at the start of the run (a stream of reads alone can pass it: the "
                 "triad counts 12 bytes an element where the writes' cache fills move 16; and other work on the "
                 "machine lowers both).\n")
    return "\n".join(w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    ap.add_argument("--new", type=int, default=128, help="new tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exe", default=os.path.join(ROOT, "build", "examples", "example_gpt2_model"))
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    ap.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    args = ap.parse_args()
    if args.prompt < 1 or args.new < 2 or args.prompt + args.new > 1024:
        sys.exit("need --prompt >= 1, --new >= 2 and --prompt + --new <= 1024")
    if not os.path.exists(args.exe):
        sys.exit(f"{args.exe} not found: run `make` first")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    info = machine()
    load = [os.getloadavg()[0]]
    triad = measure_triad(args.threads)["gbps"]
    log(f"triad: {triad:.1f} GB/s with {args.threads} threads")
    unavailable = {}
    why = register_attn()
    if why is not None:
        unavailable["attn"] = why
        log(f"attn row unavailable: {why}")
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}"
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(args.seed)
        GPT2LMHeadModel(GPT2Config()).eval().save_pretrained(tmp)
        gen = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(0, 50257, (args.prompt,), generator=gen).tolist()
        models = {}
        for impl in IMPLS:
            if impl not in unavailable:
                models[impl] = GPT2LMHeadModel.from_pretrained(tmp, attn_implementation=impl).eval()
        for rnd in range(args.rounds):
            for impl, model in models.items():
                try:
                    r = hf_row(torch, model, ids, args.new)
                except Exception as exc:
                    unavailable[impl] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    log(f"round {rnd + 1} {impl}: failed: {unavailable[impl]}")
                    continue
                rows.setdefault(impl, []).append(r)
                log(f"round {rnd + 1} {impl}: prefill {args.prompt / r['prefill_s']:.0f} tokens/s, decode "
                    f"{(args.new - 1) / r['decode_s']:.1f} tokens/s, generate {args.new / r['generate_s']:.1f} tokens/s")
            models = {k: v for k, v in models.items() if k not in unavailable}
            r = c_row(args.exe, tmp, ids, args.new, args.threads)
            rows.setdefault("C", []).append(r)
            log(f"round {rnd + 1} C: prefill {args.prompt / r['prefill_s']:.0f} tokens/s, decode "
                f"{(args.new - 1) / r['decode_s']:.1f} tokens/s, generate {args.new / r['generate_s']:.1f} tokens/s")
    load.append(os.getloadavg()[0])
    text = report(args, info, versions, rows, unavailable, load, triad)
    if args.no_write:
        print(text)
    else:
        write_section(args.out, text)
        log(f"wrote the end-to-end section of {args.out}")


if __name__ == "__main__":
    main()
