"""context.py - Context: an attn_ctx (threads, kernel set, random generator, scratch memory).

A context must not be used by two threads at once. Calls that take ctx=None use a default
context of their own thread (one thread, AUTO kernels, seed 0), created on first use.
"""
import ctypes
import os
import threading

from . import _lib
from ._arrays import choice, fail_type, flag, integer
from ._handle import Handle
from ._lib import AttnError, check, fn

_ISA_NAMES = {v: k for k, v in _lib.ISA.items()}


class RngState:
    """A copy of a context's generator state (torch.get_rng_state's role): pass it to
    Context.set_rng_state, or to sdpa_backward(dropout_state=...) to replay a forward's dropout."""

    __slots__ = ("_gen",)

    def __init__(self, gen):
        self._gen = _lib.Generator()
        ctypes.pointer(self._gen)[0] = gen

    def _pointer(self):
        return ctypes.byref(self._gen)


class Philox:
    """Counter-based dropout for sdpa and its backward (attn_sdpa_desc.dropout_rng =
    ATTN_DROPOUT_RNG_PHILOX): element (b, h, i, j) is kept when word j % 4 of Philox4x32-10 with
    counter (j // 4, i, b * H + h, offset) and key seed is below floor((1 - p) * 2**32). The mask is
    a function of seed, offset and the element's place: the same on every thread count, kernel set
    and on the GPU, the context's generator is not used, and the backward needs no dropout_state.
    Calls that need independent masks use different seeds or offsets."""

    __slots__ = ("seed", "offset")

    def __init__(self, seed, offset=0):
        self.seed = integer(seed, "Philox seed")
        self.offset = integer(offset, "Philox offset")
        if not 0 <= self.seed < 1 << 64:
            raise AttnError(_lib.ERR_INVALID_ARG, "Philox seed must be in [0, 2**64), not %d" % self.seed)
        if not 0 <= self.offset < 1 << 32:
            raise AttnError(_lib.ERR_INVALID_ARG, "Philox offset must be in [0, 2**32), not %d" % self.offset)

    def __repr__(self):
        return "Philox(seed=%d, offset=%d)" % (self.seed, self.offset)


# The names of OpenMP runtimes' files (GCC's, LLVM's, Intel's), all exporting GOMP_parallel.
_OPENMP_NAMES = ("libgomp", "libomp", "libiomp5")


def openmp_runtime(prefer=None):
    """The file of an OpenMP runtime already loaded in this process (read from /proc/self/maps;
    None when there is none, or no /proc): the first under the directory `prefer` when one is (the
    torch package's, for the runtime torch runs its threads on), else the first libgomp, libomp or
    libiomp5 mapped. Context(openmp=True) runs its threads on it."""
    try:
        with open("/proc/self/maps") as f:
            fields = [line.split(None, 5) for line in f]
    except OSError:
        return None
    found = []
    for path in (x[5].strip() for x in fields if len(x) == 6):  # the mapped file, where there is one
        if os.path.basename(path).startswith(_OPENMP_NAMES) and ".so" in path and path not in found:
            found.append(path)
    if prefer:
        under = [p for p in found if p.startswith(os.path.join(os.path.realpath(prefer), ""))]
        if under:
            return under[0]
    return found[0] if found else None


def _gomp_parallel(path):
    """The address of GOMP_parallel in the already-loaded runtime at path (never loads another)."""
    try:
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_LAZY", 1))
        return ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


