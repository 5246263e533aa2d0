"""Tests of the Python binding (python/attn) against numpy and, where installed, PyTorch references.

Covered:
  - the ctypes struct layouts (the library's own *_init functions fill the fields we read back);
  - sdpa forward against a float64 numpy reference: grouped-query attention, Dv != D, scales,
    top-left and bottom-right causal masks, bool and float masks of several broadcast shapes, key
    padding masks, local windows, ALiBi, soft-capping, attention sinks, float16 and bfloat16 k/v,
    weights and log-sum-exp, fully masked rows (zeros, -inf; with sinks, lse = the sink); strided
    inputs without copies, negative strides and strides that are not whole elements; every kernel
    set; thread counts (same bits);
  - sdpa_backward against a numpy float64 backward (dq, dk, dv, a float mask's gradient, and the
    sinks' gradient against finite differences of the float64 reference);
  - Philox dropout (attn.Philox): the mask through the weights, out and dv from it, no state needed,
    the context's generator untouched, the same result on 1 and 3 threads;
  - with torch: a torch.autograd.Function (forward attn.sdpa, backward attn.sdpa_backward) checked
    against autograd of the reference in float64 (dropout included: the context and torch seeded
    alike draw the same mask) and by torch.autograd.gradcheck;
  - MHA: created like nn.MultiheadAttention (same weights after the same seed), loaded from a
    .safetensors file written from a torch state_dict, forward against torch to 1e-5 (self and
    cross attention, kdim/vdim, bias_k/bias_v, batch_first, unbatched, masks, weights), and
    against a numpy reference without torch; parameters as views, state_dict, safetensors round trip;
  - KVCache: token-by-token decoding against full causal attention (F32/F16/BF16 storage, GQA),
    Q8_0/Q4_0 storage within the quantisation's bound,
    truncate/reset, capacity errors, MHA.forward_cached against the causal forward; attend with
    every option (sinks included) against the reference;
  - sdpa_varlen and its backward against a loop over the sequences (with sinks: sequences without
    keys, and dsinks the sum of the sequences');
  - errors: AttnError with the status name and the library's message.

Run: /usr/bin/python3 tests/python/test_binding.py [-v]   (ATTN_LIBRARY=path/to/libattn.so to pick
a library; by default build/libattn.so). Exits 77 (skipped) without numpy; the torch parts skip
without torch; KV cache and varlen parts skip when the library lacks those functions.
"""
import ctypes
import ctypes.util
import os
import sys
import tempfile
import unittest

import source_tree  # tests/python/source_tree.py, beside this file

source_tree.use_package(default_library=False)
sys.path.insert(0, os.path.join(source_tree.ROOT, "tests", "py"))

try:
    import numpy as np
except ImportError as exc:  # pragma: no cover
    print("SKIP: the Python binding's tests need numpy (%s); install python3-numpy" % exc, file=sys.stderr)
    sys.exit(77)

import attn  # noqa: E402
from attn import _lib  # noqa: E402

try:
    import torch
    torch.set_num_threads(1)
    HAVE_TORCH = True
except ImportError:  # pragma: no cover
    HAVE_TORCH = False

try:
    import tensorfile
except ImportError:  # pragma: no cover
    tensorfile = None

needs_torch = unittest.skipUnless(HAVE_TORCH, "torch is not installed")
needs_kv_cache = unittest.skipUnless(attn.has_kv_cache(), "this libattn has no KV cache functions")
needs_varlen = unittest.skipUnless(attn.has_varlen(), "this libattn has no attn_sdpa_varlen_fwd/bwd")


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- numpy references (float64) --------------------------------------------------------------

def ref_logits(q, k, causal=None, mask=None, key_padding_mask=None, scale=None, window=None, alibi=None,
               softcap=0.0):
    """(scores before softcap, final logits) of shape (B, H, L, S); k already repeated to H heads."""
    B, H, L, D = q.shape
    S = k.shape[2]
    sc = float(np.float32(scale)) if scale else 1.0 / np.sqrt(D)
    raw = np.einsum("bhld,bhsd->bhls", q, k) * sc
    s = softcap * np.tanh(raw / softcap) if softcap else raw.copy()
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    off = S - L if causal == "bottom_right" else 0
    if alibi is not None:
        s = s - np.asarray(alibi, dtype=np.float64)[None, :, None, None] * np.abs(i + off - j)
    hidden = np.zeros((L, S), dtype=bool)
    if causal:
        hidden |= j > i + off
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            hidden |= j < i + off - left
        if right is not None and right >= 0:
            hidden |= j > i + off + right
    add = np.where(hidden, -np.inf, 0.0)
    for m, shape in ((mask, None), (key_padding_mask, "kpm")):
        if m is None:
            continue
        m = np.asarray(m)
        a = np.where(m, -np.inf, 0.0) if m.dtype == bool else m.astype(np.float64)
        add = add + (a[:, None, None, :] if shape == "kpm" else a)
    return raw, s + add


def ref_softmax(s, sinks=None):
    """(weights, lse) of softmax over the last axis, rows without keys giving zeros; with sinks (H
    logits), over each row with its head's sink appended as one more column, then dropped."""
    if sinks is not None:
        z = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None, None], s.shape[:-1] + (1,))
        p, lse = ref_softmax(np.concatenate([s, z], axis=-1))
        return p[..., :-1], lse
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    z = e.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(z > 0, e / np.where(z > 0, z, 1), 0.0)
        lse = (np.log(z) + m)[..., 0]
    return p, lse


def rep(x, H):
    return np.repeat(np.asarray(x, dtype=np.float64), H // x.shape[1], axis=1)


def ref_sdpa(q, k, v, sinks=None, **opts):
    """(out, lse, weights) in float64; k and v as the values the library sees (already rounded)."""
    H = q.shape[1]
    _, s = ref_logits(np.asarray(q, np.float64), rep(k, H), **opts)
    p, lse = ref_softmax(s, sinks)
    return p @ rep(v, H), lse, p


def ref_sdpa_backward(q, k, v, dout, sinks=None, **opts):
    """(dq, dk, dv, dlogits) in float64 by the softmax backward written out (a sink has no value:
    the same formula over the keys' weights)."""
    B, H, L, D = q.shape
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    q64, kr, vr, do = np.asarray(q, np.float64), rep(k, H), rep(v, H), np.asarray(dout, np.float64)
    raw, s = ref_logits(q64, kr, **opts)
    p, _ = ref_softmax(s, sinks)
    dp = do @ vr.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dv = (p.transpose(0, 1, 3, 2) @ do).reshape(B, Hkv, H // Hkv, S, Dv).sum(2)
    softcap = opts.get("softcap", 0.0)
    draw = ds * (1 - np.tanh(raw / softcap) ** 2) if softcap else ds
    sc = float(np.float32(opts["scale"])) if opts.get("scale") else 1.0 / np.sqrt(D)
    dq = sc * draw @ kr
    dk = (sc * draw.transpose(0, 1, 3, 2) @ q64).reshape(B, Hkv, H // Hkv, S, D).sum(2)
    return dq, dk, dv, ds


def ref_dsinks(q, k, v, dout, sinks, eps=1e-5, **opts):
    """The sinks' gradient of sum(out * dout) by central differences of the float64 reference."""
    z = np.asarray(sinks, np.float64)
    g = np.empty_like(z)
    for h in range(z.size):
        up, down = z.copy(), z.copy()
        up[h] += eps
        down[h] -= eps
        f = [(ref_sdpa(q, k, v, sinks=zz, **opts)[0] * dout).sum() for zz in (up, down)]
        g[h] = (f[0] - f[1]) / (2 * eps)
    return g


def sum_to(x, shape):
    """Sums x over the dimensions a mask of `shape` was broadcast along."""
    padded = (1,) * (x.ndim - len(shape)) + tuple(shape)
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, padded)) if b == 1 and a != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape)


def close(test, got, want, rtol=1e-4, atol=2e-5, what=""):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol,
                               err_msg=what)


def assert_errors(test, cases):
    """cases: (call, status name, text): each call raises AttnError with that status, the text in its
    message, and str() "NAME: message"."""
    for call, name, text in cases:
        with test.subTest(text):
            with test.assertRaises(attn.AttnError) as cm:
                call()
            test.assertEqual(cm.exception.name, name, str(cm.exception))
            test.assertIn(text, cm.exception.message)
            test.assertTrue(str(cm.exception).startswith(name + ": "))


