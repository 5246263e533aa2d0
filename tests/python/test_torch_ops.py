"""Tests of attn.torch (PyTorch >= 2.4): the custom ops, the SDPA functions and MultiheadAttention.

Covered:
  - scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention, forward
    and backward (q, k, v and a float mask's gradient): 2-d to 5-d inputs, broadcast batch
    dimensions, L != S, Ev != E, is_causal, bool and float masks of every broadcast shape, scales
    (0 included), enable_gqa, fully masked rows, float32/float16/bfloat16/float64;
  - attn's options (bottom-right causal, windows, ALiBi as masks torch can take; soft-capping,
    lse) against torch where a mask expresses them, and against the library's scalar reference
    (Context(isa="ref") through the numpy binding); attention sinks against gpt-oss's formula
    (the sinks as one more column of the scores, softmax, the column dropped) with masks, causal
    alignments, GQA and fully masked rows: out, lse and the gradients of q, k, v and the sinks
    (in the sinks' dtype), and that another sink changes the output;
  - torch.autograd.gradcheck in float32 (attn computes in float32, float64 inputs included);
  - dropout: repeatable under torch.manual_seed, the backward replaying the forward's mask;
  - sdpa_varlen against a loop over the sequences, forward and backward (sinks included);
  - torch.library.opcheck of the four ops (schema, fake tensors, autograd registration, AOT; with
    and without sinks); torch.compile(fullgraph=True) of modules using them (aot_eager, and
    inductor when a C++ compiler is present; sinks as a parameter), against eager;
  - the ops' implementations called without the dispatcher (_ops._unwatched; a recorded gradient
    through _ops._Sdpa / _SdpaVarlen): when they are and when not (a gradient to record without
    the Function, a tensor subclass, a dispatch or function mode, the profiler, vmap); a dispatch
    mode and the profiler see the ops; the same bits as through the ops for the outputs and every
    gradient (masks, sinks, dropout, varlen); the autograd node; torch.compile without grad;
  - MultiheadAttention against nn.MultiheadAttention: state_dict both ways, outputs and weights
    for every option, parameter gradients, batch_first, unbatched input;
  - errors: AttnError with the status name (sinks of another shape or type among them); CUDA
    tensors without libattn_cuda, a libattn_cuda context on a machine without a GPU, and sinks
    refused on the CUDA path;
  - with a GPU and libattn_cuda (TestCuda): CUDA tensors against the CPU ops, forward and backward,
    float32/bfloat16/float16, causal and GQA; dropout equal to the numpy binding's Philox mask;
    sinks refused (ATTN_ERR_UNSUPPORTED);
    MultiheadAttention on CUDA against nn.MultiheadAttention on CUDA (outputs and every gradient).

Run with an interpreter that has torch >= 2.4 (CTest python_torch_ops, when ATTN_TORCH2_PYTHON is
set): `PYTHONPATH=python ATTN_LIBRARY=build/libattn.so build-venv/bin/python tests/python/test_torch_ops.py`.
Exits 77 (skipped) without torch >= 2.4.
"""
import math
import os
import shutil
import sys
import unittest
import warnings

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as exc:  # pragma: no cover
    print("SKIP: attn.torch's tests need torch >= 2.4 and numpy (%s)" % exc, file=sys.stderr)
    sys.exit(77)
if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 4):  # pragma: no cover
    print("SKIP: attn.torch needs torch >= 2.4, this is %s" % torch.__version__, file=sys.stderr)
    sys.exit(77)

import attn  # noqa: E402
import attn.torch as at  # noqa: E402
from attn.torch import _call, _cuda, _ops  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

torch.set_num_threads(1)
HAVE_CXX = any(shutil.which(c) for c in ("c++", "g++", "clang++"))


def rnd(*shape, dtype=torch.float32, grad=False):
    t = torch.randn(*shape, dtype=torch.float32).to(dtype)
    return t.requires_grad_(grad)


