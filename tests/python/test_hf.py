"""Tests of attn.hf: Hugging Face transformers models running their attention on attn.

Small random configurations of the GPT-2, Llama, Qwen2, Gemma-2 and gpt-oss families (causal
attention, grouped-query attention, sliding windows, soft-capping, attention sinks), built with
from_config (nothing is downloaded): the same weights under attn_implementation="eager"
(transformers' own matmul and softmax) and "attn":
  - logits equal to 1e-4, without padding and with left padding (at the tokens that are not
    padding), and attn really called (the eager model never);
  - greedy generate() gives the same tokens, with and without padding: prefill, then cached
    decoding past the sliding windows;
  - output_attentions: the weights equal eager's;
  - one training step: every parameter's gradient equals eager's (gpt-oss's sinks included);
  - a bfloat16 model: logits as close to eager's as sdpa's, sdpa's greedy tokens;
  - each family's feature matters in these configurations (a different window, soft cap or sink
    changes eager's logits), so agreement is not vacuous;
  - the attention function itself: s_aux is attn's sinks, position_bias is refused.

Run with an interpreter that has torch >= 2.4 and transformers >= 5 (CTest python_hf, when
ATTN_TORCH2_PYTHON is set). Exits 77 (skipped) without them.
"""
import copy
import os
import sys
import unittest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, Gemma2Config, GPT2Config, GptOssConfig, LlamaConfig, Qwen2Config
except ImportError as exc:  # pragma: no cover
    print("SKIP: attn.hf's tests need torch and transformers >= 5 (%s)" % exc, file=sys.stderr)
    sys.exit(77)
if int(transformers.__version__.split(".")[0]) < 5:  # pragma: no cover
    print("SKIP: attn.hf's tests need transformers >= 5, this is %s" % transformers.__version__, file=sys.stderr)
    sys.exit(77)

import attn  # noqa: E402
import attn.hf  # noqa: E402
import attn.torch as at  # noqa: E402
from attn.torch import _call  # noqa: E402

torch.set_num_threads(1)
VOCAB = 97
NAME = attn.hf.register()


def families():
    """name -> config. Weights drawn with a larger spread than the default (initializer_range),
    so that attention weights are far from uniform and soft caps bite; no dropout."""
    init = dict(initializer_range=0.3)
    return {
        "gpt2": GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                           eos_token_id=1, scale_attn_by_inverse_layer_idx=True, attn_pdrop=0.0, resid_pdrop=0.0,
                           embd_pdrop=0.0, **init),
        "llama": LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             bos_token_id=0, eos_token_id=1, **init),
        "qwen2": Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             use_sliding_window=True, sliding_window=4, max_window_layers=1,
                             layer_types=["full_attention", "sliding_attention"], bos_token_id=0, eos_token_id=1,
                             **init),
        "gemma2": Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                               sliding_window=4, attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
                               query_pre_attn_scalar=8, bos_token_id=0, eos_token_id=1, pad_token_id=2, **init),
        # sinks (s_aux), a sliding window on the first layer, a mixture of experts
        "gpt_oss": GptOssConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                                num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64,
                                rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 2.0,
                                                 "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                 "original_max_position_embeddings": 32},
                                bos_token_id=0, eos_token_id=1, pad_token_id=2, **init),
    }


def pair(cfg, seed=0):
    """The same random model under eager and under attn (each with its own copy of the config:
    from_config records the implementation in the config it is given)."""
    torch.manual_seed(seed)
    eager = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=NAME)
    ours.load_state_dict(eager.state_dict())
    return eager.eval(), ours.eval()


def inputs(B=2, T=12, pad=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :pad] = 0  # left padding, as generate() wants for decoder-only models
    return ids, mask


class Counter:
    """Counts the calls of the library's forward behind the torch op."""

    def __enter__(self):
        self.n, self.orig = 0, _call.sdpa_forward

        def counted(*a, **k):
            self.n += 1
            return self.orig(*a, **k)

        _call.sdpa_forward = counted
        return self

    def __exit__(self, *exc):
        _call.sdpa_forward = self.orig