# ---- configurations ------------------------------------------------------------------------------

def configs(rng):
    """(name, B, H, Hkv, L, S, D, Dv, opts builder) for the forward/backward comparisons."""
    B, H, Hkv, L, S, D, Dv = 2, 4, 2, 5, 7, 8, 6
    yield "plain", 1, 2, 2, 3, 4, 8, 8, {}
    yield "gqa_dv_scale", B, H, Hkv, L, S, D, Dv, {"scale": 0.3}
    yield "mqa_top_left", B, H, 1, L, S, D, D, {"causal": "top_left"}
    yield "bottom_right_L_gt_S", B, H, Hkv, 9, S, D, D, {"causal": "bottom_right"}
    yield "bool_mask_LS", B, H, Hkv, L, S, D, Dv, {"mask": rng.random((L, S)) < 0.3}
    yield "float_mask_B1LS", B, H, Hkv, L, S, D, Dv, {"mask": randn(rng, B, 1, L, S)}
    yield "float_mask_HLS_kpm", B, H, Hkv, L, S, D, Dv, {"mask": randn(rng, H, L, S),
                                                         "key_padding_mask": rng.random((B, S)) < 0.3}
    yield "float_kpm_causal", B, H, Hkv, L, S, D, Dv, {"key_padding_mask": randn(rng, B, S), "causal": "bottom_right"}
    yield "window", B, H, Hkv, L, S, D, Dv, {"window": (2, 1), "causal": None}
    yield "window_left_only_br", B, H, Hkv, L, S, D, Dv, {"window": (1, None), "causal": "bottom_right"}
    yield "alibi", B, H, Hkv, L, S, D, Dv, {"alibi": (2.0 ** -np.arange(1, H + 1)).astype(np.float32)}
    yield "softcap", B, H, Hkv, L, S, D, Dv, {"softcap": 1.5, "scale": 2.0}
    # a fully masked row (lse = the sink), a head without a sink (-inf) and one that takes most weight
    sinks = np.array([0.5, -np.inf, 3.0, -1.0], np.float32)
    blocked = rng.random((L, S)) < 0.3
    blocked[2] = True
    yield "sinks_gqa_mask_causal", B, H, Hkv, L, S, D, Dv, {"sinks": sinks, "mask": blocked, "causal": "bottom_right"}
    yield "sinks_float_mask_alibi_softcap", B, H, Hkv, L, S, D, Dv, {
        "sinks": randn(rng, H), "mask": randn(rng, B, 1, L, S), "softcap": 2.0, "window": (3, 1),
        "alibi": (2.0 ** -np.arange(1, H + 1)).astype(np.float32)}


def lib_opts(opts):
    o = dict(opts)
    if "alibi" in o:
        o["alibi_slopes"] = o.pop("alibi")
    return o


class TestAbi(unittest.TestCase):
    def test_struct_defaults(self):
        p = _lib.CtxParams()
        _lib.fn("attn_ctx_params_init")(ctypes.byref(p))
        self.assertEqual((p.n_threads, p.isa, p.seed, p.use_blas), (1, 0, 0, 0))
        c = _lib.MhaConfig()
        _lib.fn("attn_mha_config_init")(ctypes.byref(c), 12, 3)
        self.assertEqual((c.embed_dim, c.num_heads, c.kdim, c.vdim, c.bias, c.batch_first, c.dropout),
                         (12, 3, 0, 0, 1, 0, 0.0))
        a = _lib.MhaArgs()
        a.training = 7
        _lib.fn("attn_mha_args_init")(ctypes.byref(a))
        self.assertEqual((a.need_weights, a.average_attn_weights, a.training, a.causal), (1, 1, 0, 0))
        self.assertEqual(ctypes.sizeof(_lib.Generator), 2520)
        self.assertEqual(ctypes.sizeof(_lib.SdpaDesc), 360)  # sizeof(attn_sdpa_desc) on x86-64
        self.assertEqual(_lib.SdpaDesc.sinks.offset, 352)  # the last field
        d = _lib.SdpaDesc()
        d.sinks = 1234
        _lib.fn("attn_sdpa_desc_init")(ctypes.byref(d))
        self.assertIsNone(d.sinks)

    def test_status_names(self):
        # every status the library has a description for has its name here, and no other
        for code in range(64):
            known = _lib.fn("attn_strerror")(code).decode() != "unknown status"
            self.assertEqual(code in _lib.STATUS_NAMES, known, "status %d" % code)

    def test_isa_names(self):
        # the binding's ISA names are the library's (attn_isa_name), value for value, and no other
        for code in range(64):
            name = _lib.fn("attn_isa_name")(code).decode()
            if name == "?":
                self.assertNotIn(code, _lib.ISA.values(), "isa %d" % code)
            else:
                self.assertEqual(_lib.ISA.get(name), code, "isa %d (%s)" % (code, name))
        self.assertEqual(len(_lib.ISA), sum(_lib.fn("attn_isa_name")(c).decode() != "?" for c in range(64)))

    def test_version_and_queries(self):
        self.assertRegex(attn.__version__, r"^\d+\.\d+\.\d+$")
        self.assertGreaterEqual(attn.version_number(), 100)
        self.assertTrue(attn.isa_supported("ref"))
        self.assertIn(attn.default_context().isa,
                      ("ref", "generic", "avx2", "avx512", "avx512vnni", "avx512bf16", "amxbf16"))
        self.assertIsInstance(attn.has_blas(), bool)

    def test_missing_symbol(self):
        self.assertTrue(attn.has_symbol("attn_sdpa_fwd"))
        self.assertFalse(attn.has_symbol("attn_no_such_function"))
        with self.assertRaises(attn.AttnError) as cm:
            _lib.fn("attn_no_such_function")
        self.assertEqual(cm.exception.name, "ATTN_ERR_UNSUPPORTED")

    def test_bfloat16_conversion(self):
        x = np.array([1.0, -2.5, 1.00390625, 3.4e38, np.inf, 1e-40], dtype=np.float32)
        bits = attn.to_bfloat16(x)
        self.assertEqual(bits.dtype, np.uint16)
        if HAVE_TORCH:
            want = torch.from_numpy(x).bfloat16().view(torch.int16).numpy().view(np.uint16)
            np.testing.assert_array_equal(bits, want)
        back = attn.from_bfloat16(bits)
        np.testing.assert_array_equal(attn.to_bfloat16(back), bits)