def gradcheck(f, inputs):
    """torch.autograd.gradcheck in float32 (attn computes in float32: finite differences in float64
    would only measure float32 rounding), with tolerances to match and its warning about that
    silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Input #\d+ requires gradient and is not a double precision")
        return torch.autograd.gradcheck(f, inputs, eps=1e-3, atol=5e-3, rtol=5e-3, nondet_tol=0.0, fast_mode=False)


def grads(out, inputs, seed=0):
    g = torch.Generator().manual_seed(seed)
    dout = torch.randn(out.shape, generator=g).to(out.dtype)
    return torch.autograd.grad(out, inputs, dout, allow_unused=True)


class Close:
    def close(self, got, want, atol=2e-5, rtol=1e-4, what=""):
        self.assertEqual(tuple(got.shape), tuple(want.shape), what)
        torch.testing.assert_close(got.detach().double(), want.detach().double(), atol=atol, rtol=rtol,
                                   equal_nan=True, msg=lambda m: "%s: %s" % (what, m))


# ---- scaled_dot_product_attention against torch's ----------------------------------------------

def torch_cases():
    """(name, q shape, k shape, v shape, kwargs builder) for the comparison with torch."""
    yield "plain", (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6), lambda: {}
    yield "2d", (5, 8), (7, 8), (7, 8), lambda: {}
    yield "3d_broadcast_5d", (2, 1, 3, 4, 8), (3, 6, 8), (1, 3, 6, 5), lambda: {}
    yield "causal_L_lt_S", (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), lambda: {"is_causal": True}
    yield "causal_L_gt_S", (1, 2, 9, 8), (1, 2, 4, 8), (1, 2, 4, 8), lambda: {"is_causal": True}
    yield "bool_mask_LS", (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), lambda: {"attn_mask": torch.rand(5, 7) > 0.3}
    yield "bool_padding_B11S", (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), \
        lambda: {"attn_mask": torch.tensor([[True] * 7, [True] * 4 + [False] * 3]).view(2, 1, 1, 7)}
    yield "float_mask_grad", (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), \
        lambda: {"attn_mask": rnd(3, 1, 7, grad=True)}
    yield "float_mask_full", (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), \
        lambda: {"attn_mask": rnd(2, 3, 5, 7, grad=True)}
    yield "float_mask_mixed_batch", (2, 2, 3, 4, 8), (2, 2, 3, 6, 8), (2, 2, 3, 6, 8), \
        lambda: {"attn_mask": rnd(2, 1, 3, 1, 6, grad=True)}
    yield "scale", (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), lambda: {"scale": 0.7}
    yield "scale_zero", (1, 2, 3, 8), (1, 2, 4, 8), (1, 2, 4, 8), lambda: {"scale": 0.0}
    yield "gqa", (2, 6, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), lambda: {"enable_gqa": True}
    yield "gqa_mask", (2, 4, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8), \
        lambda: {"enable_gqa": True, "attn_mask": torch.rand(2, 4, 5, 7) > 0.5}
    yield "kv_heads_broadcast", (2, 4, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8), lambda: {}


class TestScaledDotProductAttention(unittest.TestCase, Close):
    def run_case(self, name, qs, ks, vs, kwargs, dtype=torch.float32, atol=2e-5, rtol=1e-4):
        torch.manual_seed(hash(name) % 1000)
        q, k, v = rnd(*qs, dtype=dtype, grad=True), rnd(*ks, dtype=dtype, grad=True), rnd(*vs, dtype=dtype, grad=True)
        kw = kwargs()
        if "attn_mask" in kw and kw["attn_mask"].dtype.is_floating_point:
            kw["attn_mask"] = kw["attn_mask"].detach().to(dtype).requires_grad_(True)
        got = at.scaled_dot_product_attention(q, k, v, **kw)
        want = F.scaled_dot_product_attention(q, k, v, **kw)
        self.assertEqual(got.dtype, dtype)
        self.close(got, want, atol, rtol, name + " out")
        inputs = [q, k, v] + [m for m in kw.values() if isinstance(m, torch.Tensor) and m.requires_grad]
        for i, (a, b) in enumerate(zip(grads(got, inputs), grads(want, inputs))):
            self.close(a, b, atol * 4, rtol * 4, "%s grad %d" % (name, i))

    def test_matches_torch(self):
        for name, qs, ks, vs, kw in torch_cases():
            with self.subTest(name):
                self.run_case(name, qs, ks, vs, kw)

    def test_dtypes(self):
        # float64 is computed in float32; half types as torch computes them, to their precision
        tolerances = ((torch.float64, 1e-5, 1e-5), (torch.bfloat16, 3e-2, 3e-2), (torch.float16, 4e-3, 4e-3))
        for dtype, atol, rtol in tolerances:
            for name, qs, ks, vs, kw in torch_cases():
                if name in ("gqa", "causal_L_gt_S", "float_mask_grad", "bool_padding_B11S"):
                    with self.subTest(name, dtype=dtype):
                        self.run_case(name, qs, ks, vs, kw, dtype, atol, rtol)

    def test_dtype_plan(self):
        # what runs natively follows what the library answers (native()); the rest is float32
        ctx = _call.context()
        for dt in (torch.float16, torch.bfloat16):
            q = rnd(1, 1, 2, 4, dtype=dt)
            qc, kc, vc, odt = _call.plan(ctx, q, q, q, backward=False)
            self.assertEqual(odt, dt if at.native(ctx, dt, dt, False) else torch.float32)
            self.assertEqual(qc.dtype, odt)
            self.assertEqual(kc.dtype, dt)  # half keys and values are always read as they are
        q64 = rnd(1, 1, 2, 4, dtype=torch.float64)
        self.assertEqual([t.dtype for t in _call.plan(ctx, q64, q64, q64, False)[:3]], [torch.float32] * 3)

    def test_half_types_fall_back_to_float32(self):
        """Where the library refuses a half type it was taken to accept (ATTN_ERR_UNSUPPORTED for a
        shape its kernels do not cover), the call runs again in float32: forced here by marking
        bfloat16 native, whether or not this library computes in it."""
        ctx = _call.context()
        saved = dict(_call._native)
        try:
            for backward in (False, True):
                _call._native[(ctx.isa, torch.bfloat16, torch.bfloat16, backward)] = True
            seen = []

            def refuse_half(qc, kc, vc, dt):
                seen.append(dt)
                if dt != torch.float32:
                    raise attn.AttnError(8, "no kernel for this shape")
                return qc.dtype

            h = rnd(1, 1, 2, 4, dtype=torch.bfloat16)
            self.assertEqual(_call.typed(ctx, h, h, h, False, refuse_half), torch.float32)
            self.assertEqual(seen, [torch.bfloat16, torch.float32])
            self.run_case("forced_native_bf16", (2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), lambda: {"enable_gqa": True},
                          torch.bfloat16, 3e-2, 3e-2)
        finally:
            _call._native.clear()
            _call._native.update(saved)

    def test_fully_masked_rows(self):
        q, k, v = rnd(1, 2, 3, 4, grad=True), rnd(1, 2, 5, 4, grad=True), rnd(1, 2, 5, 4, grad=True)
        mask = torch.ones(3, 5, dtype=torch.bool)
        mask[1] = False
        out, lse = at.sdpa(q, k, v, mask, return_lse=True)
        self.assertTrue(torch.equal(out[:, :, 1], torch.zeros(1, 2, 4)))
        self.assertTrue(torch.isneginf(lse[:, :, 1]).all())
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # torch 2.x: zeros as well
        self.close(out, want)
        dq, dk, dv = grads(out, [q, k, v])
        self.assertTrue(torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all())
        self.assertTrue(torch.equal(dq[:, :, 1], torch.zeros(1, 2, 4)))

    def test_mixed_precision_kv(self):
        # float32 queries on bfloat16 keys and values: the values the library reads are exact in float32
        q = rnd(2, 4, 5, 16, grad=True)
        k, v = rnd(2, 2, 9, 16, dtype=torch.bfloat16, grad=True), rnd(2, 2, 9, 16, dtype=torch.bfloat16, grad=True)
        got = at.sdpa(q, k, v, causal="bottom_right", enable_gqa=True)
        want = F.scaled_dot_product_attention(q, k.float(), v.float(), attn_mask=torch.ones(5, 9).tril(4).bool(),
                                              enable_gqa=True)
        self.close(got, want)
        dq, dk, dv = grads(got, [q, k, v])
        self.assertEqual((dq.dtype, dk.dtype, dv.dtype), (torch.float32, torch.bfloat16, torch.bfloat16))

    def test_strided_inputs_not_copied_give_same_bits(self):
        qkv = rnd(2, 5, 3, 4, 8)  # (B, L, 3, H, D) as a packed projection
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        self.assertFalse(q.is_contiguous())
        self.assertTrue(torch.equal(at.scaled_dot_product_attention(q, k, v),
                                    at.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous())))

    def test_thread_counts_same_bits(self):
        q, k, v = rnd(2, 4, 40, 16), rnd(2, 4, 50, 16), rnd(2, 4, 50, 16)
        try:
            torch.set_num_threads(1)
            one = at.sdpa(q, k, v, causal=True)
            torch.set_num_threads(2)
            two = at.sdpa(q, k, v, causal=True)
        finally:
            torch.set_num_threads(1)
        self.assertTrue(torch.equal(one, two))

    def test_errors(self):
        q = rnd(1, 2, 3, 4)
        cases = [
            (lambda: at.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool),
                                                     is_causal=True), "ATTN_ERR_INVALID_ARG"),
            (lambda: at.scaled_dot_product_attention(q, q.double(), q.double()), "ATTN_ERR_INVALID_ARG"),
            (lambda: at.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.int64)),
             "ATTN_ERR_BAD_MASK"),
            (lambda: at.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 3, dtype=torch.bool)),
             "ATTN_ERR_BAD_MASK"),
            (lambda: at.scaled_dot_product_attention(q[0, 0, 0], q[0, 0, 0], q[0, 0, 0]), "ATTN_ERR_BAD_SHAPE"),
            (lambda: at.scaled_dot_product_attention(rnd(1, 3, 3, 4), q, q, enable_gqa=True), "ATTN_ERR_BAD_SHAPE"),
            (lambda: at.scaled_dot_product_attention(rnd(1, 3, 3, 4), q, q), "ATTN_ERR_BAD_SHAPE"),
            (lambda: at.scaled_dot_product_attention(q, rnd(1, 2, 3, 5), q), "ATTN_ERR_BAD_SHAPE"),
            (lambda: at.scaled_dot_product_attention(q.int(), q, q), "ATTN_ERR_UNSUPPORTED"),
            (lambda: at.scaled_dot_product_attention(q, q, q, dropout_p=1.0), "ATTN_ERR_INVALID_ARG"),
            (lambda: at.sdpa(q, q, q, causal="left"), "ATTN_ERR_INVALID_ARG"),
            (lambda: at.sdpa(q, q, q, alibi_slopes=torch.ones(3)), "ATTN_ERR_BAD_SHAPE"),
            (lambda: at.sdpa(q, q, q, sinks=torch.ones(3)), "ATTN_ERR_BAD_SHAPE"),
            (lambda: at.sdpa(q, q, q, sinks=torch.ones(2, 1)), "ATTN_ERR_BAD_SHAPE"),
            (lambda: at.sdpa(q, q, q, sinks=torch.ones(2, dtype=torch.int64)), "ATTN_ERR_INVALID_ARG"),
            (lambda: at.sdpa(q, q, q, sinks=[0.0, 1.0]), "ATTN_ERR_INVALID_ARG"),
            (lambda: at.sdpa_varlen(q[0], q[0], q[0], torch.tensor([0, 2]), torch.tensor([0, 2]), sinks=torch.ones(2)),
             "ATTN_ERR_BAD_SHAPE"),
            # the ops check what they are given, called directly too
            (lambda: torch.ops.attn.sdpa_fwd(q, q[:, :1], q, None, None, 0, 0.0, 0.0, None, -1, -1, None, 0.0, 0, None),
             None),
            (lambda: torch.ops.attn.sdpa_fwd(q, q, q, torch.ones(1, 1, 2, 3, dtype=torch.bool), None, 0, 0.0, 0.0,
                                             None, -1, -1, None, 0.0, 0, None), "ATTN_ERR_BAD_MASK"),
            (lambda: torch.ops.attn.sdpa_fwd(q, q, q, None, None, 5, 0.0, 0.0, None, -1, -1, None, 0.0, 0, None),
             "ATTN_ERR_INVALID_ARG"),
            (lambda: torch.ops.attn.sdpa_fwd(q, q, q, None, None, 0, 0.0, 0.5, None, -1, -1, None, 0.0, 0, None),
             "ATTN_ERR_INVALID_ARG"),
            (lambda: torch.ops.attn.sdpa_bwd(q, q, q, q, q, torch.zeros(1, 2, 2), None, None, 0, 0.0, 0.0, None,
                                             -1, -1, None, 0.0, False, None, False), "ATTN_ERR_BAD_SHAPE"),
            (lambda: torch.ops.attn.sdpa_bwd(q, q, q, q, q, torch.zeros(1, 2, 3), None, None, 0, 0.0, 0.0, None,
                                             -1, -1, None, 0.0, False, None, True), "ATTN_ERR_INVALID_ARG"),
        ]
        for i, (call, name) in enumerate(cases):
            with self.subTest(i=i):
                with self.assertRaises(attn.AttnError) as cm:
                    call()
                if name:
                    self.assertEqual(cm.exception.name, name, cm.exception)
                self.assertTrue(cm.exception.message)
        # the same mistakes raise what torch's own function raises: RuntimeError (AttnError is one),
        # TypeError for what is not a tensor; each before any work and on one line
        c64 = q.to(torch.complex64)
        same = [
            (lambda f: f(c64, c64, c64), RuntimeError),
            (lambda f: f(q.int(), q.int(), q.int()), RuntimeError),
            (lambda f: f(q, q.double(), q), RuntimeError),
            (lambda f: f(q.half(), q, q), RuntimeError),
            (lambda f: f(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.int64)), RuntimeError),
            (lambda f: f(q, q, q, attn_mask=torch.ones(5, 3, dtype=torch.bool)), RuntimeError),
            (lambda f: f(q, q, q, dropout_p=2.0), RuntimeError),
            (lambda f: f(q.to("meta"), q, q), RuntimeError),
            (lambda f: f([[1.0]], q, q), TypeError),
        ]
        for i, (call, kind) in enumerate(same):
            with self.subTest(same_as_torch=i):
                with self.assertRaises(kind):
                    call(torch.nn.functional.scaled_dot_product_attention)
                with self.assertRaises(kind) as cm:
                    call(at.scaled_dot_product_attention)
                self.assertNotIn("\n", str(cm.exception))
        # a gradient attn does not compute is refused, not returned as zero
        slopes = torch.ones(2, requires_grad=True)
        out = at.sdpa(rnd(1, 2, 3, 4, grad=True), q, q, alibi_slopes=slopes)
        with self.assertRaises(attn.AttnError) as cm:
            out.sum().backward()
        self.assertIn("ALiBi", str(cm.exception))

    def test_cuda_without_libattn_cuda(self):
        saved = list(_cuda._found)
        try:
            _cuda._found[:] = [None]  # as where no libattn_cuda is installed
            desc = attn._lib.SdpaDesc()
            with self.assertRaises(attn.AttnError) as cm:
                _cuda.run("attn_cuda_sdpa_fwd", torch.device("cuda", 0), desc)
            self.assertEqual(cm.exception.name, "ATTN_ERR_UNSUPPORTED")
            self.assertIn("libattn_cuda", cm.exception.message)
        finally:
            _cuda._found[:] = saved

    def test_cuda_refuses_sinks(self):
        # what every CUDA call runs after describe(): a descriptor with sinks is refused before
        # libattn_cuda is looked up (TestCuda checks the whole calls on a GPU)
        desc, keep = _call.describe(*(rnd(1, 2, 3, 4) for _ in range(4)), None, None, 0, 0.0, 0.0, -1, -1, None, 0.0,
                                    torch.zeros(2))
        with self.assertRaises(attn.AttnError) as cm:
            _call.cuda_extras(desc, keep, torch.device("cuda", 0), None, None)
        self.assertEqual(cm.exception.name, "ATTN_ERR_UNSUPPORTED")
        self.assertIn("sinks", cm.exception.message)

    def test_cuda_contexts_follow_deterministic_algorithms(self):
        # a context per (device, deterministic): run() asks for the deterministic one under
        # torch.use_deterministic_algorithms(True); checked on a stand-in for libattn_cuda that
        # records the parameters each context is created with
        class FakeLib:
            def __init__(self):
                self.created = []

            def attn_cuda_ctx_params_init(self, params):
                p = params._obj
                p.device, p.stream, p.kernels, p.deterministic = 0, None, 0, 0

            def attn_cuda_ctx_create(self, params, out):
                p = params._obj
                self.created.append((p.device, p.deterministic))
                out._obj.value = 1000 + len(self.created)
                return attn._lib.OK

        saved = getattr(_cuda._local, "ctxs", None)
        _cuda._local.ctxs = {}
        try:
            fake = FakeLib()
            dev = torch.device("cuda", 1)
            plain = _cuda._context(fake, dev)
            det = _cuda._context(fake, dev, True)
            self.assertEqual(fake.created, [(1, 0), (1, 1)])
            self.assertNotEqual(plain.value, det.value)
            self.assertIs(_cuda._context(fake, dev, False), plain)
            self.assertIs(_cuda._context(fake, dev, True), det)
            self.assertEqual(len(fake.created), 2)  # made once each
            was = torch.are_deterministic_algorithms_enabled()
            try:
                torch.use_deterministic_algorithms(True)
                self.assertTrue(torch.are_deterministic_algorithms_enabled())  # what run() passes on
            finally:
                torch.use_deterministic_algorithms(was)
        finally:
            if saved is None:
                del _cuda._local.ctxs
            else:
                _cuda._local.ctxs = saved

    def test_cuda_context_without_gpu(self):
        # with libattn_cuda found but no usable GPU, the context says why, as a status and one line
        found = _cuda.library()
        if found is None:
            self.skipTest("libattn_cuda is not built")
        if torch.cuda.is_available():
            self.skipTest("a GPU is present (TestCuda runs)")
        with self.assertRaises(attn.AttnError) as cm:
            _cuda._context(found[0], torch.device("cuda", 0))
        self.assertEqual(cm.exception.name, "ATTN_ERR_DEVICE")
        self.assertTrue(cm.exception.message and "\n" not in cm.exception.message)


@unittest.skipUnless(torch.cuda.is_available() and _cuda.library() is not None, "needs a GPU and libattn_cuda")
class TestCuda(unittest.TestCase, Close):
    """CUDA tensors through libattn_cuda: against the CPU ops on the same values, on torch's stream."""

    def _pair(self, *shape, dtype):
        t = rnd(*shape, dtype=dtype)
        return t, t.cuda()

    def test_forward_backward_against_cpu(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 4e-3)):
            for causal, gqa in ((False, False), (True, True)):
                with self.subTest(dtype=dtype, causal=causal, gqa=gqa):
                    Hkv = 2 if gqa else 4
                    q, qg = self._pair(2, 4, 70, 64, dtype=dtype)
                    k, kg = self._pair(2, Hkv, 90, 64, dtype=dtype)
                    v, vg = self._pair(2, Hkv, 90, 64, dtype=dtype)
                    for t in (q, k, v, qg, kg, vg):
                        t.requires_grad_(True)
                    out = at.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                    outg = at.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=gqa)
                    self.assertEqual(outg.device.type, "cuda")
                    self.close(outg.cpu().float(), out.float(), atol=tol, rtol=tol)
                    g = torch.randn_like(out.float())
                    out.float().backward(g)
                    outg.float().backward(g.cuda())
                    for a, b in ((q, qg), (k, kg), (v, vg)):
                        self.close(b.grad.cpu().float(), a.grad.float(), atol=10 * tol, rtol=10 * tol)

    def test_mask_gradient_against_cpu(self):
        # a float mask that requires grad: its gradient from libattn_cuda's backward equals the CPU's,
        # for a (L, S) mask broadcast over B and H and a full one
        for shape in ((70, 90), (2, 4, 70, 90)):
            with self.subTest(shape=shape):
                q, qg = self._pair(2, 4, 70, 32, dtype=torch.float32)
                k, kg = self._pair(2, 4, 90, 32, dtype=torch.float32)
                v, vg = self._pair(2, 4, 90, 32, dtype=torch.float32)
                m, mg = self._pair(*shape, dtype=torch.float32)
                for t in (m, mg):
                    t.requires_grad_(True)
                out = at.scaled_dot_product_attention(q, k, v, attn_mask=m)
                outg = at.scaled_dot_product_attention(qg, kg, vg, attn_mask=mg)
                g = torch.randn_like(out)
                out.backward(g)
                outg.backward(g.cuda())
                self.close(mg.grad.cpu(), m.grad, atol=1e-5, rtol=1e-4)

    def test_dropout_is_the_philox_mask(self):
        # the GPU's dropout is Philox keyed by the op's seed: the numpy binding draws the same mask
        torch.manual_seed(7)
        q, k, v = (rnd(1, 2, 33, 32) for _ in range(3))
        seed = torch.tensor(1234, dtype=torch.int64)
        out, _, _ = torch.ops.attn.sdpa_fwd(q.cuda(), k.cuda(), v.cuda(), None, None, 0, 0.0, 0.25, seed, -1, -1,
                                            None, 0.0, 0, None)
        want = attn.sdpa(q.numpy(), k.numpy(), v.numpy(), dropout_p=0.25, dropout_rng=attn.Philox(1234, 0))
        self.close(out.cpu(), torch.from_numpy(want), atol=1e-5, rtol=1e-5)

    def test_multihead_attention_against_torch(self):
        # attn.torch.MultiheadAttention on CUDA (torch's projections, attn's attention on the GPU)
        # against nn.MultiheadAttention with the same state: outputs and every gradient
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            with self.subTest(dtype=dtype):
                torch.manual_seed(3)
                ref = torch.nn.MultiheadAttention(64, 4, batch_first=True).cuda().to(dtype)
                ours = at.MultiheadAttention(64, 4, batch_first=True).cuda().to(dtype)
                ours.load_state_dict(ref.state_dict())
                x = rnd(3, 50, 64, dtype=dtype).cuda()
                mask = torch.triu(torch.ones(50, 50, dtype=torch.bool, device="cuda"), 1)
                xs = [x.clone().requires_grad_(True) for _ in range(2)]
                outs = [m(t, t, t, attn_mask=mask, need_weights=False)[0] for m, t in ((ref, xs[0]), (ours, xs[1]))]
                self.close(outs[1].float(), outs[0].float(), atol=tol, rtol=tol)
                g = torch.randn_like(outs[0])
                for o in outs:
                    o.backward(g)
                self.close(xs[1].grad.float(), xs[0].grad.float(), atol=3 * tol, rtol=3 * tol)
                for (n, a), (_, b) in zip(ref.named_parameters(), ours.named_parameters()):
                    self.close(b.grad.float(), a.grad.float(), atol=3 * tol, rtol=3 * tol, what=n)

    def test_errors(self):
        q = rnd(1, 1, 4, 8).cuda()
        with self.assertRaises(attn.AttnError) as cm:
            torch.ops.attn.sdpa_fwd(q, q, q, None, None, 0, 0.0, 0.0, None, -1, -1, None, 0.0, 1, None)
        self.assertEqual(cm.exception.name, "ATTN_ERR_UNSUPPORTED")
        with self.assertRaises(attn.AttnError):  # tensors on two devices
            at.scaled_dot_product_attention(q, q.cpu(), q)
        # attention sinks are not on the GPU yet: refused, whether the sinks are on the GPU or not
        for z in (torch.zeros(1), torch.zeros(1, device="cuda")):
            for call in (lambda: at.sdpa(q, q, q, sinks=z),
                         lambda: at.sdpa_varlen(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1),
                                                torch.tensor([0, 4]), torch.tensor([0, 4]), sinks=z)):
                with self.assertRaises(attn.AttnError) as cm:
                    call()
                self.assertEqual(cm.exception.name, "ATTN_ERR_UNSUPPORTED")
                self.assertIn("sinks", cm.exception.message)


