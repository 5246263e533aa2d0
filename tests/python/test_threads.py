"""Python threads calling the binding at the same time (ctypes releases the GIL during each library
call, so the calls really overlap): contexts never shared between threads, as documented
(explicit ones with 1 and 2 compute threads, each thread's default context, and a second context
per thread for its MHA module), each thread running sdpa (dropout
included), sdpa_backward, an MHA forward and a KV-cache decode loop on inputs of its own, several
rounds. Every result must equal, bit for bit, the same call made before on the main thread alone.

Run: /usr/bin/python3 tests/python/test_threads.py [-v]  (ATTN_LIBRARY=path/to/libattn.so;
by default build/libattn.so). ATTN_THREADS_ROUNDS sets the rounds per thread (default 3).
Exits 77 (skipped) without numpy. Under ThreadSanitizer: `make test-tsan-python`
(docs/reliability.md).
"""
import os
import sys
import threading
import unittest

import source_tree  # tests/python/source_tree.py, beside this file

source_tree.use_package()
np = source_tree.numpy_or_skip()
import attn  # noqa: E402

N_THREADS = 6
ROUNDS = int(os.environ.get("ATTN_THREADS_ROUNDS", "3"))


def inputs(i):
    rng = np.random.default_rng(100 + i)
    B, H, Hkv, L, S, D = 2, 4, 2, 9 + i, 13 + i, 16
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return dict(q=f(B, H, L, D), k=f(B, Hkv, S, D), v=f(B, Hkv, S, D), dout=f(B, H, L, D),
                x=f(7, 2, 32), mask=rng.random((L, S)) < 0.2, seed=i)


def work(i, ctx):
    """Every result of thread i's calls, in order. ctx None: the thread's default context."""
    a = inputs(i)
    c = attn.default_context() if ctx is None else ctx
    c.manual_seed(a["seed"])
    state = c.rng_state()
    out = attn.sdpa(a["q"], a["k"], a["v"], causal="bottom_right", dropout_p=0.25, ctx=ctx)
    plain, lse = attn.sdpa(a["q"], a["k"], a["v"], mask=a["mask"], return_lse=True, ctx=ctx)
    grads = attn.sdpa_backward(a["q"], a["k"], a["v"], plain, a["dout"], lse, mask=a["mask"], ctx=ctx)
    m = attn.MHA(32, 4, ctx=attn.Context(threads=1 + i % 2, seed=a["seed"]))  # a second context of this thread
    y, w = m(a["x"], causal=True, need_weights=True)
    results = [out, plain, lse, *grads, y, w]
    if attn.has_kv_cache():
        cache = attn.KVCache(2, 2, 16, 32, ctx=c)
        for t in range(a["k"].shape[2]):
            cache.append(a["k"][:, :, t:t + 1], a["v"][:, :, t:t + 1])
            results.append(cache.attend(a["q"][:, :, t % a["q"].shape[2]:][:, :, :1]))
        cache.truncate(3)
        results.append(cache.attend(a["q"]))
    c.set_rng_state(state)
    results.append(attn.sdpa(a["q"], a["k"], a["v"], causal="bottom_right", dropout_p=0.25, ctx=ctx))
    return results


def make_ctx(i):
    return None if i % 3 == 2 else attn.Context(threads=1 + i % 2)


class TestThreads(unittest.TestCase):
    def test_concurrent_calls_match_single_threaded(self):
        want = [work(i, make_ctx(i)) for i in range(N_THREADS)]
        got = [[] for _ in range(N_THREADS)]
        errors = []
        start = threading.Barrier(N_THREADS)

        def run(i):
            try:
                ctx = make_ctx(i)
                start.wait()
                for _ in range(ROUNDS):
                    got[i].append(work(i, ctx))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append((i, exc))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(N_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for i in range(N_THREADS):
            self.assertEqual(len(got[i]), ROUNDS)
            for r, res in enumerate(got[i]):
                self.assertEqual(len(res), len(want[i]))
                for j, (a, b) in enumerate(zip(res, want[i])):
                    np.testing.assert_array_equal(a, b, err_msg="thread %d round %d result %d" % (i, r, j))

    def test_default_contexts_are_per_thread(self):
        seen = {}

        def run(i):
            seen[i] = attn.default_context()  # kept alive, so no two can share an id()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len({id(c) for c in seen.values()}), 4)
        self.assertNotIn(id(attn.default_context()), {id(c) for c in seen.values()})


def race_control():
    """One context used by two threads at once (what the documentation forbids): under
    ThreadSanitizer this must be reported, which shows the detector sees the library's memory."""
    ctx = attn.Context(threads=1)
    q = np.random.default_rng(0).standard_normal((2, 4, 64, 32)).astype(np.float32)

    def run():
        for _ in range(20):
            attn.sdpa(q, q, q, ctx=ctx)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    if sys.argv[1:] == ["--race-control"]:
        race_control()
        sys.exit(0)
    unittest.main()