class TestContext(unittest.TestCase):
    def test_context_manager_and_close(self):
        with attn.Context(threads=2, seed=5) as c:
            self.assertEqual(c.threads, 2)
            self.assertTrue(repr(c).startswith("Context("))
        with self.assertRaises(attn.AttnError) as cm:
            attn.sdpa(np.ones((1, 1, 1, 1), np.float32), np.ones((1, 1, 1, 1), np.float32),
                      np.ones((1, 1, 1, 1), np.float32), ctx=c)
        self.assertIn("closed", str(cm.exception))
        c.close()  # twice is fine

    def test_bad_isa(self):
        with self.assertRaises(attn.AttnError) as cm:
            attn.Context(isa="sse9")
        self.assertEqual(cm.exception.name, "ATTN_ERR_INVALID_ARG")
        for isa in ("avx2", "avx512", "avx512vnni", "avx512bf16", "amxbf16"):
            if not attn.isa_supported(isa):
                with self.assertRaises(attn.AttnError) as cm:
                    attn.Context(isa=isa)
                self.assertEqual(cm.exception.name, "ATTN_ERR_UNSUPPORTED")

    def test_rng_state(self):
        c = attn.Context(seed=1)
        c.manual_seed(42)
        st = c.rng_state()
        q = np.ones((1, 1, 4, 2), np.float32)
        a = attn.sdpa(q, q, q, dropout_p=0.5, ctx=c)
        b = attn.sdpa(q, q, q, dropout_p=0.5, ctx=c)
        c.set_rng_state(st)
        np.testing.assert_array_equal(attn.sdpa(q, q, q, dropout_p=0.5, ctx=c), a)
        self.assertFalse(np.array_equal(a, b))


    def test_openmp(self):  # a context's threads on the OpenMP runtime loaded in the process
        rng = np.random.default_rng(4)
        q, k, v = randn(rng, 2, 4, 128, 32), randn(rng, 2, 4, 128, 32), randn(rng, 2, 4, 128, 32)
        one = attn.Context(threads=1)
        want, lse = attn.sdpa(q, k, v, causal="top_left", return_lse=True, ctx=one)
        dwant = attn.sdpa_backward(q, k, v, want, want, lse, causal="top_left", ctx=one)
        with self.assertRaises(attn.AttnTypeError):
            attn.Context(threads=2, openmp=3)
        with self.assertRaises(attn.AttnError) as cm:
            attn.Context(threads=2, openmp="/nonexistent/libgomp.so.1")
        self.assertEqual(cm.exception.name, "ATTN_ERR_UNSUPPORTED")
        self.assertIsNone(attn.Context(threads=2).openmp)
        if attn.openmp_runtime() is None:  # none loaded: load GCC's, where there is one
            name = ctypes.util.find_library("gomp")
            if name is None:
                with self.assertRaises(attn.AttnError):
                    attn.Context(threads=2, openmp=True)
                self.skipTest("no OpenMP runtime loaded or installed")
            ctypes.CDLL(name)
        path = attn.openmp_runtime()
        self.assertIsNotNone(path)
        with attn.Context(threads=3, openmp=True) as c:
            self.assertEqual(c.openmp, path)
            self.assertIn("openmp=", repr(c))
            np.testing.assert_array_equal(attn.sdpa(q, k, v, causal="top_left", ctx=c), want)
            for a, b in zip(attn.sdpa_backward(q, k, v, want, want, lse, causal="top_left", ctx=c), dwant):
                np.testing.assert_array_equal(a, b)

    def test_threads_with_their_own_contexts(self):
        import threading
        rng = np.random.default_rng(9)
        q, k, v = randn(rng, 2, 4, 64, 32), randn(rng, 2, 4, 64, 32), randn(rng, 2, 4, 64, 32)
        want = attn.sdpa(q, k, v, causal="top_left")
        results = [None] * 4

        def work(i):  # each thread uses its own default context
            results[i] = [attn.sdpa(q, k, v, causal="top_left") for _ in range(5)]

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in results:
            for a in r:
                np.testing.assert_array_equal(a, want)