# ---- attn's options ------------------------------------------------------------------------------

def ref_call(q, k, v, **opts):
    """The library's scalar reference kernels through the numpy binding: (out, lse)."""
    with attn.Context(isa="ref") as ctx:
        return attn.sdpa(q.detach().float().numpy(), k.detach().float().numpy(), v.detach().float().numpy(),
                         return_lse=True, ctx=ctx, **opts)


def band(L, S, causal, window):
    """The bool mask (True = attend) of a causal alignment and a window, as torch's SDPA takes it."""
    off = S - L if causal == "bottom_right" else 0
    i, j = torch.arange(L)[:, None] + off, torch.arange(S)[None, :]
    ok = torch.ones(L, S, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            ok &= j >= i - left
        if right is not None and right >= 0:
            ok &= j <= i + right
    return ok, i - j


def with_sinks(q, k, v, sinks, bias):
    """gpt-oss's eager attention (transformers' GptOss eager_attention_forward): the head's sink as
    one more column of the scores, softmax over the row, the column dropped. (out, lse)."""
    B, H, L, D = q.shape
    s = q @ k.repeat_interleave(H // k.shape[1], 1).transpose(-1, -2) / math.sqrt(D) + bias
    s = torch.cat([s, sinks.view(1, H, 1, 1).expand(B, H, L, 1)], -1)
    p = s.softmax(-1)[..., :-1]
    return p @ v.repeat_interleave(H // v.shape[1], 1), torch.logsumexp(s, -1)


class TestOptions(unittest.TestCase, Close):
    def test_against_torch_masks(self):
        B, H, Hkv, L, S, D = 2, 4, 2, 6, 9, 8
        slopes = 2.0 ** -torch.arange(1, H + 1, dtype=torch.float32)
        for causal in (None, "top_left", "bottom_right"):
            for window in (None, (2, 1), (3, None), (None, 0)):
                for alibi in (False, True):
                    with self.subTest(causal=causal, window=window, alibi=alibi):
                        q, k, v = rnd(B, H, L, D, grad=True), rnd(B, Hkv, S, D, grad=True), rnd(B, Hkv, S, D, grad=True)
                        ok, dist = band(L, S, causal, window)
                        bias = torch.zeros(H, L, S).masked_fill(~ok, float("-inf"))
                        if alibi:
                            bias = bias - slopes[:, None, None] * dist.abs()
                        got, lse = at.sdpa(q, k, v, causal=causal, window=window, enable_gqa=True,
                                           alibi_slopes=slopes if alibi else None, return_lse=True)
                        want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
                        self.close(got, want)
                        s = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) / math.sqrt(D) + bias
                        self.close(lse, torch.logsumexp(s, -1))
                        for a, b in zip(grads(got, [q, k, v]), grads(want, [q, k, v])):
                            self.close(a, b, 1e-4, 1e-4)

    def test_sinks_against_torch_formula(self):
        # float64 formula on the same float32 values: out, lse and the gradients of q, k, v and the
        # sinks; a head without a sink (-inf), rows with every key masked (zeros, lse = the sink)
        B, H, Hkv, L, S, D, Dv = 2, 4, 2, 6, 9, 8, 5
        blocked = torch.rand(L, S) < 0.3
        blocked[2] = True
        cases = (("plain", None, None, [0.5, -1.0, float("-inf"), 2.0]),
                 ("bottom_right_bool_mask", "bottom_right", ~blocked, [1.0, -0.5, 3.0, 0.0]),
                 ("top_left_float_mask", "top_left", rnd(B, 1, L, S), [-2.0, 0.25, 1.5, -0.75]))
        for name, causal, mask, z in cases:
            with self.subTest(name):
                q, k, v = rnd(B, H, L, D, grad=True), rnd(B, Hkv, S, D, grad=True), rnd(B, Hkv, S, Dv, grad=True)
                sinks = torch.tensor(z, requires_grad=True)
                ok, _ = band(L, S, causal, None)
                bias = torch.zeros(L, S).masked_fill(~ok, float("-inf"))
                if mask is not None:
                    bias = bias + mask if mask.is_floating_point() else bias.masked_fill(~mask, float("-inf"))
                got, lse = at.sdpa(q, k, v, mask, causal=causal, enable_gqa=True, sinks=sinks, return_lse=True)
                leaves = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
                want, want_lse = with_sinks(*leaves, bias.double())
                self.close(got, want, what=name + " out")
                self.close(lse, want_lse, what=name + " lse")
                for i, (a, b) in enumerate(zip(grads(got, [q, k, v, sinks]), grads(want, leaves))):
                    self.close(a, b, 1e-4, 1e-4, "%s grad %s" % (name, "q k v sinks".split()[i]))
                other = at.sdpa(q, k, v, mask, causal=causal, enable_gqa=True, sinks=sinks.detach().flip(0))
                self.assertGreater((other - got).abs().max().item(), 1e-3, name)
                if name == "bottom_right_bool_mask":
                    self.assertTrue(torch.equal(got[:, :, 2], torch.zeros(B, H, Dv)))
                    self.close(lse[:, :, 2], sinks.detach().expand(B, H))
        # no keys at all (answered without the library): zeros, lse = the sink, no gradient
        sinks = torch.tensor([0.5, -1.0], requires_grad=True)
        out, lse = at.sdpa(rnd(1, 2, 3, 4), rnd(1, 2, 0, 4), rnd(1, 2, 0, 4), sinks=sinks, return_lse=True)
        self.assertTrue(torch.equal(out, torch.zeros(1, 2, 3, 4)))
        self.assertTrue(torch.equal(lse, sinks.detach().view(1, 2, 1).expand(1, 2, 3)))
        self.assertTrue(torch.equal(grads(out, [sinks])[0], torch.zeros(2)))

    def test_sinks_gradient_dtype(self):
        # the sinks' gradient comes in the sinks' dtype, whatever q's; with bfloat16 inputs too
        q, k, v = rnd(2, 4, 5, 8, grad=True), rnd(2, 4, 7, 8, grad=True), rnd(2, 4, 7, 8, grad=True)
        base = torch.randn(4)
        grads_by_dtype = {}
        for dt in (torch.float32, torch.float64, torch.bfloat16):
            z = base.to(dt).requires_grad_()
            out = at.sdpa(q, k, v, causal=True, sinks=z)
            (g,) = grads(out, [z])
            self.assertEqual(g.dtype, dt)
            grads_by_dtype[dt] = g.double()
        self.close(grads_by_dtype[torch.float64], grads_by_dtype[torch.float32], 1e-6, 1e-6)
        qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
        z = base.bfloat16().requires_grad_()
        out = at.sdpa(qb, kb, vb, causal=True, sinks=z)
        self.assertEqual(out.dtype, torch.bfloat16)
        want, _ = with_sinks(*(t.detach().double() for t in (qb, kb, vb, z)),
                             torch.ones(5, 7, dtype=torch.bool).tril().logical_not().double() * -1e30)
        self.close(out, want, 3e-2, 3e-2)
        self.assertEqual(grads(out, [z])[0].dtype, torch.bfloat16)

    def test_softcap_against_reference(self):
        q, k, v = rnd(2, 4, 5, 8, grad=True), rnd(2, 2, 7, 8, grad=True), rnd(2, 2, 7, 6, grad=True)
        mask = torch.rand(5, 7) > 0.2
        got, lse = at.sdpa(q, k, v, mask, softcap=1.5, scale=2.0, causal="bottom_right", enable_gqa=True,
                           return_lse=True)
        out_ref, lse_ref = ref_call(q, k, v, softcap=1.5, scale=2.0, causal="bottom_right",
                                    mask=~mask.numpy())
        self.close(got, torch.from_numpy(out_ref), 1e-5, 1e-5)
        self.close(lse, torch.from_numpy(lse_ref), 1e-5, 1e-5)
        # and the torch composition Gemma 2's eager attention uses
        s = 1.5 * torch.tanh(2.0 * (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) / 1.5)
        ok, _ = band(5, 7, "bottom_right", None)
        want = torch.softmax(s.masked_fill(~(mask & ok), float("-inf")), -1) @ v.repeat_interleave(2, 1)
        self.close(got, want)
        for a, b in zip(grads(got, [q, k, v]), grads(want, [q, k, v])):
            self.close(a, b, 1e-4, 1e-4)

    def test_gradcheck(self):
        torch.manual_seed(3)
        q, k, v = rnd(1, 2, 3, 4, grad=True), rnd(1, 1, 5, 4, grad=True), rnd(1, 1, 5, 3, grad=True)
        mask = rnd(2, 3, 5, grad=True)
        slopes = torch.tensor([0.5, 0.25])
        checks = {
            "plain": lambda q, k, v: at.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            "causal": lambda q, k, v: at.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            "float_mask": lambda q, k, v, m: at.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
            "options": lambda q, k, v: at.sdpa(q, k, v, causal="bottom_right", window=(2, 0), softcap=2.0,
                                               alibi_slopes=slopes, enable_gqa=True, scale=0.8),
            "sinks": lambda q, k, v, z: at.sdpa(q, k, v, causal="bottom_right", softcap=2.0, sinks=z, enable_gqa=True),
        }
        sinks = torch.tensor([0.3, -0.4], requires_grad=True)
        for name, f in checks.items():
            with self.subTest(name):
                inputs = (q, k, v) + {"float_mask": (mask,), "sinks": (sinks,)}.get(name, ())
                self.assertTrue(gradcheck(f, inputs))

    def test_dropout(self):
        q, k, v = rnd(2, 2, 6, 8, grad=True), rnd(2, 2, 6, 8, grad=True), rnd(2, 2, 6, 8, grad=True)

        def f(q, k, v):
            torch.manual_seed(7)  # the seed of attn's draw comes from torch's generator
            return at.scaled_dot_product_attention(q, k, v, dropout_p=0.4)

        a, b = f(q, k, v), f(q, k, v)
        self.assertTrue(torch.equal(a, b))
        self.assertFalse(torch.allclose(a, at.scaled_dot_product_attention(q, k, v)))
        torch.manual_seed(8)
        self.assertFalse(torch.equal(a, at.scaled_dot_product_attention(q, k, v, dropout_p=0.4)))
        # the backward regenerates the forward's mask: finite differences of the seeded function agree
        self.assertTrue(gradcheck(f, (q, k, v)))

    def test_varlen_against_loop(self):
        H, Hkv, D, Dv = 4, 2, 8, 6
        lens_q, lens_k = [3, 1, 5], [4, 2, 5]
        cq = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32)
        ck = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int64)
        q, k, v = rnd(sum(lens_q), H, D, grad=True), rnd(sum(lens_k), Hkv, D, grad=True), rnd(sum(lens_k), Hkv, Dv,
                                                                                              grad=True)
        z = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
        for causal, sinks in ((None, None), ("bottom_right", None), ("bottom_right", z)):
            with self.subTest(causal=causal, sinks=sinks is not None):
                out, lse = at.sdpa_varlen(q, k, v, cq, ck, causal=causal, softcap=3.0, sinks=sinks, return_lse=True)
                parts, lses = [], []
                for b in range(3):
                    sq, sk = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
                    o, l = at.sdpa(q[sq].transpose(0, 1), k[sk].transpose(0, 1), v[sk].transpose(0, 1), causal=causal,
                                   softcap=3.0, enable_gqa=True, sinks=sinks, return_lse=True)
                    parts.append(o.transpose(0, 1))
                    lses.append(l)
                want = torch.cat(parts)
                self.close(out, want, 1e-6, 1e-6)
                self.close(lse, torch.cat(lses, 1), 1e-6, 1e-6)
                inputs = [q, k, v] + ([sinks] if sinks is not None else [])
                for a, b in zip(grads(out, inputs), grads(want, inputs)):  # dsinks: the sequences' sum
                    self.close(a, b, 1e-5, 1e-5)


