"""Bad arguments to every public function of the numpy binding (python/attn): each raises
AttnError (a RuntimeError), TypeError (AttnTypeError for arrays and values of the wrong type) or
ValueError, with a one-line message naming the argument, before any work is done.

Covered: complex, object, string, bool and integer arrays where floats are meant; integer,
complex and object masks; float cu_seqlens; float arrays as bfloat16 bits; k and v of different
dtypes; wrong ndim/shapes (ALiBi slopes and sinks too); non-finite scale, ALiBi slopes; bad
dropout_p, softcap, window; return_dsinks without sinks;
strings/floats/bools where integers, flags or names are meant; a ctx that is not a Context; and
that a refused call changes nothing (a KV cache keeps its length, a context its generator).

Run: /usr/bin/python3 tests/python/test_validation.py [-v]  (ATTN_LIBRARY=path/to/libattn.so;
by default build/libattn.so). Exits 77 (skipped) without numpy.
"""
import unittest

import source_tree  # tests/python/source_tree.py, beside this file

source_tree.use_package()
np = source_tree.numpy_or_skip()
import attn  # noqa: E402

ERRORS = (attn.AttnError, TypeError, ValueError)
B, H, L, D = 1, 2, 3, 4


def arrays():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, L, D)).astype(np.float32)
    return q, q.copy(), q.copy()


