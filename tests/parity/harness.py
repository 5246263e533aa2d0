"""harness.py - what the parity scripts (tests/parity/*_parity.py) share: numpy and torch imported
or the run skipped, the command line and the loop over random configurations, and the arguments of
the `attn` tool's runs (arrays saved as .npy files; `attn mha`'s inputs and options).

A script imports it from its own folder (Python puts the folder of the script it runs first on
sys.path), before numpy and torch: import_torch() exits 77 (skipped) without them.
"""
import argparse
import os
import random
import sys
import tempfile

# tests/py: tensorfile.py (safetensors reading and writing without torch)
TESTS_PY = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))


def import_torch(min_major=1):
    """(numpy, torch), torch on one thread, and tests/py first on sys.path (import tensorfile).
    Without numpy or torch, or with a torch older than min_major.0: prints why and exits 77."""
    sys.path.insert(0, TESTS_PY)
    need = f"torch >= {min_major} and numpy" if min_major > 1 else "torch and numpy"
    try:
        import numpy
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the machine
        print(f"SKIP: the PyTorch parity tests need {need} ({exc}); Debian: python3-torch", file=sys.stderr)
        sys.exit(77)
    if int(torch.__version__.split(".")[0]) < min_major:
        print(f"SKIP: needs {need}, found torch {torch.__version__}", file=sys.stderr)
        sys.exit(77)
    torch.set_num_threads(1)
    return numpy, torch


def command_line(configs, seed):
    """The scripts' options, parsed: --attn (the attn tool, required), --configs (how many random
    configurations; default `configs`) and --seed (of their draw; default `seed`)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", required=True)
    ap.add_argument("--configs", type=int, default=configs)
    ap.add_argument("--seed", type=int, default=seed)
    return ap.parse_args()


def each_config(args, random_config):
    """Yields (index, configuration, folder) for args.configs configurations drawn by
    random_config(rng) from random.Random(args.seed); folder: a scratch folder, removed after."""
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        for idx in range(args.configs):
            yield idx, random_config(rng), tmp


def npy_arg(args, tmp, option, name, array):
    """Saves array as tmp/<name>.npy and appends option and that path to the list args."""
    import numpy
    path = os.path.join(tmp, name + ".npy")
    numpy.save(path, array)
    args += [option, path]


def mha_args(tmp, c, q, k, v, attn_mask, kpm):
    """`attn mha`'s inputs and options for configuration c (its keys batch_first, add_zero_attn,
    need_weights, average): --query, --key unless k is q, --value unless v is k (as float32 .npy
    files in tmp), --batch-first, --attn-mask, --key-padding-mask (each where not None),
    --add-zero-attn and, with need_weights, --weights-out tmp/w.npy (--per-head-weights unless
    average)."""
    args = []
    for name, t in (("query", q), ("key", k), ("value", v)):
        if (name == "key" and k is q) or (name == "value" and v is k):
            continue
        npy_arg(args, tmp, f"--{name}", name, t.float().numpy())
    if c["batch_first"]:
        args.append("--batch-first")
    if attn_mask is not None:
        npy_arg(args, tmp, "--attn-mask", "mask", attn_mask.numpy())
    if kpm is not None:
        npy_arg(args, tmp, "--key-padding-mask", "kpm", kpm.numpy())
    if c["add_zero_attn"]:
        args.append("--add-zero-attn")
    if c["need_weights"]:
        args += ["--weights-out", os.path.join(tmp, "w.npy")]
        if not c["average"]:
            args.append("--per-head-weights")
    return args
