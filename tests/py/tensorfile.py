"""tensorfile.py - read and write .npy and .safetensors files with numpy only.

What it does:
  read_npy(path) / write_npy(path, array)      thin wrappers around numpy's own .npy code
  read_safetensors(path) -> dict               name -> numpy array, in data-offset order
  write_safetensors(path, tensors, metadata)   dict name -> array (or BF16(array)), given order
  loads_safetensors(bytes) / dumps_safetensors(tensors, metadata)   the same on bytes
Supported safetensors dtypes: F32 F64 F16 BOOL U8 I32 I64, and BF16 (numpy has no bfloat16:
reading gives float32 arrays, exact; writing takes BF16(float32 array), rounded to nearest even).
The reader checks the file like libattn does (header length, strict JSON without duplicate keys,
exactly dtype/shape/data_offsets per entry, sizes, and that the tensors tile the data buffer).
The writer lays tensors out in the order given, header JSON compact and padded with spaces to a
multiple of 8 bytes, which is byte for byte what attn_safetensors_write produces.
What it does not do: import torch (callers convert with torch.from_numpy / tensor.numpy()),
memory-map, or depend on the `safetensors` package (the self-check uses it if installed).

Run as a script for a self-check: python3 tests/py/tensorfile.py
"""

import io
import json
import os
import struct
import tempfile

import numpy as np

MAX_HEADER = 100_000_000

_ST_TO_NP = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "F16": np.dtype("<f2"),
    "BOOL": np.dtype("|b1"),
    "U8": np.dtype("|u1"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
}
_NP_TO_ST = {v: k for k, v in _ST_TO_NP.items()}
_ST_SIZES = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "BOOL": 1, "U8": 1, "I32": 4, "I64": 8}


class BF16:
    """Marks a float array to be stored as bfloat16 (round to nearest even; NaN stays NaN)."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(np.asarray(array, dtype=np.float32))


def f32_to_bf16_bits(a):
    """float32 array -> uint16 array of bfloat16 bits, round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)  # keep NaN quiet
    return rounded


def bf16_bits_to_f32(bits):
    """uint16 array of bfloat16 bits -> float32 array (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---- .npy ------------------------------------------------------------------------------------

def read_npy(path):
    return np.load(path, allow_pickle=False)


def write_npy(path, array):
    """np.save to exactly `path` (np.save would append '.npy' to a str path), atomically."""
    _atomic_write(path, _npy_bytes(array))


def _npy_bytes(array):
    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    return buf.getvalue()


# ---- .safetensors ----------------------------------------------------------------------------

def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("duplicate key %r in the safetensors header" % k)
        d[k] = v
    return d


def _reject_constant(name):
    raise ValueError("%s is not valid JSON" % name)


def loads_safetensors(data, bf16="float32"):
    """Parses safetensors bytes. bf16: 'float32' (converted) or 'bits' (uint16 arrays)."""
    data = memoryview(bytes(data))
    if len(data) < 8:
        raise ValueError("truncated: %d bytes" % len(data))
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8 or n > MAX_HEADER:
        raise ValueError("header length %d is impossible for %d bytes" % (n, len(data)))
    text = bytes(data[8:8 + n]).decode("utf-8")
    header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    buf = data[8 + n:]
    entries = []
    for index, (name, info) in enumerate(header.items()):
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise ValueError("__metadata__ must map strings to strings")
            continue
        if not name or "\0" in name:
            raise ValueError("bad tensor name %r" % name)
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise ValueError("tensor %r: entry must have exactly dtype, shape, data_offsets" % name)
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _ST_SIZES:
            raise ValueError("tensor %r: unsupported dtype %r" % (name, dtype))
        ints = lambda xs: isinstance(xs, list) and all(type(x) is int and x >= 0 for x in xs)  # noqa: E731
        if not ints(shape) or not ints(offs) or len(offs) != 2:
            raise ValueError("tensor %r: bad shape or data_offsets" % name)
        begin, end = offs
        if not begin <= end <= len(buf) or end - begin != int(np.prod(shape, dtype=object)) * _ST_SIZES[dtype]:
            raise ValueError("tensor %r: data_offsets %r do not match the shape/buffer" % (name, offs))
        entries.append((begin, end, index, name, dtype, tuple(shape)))
    entries.sort()
    pos = 0
    out = {}
    for begin, end, _, name, dtype, shape in entries:
        if begin != pos:
            raise ValueError("tensor %r at %d: gap or overlap (expected %d)" % (name, begin, pos))
        pos = end
        raw = bytes(buf[begin:end])
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").reshape(shape)
            out[name] = bf16_bits_to_f32(bits) if bf16 == "float32" else bits.copy()
        else:
            out[name] = np.frombuffer(raw, dtype=_ST_TO_NP[dtype]).reshape(shape).copy()
    if pos != len(buf):
        raise ValueError("%d bytes after the last tensor" % (len(buf) - pos))
    return out


def read_safetensors(path, bf16="float32"):
    with open(path, "rb") as f:
        return loads_safetensors(f.read(), bf16=bf16)


def dumps_safetensors(tensors, metadata=None):
    """dict name -> array (or BF16(array)) -> bytes. Tensors are laid out in the dict's order."""
    header = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    blobs = []
    pos = 0
    for name, value in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError("bad tensor name %r" % (name,))
        if isinstance(value, BF16):
            dtype, shape, raw = "BF16", value.array.shape, f32_to_bf16_bits(value.array).astype("<u2").tobytes()
        else:
            a = np.asarray(value)
            key = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
            if key not in _NP_TO_ST:
                raise ValueError("tensor %r: unsupported dtype %s" % (name, a.dtype))
            dtype, shape, raw = _NP_TO_ST[key], a.shape, np.ascontiguousarray(a, dtype=key).tobytes()
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def write_safetensors(path, tensors, metadata=None):
    _atomic_write(path, dumps_safetensors(tensors, metadata))


