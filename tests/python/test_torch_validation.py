"""Bad arguments to attn.torch: for each mistake, attn.torch.scaled_dot_product_attention and
attn.torch.MultiheadAttention raise an exception of the type torch's own
F.scaled_dot_product_attention / nn.MultiheadAttention raise for it (RuntimeError, TypeError,
AssertionError, ...), with a one-line message, and the raw ops (torch.ops.attn.sdpa_fwd) refuse
non-float tensors.

Run with an interpreter that has torch >= 2.4 (CTest python_torch_validation, when
ATTN_TORCH2_PYTHON is set): `PYTHONPATH=python ATTN_LIBRARY=build/libattn.so
/tmp/venv-t2/bin/python tests/python/test_torch_validation.py`. Exits 77 (skipped) without torch >= 2.4.
"""
import sys
import unittest
import warnings

import source_tree  # tests/python/source_tree.py, beside this file

source_tree.use_package()

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: torch is not installed")
    sys.exit(77)
if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 4):
    print("SKIP: attn.torch needs torch >= 2.4, this is %s" % torch.__version__)
    sys.exit(77)
import attn  # noqa: E402
import attn.torch as at  # noqa: E402

warnings.simplefilter("ignore")


def outcome(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return exc
    return None


def sdpa_cases():
    q = torch.randn(1, 2, 3, 4)
    k = v = q.clone()
    yield "complex q", lambda f: f(q.to(torch.complex64), k, v)
    yield "int q", lambda f: f(q.to(torch.int32), k, v)
    yield "bool q", lambda f: f(q > 0, k, v)
    yield "f16 k only", lambda f: f(q, k.half(), v)
    yield "f64 q", lambda f: f(q.double(), k, v)
    yield "int mask", lambda f: f(q, k, v, torch.zeros(3, 3, dtype=torch.int64))
    yield "complex mask", lambda f: f(q, k, v, torch.zeros(3, 3, dtype=torch.complex64))
    yield "mask shape", lambda f: f(q, k, v, torch.zeros(2, 3))
    yield "head_dim mismatch", lambda f: f(q, k[..., :3], v)
    yield "dropout 1.5", lambda f: f(q, k, v, dropout_p=1.5)
    yield "dropout -1", lambda f: f(q, k, v, dropout_p=-1.0)
    yield "string scale", lambda f: f(q, k, v, scale="x")
    yield "numpy query", lambda f: f(q.numpy(), k, v)
    yield "causal with mask", lambda f: f(q, k, v, torch.zeros(3, 3), is_causal=True)


def mha_cases():
    x = torch.randn(3, 1, 4)
    yield "complex input", lambda m: m(x.to(torch.complex64), x.to(torch.complex64), x.to(torch.complex64))
    yield "int input", lambda m: m(x.int(), x.int(), x.int())
    yield "int attn_mask", lambda m: m(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.int64))
    yield "int key_padding_mask", lambda m: m(x, x, x, key_padding_mask=torch.zeros(1, 3, dtype=torch.int64))
    yield "embed_dim", lambda m: m(x[..., :3], x[..., :3], x[..., :3])
    yield "mask shape", lambda m: m(x, x, x, attn_mask=torch.zeros(2, 3))


class TestTorchErrors(unittest.TestCase):
    def compare(self, name, ref, got):
        self.assertIsNotNone(ref, "%s: torch accepts it; the case is wrong" % name)
        self.assertIsNotNone(got, "%s: torch raises %s, attn accepts it" % (name, type(ref).__name__))
        self.assertIsInstance(got, type(ref), "%s: torch raises %s (%s), attn %s (%s)" % (
            name, type(ref).__name__, ref, type(got).__name__, got))
        self.assertNotIn("\n", str(got).strip())

    def test_sdpa_raises_torchs_error_types(self):
        for name, case in sdpa_cases():
            with self.subTest(name):
                self.compare(name, outcome(lambda: case(F.scaled_dot_product_attention)),
                             outcome(lambda: case(at.scaled_dot_product_attention)))

    def test_mha_raises_torchs_error_types(self):
        torch.manual_seed(0)
        ref = torch.nn.MultiheadAttention(4, 2)
        mine = at.MultiheadAttention(4, 2)
        mine.load_state_dict(ref.state_dict())
        for name, case in mha_cases():
            with self.subTest(name):
                self.compare(name, outcome(lambda: case(ref)), outcome(lambda: case(mine)))

    def test_raw_op_refuses_non_float(self):
        q = torch.randn(1, 2, 3, 4)
        for bad in (q.to(torch.complex64), q.to(torch.int64)):
            with self.assertRaises(RuntimeError) as cm:
                torch.ops.attn.sdpa_fwd(bad, q, q, None, None, 0, 0.0, 0.0, None, -1, -1, None, 0.0, 0, None)
            self.assertIn("q", str(cm.exception))
        self.assertTrue(issubclass(attn.AttnError, RuntimeError))


if __name__ == "__main__":
    unittest.main()
