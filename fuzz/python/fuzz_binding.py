"""fuzz_binding.py - the numpy binding (python/attn) driven by fuzzer bytes: random shapes, dtypes,
strides (non-contiguous, negative, broadcast views) and options of attn.sdpa and sdpa_backward,
checked against the float64 numpy reference of tests/python/test_binding.py (ref_sdpa,
ref_sdpa_backward). Every input either gives a result within tolerance or, when the bytes asked for
a mistake (a complex/integer/object array, an integer mask, k and v of different dtypes, a bad
scale, dropout_p, window or ALiBi slopes), raises AttnError, TypeError or ValueError; anything else
(another exception, a wrong number, a crash) is a finding.

  test_one_input(data)      the check, for one input (no atheris needed)
  python3 fuzz/python/fuzz_binding.py -max_total_time=N fuzz/python/corpus   the fuzzer (atheris)
  python3 fuzz/python/replay.py                                             replays the corpus

ATTN_LIBRARY picks the library (default build/libattn.so).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
os.environ.setdefault("ATTN_LIBRARY", os.path.join(ROOT, "build", "libattn.so"))

import numpy as np  # noqa: E402

ERRORS = None  # set by load(): (attn.AttnError, TypeError, ValueError)
attn = ref = None


def load():
    """Imports attn and the reference (under atheris.instrument_imports when fuzzing)."""
    global attn, ref, ERRORS
    import attn as _attn
    import test_binding as _ref
    attn, ref = _attn, _ref
    ERRORS = (attn.AttnError, TypeError, ValueError)


class Bytes:
    """Draws small integers and floats from the input, zeros once it is used up."""

    def __init__(self, data):
        self.data, self.at, self.draws = data, 0, 0

    def byte(self):
        if self.at >= len(self.data):
            return 0
        self.at += 1
        return self.data[self.at - 1]

    def int(self, lo, hi):
        """An integer in [lo, hi]."""
        return lo + self.byte() % (hi - lo + 1)

    def pick(self, options):
        return options[self.byte() % len(options)]

    def floats(self, n):
        """n floats in [-4, 4): from a generator seeded by the whole input and the draw count, so
        that the input's bytes go to the choices (shapes, dtypes, layouts, options)."""
        self.draws += 1
        rng = np.random.default_rng([self.draws] + list(self.data[:64]))
        return rng.uniform(-4, 4, n)


BAD_ARRAY = [np.complex64, np.int32, np.bool_, object]