# ---- the ops under torch.library's checks and torch.compile ---------------------------------------

class TestOpsAndCompile(unittest.TestCase, Close):
    def test_opcheck(self):
        q, k, v = rnd(2, 4, 5, 8, grad=True), rnd(2, 2, 7, 8, grad=True), rnd(2, 2, 7, 6, grad=True)
        mask = rnd(2, 1, 5, 7, grad=True)
        kpm = torch.rand(2, 7) > 0.7
        slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
        calls = [
            (torch.ops.attn.sdpa_fwd.default, (q, k, v, mask, kpm, 2, 0.0, 0.0, None, 3, 0, slopes, 2.0, 1, None)),
            (torch.ops.attn.sdpa_fwd.default, (q, k, v, None, None, 1, 0.5, 0.0, None, -1, -1, None, 0.0, 0, None)),
        ]
        out, lse, _ = torch.ops.attn.sdpa_fwd(q, k, v, mask, None, 0, 0.0, 0.0, None, -1, -1, None, 0.0, 0, None)
        calls.append((torch.ops.attn.sdpa_bwd.default, (torch.randn_like(out), q, k, v, out, lse, mask, None, 0, 0.0,
                                                        0.0, None, -1, -1, None, 0.0, True, None, False)))
        z = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
        calls.append((torch.ops.attn.sdpa_fwd.default, (q, k, v, None, kpm, 2, 0.0, 0.0, None, -1, -1, None, 0.0, 0,
                                                        z)))
        out, lse, _ = torch.ops.attn.sdpa_fwd(q, k, v, None, None, 1, 0.0, 0.0, None, -1, -1, None, 0.0, 0, z)
        calls.append((torch.ops.attn.sdpa_bwd.default, (torch.randn_like(out), q, k, v, out, lse, None, None, 1, 0.0,
                                                        0.0, None, -1, -1, None, 0.0, False, z, True)))
        cq, ck = torch.tensor([0, 2, 5]), torch.tensor([0, 3, 7])
        vq, vk, vv = rnd(5, 4, 8, grad=True), rnd(7, 2, 8, grad=True), rnd(7, 2, 8, grad=True)
        for causal, sinks in ((1, None), (2, z)):  # top-left without sinks, bottom-right with them
            args = (vq, vk, vv, cq, ck, 3, 4, causal, 0.0, 0.0, None, -1, -1, None, 0.0, sinks)
            calls.append((torch.ops.attn.sdpa_varlen_fwd.default, args))
            vo, vl = torch.ops.attn.sdpa_varlen_fwd(*args)
            bwd = (torch.randn_like(vo), vq, vk, vv, vo, vl, cq, ck, 3, 4, causal, 0.0, 0.0, None, -1, -1, None, 0.0,
                   sinks, sinks is not None)
            calls.append((torch.ops.attn.sdpa_varlen_bwd.default, bwd))
        for op, args in calls:
            if "bwd" in str(op):  # no double backward: the backward ops are checked without gradients
                args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            with self.subTest(str(op)):
                result = torch.library.opcheck(op, args)
                self.assertTrue(all(r == "SUCCESS" for r in result.values()), result)

    def compiled_matches_eager(self, backend):
        torch.manual_seed(0)

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.mha = at.MultiheadAttention(16, 4, batch_first=True)
                self.proj = torch.nn.Linear(16, 48)
                self.sinks = torch.nn.Parameter(torch.randn(4))

            def forward(self, x, mask):
                h, _ = self.mha(x, x, x, need_weights=False)
                q, k, v = self.proj(h).view(x.shape[0], x.shape[1], 3, 4, 4).unbind(2)
                q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                a = at.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                b = at.sdpa(q, k[:, :2], v[:, :2], causal="bottom_right", window=(3, 0), softcap=5.0, enable_gqa=True,
                            sinks=self.sinks)
                return (a + b).transpose(1, 2).reshape(x.shape)

        block = Block()
        x = rnd(2, 6, 16, grad=True)
        mask = torch.rand(6, 6) > 0.2
        eager = block(x, mask)
        ge = grads(eager, [x] + list(block.parameters()))
        compiled = torch.compile(block, fullgraph=True, backend=backend)
        got = compiled(x, mask)
        gc = grads(got, [x] + list(block.parameters()))
        self.close(got, eager, 1e-5, 1e-5, backend)
        for i, (a, b) in enumerate(zip(gc, ge)):
            self.close(a, b, 1e-5, 1e-4, "%s grad %d" % (backend, i))

    def test_compile_aot_eager(self):
        self.compiled_matches_eager("aot_eager")

    @unittest.skipUnless(HAVE_CXX, "inductor needs a C++ compiler")
    def test_compile_inductor(self):
        self.compiled_matches_eager("inductor")