def _atomic_write(path, data):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


# ---- self-check ------------------------------------------------------------------------------

def _self_check():
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((2, 3)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "f16": rng.standard_normal((2, 2, 2)).astype(np.float16),
        "bool": rng.integers(0, 2, 7).astype(bool),
        "u8": rng.integers(0, 256, (3, 1), dtype=np.uint8),
        "i32": rng.integers(-2**31, 2**31, 4, dtype=np.int32),
        "i64": np.array([-2**63, 0, 2**63 - 1], dtype=np.int64),
        "scalar": np.array(1.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, a in arrays.items():
            p = os.path.join(tmp, name + ".npy")
            write_npy(p, a)
            b = read_npy(p)
            assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b), name
        p = os.path.join(tmp, "t.safetensors")
        bf = BF16(np.array([1.0, -2.5, 3.140625, np.inf, 1 + 2**-9, 1 + 3 * 2**-9], dtype=np.float32))
        write_safetensors(p, dict(arrays, bf16=bf), metadata={"format": "np"})
        back = read_safetensors(p)
        assert list(back) == list(arrays) + ["bf16"], list(back)
        for name, a in arrays.items():
            assert back[name].dtype == a.dtype and back[name].shape == a.shape, name
            assert np.array_equal(back[name], a), name
        # 1 + 2^-9 is a tie: rounds to even (1.0); 1 + 3*2^-9 rounds up to 1 + 2^-7.
        assert back["bf16"].tolist() == [1.0, -2.5, 3.140625, np.inf, 1.0, 1 + 2**-7], back["bf16"]
        raw = open(p, "rb").read()
        assert struct.unpack("<Q", raw[:8])[0] % 8 == 0
        for bad in (raw[:-1], raw[:9], raw + b"\0"):
            try:
                loads_safetensors(bad)
            except (ValueError, UnicodeDecodeError):
                pass
            else:
                raise AssertionError("a damaged file was accepted")
        try:
            import safetensors.numpy as stnp  # optional cross-check with the reference implementation
        except ImportError:
            stnp = None
        if stnp is not None:
            ref = stnp.load(raw)
            for name, a in arrays.items():
                assert np.array_equal(ref[name], a), name
            mine = loads_safetensors(stnp.save(arrays))
            for name, a in arrays.items():
                assert np.array_equal(mine[name], a), name
    here = os.path.dirname(os.path.abspath(__file__))
    fixtures = os.path.join(here, "..", "golden", "io")
    checked = 0
    if os.path.isdir(fixtures):
        for f in sorted(os.listdir(fixtures)):
            if f.endswith(".safetensors") and not f.startswith("bad_"):
                read_safetensors(os.path.join(fixtures, f))
                checked += 1
    print("tensorfile self-check passed (%d fixtures read%s)" % (
        checked, ", cross-checked with safetensors" if stnp is not None else ""))


if __name__ == "__main__":
    _self_check()