class TestFamilies(unittest.TestCase):
    def close(self, got, want, atol=1e-4, what=""):
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-4, msg=lambda m: "%s: %s" % (what, m))

    def test_registered(self):
        self.assertEqual(NAME, "attn")
        self.assertIn("attn", transformers.AttentionInterface())
        _, ours = pair(families()["llama"])
        self.assertEqual(ours.config._attn_implementation, "attn")

    def test_logits(self):
        ids, mask = inputs()
        for name, cfg in families().items():
            with self.subTest(name):
                eager, ours = pair(cfg)
                with torch.no_grad():
                    with Counter() as c:
                        want = eager(ids).logits
                    self.assertEqual(c.n, 0)
                    with Counter() as c:
                        got = ours(ids).logits
                    self.assertEqual(c.n, cfg.num_hidden_layers)
                    self.close(got, want, what=name)
                    keep = mask.bool()
                    got_p, want_p = ours(ids, attention_mask=mask).logits, eager(ids, attention_mask=mask).logits
                    self.close(got_p[keep], want_p[keep], what=name + " padded")

    def test_greedy_generation(self):
        ids, mask = inputs(T=6)
        for name, cfg in families().items():
            with self.subTest(name):
                eager, ours = pair(cfg)
                kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=2)
                with torch.no_grad():
                    for m in (None, mask):
                        want = eager.generate(ids, attention_mask=m, **kw)
                        with Counter() as c:
                            got = ours.generate(ids, attention_mask=m, **kw)
                        self.assertGreaterEqual(c.n, cfg.num_hidden_layers * 10)  # prefill + every cached step
                        self.assertEqual(got.tolist(), want.tolist(), name)
                        self.assertEqual(got.shape[1], ids.shape[1] + 10)

    def test_output_attentions(self):
        ids, mask = inputs()
        for name in ("llama", "gemma2", "gpt_oss"):
            with self.subTest(name):
                eager, ours = pair(families()[name])
                with torch.no_grad():
                    want = eager(ids, attention_mask=mask, output_attentions=True).attentions
                    got = ours(ids, attention_mask=mask, output_attentions=True).attentions
                self.assertEqual(len(got), len(want))
                for g, w in zip(got, want):
                    keep = mask.bool()[:, None, :, None].expand_as(w)  # rows of padding queries differ (see README)
                    self.close(g[keep], w[keep], 1e-5, name)

    def test_training_gradients(self):
        ids, _ = inputs()
        for name, cfg in families().items():
            with self.subTest(name):
                eager, ours = pair(cfg)
                for m in (eager, ours):
                    m.train()
                    m.zero_grad()
                    m(ids, labels=ids).loss.backward()
                for (n, a), (_, b) in zip(ours.named_parameters(), eager.named_parameters()):
                    if b.grad is not None:
                        self.close(a.grad, b.grad, 1e-4, "%s %s" % (name, n))

    def test_bfloat16_model(self):
        """A bfloat16 model: keys and values go to attn as bfloat16; its logits stay as close to
        eager's as sdpa's are (bfloat16 rounding of every layer's activations), and its greedy
        tokens are sdpa's."""
        ids, _ = inputs()
        cfg = families()["llama"]
        torch.manual_seed(0)
        models = {impl: AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl,
                                                         dtype=torch.bfloat16).eval()
                  for impl in ("eager", "sdpa", NAME)}
        for m in models.values():
            m.load_state_dict(models["eager"].state_dict())
        with torch.no_grad():
            logits = {impl: m(ids).logits.float() for impl, m in models.items()}
            scale = logits["eager"].abs().max()
            self.assertLess((logits[NAME] - logits["eager"]).abs().max(), 0.05 * scale)
            self.assertLess((logits[NAME] - logits["sdpa"]).abs().max(), 0.05 * scale)
            kw = dict(max_new_tokens=5, do_sample=False)
            self.assertEqual(models[NAME].generate(ids, **kw).tolist(), models["sdpa"].generate(ids, **kw).tolist())

    def test_features_matter(self):
        """A different sliding window or soft cap changes eager's logits on these inputs, so the
        agreement above covers them."""
        ids, _ = inputs()
        base = families()
        for name, field, other in (("qwen2", "sliding_window", 64), ("gemma2", "sliding_window", 64),
                                   ("gemma2", "attn_logit_softcapping", None)):
            with self.subTest(name=name, field=field):
                changed = copy.deepcopy(base[name])
                setattr(changed, field, other)
                a, _ = pair(base[name])
                b, _ = pair(changed)
                with torch.no_grad():
                    self.assertFalse(torch.allclose(a(ids).logits, b(ids).logits, atol=1e-4))
        a, _ = pair(base["gpt_oss"])
        with torch.no_grad():
            before = a(ids).logits
            for layer in a.model.layers:
                layer.self_attn.sinks.add_(1.0)
            self.assertFalse(torch.allclose(before, a(ids).logits, atol=1e-4))
        llama = base["llama"]
        self.assertLess(llama.num_key_value_heads, llama.num_attention_heads)


class TestAttentionFunction(unittest.TestCase):
    """attn.hf.attention_forward as transformers calls it, without a model."""

    class Module:
        is_causal = True
        training = False

    def test_s_aux_is_sinks(self):
        torch.manual_seed(0)
        q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
        z = torch.randn(4, requires_grad=True)
        out, weights = attn.hf.attention_forward(self.Module(), q, k, v, None, scaling=0.5, s_aux=z,
                                                 output_attentions=True)
        want = at.sdpa(q, k, v, causal=True, scale=0.5, enable_gqa=True, sinks=z)
        torch.testing.assert_close(out, want.transpose(1, 2))
        self.assertTrue((weights.sum(-1) < 1).all())  # the sinks take part of every row's weight
        plain, _ = attn.hf.attention_forward(self.Module(), q, k, v, None, scaling=0.5)
        self.assertFalse(torch.allclose(out, plain, atol=1e-4))
        (g,) = torch.autograd.grad(out.sum(), [z])
        self.assertTrue(torch.isfinite(g).all() and (g != 0).all())

    def test_position_bias_refused(self):
        q = torch.randn(1, 2, 3, 4)
        with self.assertRaises(attn.AttnError) as cm:
            attn.hf.attention_forward(self.Module(), q, q, q, None, position_bias=torch.zeros(1, 2, 3, 3))
        self.assertEqual(cm.exception.name, "ATTN_ERR_UNSUPPORTED")
        self.assertIn("position_bias", cm.exception.message)


if __name__ == "__main__":
    print("attn from %s, torch %s, transformers %s" % (os.path.dirname(attn.__file__), torch.__version__,
                                                        transformers.__version__), file=sys.stderr)
    unittest.main()