# ---- calls without the dispatcher (_ops.forward, _ops.varlen_forward) ----------------------------

class _SeenOps(TorchDispatchMode):
    """Records the ops the dispatcher hands it (the op then runs as usual)."""
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class TestDirectCalls(unittest.TestCase):
    """The public functions run the ops' implementations straight (through an autograd.Function
    with the ops' formula when a gradient is recorded) when nothing could tell the difference, and
    the ops whenever something watches, traces or records."""

    def test_when_the_op_is_skipped(self):
        q, k, v = rnd(1, 2, 3, 8), rnd(1, 2, 5, 8), rnd(1, 2, 5, 8)
        param = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
        self.assertTrue(_ops._unwatched((q, k, v, None, param)))
        with torch.no_grad():  # no autograd node to record, even for inputs that require grad
            self.assertTrue(_ops._unwatched((q.requires_grad_(), k, v)))
        self.assertFalse(_ops._unwatched((q, k, v)))  # q requires grad, grad mode on
        self.assertTrue(_ops._unwatched((q, k, v), recorded=True))  # the caller records the node
        q.requires_grad_(False)
        cases = [("a dispatch mode", _SeenOps), ("a function mode", lambda: torch.device("cpu")),
                 ("the profiler", torch.profiler.profile)]
        for what, make in cases:
            with self.subTest(what), make():
                self.assertFalse(_ops._unwatched((q, k, v)))
        self.assertTrue(_ops._unwatched((q, k, v)))
        self.assertFalse(_ops._unwatched((q, k.as_subclass(_Sub), v)))
        inside = []
        torch.func.vmap(lambda x: inside.append(_ops._unwatched((x,))) or x)(q)
        self.assertEqual(inside, [False])  # vmap's batched tensors

    def test_observers_see_the_op(self):
        q, k, v = rnd(2, 2, 3, 8), rnd(2, 2, 5, 8), rnd(2, 2, 5, 8)
        cq = torch.tensor([0, 2, 3])
        with _SeenOps() as mode:
            at.sdpa(q, k, v, causal=True)
            at.sdpa_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1)[:4], v[0].transpose(0, 1)[:4], cq,
                           torch.tensor([0, 1, 4]))
        self.assertIn("attn.sdpa_fwd.default", mode.seen)
        self.assertIn("attn.sdpa_varlen_fwd.default", mode.seen)
        with torch.profiler.profile() as prof:
            at.sdpa(q, k, v)
        self.assertIn("attn::sdpa_fwd", [e.name for e in prof.events()])

    def test_compiled_without_grad(self):  # traced as the op (fullgraph: no break for the direct call)
        q, k, v = rnd(1, 2, 3, 8), rnd(1, 2, 5, 8), rnd(1, 2, 5, 8)
        f = torch.compile(lambda q, k, v: at.sdpa(q, k, v, causal=True) * 2.0, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            self.assertTrue(torch.equal(f(q, k, v), at.sdpa(q, k, v, causal=True) * 2.0))

    def test_gradient_node(self):  # the autograd.Function where nothing watches, the op's node otherwise
        q, k, v = rnd(1, 2, 3, 8, grad=True), rnd(1, 2, 5, 8), rnd(1, 2, 5, 8)
        self.assertEqual(type(at.sdpa(q, k, v).grad_fn).__name__, "_SdpaBackward")
        with _SeenOps():
            self.assertNotEqual(type(at.sdpa(q, k, v).grad_fn).__name__, "_SdpaBackward")
        vq = q[0].transpose(0, 1)
        cu = torch.tensor([0, 1, 3])
        self.assertEqual(type(at.sdpa_varlen(vq, vq, vq, cu, cu).grad_fn).__name__, "_SdpaVarlenBackward")

    def test_same_bits_as_the_op(self):
        torch.manual_seed(3)
        q, k, v = rnd(2, 4, 5, 8, grad=True), rnd(2, 2, 7, 8, grad=True), rnd(2, 2, 7, 6, grad=True)
        mask = rnd(2, 1, 5, 7, grad=True)
        sinks = torch.nn.Parameter(torch.randn(4))
        calls = [lambda: at.sdpa(q, k, v, mask, enable_gqa=True, return_lse=True),
                 lambda: at.sdpa(q, k, v, causal="bottom_right", window=(3, 1), softcap=4.0, enable_gqa=True,
                                 sinks=sinks, return_lse=True),
                 lambda: at.sdpa(q, k, v, dropout_p=0.3, enable_gqa=True, return_lse=True),
                 lambda: at.sdpa_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                        torch.tensor([0, 2, 5]), torch.tensor([0, 3, 7]), causal=True,
                                        return_lse=True)]
        inputs = [q, k, v, mask, sinks]

        def run(call, grad):  # outputs, then the inputs' gradients (the backward as the forward ran)
            torch.manual_seed(7)  # the dropout's seed is drawn from torch's generator
            with torch.set_grad_enabled(grad):
                out = call()
            if not grad:
                return list(out)
            dout = torch.randn(out[0].shape, generator=torch.Generator().manual_seed(1))
            gs = torch.autograd.grad(out[0], inputs, dout, allow_unused=True)
            return [o.detach() for o in out] + [g for g in gs if g is not None]

        for i, call in enumerate(calls):
            for grad in (False, True):
                with self.subTest(call=i, grad=grad):
                    direct = run(call, grad)
                    with _SeenOps() as mode:
                        through_op = run(call, grad)
                    self.assertTrue(any("attn.sdpa" in op for op in mode.seen))
                    self.assertEqual(any("_bwd" in op for op in mode.seen), grad)
                    self.assertEqual(len(direct), len(through_op))
                    for a, b in zip(direct, through_op):
                        self.assertTrue(torch.equal(a, b), "call %d" % i)