class Context(Handle):
    """An attn_ctx. Context(threads=1, isa="auto", seed=0, use_blas=False, openmp=False).

    threads: threads used by compute calls (results are identical for every count);
    isa: "auto", "ref" (scalar reference), "generic", "avx2", "avx512", "avx512vnni", "avx512bf16"
        or "amxbf16";
    seed: seed of the context's generator (torch.manual_seed's numbers), used by dropout and by
    module initialisation;
    use_blas: projections through CBLAS, loaded now (see has_blas; without it the library's own
    GEMM serves);
    openmp: False (default): the context starts threads - 1 threads of its own; True: it starts
    none and runs its loops on the threads of the OpenMP runtime this process has loaded
    (openmp_runtime(); torch's, as attn.torch's contexts do), as one parallel region of `threads`
    threads each (attn_executor_gomp), so that they do not compete for the cores with that
    runtime's waiting threads; a path: the runtime loaded from that file. AttnError (unsupported)
    when no such runtime is loaded. Usable as a context manager; close() frees it (also on garbage
    collection). Objects created with a context (MHA, KVCache) keep it alive."""

    _FREE, _WHAT = "attn_ctx_free", "the context"

    def __init__(self, threads=1, isa="auto", seed=0, use_blas=False, openmp=False):
        self._ptr = None
        params = _lib.CtxParams()
        fn("attn_ctx_params_init")(ctypes.byref(params))
        threads = integer(threads, "threads")
        if not 0 <= threads <= 4096:
            raise AttnError(_lib.ERR_INVALID_ARG, "threads = %d is out of range [0, 4096]" % threads)
        params.n_threads = threads
        params.isa = choice(isa, _lib.ISA, "isa")
        params.seed = integer(seed, "seed") & 0xFFFFFFFFFFFFFFFF
        params.use_blas = 1 if flag(use_blas, "use_blas") else 0
        self.openmp = None
        if openmp is not False and openmp is not None:
            if openmp is True:
                path = openmp_runtime()
            elif isinstance(openmp, (str, os.PathLike)):
                path = os.fspath(openmp)
            else:
                fail_type("openmp must be True, False or the path of a loaded OpenMP runtime, not %s"
                          % type(openmp).__name__)
            entry = _gomp_parallel(path) if path else None
            if entry is None:
                raise AttnError(_lib.ERR_UNSUPPORTED, "openmp: no OpenMP runtime exporting GOMP_parallel is loaded"
                                + (" from %s" % path if path else " in this process"))
            check(fn("attn_executor_gomp")(entry, ctypes.byref(params.executor)))
            self.openmp = path
        ptr = ctypes.c_void_p()
        status = fn("attn_ctx_create")(ctypes.byref(params), ctypes.byref(ptr))
        if status != _lib.OK:
            why = {_lib.ERR_UNSUPPORTED: "isa %r cannot run on this CPU or build" % isa,
                   _lib.ERR_INVALID_ARG: "threads = %d is out of range [0, 4096]" % params.n_threads}
            raise AttnError(status, why.get(status, _lib.strerror(status)))
        self._ptr = ptr.value
        self.threads = max(1, params.n_threads)

    def check(self, status):
        check(status, self._ptr)

    @property
    def isa(self):
        """The kernel set in use, AUTO resolved ("amxbf16", "avx512bf16", "avx512vnni", "avx512", "avx2",
        "generic" or "ref")."""
        return _ISA_NAMES.get(fn("attn_ctx_isa")(self.ptr), "?")

    @property
    def last_error(self):
        return fn("attn_ctx_last_error")(self.ptr).decode(errors="replace")

    def manual_seed(self, seed):
        """Seeds the context's generator as torch.manual_seed(seed) seeds torch's."""
        fn("attn_generator_seed")(fn("attn_ctx_generator")(self.ptr), integer(seed, "seed") & 0xFFFFFFFFFFFFFFFF)

    def rng_state(self):
        """A copy of the generator's state."""
        return RngState(fn("attn_ctx_generator")(self.ptr)[0])

    def set_rng_state(self, state):
        if not isinstance(state, RngState):
            fail_type("state must be an attn.RngState (ctx.rng_state()), not %s" % type(state).__name__)
        fn("attn_ctx_generator")(self.ptr)[0] = state._gen

    def reserve(self, nbytes):
        """Grows the context's scratch memory to at least nbytes now."""
        self.check(fn("attn_ctx_reserve")(self.ptr, integer(nbytes, "nbytes")))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._ptr is None:
            return "Context(closed)"
        omp = ", openmp=%r" % self.openmp if self.openmp else ""
        return "Context(threads=%d, isa=%r%s)" % (self.threads, self.isa, omp)


_local = threading.local()


def default_context():
    """This thread's default context (created on first use)."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = Context()
    return ctx


def resolve(ctx, default=None):
    """ctx, checked to be a Context; for None, `default` (or this thread's default context)."""
    if ctx is None:
        return default if default is not None else default_context()
    if not isinstance(ctx, Context):
        fail_type("ctx must be an attn.Context or None, not %s" % type(ctx).__name__)
    return ctx
