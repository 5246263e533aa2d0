"""The C GPT-2 (examples/gpt2_model.c) against transformers' GPT2LMHeadModel, on small random models.

Each case builds a model from a random GPT2Config with transformers, gives every parameter random
values (biases and LayerNorms included, so each of them counts; logits of order 10), saves it with
save_pretrained (model.safetensors + config.json), runs the C program on random token ids filling
most of the context, and compares:
  * the logits at every prompt position (--logits-out) with the model's, to
    |c - hf| <= 2e-5 * max|hf| (float32 on both sides; the sums run in another order: the
    differences measured are 2.4e-7 to 5.4e-7 of the largest logit);
  * the 8 tokens of greedy generation (the C program's KV-cache path) with generate(do_sample=False)
    under the "eager" attention: the same ids, except where transformers' two best logits are closer
    than the tolerance (a tie either side may break).
Cases: GPT2LMHeadModel (names under "transformer.", tied head) with heads of 24; GPT2Model (no
prefix) without config.json, so the C side reads every size off the shapes and takes heads of 64;
an untied head, n_inner != 4 n_embd, the exact "gelu" and another epsilon; float16 and bfloat16
checkpoints (compared with the model whose weights were rounded the same way); and a model the C
program draws and saves (--save) that transformers loads with from_pretrained. Bad checkpoints
(a tensor missing, an unexpected tensor, a config.json that contradicts the shapes) must fail with
exit status 1 and a message naming the problem.

Run: PYTHON tests/parity/gpt2_model_parity.py --exe build/examples/example_gpt2_model
(PYTHON with torch >= 2, transformers and safetensors). Exits 77 (skipped) without them.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model
except ImportError as exc:  # pragma: no cover - depends on the machine
    print(f"SKIP: needs torch >= 2, transformers and safetensors ({exc})", file=sys.stderr)
    sys.exit(77)

torch.set_num_threads(2)
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
# eager attention as the reference; no bos/eos: random vocabularies are smaller than GPT-2's 50257
COMMON = dict(attn_implementation="eager", bos_token_id=None, eos_token_id=None)
RTOL = 2e-5  # of the largest |logit|
NEW_TOKENS = 8


def randomize(model, gen):
    """Every parameter random: LayerNorm weights near 1, everything else N(0, s) with s giving logits of order 10."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("wte.weight") or name.endswith("lm_head.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[0] ** 0.5)