class TestTorchThreads(unittest.TestCase):
    """CPU calls run on torch's OpenMP threads where torch has them (at.torch_threads()), with the
    same bits as on attn's own threads."""

    def test_same_bits_on_torch_threads(self):
        setting, threads = at.torch_threads(), torch.get_num_threads()
        openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
        self.assertEqual(setting, openmp and _call.torch_runtime() is not None)
        if openmp:
            self.assertIsNotNone(_call.torch_runtime())
            self.assertTrue(os.path.basename(_call.torch_runtime()).startswith(("libgomp", "libomp", "libiomp5")))
        torch.manual_seed(2)
        q, k, v = rnd(2, 4, 96, 32, grad=True), rnd(2, 2, 80, 32, grad=True), rnd(2, 2, 80, 32, grad=True)

        def run():
            out = at.sdpa(q, k, v, causal=True, enable_gqa=True)
            return [out.detach()] + list(torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))

        try:
            torch.set_num_threads(3)
            results = {}
            for on in (True, False):
                at.torch_threads(on)
                ctx = _call.context()
                self.assertEqual(ctx.threads, 3)
                self.assertEqual(ctx.openmp, _call.torch_runtime() if on else None)
                results[on] = run()
            for a, b in zip(results[True], results[False]):
                self.assertTrue(torch.equal(a, b))
            torch.set_num_threads(1)
            self.assertIsNone(_call.context().openmp)  # one thread: no parallel region at all
        finally:
            at.torch_threads(True)
            torch.set_num_threads(threads)
        self.assertEqual(at.torch_threads(), setting)


