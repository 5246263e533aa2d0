"""replay.py - runs fuzz_binding.test_one_input over every file of the corpus (no atheris needed):
what `make test` runs (CTest python_fuzz_replay). Exits 77 (skipped) without numpy.

  python3 fuzz/python/replay.py [corpus folders or files...]   (default fuzz/python/corpus)
"""
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import numpy  # noqa: F401
except ImportError:
    print("SKIP: numpy is not installed")
    sys.exit(77)
sys.path.insert(0, HERE)
import fuzz_binding  # noqa: E402


def files(paths):
    for p in paths:
        if os.path.isdir(p):
            for name in sorted(os.listdir(p)):
                yield os.path.join(p, name)
        else:
            yield p


def main(argv):
    paths = argv[1:] or [os.path.join(HERE, "corpus")]
    n, failed = 0, 0
    for path in files(paths):
        with open(path, "rb") as f:
            data = f.read()
        n += 1
        try:
            fuzz_binding.test_one_input(data)
        except Exception:  # noqa: BLE001 - every failure is reported, then the exit status says it
            failed += 1
            print("FAIL %s" % path)
            traceback.print_exc()
    print("%d inputs replayed, %d failed" % (n, failed))
    if n == 0:
        print("no inputs found in %s" % paths)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
