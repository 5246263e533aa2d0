"""gen_io_fixtures.py - writes the .npy and .safetensors fixtures of tests/test_io.c into tests/golden/io/.

The .npy files are written by numpy itself (np.save / numpy.lib.format.write_array), so the C
reader is tested against the real format and the C writer's bytes can be compared with numpy's.
The .safetensors files are written by tests/py/tensorfile.py (pure Python) or assembled by hand
here (to put the JSON keys in a different order from the data). Every value follows a formula
that tests/test_io.c recomputes; keep the two in sync.

Run once and commit the output:  /usr/bin/python3 tests/golden/gen_io_fixtures.py
"""

import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "io")
sys.path.insert(0, os.path.join(HERE, "..", "py"))
import tensorfile  # noqa: E402


def npy(name, array, version=None):
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        if version is None:
            np.save(f, array, allow_pickle=False)
        else:
            np.lib.format.write_array(f, np.asanyarray(array), version=version, allow_pickle=False)


def f32_2x3():
    return (np.arange(6, dtype=np.float32) * np.float32(0.25) - np.float32(1)).reshape(2, 3)  # i*0.25 - 1


def f64_5():
    return np.arange(5, dtype=np.float64) / 3.0  # i / 3.0


def f16_2x3x4():
    return ((np.arange(24) - 12) * 0.5).astype(np.float16).reshape(2, 3, 4)  # (i - 12) * 0.5


def bool_7():
    return np.arange(7) % 3 == 0  # i % 3 == 0


def u8_2x2():
    return np.array([[0, 1], [254, 255]], dtype=np.uint8)


def i32_3():
    return np.array([-2**31, 0, 2**31 - 1], dtype=np.int32)


def i64_2x2():
    return np.array([[-2**63, -1], [0, 2**63 - 1]], dtype=np.int64)


def main():
    os.makedirs(OUT, exist_ok=True)
    # Supported: every dtype, 0-d, 1-d, 3-d, empty, format versions 2.0 and 3.0.
    npy("f32_2x3.npy", f32_2x3())
    npy("f64_5.npy", f64_5())
    npy("f16_2x3x4.npy", f16_2x3x4())
    npy("bool_7.npy", bool_7())
    npy("u8_2x2.npy", u8_2x2())
    npy("i32_3.npy", i32_3())
    npy("i64_2x2.npy", i64_2x2())
    npy("scalar_f32.npy", np.array(3.5, dtype=np.float32))
    npy("empty_f32_0x3.npy", np.zeros((0, 3), dtype=np.float32))
    npy("f32_1d_7.npy", np.arange(7, dtype=np.float32) * np.float32(0.25) - np.float32(1))
    npy("f32_2x3_v2.npy", f32_2x3(), version=(2, 0))
    npy("f32_2x3_v3.npy", f32_2x3(), version=(3, 0))
    # Valid .npy files libattn does not support.
    npy("fortran_f32_2x3.npy", np.asfortranarray(f32_2x3()))
    npy("bigendian_f32_4.npy", np.arange(4, dtype=">f4"))
    npy("i8_4.npy", np.arange(4, dtype=np.int8))
    npy("u16_4.npy", np.arange(4, dtype=np.uint16))

    # multi.safetensors: all eight dtypes; JSON keys sorted by name, data in another order.
    tensors = {  # name -> (dtype, shape, raw bytes), in data order
        "h.i64": ("I64", [2, 2], i64_2x2().astype("<i8").tobytes()),
        "b.f64": ("F64", [5], f64_5().astype("<f8").tobytes()),
        "a.f32": ("F32", [2, 3], f32_2x3().astype("<f4").tobytes()),
        "g.i32": ("I32", [3], i32_3().astype("<i4").tobytes()),
        "c.f16": ("F16", [2, 3, 4], f16_2x3x4().astype("<f2").tobytes()),
        "d.bf16": ("BF16", [4], np.array([0x3F80, 0xC000, 0x3F00, 0x4040], dtype="<u2").tobytes()),  # 1 -2 .5 3
        "e.bool": ("BOOL", [7], bool_7().tobytes()),
        "f.u8": ("U8", [2, 2], u8_2x2().tobytes()),
        "j.empty": ("F32", [0, 3], b""),
        "i.scalar": ("F32", [], np.array(3.5, dtype="<f4").tobytes()),
    }
    header = {"__metadata__": {"format": "pt", "note": "keys sorted, data not"}}
    pos = 0
    entries = {}
    for name, (dtype, shape, raw) in tensors.items():
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + len(raw)]}
        pos += len(raw)
    for name in sorted(entries):
        header[name] = entries[name]
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(OUT, "multi.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, raw in tensors.values()))

    # py_order.safetensors: written by tensorfile.py; attn_safetensors_write must give the same bytes.
    tensorfile.write_safetensors(os.path.join(OUT, "py_order.safetensors"), {
        "w": f32_2x3(),
        "b": i64_2x2(),
        "mask": bool_7(),
        "h": f16_2x3x4(),
        "e": np.zeros((0,), dtype=np.float32),
        "s": np.array(-0.125, dtype=np.float64),
        "name \"quoted\"\n\u00e9": np.array([7], dtype=np.uint8),
    })
    tensorfile.write_safetensors(os.path.join(OUT, "empty.safetensors"), {})
    print("wrote", len(os.listdir(OUT)), "files to", OUT)


if __name__ == "__main__":
    main()