class TestSdpa(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(1)

    def test_forward_matches_reference(self):
        for name, B, H, Hkv, L, S, D, Dv, opts in configs(self.rng):
            with self.subTest(name):
                q, k, v = randn(self.rng, B, H, L, D), randn(self.rng, B, Hkv, S, D), randn(self.rng, B, Hkv, S, Dv)
                out, lse, w = attn.sdpa(q, k, v, return_lse=True, return_weights="per_head", **lib_opts(opts))
                ro, rl, rw = ref_sdpa(q, k, v, **opts)
                self.assertEqual(out.shape, (B, H, L, Dv))
                self.assertEqual(out.dtype, np.float32)
                close(self, out, ro, what=name)
                close(self, lse, rl, what=name)
                close(self, w, rw, what=name)
                avg = attn.sdpa(q, k, v, return_weights="average", **lib_opts(opts))[1]
                close(self, avg, rw.mean(1), what=name)

    def test_fully_masked_row(self):
        q, k, v = randn(self.rng, 1, 2, 3, 4), randn(self.rng, 1, 2, 5, 4), randn(self.rng, 1, 2, 5, 4)
        mask = np.zeros((3, 5), bool)
        mask[1] = True
        out, lse = attn.sdpa(q, k, v, mask=mask, return_lse=True)
        np.testing.assert_array_equal(out[:, :, 1], 0.0)
        self.assertTrue(np.all(np.isneginf(lse[:, :, 1])))
        self.assertTrue(np.all(np.isfinite(out)))

    def test_sinks(self):
        # sinks are per head and matter: another sink (or none) gives another output; -inf is no
        # sink at all (the same bits); a row with every key masked gives zeros and lse = its sink;
        # torch's formula (the sink as a column of the scores, softmax, the column dropped)
        B, H, Hkv, L, S, D = 2, 4, 2, 5, 6, 8
        q, k, v = randn(self.rng, B, H, L, D), randn(self.rng, B, Hkv, S, D), randn(self.rng, B, Hkv, S, D)
        z = np.array([1.0, -2.0, 0.5, 4.0], np.float32)
        mask = np.zeros((L, S), bool)
        mask[3] = True
        out, lse, w = attn.sdpa(q, k, v, mask=mask, sinks=z, return_lse=True, return_weights="per_head")
        plain = attn.sdpa(q, k, v, mask=mask)
        np.testing.assert_array_equal(attn.sdpa(q, k, v, mask=mask, sinks=np.full(H, -np.inf)), plain)
        for other in (z[::-1], z + 1, np.zeros(H)):
            self.assertGreater(np.abs(attn.sdpa(q, k, v, mask=mask, sinks=other) - out).max(), 1e-3)
        self.assertGreater(np.abs(plain - out).max(), 1e-3)
        np.testing.assert_array_equal(out[:, :, 3], 0.0)
        close(self, lse[:, :, 3], np.broadcast_to(z, (B, H)))
        rows = np.delete(w.sum(-1), 3, axis=2)
        self.assertTrue(np.all(rows < 1) and np.all(rows > 0))
        if HAVE_TORCH:
            s = torch.from_numpy(q).double() @ torch.from_numpy(rep(k, H)).transpose(-1, -2) / D ** 0.5
            s = s.masked_fill(torch.from_numpy(mask), float("-inf"))
            zz = torch.from_numpy(z).double().view(1, H, 1, 1).expand(B, H, L, 1)
            p = torch.cat([s, zz], -1).softmax(-1)[..., :-1]
            close(self, out, (p @ torch.from_numpy(rep(v, H))).numpy(), what="torch's formula")
        # the gradient (the sinks given as a list), against finite differences of the reference
        dout = randn(self.rng, *out.shape)
        dq, dk, dv, dz = attn.sdpa_backward(q, k, v, out, dout, lse, mask=mask, sinks=list(z), return_dsinks=True)
        close(self, dz, ref_dsinks(q, k, v, dout, sinks=z, mask=mask), rtol=1e-4, atol=5e-5)
        with attn.Context(isa="ref") as c:
            close(self, attn.sdpa(q, k, v, mask=mask, sinks=z, ctx=c), out, rtol=1e-5, atol=1e-6,
                  what="the reference kernels")

    def test_half_precision_kv(self):
        q, k, v = randn(self.rng, 2, 4, 3, 16), randn(self.rng, 2, 2, 9, 16), randn(self.rng, 2, 2, 9, 8)
        k16, v16 = k.astype(np.float16), v.astype(np.float16)
        out = attn.sdpa(q, k16, v16, causal="bottom_right")
        close(self, out, ref_sdpa(q, k16.astype(np.float64), v16.astype(np.float64), causal="bottom_right")[0])
        kb, vb = attn.to_bfloat16(k), attn.to_bfloat16(v)
        out = attn.sdpa(q, kb, vb, kv_dtype="bf16")
        close(self, out, ref_sdpa(q, attn.from_bfloat16(kb), attn.from_bfloat16(vb))[0])
        dq, dk, dv = attn.sdpa_backward(q, k16, v16, *attn.sdpa(q, k16, v16, return_lse=True)[:1],
                                        np.ones_like(out), attn.sdpa(q, k16, v16, return_lse=True)[1])
        self.assertEqual((dk.dtype, dk.shape), (np.float32, k.shape))
        with self.assertRaises(attn.AttnError):
            attn.sdpa(q, kb, vb)  # uint16 without kv_dtype="bf16"
        # mixed float16 / float32 k and v: refused (torch's ops refuse them too)
        with self.assertRaises(TypeError):
            attn.sdpa(q, k16, v)

    def test_strides(self):
        B, L, H, D = 2, 6, 4, 8
        qkv = randn(self.rng, B, L, 3, H, D)  # a packed projection, (B, L, 3, H, D)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        self.assertFalse(q.flags.c_contiguous)
        want = attn.sdpa(*(np.ascontiguousarray(x) for x in (q, k, v)), causal="top_left")
        np.testing.assert_array_equal(attn.sdpa(q, k, v, causal="top_left"), want)
        # negative strides: copied
        qr = np.ascontiguousarray(q[:, :, ::-1])[:, :, ::-1]
        np.testing.assert_array_equal(attn.sdpa(qr, k, v, causal="top_left"), want)
        # strides that are not whole floats (a float32 field of a packed record): copied
        rec = np.zeros(q.shape, dtype=np.dtype([("x", "<f4"), ("pad", "<i2")]))
        rec["x"] = q
        self.assertEqual(rec["x"].strides[-1], 6)
        np.testing.assert_array_equal(attn.sdpa(rec["x"], k, v, causal="top_left"), want)
        # broadcast k and v over the batch (stride 0)
        kb = np.broadcast_to(k[:1], k.shape)
        vb = np.broadcast_to(v[:1], v.shape)
        np.testing.assert_array_equal(attn.sdpa(q, kb, vb), attn.sdpa(q, np.ascontiguousarray(kb),
                                                                      np.ascontiguousarray(vb)))
        # float64 input is converted
        close(self, attn.sdpa(q.astype(np.float64), k, v, causal="top_left"), want, rtol=0, atol=0)
        # backward through strided views gives the contiguous results
        out, lse = attn.sdpa(q, k, v, return_lse=True)
        dout = randn(self.rng, *out.shape)
        g1 = attn.sdpa_backward(q, k, v, out, dout, lse)
        g2 = attn.sdpa_backward(*(np.ascontiguousarray(x) for x in (q, k, v)), out, dout, lse)
        for a, b in zip(g1, g2):
            np.testing.assert_array_equal(a, b)
        g3 = attn.sdpa_backward(q, kb, vb, *attn.sdpa(q, kb, vb, return_lse=True)[:1], dout,
                                attn.sdpa(q, kb, vb, return_lse=True)[1])
        self.assertEqual(g3[1].shape, k.shape)

    def test_every_isa_and_thread_count(self):
        q, k, v = randn(self.rng, 2, 4, 33, 16), randn(self.rng, 2, 2, 40, 16), randn(self.rng, 2, 2, 40, 16)
        ro = ref_sdpa(q, k, v, causal="bottom_right")[0]
        for isa in ("ref", "generic", "avx2", "avx512", "avx512vnni", "avx512bf16", "amxbf16"):
            if not attn.isa_supported(isa):
                continue
            with self.subTest(isa):
                with attn.Context(isa=isa) as c1, attn.Context(isa=isa, threads=3) as c3:
                    a = attn.sdpa(q, k, v, causal="bottom_right", ctx=c1)
                    close(self, a, ro, what=isa)
                    np.testing.assert_array_equal(attn.sdpa(q, k, v, causal="bottom_right", ctx=c3), a)

    def test_backward_matches_reference(self):
        for name, B, H, Hkv, L, S, D, Dv, opts in configs(self.rng):
            with self.subTest(name):
                q, k, v = randn(self.rng, B, H, L, D), randn(self.rng, B, Hkv, S, D), randn(self.rng, B, Hkv, S, Dv)
                out, lse = attn.sdpa(q, k, v, return_lse=True, **lib_opts(opts))
                dout = randn(self.rng, *out.shape)
                mask = opts.get("mask")
                want_dmask = mask is not None and mask.dtype != bool
                want_dsinks = "sinks" in opts
                got = attn.sdpa_backward(q, k, v, out, dout, lse, return_dmask=want_dmask, return_dsinks=want_dsinks,
                                         **lib_opts(opts))
                self.assertEqual(len(got), 3 + want_dmask + want_dsinks)
                rq, rk, rv, rds = ref_sdpa_backward(q, k, v, dout, **opts)
                for g, r, n in zip(got, (rq, rk, rv), "qkv"):
                    close(self, g, r, rtol=1e-4, atol=5e-5, what="%s d%s" % (name, n))
                if want_dmask:
                    self.assertEqual(got[3].shape, mask.shape)
                    close(self, got[3], sum_to(rds, mask.shape), atol=5e-5, what=name + " dmask")
                if want_dsinks:
                    self.assertEqual((got[-1].shape, got[-1].dtype), ((H,), np.float32))
                    close(self, got[-1], ref_dsinks(q, k, v, dout, **opts), rtol=1e-4, atol=5e-5, what=name + " dsinks")

    def test_dropout_needs_state(self):
        q = randn(self.rng, 1, 1, 3, 4)
        out, lse = attn.sdpa(q, q, q, dropout_p=0.2, return_lse=True)
        with self.assertRaises(attn.AttnError) as cm:
            attn.sdpa_backward(q, q, q, out, out, lse, dropout_p=0.2)
        self.assertIn("dropout_state", cm.exception.message)

    def test_philox_dropout(self):
        # The weights output shows the mask; the forward is p' v with it, the backward regenerates it
        # (no dropout_state), the context's generator is untouched, and the mask is the same on every
        # thread count and for the same (seed, offset) only.
        B, H, Hkv, L, S, D, p = 2, 4, 2, 7, 9, 8, 0.3
        q, k, v = randn(self.rng, B, H, L, D), randn(self.rng, B, Hkv, S, D), randn(self.rng, B, Hkv, S, D)
        rng = attn.Philox(seed=2 ** 40 + 3, offset=11)
        with attn.Context(threads=1) as c1, attn.Context(threads=3) as c3:
            before = c1.rng_state()
            out, lse, w = attn.sdpa(q, k, v, causal="top_left", dropout_p=p, dropout_rng=rng, return_lse=True,
                                    return_weights="per_head", ctx=c1)
            self.assertEqual(bytes(before._gen), bytes(c1.rng_state()._gen))
            out3 = attn.sdpa(q, k, v, causal="top_left", dropout_p=p, dropout_rng=rng, ctx=c3)
            np.testing.assert_array_equal(out3, attn.sdpa(q, k, v, causal="top_left", dropout_p=p, dropout_rng=rng, ctx=c1))
            close(self, out3, out, atol=1e-6, what="fused kernels against the weights' path")
            other = attn.sdpa(q, k, v, causal="top_left", dropout_p=p, dropout_rng=attn.Philox(2 ** 40 + 3, 12),
                              return_weights="per_head", ctx=c1)[1]
            self.assertFalse(np.array_equal(other != 0, w != 0))
            ro, _, rp = ref_sdpa(q, k, v, causal="top_left")
            keep = (w != 0) & (rp > 0)
            self.assertTrue(0.5 < keep.sum() / (rp > 0).sum() < 0.9)
            scale = float(np.float32(1) / np.float32(1 - p))
            pd = np.where(keep, rp * scale, 0.0)
            close(self, w, pd, atol=1e-6, what="weights")
            close(self, out, pd @ rep(v, H), atol=1e-5, what="out")
            dout = randn(self.rng, *out.shape)
            dq, dk, dv = attn.sdpa_backward(q, k, v, out, dout, lse, causal="top_left", dropout_p=p, dropout_rng=rng,
                                            ctx=c3)
            rdv = (pd.transpose(0, 1, 3, 2) @ np.asarray(dout, np.float64)).reshape(B, Hkv, H // Hkv, S, D).sum(2)
            close(self, dv, rdv, atol=1e-5, what="dv")
        with self.assertRaises(attn.AttnError):
            attn.Philox(-1)
        with self.assertRaises(attn.AttnError):
            attn.Philox(1, 2 ** 32)
        with self.assertRaises(TypeError):
            attn.sdpa(q, k, v, dropout_p=p, dropout_rng=123)

    def test_errors(self):
        q, k, v = randn(self.rng, 2, 4, 3, 8), randn(self.rng, 2, 2, 5, 8), randn(self.rng, 2, 2, 5, 8)
        cases = [
            (lambda: attn.sdpa(q, k[..., :4], v), "ATTN_ERR_BAD_SHAPE", "k has shape (2, 2, 5, 4)"),
            (lambda: attn.sdpa(q[0], k, v), "ATTN_ERR_BAD_SHAPE", "q must have 4 dimensions"),
            (lambda: attn.sdpa(q, k, v[:, :, :4]), "ATTN_ERR_BAD_SHAPE", "v has shape"),
            (lambda: attn.sdpa(q[:, :3], k, v), "ATTN_ERR_BAD_SHAPE", "not a multiple of n_kv_heads"),
            (lambda: attn.sdpa(q, k, v, mask=np.zeros((4, 5), bool)), "ATTN_ERR_BAD_MASK", "does not broadcast"),
            (lambda: attn.sdpa(q, k, v, key_padding_mask=np.zeros((3, 5), bool)), "ATTN_ERR_BAD_MASK", "(2, 5)"),
            (lambda: attn.sdpa(q, k, v, causal="diagonal"), "ATTN_ERR_INVALID_ARG", "causal"),
            (lambda: attn.sdpa(q, k, v, dropout_p=1.5), "ATTN_ERR_INVALID_ARG", "dropout"),
            (lambda: attn.sdpa(q, k, v, alibi_slopes=[1.0]), "ATTN_ERR_BAD_SHAPE", "alibi_slopes"),
            (lambda: attn.sdpa(q, k, v, sinks=np.zeros(3)), "ATTN_ERR_BAD_SHAPE", "sinks has shape (3,)"),
            (lambda: attn.sdpa_backward(q, k, v, q, q, np.zeros((2, 4, 3), np.float32), return_dsinks=True),
             "ATTN_ERR_INVALID_ARG", "return_dsinks needs"),
            (lambda: attn.sdpa(q, k, v, softcap=-1.0), "ATTN_ERR_INVALID_ARG", "softcap"),
            (lambda: attn.sdpa(q, k, v, return_weights="sum"), "ATTN_ERR_INVALID_ARG", "return_weights"),
            (lambda: attn.sdpa_backward(q, k, v, q, q[:, :, :2], np.zeros((2, 4, 3), np.float32)),
             "ATTN_ERR_BAD_SHAPE", "dout"),
        ]
        assert_errors(self, cases)


# ---- the autograd wrapper -------------------------------------------------------------------------

if HAVE_TORCH:
    class AttnSDPA(torch.autograd.Function):
        """attn.sdpa as a torch op: the forward calls the library's forward, the backward its backward
        (with the forward's generator state, so dropout is replayed). mask may be a float tensor that
        requires grad."""

        @staticmethod
        def forward(fctx, q, k, v, mask, opts):
            actx = opts.get("ctx") or attn.default_context()
            state = actx.rng_state()
            m = None if mask is None else mask.detach().numpy()
            out, lse = attn.sdpa(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), mask=m,
                                 return_lse=True, **opts)
            out, lse = torch.from_numpy(out), torch.from_numpy(lse)
            fctx.save_for_backward(q, k, v, out, lse)
            fctx.mask, fctx.opts, fctx.state = mask, opts, state
            return out

        @staticmethod
        def backward(fctx, dout):
            q, k, v, out, lse = fctx.saved_tensors
            mask = fctx.mask
            want_dmask = mask is not None and mask.is_floating_point() and fctx.needs_input_grad[3]
            g = attn.sdpa_backward(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), out.numpy(),
                                   dout.numpy(), lse.numpy(), mask=None if mask is None else mask.detach().numpy(),
                                   dropout_state=fctx.state, return_dmask=want_dmask, **fctx.opts)
            dmask = torch.from_numpy(g[3]) if want_dmask else None
            return torch.from_numpy(g[0]), torch.from_numpy(g[1]), torch.from_numpy(g[2]), dmask, None

    def torch_reference(q, k, v, mask=None, causal=None, dropout_p=0.0, seed=0, softcap=0.0):
        """The textbook expression in torch ops (float64 leaves): GQA by repeat_interleave, F.dropout's
        draws (torch.manual_seed(seed)) as a bernoulli mask."""
        B, H, L, D = q.shape
        S = k.shape[2]
        kr, vr = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // v.shape[1], 1)
        s = (q @ kr.transpose(-1, -2)) / D ** 0.5
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        if causal:
            off = S - L if causal == "bottom_right" else 0
            hidden = torch.arange(S).view(1, S) > torch.arange(L).view(L, 1) + off
            s = s.masked_fill(hidden, float("-inf"))
        if mask is not None:
            s = s.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        w = torch.softmax(s, dim=-1)
        if dropout_p:
            torch.manual_seed(seed)
            keep = torch.empty(B, H, L, S).bernoulli_(1 - dropout_p)
            w = w * keep.double() * float(torch.tensor(1.0) / torch.tensor(1 - dropout_p, dtype=torch.float32))
        return w @ vr


