"""python -m attn [ARGS]: runs the attn command-line tool that goes with this package, with ARGS
(`attn demo`, the chapter's walkthrough, when none are given): `python -m attn bench --len-q 1024`,
`python -m attn --help`. The tool is the one `pip install .` put inside the package, or build/attn
of the source tree (see attn._lib.tool_path); ATTN_TOOL names another."""
import subprocess
import sys

from ._lib import tool_path


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv) or ["demo"]
    exe = tool_path()
    if exe is None:
        print("attn: the attn command-line tool was not found: install the package with `pip install .`, "
              "build it with `make`, or set ATTN_TOOL to its path", file=sys.stderr)
        return 1
    return subprocess.call([exe] + args)


if __name__ == "__main__":
    sys.exit(main())