def cases():
    """(name, argument the message must name, call)."""
    q, k, v = arrays()
    lse = np.zeros((B, H, L), np.float32)
    c = np.complex64
    i64 = np.int64

    def mha(*a, **kw):
        return attn.MHA(4, 2)(*a, **kw)

    x = np.zeros((3, 1, 4), np.float32)
    cu = np.array([0, 3])
    yield "complex q", "q", lambda: attn.sdpa(q.astype(c), k, v)
    yield "complex k", "k", lambda: attn.sdpa(q, k.astype(c), v.astype(c))
    yield "complex v", "v", lambda: attn.sdpa(q, k, v.astype(c))
    yield "object q", "q", lambda: attn.sdpa(q.astype(object), k, v)
    yield "string q", "q", lambda: attn.sdpa(np.full(q.shape, "1"), k, v)
    yield "bool q", "q", lambda: attn.sdpa(q > 0, k, v)
    yield "int q", "q", lambda: attn.sdpa(q.astype(np.int32), k, v)
    yield "ragged q", "q", lambda: attn.sdpa([[1.0], [1.0, 2.0]], k, v)
    yield "k f16 v f32", "k and v", lambda: attn.sdpa(q, k.astype(np.float16), v)
    yield "k f64 v f32", "k and v", lambda: attn.sdpa(q, k.astype(np.float64), v)
    yield "uint16 k without kv_dtype", "kv_dtype", lambda: attn.sdpa(q, k.view(np.uint16)[..., :D],
                                                                     v.view(np.uint16)[..., :D])
    yield "float k with bf16", "k", lambda: attn.sdpa(q, k, v, kv_dtype="bf16")
    yield "int64 mask", "mask", lambda: attn.sdpa(q, k, v, mask=np.zeros((L, L), i64))
    yield "complex mask", "mask", lambda: attn.sdpa(q, k, v, mask=np.zeros((L, L), c))
    yield "object mask", "mask", lambda: attn.sdpa(q, k, v, mask=np.zeros((L, L), object))
    yield "int key_padding_mask", "key_padding_mask", \
        lambda: attn.sdpa(q, k, v, key_padding_mask=np.zeros((B, L), i64))
    yield "mask shape", "mask", lambda: attn.sdpa(q, k, v, mask=np.zeros((2, L), np.float32))
    yield "q ndim", "q", lambda: attn.sdpa(q[0], k, v)
    yield "k head_dim", "k", lambda: attn.sdpa(q, k[..., :2], v)
    yield "v length", "v", lambda: attn.sdpa(q, k, v[:, :, :2])
    yield "nan scale", "scale", lambda: attn.sdpa(q, k, v, scale=float("nan"))
    yield "inf scale", "scale", lambda: attn.sdpa(q, k, v, scale=float("inf"))
    yield "string scale", "scale", lambda: attn.sdpa(q, k, v, scale="0.5")
    yield "complex scale", "scale", lambda: attn.sdpa(q, k, v, scale=0.5j)
    yield "dropout_p 1.5", "dropout_p", lambda: attn.sdpa(q, k, v, dropout_p=1.5)
    yield "dropout_p -0.1", "dropout_p", lambda: attn.sdpa(q, k, v, dropout_p=-0.1)
    yield "dropout_p nan", "dropout_p", lambda: attn.sdpa(q, k, v, dropout_p=float("nan"))
    yield "dropout_p string", "dropout_p", lambda: attn.sdpa(q, k, v, dropout_p="0")
    yield "softcap -1", "softcap", lambda: attn.sdpa(q, k, v, softcap=-1.0)
    yield "window float", "window", lambda: attn.sdpa(q, k, v, window=(1.5, 0))
    yield "window scalar", "window", lambda: attn.sdpa(q, k, v, window=2)
    yield "window -5", "window", lambda: attn.sdpa(q, k, v, window=(-5, 0))
    yield "alibi complex", "alibi_slopes", lambda: attn.sdpa(q, k, v, alibi_slopes=np.ones(H, c))
    yield "alibi nan", "alibi_slopes", lambda: attn.sdpa(q, k, v, alibi_slopes=np.array([np.nan, 1.0]))
    yield "alibi 2-d", "alibi_slopes", lambda: attn.sdpa(q, k, v, alibi_slopes=np.ones((1, H)))
    yield "alibi count", "alibi_slopes", lambda: attn.sdpa(q, k, v, alibi_slopes=np.ones(H + 1))
    yield "sinks complex", "sinks", lambda: attn.sdpa(q, k, v, sinks=np.ones(H, c))
    yield "sinks int", "sinks", lambda: attn.sdpa(q, k, v, sinks=np.ones(H, i64))
    yield "sinks 2-d", "sinks", lambda: attn.sdpa(q, k, v, sinks=np.ones((1, H)))
    yield "sinks count", "sinks", lambda: attn.sdpa(q, k, v, sinks=np.ones(H + 1))
    yield "sinks scalar", "sinks", lambda: attn.sdpa(q, k, v, sinks=0.5)
    yield "causal 1", "causal", lambda: attn.sdpa(q, k, v, causal=1)
    yield "causal list", "causal", lambda: attn.sdpa(q, k, v, causal=[])
    yield "return_lse string", "return_lse", lambda: attn.sdpa(q, k, v, return_lse="yes")
    yield "return_weights True", "return_weights", lambda: attn.sdpa(q, k, v, return_weights=True)
    yield "kv_dtype unknown", "kv_dtype", lambda: attn.sdpa(q, k, v, kv_dtype="f8")
    yield "kv_dtype list", "kv_dtype", lambda: attn.sdpa(q, k, v, kv_dtype=[])
    yield "ctx int", "ctx", lambda: attn.sdpa(q, k, v, ctx=1)
    yield "bwd complex dout", "dout", lambda: attn.sdpa_backward(q, k, v, q, q.astype(c), lse)
    yield "bwd int lse", "lse", lambda: attn.sdpa_backward(q, k, v, q, q, lse.astype(i64))
    yield "bwd out shape", "out", lambda: attn.sdpa_backward(q, k, v, q[:, :1], q, lse)
    yield "bwd dropout_state", "dropout_state", \
        lambda: attn.sdpa_backward(q, k, v, q, q, lse, dropout_p=0.5, dropout_state=1)
    yield "bwd dmask of int mask", "mask", \
        lambda: attn.sdpa_backward(q, k, v, q, q, lse, mask=np.zeros((L, L), i64), return_dmask=True)
    yield "bwd dsinks without sinks", "sinks", lambda: attn.sdpa_backward(q, k, v, q, q, lse, return_dsinks=True)
    yield "bwd return_dsinks string", "return_dsinks", \
        lambda: attn.sdpa_backward(q, k, v, q, q, lse, sinks=np.zeros(H), return_dsinks="yes")
    yield "bwd sinks count", "sinks", \
        lambda: attn.sdpa_backward(q, k, v, q, q, lse, sinks=np.zeros(H + 1), return_dsinks=True)
    yield "varlen complex q", "q", lambda: attn.sdpa_varlen(q[0].astype(c), k[0], v[0], cu[:1] * 0 + [0], cu)
    yield "varlen float cu", "cu_seqlens_q", lambda: attn.sdpa_varlen(q[0], k[0], v[0], cu.astype(float), cu)
    yield "varlen 2-d cu", "cu_seqlens", lambda: attn.sdpa_varlen(q[0], k[0], v[0], cu[None], cu[None])
    yield "varlen sinks count", "sinks", \
        lambda: attn.sdpa_varlen(q[0].transpose(1, 0, 2), k[0].transpose(1, 0, 2), v[0].transpose(1, 0, 2), cu, cu,
                                 sinks=np.zeros(H + 1))
    yield "varlen dsinks without sinks", "sinks", \
        lambda: attn.sdpa_varlen_backward(q[0].transpose(1, 0, 2), k[0].transpose(1, 0, 2), v[0].transpose(1, 0, 2),
                                          cu, cu, q[0].transpose(1, 0, 2), q[0].transpose(1, 0, 2),
                                          lse[0], return_dsinks=True)
    yield "varlen max_seqlen float", "max_seqlen_q", \
        lambda: attn.sdpa_varlen(q[0].transpose(1, 0, 2), k[0].transpose(1, 0, 2), v[0].transpose(1, 0, 2),
                                 cu, cu, max_seqlen_q=2.5)
    yield "MHA embed_dim float", "embed_dim", lambda: attn.MHA(4.5, 2)
    yield "MHA num_heads string", "num_heads", lambda: attn.MHA(4, "2")
    yield "MHA dropout 2", "dropout", lambda: attn.MHA(4, 2, dropout=2.0)
    yield "MHA bias string", "bias", lambda: attn.MHA(4, 2, bias="no")
    yield "MHA complex query", "query", lambda: mha(x.astype(c))
    yield "MHA int key", "key", lambda: mha(x, x.astype(np.int32), x)
    yield "MHA int attn_mask", "attn_mask", lambda: mha(x, attn_mask=np.zeros((3, 3), i64))
    yield "MHA int key_padding_mask", "key_padding_mask", lambda: mha(x, key_padding_mask=np.zeros((1, 3), i64))
    yield "MHA need_weights string", "need_weights", lambda: mha(x, need_weights="no")
    yield "MHA state complex", "in_proj_weight", lambda: attn.MHA.from_state_dict(
        {n: a.astype(c) for n, a in attn.MHA(4, 2).state_dict().items()}, 2)
    yield "MHA load_state_dict int", "in_proj_weight", lambda: attn.MHA(4, 2).load_state_dict(
        {n: a.astype(i64) for n, a in attn.MHA(4, 2).state_dict().items()})
    yield "KVCache capacity float", "capacity", lambda: attn.KVCache(1, 2, 4, 8.0)
    yield "KVCache dtype unknown", "dtype", lambda: attn.KVCache(1, 2, 4, 8, dtype="q2_k")
    yield "KVCache complex append", "k", lambda: attn.KVCache(1, 2, 4, 8).append(k.astype(c), v)
    yield "KVCache int append", "v", lambda: attn.KVCache(1, 2, 4, 8).append(k, v.astype(np.int16))
    yield "KVCache truncate float", "length", lambda: attn.KVCache(1, 2, 4, 8).truncate(0.0)
    yield "KVCache attend complex", "q", lambda: attn.KVCache(1, 2, 4, 8).attend(q.astype(c))
    yield "KVCache attend causal", "causal", lambda: attn.KVCache(1, 2, 4, 8).attend(q, causal="top_left")
    yield "KVCache attend sinks count", "sinks", lambda: attn.KVCache(1, 2, 4, 8).attend(q, sinks=np.zeros(H + 1))
    yield "Context threads float", "threads", lambda: attn.Context(threads=1.5)
    yield "Context threads -1", "threads", lambda: attn.Context(threads=-1)
    yield "Context seed string", "seed", lambda: attn.Context(seed="1")
    yield "Context isa unknown", "isa", lambda: attn.Context(isa="sse")
    yield "Context use_blas string", "use_blas", lambda: attn.Context(use_blas="no")
    yield "manual_seed float", "seed", lambda: attn.Context().manual_seed(1.0)
    yield "set_rng_state bytes", "state", lambda: attn.Context().set_rng_state(b"")
    yield "reserve string", "nbytes", lambda: attn.Context().reserve("1")
    yield "to_bfloat16 complex", "x", lambda: attn.to_bfloat16(np.ones(3, c))
    yield "from_bfloat16 float", "bits", lambda: attn.from_bfloat16(np.ones(3, np.float32))
    yield "from_bfloat16 int64", "bits", lambda: attn.from_bfloat16(np.ones(3, i64))
    yield "isa_supported list", "isa", lambda: attn.isa_supported([])
    yield "save_safetensors complex", "'a'", lambda: attn.save_safetensors("/nonexistent/x", {"a": np.ones(2, c)})