def run_c(exe, model_dir, ids, out_dir, extra=(), check=True):
    logits_path = os.path.join(out_dir, "logits.npy")
    cmd = [exe, "--model", model_dir, "--prompt", ",".join(str(i) for i in ids), "--tokens", str(NEW_TOKENS),
           "--logits-out", logits_path, "--json", "--quiet", "--threads", "2", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    if r.returncode != 0:
        return r, None, None
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return r, np.load(logits_path), out["tokens"]


def hf_logits(model, ids):
    with torch.no_grad():
        x = torch.tensor([ids])
        if isinstance(model, GPT2LMHeadModel):
            return model(x).logits[0].double().numpy()
        h = model(x).last_hidden_state[0]  # GPT2Model: the head is wte, as the C program ties it
        return (h @ model.wte.weight.T).double().numpy()


def hf_greedy(model, ids):
    """Greedy tokens of transformers' generate() and, per step, the gap between its two best logits."""
    with torch.no_grad():
        x = torch.tensor([ids])  # the mask given: with pad_token_id alone, generate() would hide the 0 ids
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    tokens = out.sequences[0, len(ids):].tolist()
    gaps = [float(v[0] - v[1]) for v in (torch.topk(step[0].double(), 2).values for step in out.logits)]
    return tokens, gaps


class Failures:
    def __init__(self):
        self.count = 0

    def check(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        self.count += 0 if ok else 1


def compare(fails, name, exe, model_dir, ref_model, lm_model, ids, tmp, extra=()):
    _, c_logits, c_tokens = run_c(exe, model_dir, ids, tmp, extra)
    want = hf_logits(ref_model, ids)
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(c_logits.astype(np.float64) - want).max())
    fails.check(c_logits.shape == want.shape and err <= RTOL * scale,
                f"{name}: logits at all {len(ids)} positions, max |c - hf| = {err:.3g} "
                f"({err / scale:.2g} of max |logit| {scale:.3g}; bound {RTOL:g})")
    hf_tokens, gaps = hf_greedy(lm_model, ids)
    same = c_tokens == hf_tokens
    if not same:  # allowed only from a near tie on
        first = next(i for i, (a, b) in enumerate(zip(c_tokens, hf_tokens)) if a != b)
        same = gaps[first] <= RTOL * scale
    fails.check(same, f"{name}: greedy tokens {c_tokens} (transformers: {hf_tokens})")


def lm_from_base(base, cfg):
    """A GPT2LMHeadModel holding GPT2Model `base` (for generate)."""
    lm = GPT2LMHeadModel(cfg).eval()
    lm.transformer.load_state_dict(base.state_dict())
    lm.tie_weights()
    return lm


def expect_failure(fails, name, exe, model_dir, ids, tmp, words):
    r, _, _ = run_c(exe, model_dir, ids, tmp, check=False)
    msg = r.stderr.strip()
    fails.check(r.returncode == 1 and all(w in msg for w in words) and len(msg.splitlines()) == 1,
                f"{name}: exit status {r.returncode}, message: {msg}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    gen = torch.Generator().manual_seed(20261124)
    rng = np.random.default_rng(7)
    fails = Failures()
    with tempfile.TemporaryDirectory() as tmp:
        def new_dir(name):
            d = os.path.join(tmp, name)
            os.makedirs(d)
            return d

        # 1. GPT2LMHeadModel, tied, heads of 24, names under "transformer."
        cfg = GPT2Config(vocab_size=101, n_positions=48, n_embd=96, n_layer=3, n_head=4, **COMMON)
        lm = GPT2LMHeadModel(cfg).eval()
        randomize(lm, gen)
        d = new_dir("lm")
        lm.save_pretrained(d)
        ids = rng.integers(0, cfg.vocab_size, size=cfg.n_positions - NEW_TOKENS).tolist()
        compare(fails, "GPT2LMHeadModel E=96 H=4 L=3", args.exe, d, lm, lm, ids, tmp)

        # 2. GPT2Model without prefix and without config.json: sizes from the shapes, heads of 64
        cfg2 = GPT2Config(vocab_size=77, n_positions=40, n_embd=128, n_layer=2, n_head=2, **COMMON)
        base = GPT2Model(cfg2).eval()
        randomize(base, gen)
        d = new_dir("base")
        base.save_pretrained(d)
        os.remove(os.path.join(d, "config.json"))
        ids2 = rng.integers(0, cfg2.vocab_size, size=30).tolist()
        compare(fails, "GPT2Model, no config.json (E=128, H inferred 2)", args.exe, d, base, lm_from_base(base, cfg2),
                ids2, tmp)

        # 3. untied head, n_inner 200, exact GELU, eps 1e-3
        cfg3 = GPT2Config(vocab_size=64, n_positions=32, n_embd=48, n_layer=2, n_head=3, n_inner=200,
                          activation_function="gelu", layer_norm_epsilon=1e-3, tie_word_embeddings=False,
                          **COMMON)
        lm3 = GPT2LMHeadModel(cfg3).eval()
        randomize(lm3, gen)
        d = new_dir("untied")
        lm3.save_pretrained(d)
        ids3 = rng.integers(0, cfg3.vocab_size, size=20).tolist()
        compare(fails, "untied head, n_inner 200, gelu (erf), eps 1e-3", args.exe, d, lm3, lm3, ids3, tmp)

        # 4. float16 and bfloat16 checkpoints of model 1: against the model with the rounded weights
        for dtype, label in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
            rounded = GPT2LMHeadModel(cfg).eval()
            rounded.load_state_dict({k: v.to(dtype).float() for k, v in lm.state_dict().items()})
            d = new_dir(label)
            lm.to(dtype).save_pretrained(d)
            lm.float()
            compare(fails, f"{label} checkpoint", args.exe, d, rounded, rounded, ids[:24], tmp)

        # 5. a model the C program draws and saves, loaded by transformers
        d = os.path.join(tmp, "from_c")
        r = subprocess.run([args.exe, "--layers", "2", "--embd", "64", "--heads", "4", "--vocab", "50", "--context",
                            "24", "--tokens", "1", "--quiet", "--save", d], capture_output=True, text=True)
        fails.check(r.returncode == 0, f"C random model saved with --save (status {r.returncode} {r.stderr.strip()})")
        if r.returncode == 0:
            from_c = GPT2LMHeadModel.from_pretrained(d, attn_implementation="eager", bos_token_id=None, eos_token_id=None).eval()
            compare(fails, "the C program's own model loaded by from_pretrained", args.exe, d, from_c, from_c,
                    rng.integers(0, 50, size=16).tolist(), tmp)

        # 6. bad checkpoints
        state = load_file(os.path.join(tmp, "lm", "model.safetensors"))
        config = json.load(open(os.path.join(tmp, "lm", "config.json")))

        def bad(name, tensors, cfg_changes, words):
            d = new_dir(name)
            save_file(tensors, os.path.join(d, "model.safetensors"))
            json.dump(dict(config, **cfg_changes), open(os.path.join(d, "config.json"), "w"))
            expect_failure(fails, name, args.exe, d, ids[:8], tmp, words)

        missing = {k: v for k, v in state.items() if k != "transformer.h.1.mlp.c_fc.bias"}
        bad("missing tensor", missing, {}, ["transformer.h.1.mlp.c_fc.bias", "missing"])
        bad("unexpected tensor", dict(state, **{"transformer.h.0.attn.rotary": torch.zeros(3)}), {},
            ["transformer.h.0.attn.rotary", "unexpected"])
        bad("extra block", dict(state, **{"transformer.h.7.ln_1.bias": torch.zeros(96)}), {},
            ["transformer.h.7.ln_1.bias"])
        bad("config contradicts the shapes", state, {"n_embd": 64}, ["n_embd", "64"])
        bad("config with another layer count", state, {"n_layer": 5}, ["n_layer", "3 blocks"])
        bad("wrong shape", dict(state, **{"transformer.h.2.ln_2.weight": torch.ones(95)}), {},
            ["transformer.h.2.ln_2.weight", "(95)", "(96)"])
        bad("scale_attn_by_inverse_layer_idx", state, {"scale_attn_by_inverse_layer_idx": True},
            ["scale_attn_by_inverse_layer_idx"])
        bad("integer tensor", dict(state, **{"transformer.ln_f.bias": torch.zeros(96, dtype=torch.int64)}), {},
            ["transformer.ln_f.bias", "I64"])
    if fails.count:
        print(f"{fails.count} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
