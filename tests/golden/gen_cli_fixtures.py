"""Small input files for the CLI error tests (tests/cli_errors.sh): a valid nn.MultiheadAttention
state (E=4, H=2) and inputs, plus broken variants. numpy only; run once and commit the files:
    /usr/bin/python3 tests/golden/gen_cli_fixtures.py
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "py"))
import tensorfile  # noqa: E402

out = os.path.join(HERE, "cli")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
state = {"in_proj_weight": f32(12, 4), "in_proj_bias": f32(12), "out_proj.weight": f32(4, 4), "out_proj.bias": f32(4)}
tensorfile.write_safetensors(os.path.join(out, "state.safetensors"), state)
bad = dict(state)
bad["in_proj_weight"] = f32(11, 4)
tensorfile.write_safetensors(os.path.join(out, "state_bad_shape.safetensors"), bad)
np.save(os.path.join(out, "q.npy"), f32(3, 2, 4))          # (L, N, E)
np.save(os.path.join(out, "q_f64.npy"), f32(3, 2, 4).astype(np.float64))
np.save(os.path.join(out, "q_e5.npy"), f32(3, 2, 5))
np.save(os.path.join(out, "mask_bad.npy"), np.zeros((3, 4), bool))
np.save(os.path.join(out, "mask_i64.npy"), np.zeros((3, 3), np.int64))
np.save(os.path.join(out, "kpm.npy"), np.zeros((2, 3), bool))
np.save(os.path.join(out, "q4.npy"), f32(1, 2, 3, 4))       # (B, H, L, D)
np.save(os.path.join(out, "k4_bad.npy"), f32(1, 2, 5, 3))
with open(os.path.join(out, "q.npy"), "rb") as fh:
    data = fh.read()
with open(os.path.join(out, "q_truncated.npy"), "wb") as fh:
    fh.write(data[:-5])
print("wrote", out)
