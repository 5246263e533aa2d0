#!/bin/sh
# The Python package as users install it: `pip install .` into a fresh virtual environment, then the
# package's tests run from a directory outside the source tree (so `import attn` can only find the
# installed copy); then `pip wheel .`, and the wheel installed into a second fresh environment in
# another directory, checked to be self-contained (library and tool inside the package, needing only
# libc and libm, no path of the source tree in any file).
#
# usage: tests/pip_install_test.sh PYTHON [SOURCE_DIR]
# PYTHON: an interpreter with torch >= 2.4, numpy and transformers (.ci/run's build-venv/bin/python).
# The fresh environments are made by it (from its base interpreter) and reach its site-packages
# through a .pth file, so torch and transformers are not downloaded again: what is installed fresh,
# and tested, is attn. Needs PyPI for the build backend (scikit-build-core), as pip does.
set -eu
py="$1"
src=$(cd "${2:-$(dirname "$0")/..}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset PYTHONPATH ATTN_LIBRARY ATTN_TOOL
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

fresh_venv() {  # $1: directory; prints nothing
    "$py" -m venv "$1"
    "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$tmp/purelib"
    echo "$site" > "$(cat "$tmp/purelib")/build_venv_packages.pth"
}

run_tests() {  # $1: venv; the rest: test files; exit 77 (skipped) counts as a failure here
    venv="$1"
    shift
    for t in "$@"; do
        echo "-- $t (installed package)"
        status=0
        (cd "$tmp/tests" && ATTN_EXPECT_INSTALLED=1 ATTN_SOURCE_DIR="$src" "$venv/bin/python" "$t") || status=$?
        if [ "$status" -ne 0 ]; then
            echo "FAILED: $t exited $status"
            exit 1
        fi
    done
}

mkdir -p "$tmp/tests" "$tmp/dist" "$tmp/elsewhere"
cp "$src/tests/python/test_package.py" "$src/tests/python/test_torch_ops.py" "$src/tests/python/test_hf.py" "$tmp/tests/"

echo "== pip install $src into a fresh virtual environment"
fresh_venv "$tmp/venv"
(cd "$tmp" && "$tmp/venv/bin/python" -m pip install -q "$src")
run_tests "$tmp/venv" test_package.py test_torch_ops.py test_hf.py

echo "== pip wheel, installed into another fresh environment elsewhere"
(cd "$tmp" && "$tmp/venv/bin/python" -m pip wheel -q --no-deps -w "$tmp/dist" "$src")
wheel=$(ls "$tmp"/dist/attn-*.whl)
echo "wheel: $(basename "$wheel") ($(wc -c < "$wheel") bytes)"
"$py" -m zipfile -l "$wheel"
fresh_venv "$tmp/elsewhere/venv"
(cd "$tmp/elsewhere" && "$tmp/elsewhere/venv/bin/python" -m pip install -q "$wheel")
lib=$(cd "$tmp/tests" && "$tmp/elsewhere/venv/bin/python" -c 'import attn; print(attn.library_path)')
if command -v readelf > /dev/null; then
    needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    echo "libattn.so needs: $needed"
    for n in $needed; do
        case "$n" in
            libc.so.*|libm.so.*|libpthread.so.*|ld-linux*) ;;
            *) echo "FAILED: the wheel's library needs $n"; exit 1 ;;
        esac
    done
    if readelf -d "$lib" | grep -q -E "RPATH|RUNPATH"; then
        echo "FAILED: the wheel's library has an RPATH"
        exit 1
    fi
fi
run_tests "$tmp/elsewhere/venv" test_package.py
echo "the package installs with pip and passes its tests from outside the source tree"