@needs_torch
class TestAutograd(unittest.TestCase):
    def check(self, B, H, Hkv, L, S, D, Dv, mask=None, **opts):
        gen = torch.Generator().manual_seed(B * 100 + L * 10 + S)
        q, k, v = torch.randn(B, H, L, D, generator=gen), torch.randn(B, Hkv, S, D, generator=gen), \
            torch.randn(B, Hkv, S, Dv, generator=gen)
        wout = torch.randn(B, H, L, Dv, generator=gen)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fmask = mask is not None and mask.is_floating_point()
        m = mask.clone().requires_grad_() if fmask else mask
        seed = opts.pop("seed", 0)
        actx = attn.Context(seed=seed)
        out = AttnSDPA.apply(*leaves, m, dict(opts, ctx=actx))
        (out * wout).sum().backward()
        ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
        rm = mask.double().requires_grad_() if fmask else mask
        ref = torch_reference(*ref_leaves, mask=rm, seed=seed, **opts)
        (ref * wout.double()).sum().backward()
        close(self, out.detach(), ref.detach(), rtol=1e-5, atol=1e-5, what="out")
        for a, b, n in zip(leaves + ([m] if fmask else []), ref_leaves + ([rm] if fmask else []), "qkvm"):
            close(self, a.grad, b.grad, rtol=1e-4, atol=1e-5, what="d" + n)

    def test_plain(self):
        self.check(2, 4, 4, 5, 7, 8, 8)

    def test_gqa_causal_dv(self):
        self.check(2, 6, 2, 6, 6, 16, 4, causal="top_left")

    def test_bottom_right_bool_mask(self):
        self.check(1, 2, 1, 3, 9, 8, 8, causal="bottom_right", mask=torch.rand(3, 9) < 0.2)

    def test_float_mask_gradient(self):
        self.check(2, 2, 2, 4, 5, 8, 8, mask=torch.randn(2, 1, 4, 5))

    def test_softcap(self):
        self.check(1, 2, 2, 4, 6, 8, 8, softcap=2.0)

    def test_dropout(self):
        self.check(2, 2, 1, 5, 6, 4, 4, dropout_p=0.3, seed=123)

    def test_gradcheck(self):
        gen = torch.Generator().manual_seed(0)
        leaves = [torch.randn(1, 2, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]

        def f(q, k, v):
            return AttnSDPA.apply(q.float(), k.float(), v.float(), None, {"causal": "top_left"}).double()

        self.assertTrue(torch.autograd.gradcheck(f, leaves, eps=1e-3, atol=2e-3, rtol=2e-2))

    def test_dout_not_contiguous(self):
        q = torch.randn(1, 2, 3, 4, requires_grad=True)
        out = AttnSDPA.apply(q, q.detach(), q.detach(), None, {})
        out.sum().backward()  # dout is an expanded tensor (stride 0)
        ref_q = q.detach().double().requires_grad_()
        torch_reference(ref_q, q.detach().double(), q.detach().double()).sum().backward()
        close(self, q.grad, ref_q.grad, atol=1e-5)


# ---- MHA ----------------------------------------------------------------------------------------

def ref_mha(state, x, H, causal=False):
    """Self-attention nn.MultiheadAttention on x (L, N, E) in float64 (packed in_proj)."""
    L, N, E = x.shape
    W, b = state["in_proj_weight"].astype(np.float64), state["in_proj_bias"].astype(np.float64)
    qkv = x.astype(np.float64) @ W.T + b
    q, k, v = (qkv[..., i * E:(i + 1) * E].reshape(L, N, H, E // H).transpose(1, 2, 0, 3) for i in range(3))
    o = ref_sdpa(q, k, v, causal="top_left" if causal else None)[0]
    o = o.transpose(2, 0, 1, 3).reshape(L, N, E)
    return o @ state["out_proj.weight"].astype(np.float64).T + state["out_proj.bias"]


class TestMHA(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(2)
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def test_numpy_reference_and_parameters(self):
        E, H = 12, 3
        c = attn.Context(seed=7)
        m = attn.MHA(E, H, ctx=c)
        names = [n for n, _ in m.named_parameters()]
        self.assertEqual(names, ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"])
        # torch initialises in_proj_bias and out_proj.bias to 0: give them values
        params = dict(m.named_parameters())
        params["in_proj_bias"][...] = randn(self.rng, 3 * E)
        params["out_proj.bias"][...] = randn(self.rng, E)
        x = randn(self.rng, 5, 2, E)
        out, w = m(x, x, x, causal=True)
        close(self, out, ref_mha(m.state_dict(), x, H, causal=True), atol=1e-5)
        self.assertEqual(w.shape, (2, 5, 5))
        np.testing.assert_array_equal(np.triu(w[0], 1), 0)
        out2, none = m(x, need_weights=False, causal=True)  # key = value = query
        self.assertIsNone(none)
        close(self, out2, out, rtol=0, atol=1e-6)
        # the state dict round trip through the library's safetensors writer and reader
        path = os.path.join(self.tmp.name, "m.safetensors")
        m.save_safetensors(path)
        sd = attn.load_safetensors(path)
        self.assertEqual(list(sd), names)
        for n, a in m.state_dict().items():
            np.testing.assert_array_equal(sd[n], a)
        m2 = attn.MHA.from_safetensors(path, H)
        np.testing.assert_array_equal(m2(x, causal=True)[0], out)
        m3 = attn.MHA.from_state_dict(sd, H)
        np.testing.assert_array_equal(m3(x, causal=True)[0], out)
        # state_dict() is a copy, parameters() are views
        sd0 = m.state_dict()
        m.parameters()[0][...] = 0
        self.assertFalse(np.any(m.state_dict()["in_proj_weight"]))
        m.load_state_dict(sd0)
        np.testing.assert_array_equal(m(x, causal=True)[0], out)

    def test_errors(self):
        E, H = 8, 2
        m = attn.MHA(E, H)
        x = randn(self.rng, 4, 2, E)
        cases = [
            (lambda: m(x[..., :6]), "ATTN_ERR_BAD_SHAPE", "query has shape"),
            (lambda: m(x, x[:, :1], x[:, :1]), "ATTN_ERR_BAD_SHAPE", "key has shape"),
            (lambda: m(x, attn_mask=np.zeros((3, 4), bool)), "ATTN_ERR_BAD_SHAPE", "attn_mask"),
            (lambda: m(x, key_padding_mask=np.zeros((2, 3), bool)), "ATTN_ERR_BAD_MASK", "key_padding_mask"),
            (lambda: m(x, attn_mask=np.zeros((4, 4), bool), causal=True), "ATTN_ERR_INVALID_ARG", "causal"),
            (lambda: attn.MHA(10, 3), "ATTN_ERR_BAD_SHAPE", "num_heads"),
            (lambda: attn.MHA.from_safetensors(os.path.join(self.tmp.name, "missing.safetensors"), 2),
             "ATTN_ERR_IO", "missing.safetensors"),
            (lambda: attn.MHA.from_state_dict(dict(m.state_dict(), extra=np.zeros(1, np.float32)), H),
             "ATTN_ERR_INVALID_ARG", "extra"),
            (lambda: attn.MHA.from_state_dict({"in_proj_weight": np.zeros((24, 8), np.float32)}, H),
             "ATTN_ERR_NOT_FOUND", "out_proj.weight"),
        ]
        assert_errors(self, cases)

    @needs_torch
    def test_same_weights_as_torch_after_the_same_seed(self):
        for kw in ({}, {"kdim": 5, "vdim": 3, "add_bias_kv": True}, {"bias": False}):
            with self.subTest(str(kw)):
                torch.manual_seed(11)
                tm = torch.nn.MultiheadAttention(8, 2, **kw)
                c = attn.Context()
                c.manual_seed(11)
                m = attn.MHA(8, 2, ctx=c, **kw)
                sd = m.state_dict()
                self.assertEqual(list(sd), list(tm.state_dict()))
                for n, t in tm.state_dict().items():
                    np.testing.assert_array_equal(sd[n], t.numpy(), err_msg=n)

    @needs_torch
    @unittest.skipIf(tensorfile is None, "tests/py/tensorfile.py not found")
    def test_forward_matches_torch(self):
        gen = torch.Generator().manual_seed(3)
        cases = [
            dict(name="self", kw={}, self_attn=True),
            dict(name="self_batch_first_causal", kw={"batch_first": True}, self_attn=True, causal=True),
            dict(name="cross_kvdim_bias_kv", kw={"kdim": 6, "vdim": 5, "add_bias_kv": True}),
            dict(name="cross_masks", kw={}, attn_mask="float", kpm=True),
            dict(name="self_bool_mask_per_head", kw={"bias": False}, self_attn=True, attn_mask="bool3",
                 average=False),
            dict(name="unbatched", kw={}, unbatched=True, kpm=True),
            dict(name="zero_attn", kw={"add_zero_attn": True}, self_attn=True),
        ]
        E, H, L, S, N = 8, 2, 5, 6, 3
        for c in cases:
            with self.subTest(c["name"]):
                torch.manual_seed(5)
                tm = torch.nn.MultiheadAttention(E, H, **c["kw"]).eval()
                with torch.no_grad():  # give the zero-initialised biases values
                    for n, p in tm.named_parameters():
                        if "bias" in n:
                            p.copy_(torch.randn(p.shape, generator=gen))
                path = os.path.join(self.tmp.name, c["name"] + ".safetensors")
                tensorfile.write_safetensors(path, {n: t.numpy() for n, t in tm.state_dict().items()})
                bf = c["kw"].get("batch_first", False)
                m = attn.MHA.from_safetensors(path, H, batch_first=bf, add_zero_attn=c["kw"].get("add_zero_attn", False))
                kdim, vdim = c["kw"].get("kdim", E), c["kw"].get("vdim", E)
                Sx = L if c.get("self_attn") else S
                if c.get("unbatched"):
                    q, k, v = (torch.randn(L, E, generator=gen), torch.randn(S, kdim, generator=gen),
                               torch.randn(S, vdim, generator=gen))
                else:
                    def shaped(n, d):
                        return torch.randn(N, n, d, generator=gen) if bf else torch.randn(n, N, d, generator=gen)
                    q, k, v = shaped(L, E), shaped(S, kdim), shaped(S, vdim)
                if c.get("self_attn"):
                    k = v = q
                mask = None
                if c.get("attn_mask") == "float":
                    mask = torch.randn(L, Sx, generator=gen)
                elif c.get("attn_mask") == "bool3":
                    mask = torch.rand(N * H, L, Sx, generator=gen) < 0.3
                    mask[..., 0] = False  # no fully masked rows (torch 1.13 gives NaN there)
                elif c.get("causal"):
                    mask = torch.triu(torch.ones(L, Sx, dtype=torch.bool), 1)
                kpm = None
                if c.get("kpm"):
                    kpm = torch.rand(Sx, generator=gen) < 0.3 if c.get("unbatched") else \
                        torch.rand(N, Sx, generator=gen) < 0.3
                    kpm[..., 1] = False
                avg = c.get("average", True)
                with torch.no_grad():
                    to, tw = tm(q, k, v, key_padding_mask=kpm, attn_mask=mask, need_weights=True,
                                average_attn_weights=avg)
                qn = q.numpy()
                kn = qn if k is q else k.numpy()
                vn = qn if v is q else v.numpy()
                out, w = m(qn, kn, vn, None if kpm is None else kpm.numpy(),
                           attn_mask=None if mask is None or c.get("causal") else mask.numpy(),
                           causal=bool(c.get("causal")), average_attn_weights=avg)
                close(self, out, to.numpy(), rtol=1e-5, atol=1e-5, what="out")
                close(self, w, tw.numpy(), rtol=1e-5, atol=1e-5, what="weights")
                out_nw, w_nw = m(qn, kn, vn, None if kpm is None else kpm.numpy(),
                                 attn_mask=None if mask is None or c.get("causal") else mask.numpy(),
                                 causal=bool(c.get("causal")), need_weights=False)
                self.assertIsNone(w_nw)
                close(self, out_nw, to.numpy(), rtol=1e-5, atol=1e-5, what="out without weights")


# ---- KV cache -----------------------------------------------------------------------------------

@needs_kv_cache
class TestMHALowPrecision(unittest.TestCase):
    """MHA(dtype="f16" / "bf16"): parameters, inputs and outputs of the type (bfloat16 as uint16 bits),
    against the float32 module holding the same values."""

    def check(self, dtype, unit):
        ctx = attn.Context(seed=3)
        m16 = attn.MHA(16, 4, batch_first=True, dtype=dtype, ctx=ctx)
        self.assertEqual(m16.dtype, dtype)
        npt = np.float16 if dtype == "f16" else np.uint16
        widen = (lambda a: a.astype(np.float32)) if dtype == "f16" else attn.from_bfloat16
        narrow = (lambda a: a.astype(np.float16)) if dtype == "f16" else attn.to_bfloat16
        params = m16.state_dict()
        self.assertTrue(all(a.dtype == npt for a in params.values()))
        m32 = attn.MHA.from_state_dict({k: widen(v) for k, v in params.items()}, 4, batch_first=True, ctx=ctx)
        x = narrow(np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32))
        out, w = m16(x, x, x)
        self.assertEqual(out.dtype, npt)
        self.assertEqual(w.dtype, npt)
        out32, w32 = m32(widen(x), widen(x), widen(x))
        scale = float(np.abs(out32).max())
        self.assertLess(float(np.abs(widen(out) - out32).max()), 8 * unit * scale)
        self.assertLess(float(np.abs(widen(w) - w32).max()), 8 * unit)
        # a float32 query is refused for a bfloat16 module (its bits are uint16)
        if dtype == "bf16":
            with self.assertRaises(attn.AttnError):
                m16(widen(x))
        # float32 state rounded to the type on load
        m = attn.MHA.from_state_dict({k: widen(v) for k, v in params.items()}, 4, batch_first=True, dtype=dtype,
                                     ctx=ctx)
        for k, v in m.state_dict().items():
            np.testing.assert_array_equal(v, params[k])

    def test_f16(self):
        self.check("f16", 2.0 ** -11)

    def test_bf16(self):
        self.check("bf16", 2.0 ** -8)


class TestKVCache(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(4)

    def test_decode_matches_full_causal_attention(self):
        B, H, Hkv, D, Dv, T, P = 2, 4, 2, 16, 8, 12, 5
        q, k, v = randn(self.rng, B, H, T, D), randn(self.rng, B, Hkv, T, D), randn(self.rng, B, Hkv, T, Dv)
        for dtype in ("f32", "f16", "bf16"):
            with self.subTest(dtype):
                if dtype == "f32":
                    ks, vs = k, v
                elif dtype == "f16":
                    ks, vs = k.astype(np.float16), v.astype(np.float16)
                else:
                    ks, vs = attn.to_bfloat16(k), attn.to_bfloat16(v)
                full = attn.sdpa(q, ks, vs, causal="bottom_right", kv_dtype=None if dtype != "bf16" else "bf16")
                cache = attn.KVCache(B, Hkv, D, capacity=T, dtype=dtype, head_dim_v=Dv)
                self.assertEqual((len(cache), cache.capacity, cache.dtype), (0, T, dtype))
                cache.append(k[:, :, :P], v[:, :, :P])  # prefill
                outs = [cache.attend(q[:, :, :P])]
                for t in range(P, T):  # one token at a time
                    cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
                    outs.append(cache.attend(q[:, :, t:t + 1]))
                self.assertEqual(len(cache), T)
                close(self, np.concatenate(outs, axis=2), full, rtol=1e-5, atol=1e-5, what=dtype)
                rk = {"f32": lambda: k, "f16": lambda: k.astype(np.float16).astype(np.float32),
                      "bf16": lambda: attn.from_bfloat16(ks)}[dtype]()
                np.testing.assert_array_equal(cache.keys(), rk)
                self.assertEqual(cache.values().shape, (B, Hkv, T, Dv))

    def test_quantised_cache(self):
        # q8_0 / q4_0: quantised on append (blocks of 32 along D), read back within the bound of
        # attn.h, and attend equals attention on the values the cache holds
        B, H, Hkv, D, Dv, T = 1, 4, 2, 64, 32, 40
        q, k, v = randn(self.rng, B, H, 2, D), randn(self.rng, B, Hkv, T, D), randn(self.rng, B, Hkv, T, Dv)
        for dtype, c, a in (("q8_0", 1 / 254 + 2 ** -11 + 2 ** -20, 2 ** -18), ("q4_0", 1 / 8 + 2 ** -10, 2 ** -21)):
            with self.subTest(dtype):
                cache = attn.KVCache(B, Hkv, D, capacity=T, dtype=dtype, head_dim_v=Dv)
                self.assertEqual(cache.dtype, dtype)
                cache.append(k, v)
                for got, x in ((cache.keys(), k), (cache.values(), v)):
                    m = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
                    err = np.abs(got.reshape(-1, 32) - x.reshape(-1, 32))
                    self.assertTrue(np.all(err <= c * m + a), dtype)
                    self.assertTrue(np.any(err > 0), dtype)
                want = attn.sdpa(q, cache.keys(), cache.values(), causal="bottom_right")
                if True:  # the ISAs with 8-bit products round the query to int8 per block (attn.h, kv_dtype)
                    kd, vd = cache.keys(), cache.values()
                    scale = 1 / np.sqrt(D)
                    m = np.abs(np.asarray(q, np.float64)).reshape(B, H, 2, D // 32, 32).max(axis=-1)
                    kmax = np.abs(kd).max(axis=(2, 3)).repeat(H // Hkv, axis=1)[:, :, None]
                    vmax = np.abs(vd).max(axis=(2, 3)).repeat(H // Hkv, axis=1)[:, :, None, None]
                    dq = (scale * (1 / 254 + 2 ** -20) * 32 * m.sum(axis=-1) + 2 ** -96 * D) * kmax
                    bound = (np.exp(2 * dq)[..., None] * (1 + 2 ** -8) - 1) * vmax + T * 2 ** -122
                    err = np.abs(np.asarray(cache.attend(q), np.float64) - want)
                    self.assertTrue(np.all(err <= bound + 1e-5 * (1 + np.abs(want))), dtype)
                    int8_query = ("avx2", "avx512vnni", "avx512bf16", "amxbf16")
                    if attn.default_context().isa not in int8_query:  # the float kernels
                        close(self, cache.attend(q), want, rtol=1e-5, atol=1e-5, what=dtype)
        with self.assertRaises(attn.AttnError):
            attn.KVCache(1, 1, 48, 8, dtype="q8_0")  # head_dim not a multiple of 32

    def test_attend_options(self):
        B, H, Hkv, D, T = 1, 2, 1, 8, 9
        q, k, v = randn(self.rng, B, H, 3, D), randn(self.rng, B, Hkv, T, D), randn(self.rng, B, Hkv, T, D)
        cache = attn.KVCache(B, Hkv, D, 16)
        cache.append(k[:, :, ::1], v)  # contiguous
        kpm = self.rng.random((B, T)) < 0.3
        kpm[:, -1] = False
        opts = dict(key_padding_mask=kpm, window=(4, None), alibi_slopes=[0.5, 0.25], softcap=3.0, scale=0.2)
        out, lse = cache.attend(q, return_lse=True, **opts)
        ro, rl, _ = ref_sdpa(q, k, v, causal="bottom_right", key_padding_mask=kpm, window=(4, None),
                             alibi=[0.5, 0.25], softcap=3.0, scale=0.2)
        close(self, out, ro)
        close(self, lse, rl)
        out, lse = cache.attend(q, return_lse=True, sinks=[1.5, -0.5], **opts)
        ro, rl, _ = ref_sdpa(q, k, v, causal="bottom_right", key_padding_mask=kpm, window=(4, None),
                             alibi=[0.5, 0.25], softcap=3.0, scale=0.2, sinks=[1.5, -0.5])
        close(self, out, ro, what="sinks")
        close(self, lse, rl, what="sinks")
        close(self, cache.attend(q, causal=None), ref_sdpa(q, k, v)[0])

    def test_truncate_reset_capacity(self):
        cache = attn.KVCache(1, 1, 4, capacity=6)
        k = randn(self.rng, 1, 1, 4, 4)
        cache.append(k, k)
        with self.assertRaises(attn.AttnError) as cm:
            cache.append(k, k)
        self.assertEqual(cm.exception.name, "ATTN_ERR_CAPACITY")
        self.assertEqual(len(cache), 4)  # nothing written
        cache.truncate(2)
        self.assertEqual(len(cache), 2)
        np.testing.assert_array_equal(cache.keys(), k[:, :, :2])
        with self.assertRaises(attn.AttnError) as cm:
            cache.truncate(3)
        self.assertEqual(cm.exception.name, "ATTN_ERR_INVALID_ARG")
        cache.append(k[:, :, :4], k[:, :, :4])
        self.assertEqual(len(cache), 6)
        cache.reset()
        self.assertEqual(cache.len(), 0)
        with self.assertRaises(attn.AttnError) as cm:
            cache.attend(randn(self.rng, 1, 1, 1, 4))
        self.assertIn("empty", cm.exception.message)
        with self.assertRaises(attn.AttnError) as cm:
            cache.append(k[..., :3], k)
        self.assertIn("k has shape", cm.exception.message)
        with self.assertRaises(attn.AttnError):
            attn.KVCache(1, 1, 4, 8, dtype="f64")
        with self.assertRaises(attn.AttnError) as cm:
            attn.KVCache(1, 0, 4, 8)
        self.assertIn("n_kv_heads", cm.exception.message)

    def test_mha_forward_cached(self):
        E, H, N, T, P = 16, 4, 2, 9, 4
        for bf in (False, True):
            with self.subTest(batch_first=bf):
                c = attn.Context(seed=3)
                m = attn.MHA(E, H, batch_first=bf, ctx=c)
                params = dict(m.named_parameters())
                params["in_proj_bias"][...] = randn(self.rng, 3 * E)
                x = randn(self.rng, N, T, E) if bf else randn(self.rng, T, N, E)
                full, _ = m(x, causal=True, need_weights=False)
                cache = attn.KVCache(N, H, E // H, T)
                ax = 1 if bf else 0
                first = x[:, :P] if bf else x[:P]
                outs = [m.forward_cached(first, cache)]
                for t in range(P, T):
                    outs.append(m.forward_cached(x[:, t:t + 1] if bf else x[t:t + 1], cache))
                close(self, np.concatenate(outs, axis=ax), full, rtol=1e-5, atol=1e-5)
                with self.assertRaises(attn.AttnError) as cm:
                    m.forward_cached(x[:1] if not bf else x[:, :1], cache)
                self.assertEqual(cm.exception.name, "ATTN_ERR_CAPACITY")
                with self.assertRaises(attn.AttnError):
                    m.forward_cached(x, object())

    @needs_torch
    def test_mha_forward_cached_against_torch(self):
        E, H, T = 8, 2, 6
        torch.manual_seed(0)
        tm = torch.nn.MultiheadAttention(E, H).eval()
        m = attn.MHA.from_state_dict({n: t.numpy() for n, t in tm.state_dict().items()}, H)
        x = torch.randn(T, 1, E)
        with torch.no_grad():
            want = tm(x, x, x, attn_mask=torch.triu(torch.ones(T, T, dtype=torch.bool), 1))[0].numpy()
        cache = attn.KVCache(1, H, E // H, T)
        got = np.concatenate([m.forward_cached(x[t:t + 1].numpy(), cache) for t in range(T)])
        close(self, got, want, rtol=1e-5, atol=1e-5)


# ---- varlen ---------------------------------------------------------------------------------------

@needs_varlen
class TestVarlen(unittest.TestCase):
    def test_against_loop(self):
        rng = np.random.default_rng(5)
        H, Hkv, D, Dv = 4, 2, 8, 6
        lq, lk = [3, 0, 5, 1], [4, 0, 5, 6]
        cq, ck = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk)])
        q, k, v = randn(rng, cq[-1], H, D), randn(rng, ck[-1], Hkv, D), randn(rng, ck[-1], Hkv, Dv)
        for causal in (None, "bottom_right", "top_left"):
            with self.subTest(causal=causal):
                out, lse = attn.sdpa_varlen(q, k, v, cq, ck, causal=causal, return_lse=True)
                self.assertEqual((out.shape, lse.shape), ((cq[-1], H, Dv), (H, cq[-1])))
                dout = randn(rng, *out.shape)
                dq, dk, dv = attn.sdpa_varlen_backward(q, k, v, cq, ck, out, dout, lse, causal=causal)
                for b in range(len(lq)):
                    if lq[b] == 0:
                        continue
                    sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
                    qb, kb, vb = (x[s].transpose(1, 0, 2)[None] for x, s in ((q, sq), (k, sk), (v, sk)))
                    ob, lb = attn.sdpa(qb, kb, vb, causal=causal, return_lse=True)
                    close(self, out[sq], ob[0].transpose(1, 0, 2), rtol=1e-5, atol=1e-6)
                    close(self, lse[:, sq], lb[0], rtol=1e-5, atol=1e-6)
                    g = attn.sdpa_backward(qb, kb, vb, ob, dout[sq].transpose(1, 0, 2)[None], lb, causal=causal)
                    close(self, dq[sq], g[0][0].transpose(1, 0, 2), rtol=1e-4, atol=1e-5)
                    close(self, dk[sk], g[1][0].transpose(1, 0, 2), rtol=1e-4, atol=1e-5)
                    close(self, dv[sk], g[2][0].transpose(1, 0, 2), rtol=1e-4, atol=1e-5)
        # a strided q (a slice of a packed qkv) gives the same bits
        qkv = np.concatenate([q, q], axis=2)
        np.testing.assert_array_equal(attn.sdpa_varlen(qkv[:, :, :D], k, v, cq, ck),
                                      attn.sdpa_varlen(q, k, v, cq, ck))
        with self.assertRaises(attn.AttnError) as cm:
            attn.sdpa_varlen(q, k, v, cq[:-1], ck)
        self.assertEqual(cm.exception.name, "ATTN_ERR_BAD_SHAPE")
        with self.assertRaises(attn.AttnError) as cm:
            bad = cq.copy()
            bad[1], bad[2] = 5, 4
            attn.sdpa_varlen(q, k, v, bad, ck)
        self.assertTrue(cm.exception.message)

    def test_sinks_against_loop(self):
        # sinks per head, shared by the sequences: each sequence as sdpa with the same sinks, a
        # sequence without keys giving zeros and lse = the sink, dsinks the sum of the sequences'
        rng = np.random.default_rng(6)
        H, Hkv, D = 4, 2, 8
        z = np.array([0.3, -1.0, 2.0, -np.inf], np.float32)
        lq, lk = [3, 2, 5], [4, 0, 6]
        cq, ck = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk)])
        q, k, v = randn(rng, cq[-1], H, D), randn(rng, ck[-1], Hkv, D), randn(rng, ck[-1], Hkv, D)
        out, lse = attn.sdpa_varlen(q, k, v, cq, ck, causal="bottom_right", sinks=z, return_lse=True)
        self.assertGreater(np.abs(out - attn.sdpa_varlen(q, k, v, cq, ck, causal="bottom_right")).max(), 1e-3)
        dout = randn(rng, *out.shape)
        dq, dk, dv, dz = attn.sdpa_varlen_backward(q, k, v, cq, ck, out, dout, lse, causal="bottom_right", sinks=z,
                                                   return_dsinks=True)
        want_dz = np.zeros(H)
        for b in range(len(lq)):
            sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
            if lk[b] == 0:
                np.testing.assert_array_equal(out[sq], 0.0)
                np.testing.assert_array_equal(lse[:, sq], np.repeat(z[:, None], lq[b], axis=1))
                continue
            qb, kb, vb = (x[s].transpose(1, 0, 2)[None] for x, s in ((q, sq), (k, sk), (v, sk)))
            ob, lb = attn.sdpa(qb, kb, vb, causal="bottom_right", sinks=z, return_lse=True)
            close(self, out[sq], ob[0].transpose(1, 0, 2), rtol=1e-5, atol=1e-6)
            close(self, lse[:, sq], lb[0], rtol=1e-5, atol=1e-6)
            g = attn.sdpa_backward(qb, kb, vb, ob, dout[sq].transpose(1, 0, 2)[None], lb, causal="bottom_right",
                                   sinks=z, return_dsinks=True)
            close(self, dq[sq], g[0][0].transpose(1, 0, 2), rtol=1e-4, atol=1e-5)
            close(self, dk[sk], g[1][0].transpose(1, 0, 2), rtol=1e-4, atol=1e-5)
            want_dz += g[3]
        close(self, dz, want_dz, rtol=1e-4, atol=1e-5)
        self.assertEqual(dz[3], 0.0)  # no sink, no gradient


if __name__ == "__main__":
    unittest.main()