def layout(b, a):
    """a as the fuzzer picks: as is, a strided view of a larger array, reversed, Fortran order, or a
    broadcast (stride-0) view over a size-1 leading dimension."""
    how = b.int(0, 5)
    if how == 1:  # every other element of a twice-as-long last axis
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        return big[..., ::2]
    if how == 2:  # negative strides (the binding copies these)
        return a[:, :, ::-1, :][:, :, ::-1, :]
    if how == 3:
        return np.asfortranarray(a)
    if how == 4 and a.shape[0] > 1:  # the same batch entry broadcast
        return np.broadcast_to(a[:1], a.shape)
    if how == 5:  # dims swapped in memory
        return np.ascontiguousarray(a.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    return a


def draw(b):
    """(args, options, the reference's k and v, expect_error)."""
    Hkv = b.int(1, 3)
    B, H, L, S = b.int(1, 2), Hkv * b.int(1, 2), b.int(1, 6), b.int(1, 7)
    D, Dv = b.int(1, 9), b.pick([None, 1, 3, 8, 16])
    Dv = D if Dv is None else Dv
    q = b.floats(B * H * L * D).reshape(B, H, L, D)
    k = b.floats(B * Hkv * S * D).reshape(B, Hkv, S, D)
    v = b.floats(B * Hkv * S * Dv).reshape(B, Hkv, S, Dv)
    bad = False
    opts = {}
    q_dtype = b.pick([np.float32, np.float32, np.float64, np.float16])
    if b.int(0, 15) == 0:
        q_dtype, bad = b.pick(BAD_ARRAY), True
    q = layout(b, q.astype(q_dtype))
    q_ref = q if bad else q.astype(np.float32)  # the values the library reads
    kv = b.pick(["f32", "f32", "f16", "bf16"])
    if kv == "f16":
        k, v = layout(b, k.astype(np.float16)), layout(b, v.astype(np.float16))
        k_ref, v_ref = k.astype(np.float64), v.astype(np.float64)
    elif kv == "bf16":
        k, v = layout(b, attn.to_bfloat16(k)), layout(b, attn.to_bfloat16(v))
        k_ref, v_ref = attn.from_bfloat16(k), attn.from_bfloat16(v)
        opts["kv_dtype"] = "bf16"
    else:
        k, v = layout(b, k.astype(np.float32)), layout(b, v.astype(np.float32))
        k_ref, v_ref = k, v
    mistake = b.int(0, 31)
    if mistake == 1 and kv == "f32":
        v, bad = v.astype(np.float16), True  # k and v of different dtypes
    elif mistake == 2:
        k, bad = k.astype(b.pick(BAD_ARRAY)), True
    causal = b.pick([None, None, "top_left", "bottom_right"])
    if causal:
        opts["causal"] = causal
    m = b.int(0, 4)
    if m:
        shape = [(L, S), (B, 1, L, S), (1, H, 1, S), (H, L, S)][m - 1]
        if b.int(0, 1):
            opts["mask"] = b.floats(int(np.prod(shape))).reshape(shape) < -2.0
        else:
            opts["mask"] = b.floats(int(np.prod(shape))).reshape(shape).astype(b.pick([np.float32, np.float64]))
        if mistake == 3:
            opts["mask"], bad = opts["mask"].astype(b.pick([np.int64, np.complex64, np.uint8])), True
    if b.int(0, 3) == 0:
        opts["key_padding_mask"] = b.floats(B * S).reshape(B, S) < -3.0
    if b.int(0, 2) == 0:
        opts["scale"] = float(b.pick([0.1, 0.5, 2.0, -1.0, 1e-3]))
    if b.int(0, 3) == 0:
        opts["window"] = (b.pick([None, 0, 1, 3]), b.pick([None, 0, 2]))
    if b.int(0, 3) == 0:
        opts["alibi"] = (2.0 ** -np.arange(1, H + 1)).astype(np.float32)
    if b.int(0, 3) == 0:
        opts["softcap"] = float(b.pick([0.5, 1.0, 30.0]))
    if mistake == 4:
        opts["scale"], bad = b.pick([float("nan"), float("inf"), "1", 1j]), True
    elif mistake == 5:
        opts["dropout_p"], bad = b.pick([-0.5, 1.5, float("nan"), "0"]), True
    elif mistake == 6:
        opts["window"], bad = b.pick([(-3, 0), (1.5, 0), 4]), True
    elif mistake == 7:
        opts["alibi"], bad = b.pick([np.ones(H + 1), np.full(H, np.nan), np.ones(H, np.complex64)]), True
    elif mistake == 8:
        opts["causal"], bad = b.pick([1, "yes", []]), True
    return (q, k, v), opts, (q_ref, k_ref, v_ref), bad


def lib_opts(opts):
    o = dict(opts)
    if "alibi" in o:
        o["alibi_slopes"] = o.pop("alibi")
    return o


def ref_opts(opts):
    o = {n: x for n, x in opts.items() if n not in ("kv_dtype", "dropout_p")}
    if o.get("window") is not None:
        o["window"] = tuple(-1 if x is None else x for x in o["window"])
    return o


def test_one_input(data):
    b = Bytes(data)
    (q, k, v), opts, (q_ref, k_ref, v_ref), bad = draw(b)
    backward = b.int(0, 3) == 0
    if bad:
        try:
            attn.sdpa(q, k, v, **lib_opts(opts))
        except ERRORS as exc:
            if "\n" in str(exc).strip():
                raise AssertionError("a message of several lines: %r" % str(exc))
            return
        raise AssertionError("a mistake was accepted: %s" % sorted(opts))
    out, lse = attn.sdpa(q, k, v, return_lse=True, **lib_opts(opts))
    want, want_lse, _ = ref.ref_sdpa(q_ref, k_ref, v_ref, **ref_opts(opts))
    tol = dict(rtol=2e-4, atol=5e-5)
    np.testing.assert_allclose(out, want, err_msg="out", **tol)
    np.testing.assert_allclose(lse, want_lse, err_msg="lse", **tol)
    if backward and q_ref.dtype == np.float32 and "bf16" != opts.get("kv_dtype") and not np.isinf(lse).any():
        dout = b.floats(out.size).reshape(out.shape).astype(np.float32)
        dq, dk, dv = attn.sdpa_backward(q, k, v, out, dout, lse, **lib_opts(opts))
        rdq, rdk, rdv, _ = ref.ref_sdpa_backward(q_ref, k_ref, v_ref, dout, **ref_opts(opts))
        scale = 1.0 + max(np.abs(rdq).max(), np.abs(rdk).max(), np.abs(rdv).max())
        for name, got, exp in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
            np.testing.assert_allclose(got, exp, rtol=1e-3, atol=1e-4 * scale, err_msg=name)


def main():
    import atheris
    with atheris.instrument_imports():
        load()
    g = globals()  # this file's own branches (the choices) count as coverage too
    for name in ("draw", "layout", "test_one_input", "lib_opts", "ref_opts"):
        g[name] = atheris.instrument_func(g[name])
    atheris.Setup(sys.argv, g["test_one_input"])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
else:
    load()