class TestValidation(unittest.TestCase):
    def test_every_case_raises_a_named_one_line_error(self):
        n = 0
        for name, arg, call in cases():
            n += 1
            with self.subTest(name):
                with self.assertRaises(ERRORS) as cm:
                    call()
                msg = str(cm.exception)
                self.assertNotIn("\n", msg)
                self.assertIn(arg, msg, "%s: the message does not name %r" % (name, arg))
        self.assertGreater(n, 80)

    def test_type_mistakes_are_type_errors(self):
        q, k, v = arrays()
        for bad in (q.astype(np.complex64), q.astype(object), q.astype(np.int64), q > 0):
            with self.assertRaises(TypeError):
                attn.sdpa(bad, k, v)
        with self.assertRaises(TypeError):
            attn.sdpa(q, k, v, mask=np.zeros((L, L), np.int64))
        with self.assertRaises(attn.AttnTypeError) as cm:
            attn.sdpa(q, k, v, scale="1")
        self.assertEqual(cm.exception.name, "ATTN_ERR_INVALID_ARG")
        self.assertTrue(issubclass(attn.AttnError, RuntimeError))

    def test_refused_calls_change_nothing(self):
        q, k, v = arrays()
        cache = attn.KVCache(1, 2, 4, 8)
        cache.append(k[:, :, :1], v[:, :, :1])
        before = cache.keys().copy()
        for bad in (lambda: cache.append(k, v.astype(np.complex64)), lambda: cache.append(k, v.astype(np.int32)),
                    lambda: cache.truncate(0.5)):
            with self.assertRaises(ERRORS):
                bad()
            self.assertEqual(len(cache), 1)
            np.testing.assert_array_equal(cache.keys(), before)
        ctx = attn.Context(seed=5)
        state = ctx.rng_state()
        with self.assertRaises(ERRORS):
            attn.sdpa(q, k, v, dropout_p=0.5, mask=np.zeros((L, L), np.int64), ctx=ctx)
        a = attn.sdpa(q, k, v, dropout_p=0.5, ctx=ctx)
        ctx.set_rng_state(state)
        np.testing.assert_array_equal(attn.sdpa(q, k, v, dropout_p=0.5, ctx=ctx), a)

    def test_what_stays_accepted(self):
        # documented conversions: float16/float64 q, float64 masks, Python lists of floats, numpy
        # integer scalars for sizes, bool masks
        q, k, v = arrays()
        want = attn.sdpa(q, k, v)
        np.testing.assert_allclose(attn.sdpa(q.astype(np.float64), k, v), want, rtol=1e-6)
        np.testing.assert_allclose(attn.sdpa(q.tolist(), k.tolist(), v.tolist()), want, rtol=1e-6)
        m = np.zeros((L, L))
        np.testing.assert_array_equal(attn.sdpa(q, k, v, mask=m), want)
        np.testing.assert_array_equal(attn.sdpa(q, k, v, mask=m > 0), want)
        self.assertEqual(attn.KVCache(np.int64(1), 2, 4, np.int32(8)).capacity, 8)
        attn.sdpa(q, k, v, scale=np.float32(0.5), dropout_p=0, window=(np.int64(1), None))


if __name__ == "__main__":
    unittest.main()