class _Sub(torch.Tensor):
    pass


# ---- MultiheadAttention ---------------------------------------------------------------------------

MHA_CASES = [
    ("self", dict(embed_dim=16, num_heads=4), "self", {}),
    ("batch_first_no_weights", dict(embed_dim=16, num_heads=4, batch_first=True), "self", {"need_weights": False}),
    ("cross_kdim_vdim_bias_kv_zero_attn", dict(embed_dim=16, num_heads=2, kdim=5, vdim=7, bias=False,
                                               add_bias_kv=True, add_zero_attn=True), "cross",
     {"average_attn_weights": False}),
    ("bool_masks", dict(embed_dim=16, num_heads=4), "self",
     {"attn_mask": "causal_bool", "key_padding_mask": "pad_bool"}),
    ("float_masks_3d", dict(embed_dim=16, num_heads=4), "cross",
     {"attn_mask": "float3d", "key_padding_mask": "pad_float"}),
    ("is_causal_hint", dict(embed_dim=16, num_heads=4, batch_first=True), "self",
     {"attn_mask": "causal_bool", "is_causal": True, "need_weights": False}),
    ("unbatched", dict(embed_dim=16, num_heads=4), "unbatched", {"key_padding_mask": "pad_unbatched"}),
]


def mha_inputs(cfg, kind, extra, L=5, S=6, N=3):
    E, bf = cfg["embed_dim"], cfg.get("batch_first", False)
    if kind == "unbatched":
        x = rnd(L, E)
        return (x, x, x), _mha_masks(extra, L, L, N, cfg["num_heads"], True)
    shape = (lambda n, d: (N, n, d)) if bf else (lambda n, d: (n, N, d))
    if kind == "self":
        x = rnd(*shape(L, E))
        return (x, x, x), _mha_masks(extra, L, L, N, cfg["num_heads"], False)
    return (rnd(*shape(L, E)), rnd(*shape(S, cfg.get("kdim") or E)), rnd(*shape(S, cfg.get("vdim") or E))), \
        _mha_masks(extra, L, S, N, cfg["num_heads"], False)


