"""_handle.py - Handle: the base of the classes that own one library object (Context, MHA,
KVCache): its pointer, refused once closed, and its release by close() or garbage collection."""
from . import _lib
from ._lib import AttnError, fn


class Handle:
    """A subclass names _FREE, the library function that frees its object (attn_mha_free, ...),
    and _WHAT, the object in the message of a use after close ("the module"); its __init__ sets
    self._ptr (None until the object exists, so that a failed __init__ frees nothing)."""

    _FREE = None
    _WHAT = None

    @property
    def ptr(self):
        """The library's pointer; AttnError (ATTN_ERR_INVALID_ARG) once closed."""
        if self._ptr is None:
            raise AttnError(_lib.ERR_INVALID_ARG, "%s is closed" % self._WHAT)
        return self._ptr

    def close(self):
        """Frees the library's object now; later uses raise AttnError. Closing twice is allowed."""
        if getattr(self, "_ptr", None) is not None:
            fn(self._FREE)(self._ptr)
            self._ptr = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
