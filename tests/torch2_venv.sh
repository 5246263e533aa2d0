#!/bin/sh
# Makes, or reuses when it already imports everything, a virtual environment with PyTorch 2.x,
# numpy, transformers and safetensors from PyPI: the interpreter for the tests registered under
# -DATTN_TORCH2_PYTHON and for tests/pip_install_test.sh. About 5.6 GB and 2 minutes to make: PyPI's
# Linux torch is the CUDA build, and it does not import without its CUDA libraries (see
# python/README.md, "Tests"). pip's cache is off: it would hold a second copy of those wheels.
# usage: tests/torch2_venv.sh [DIR]   (DIR defaults to build-venv; PYTHON picks the base interpreter,
# default /usr/bin/python3). Prints the absolute path of DIR/bin/python, and nothing else, on stdout.
set -eu
dir="${1:-build-venv}"
base="${PYTHON:-/usr/bin/python3}"
[ -x "$base" ] || base=python3
if ! { [ -x "$dir/bin/python" ] && "$dir/bin/python" -c 'import torch, numpy, transformers, safetensors' 2> /dev/null; }; then
    rm -rf "$dir"
    "$base" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --no-cache-dir "torch>=2.4,<3" numpy "transformers>=5,<6" safetensors >&2
fi
echo "$(cd "$dir" && pwd)/bin/python"