def _mha_masks(extra, L, S, N, H, unbatched):
    make = {
        "causal_bool": lambda: torch.ones(L, S, dtype=torch.bool).triu(1),
        "pad_bool": lambda: torch.tensor([[False] * (S - i) + [True] * i for i in range(N)]),
        "float3d": lambda: rnd(N * H, L, S),
        "pad_float": lambda: rnd(N, S),
        "pad_unbatched": lambda: torch.tensor([False] * (S - 1) + [True]),
    }
    return {k: make[v]() if isinstance(v, str) else v for k, v in extra.items()}


class TestMultiheadAttention(unittest.TestCase, Close):
    def test_state_dict_both_ways(self):
        torch.manual_seed(4)
        ours = at.MultiheadAttention(16, 4, kdim=5, vdim=7, add_bias_kv=True)
        torch.manual_seed(4)
        theirs = torch.nn.MultiheadAttention(16, 4, kdim=5, vdim=7, add_bias_kv=True)
        self.assertIsInstance(ours, torch.nn.MultiheadAttention)
        self.assertEqual(list(ours.state_dict()), list(theirs.state_dict()))
        for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()):
            self.assertTrue(torch.equal(a, b))  # torch's initialisation, the same draws
        fresh = at.MultiheadAttention(16, 4, kdim=5, vdim=7, add_bias_kv=True)
        fresh.load_state_dict(theirs.state_dict())
        back = torch.nn.MultiheadAttention(16, 4, kdim=5, vdim=7, add_bias_kv=True)
        back.load_state_dict(fresh.state_dict())
        for a, b in zip(back.state_dict().values(), theirs.state_dict().values()):
            self.assertTrue(torch.equal(a, b))

    def test_outputs_and_gradients_match_torch(self):
        for name, cfg, kind, extra in MHA_CASES:
            with self.subTest(name):
                torch.manual_seed(11)
                ours = at.MultiheadAttention(**cfg)
                theirs = torch.nn.MultiheadAttention(**cfg)
                theirs.load_state_dict(ours.state_dict())
                (q, k, v), kw = mha_inputs(cfg, kind, extra)
                if kind == "self":
                    k = v = q
                for mode in ("eval", "train"):  # dropout 0: train mode runs the same numbers
                    ours.train(mode == "train")
                    theirs.train(mode == "train")
                    o1, w1 = ours(q, k, v, **kw)
                    o2, w2 = theirs(q, k, v, **kw)
                    self.close(o1, o2, 1e-5, 1e-5, name + " out")
                    self.assertEqual(w1 is None, w2 is None)
                    if w1 is not None:
                        self.close(w1, w2, 1e-6, 1e-5, name + " weights")
                    params = list(ours.parameters())
                    for a, b in zip(grads(o1, params), grads(o2, list(theirs.parameters()))):
                        self.close(a, b, 1e-4, 1e-4, name + " parameter gradient")

    def test_dropout_in_training(self):
        m = at.MultiheadAttention(16, 4, dropout=0.5, batch_first=True)
        x = rnd(2, 5, 16)
        torch.manual_seed(1)
        a, _ = m(x, x, x)
        torch.manual_seed(1)
        b, _ = m(x, x, x)
        self.assertTrue(torch.equal(a, b))
        m.eval()
        c, _ = m(x, x, x)
        self.assertFalse(torch.allclose(a, c))


if __name__ == "__main__":
    print("attn from %s, library %s, torch %s" % (os.path.dirname(attn.__file__), attn.library_path,
                                                   torch.__version__), file=sys.stderr)
    unittest.main()
