#!/bin/sh
# make fuzz-python: runs fuzz/python/fuzz_binding.py (atheris) for SECONDS over a copy of
# fuzz/python/corpus, then merges the inputs that add coverage back into it; failing inputs are
# written to fuzz/python/findings/.
#   sh fuzz/python/run.sh LIBATTN SECONDS [PYTHON]
# PYTHON needs atheris and numpy (pip install atheris numpy into a virtual environment of its own).
set -u
lib=$1
seconds=$2
python=${3:-python3}
here=$(cd "$(dirname "$0")" && pwd)
if ! "$python" -c "import atheris, numpy" 2>/dev/null; then
  echo "$python has no atheris (or numpy): python3 -m venv V && V/bin/pip install atheris numpy, then"
  echo "make fuzz-python ATHERIS_PYTHON=V/bin/python"
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here"/corpus/* "$work"/
mkdir -p "$here/findings"
export ATTN_LIBRARY="$lib"
"$python" "$here/fuzz_binding.py" -max_total_time="$seconds" -rss_limit_mb=4096 \
  -artifact_prefix="$here/findings/" "$work" 2>&1 | grep -v "NEW\|REDUCE\|pulse"
rc=$?
"$python" "$here/fuzz_binding.py" -merge=1 "$here/corpus" "$work" > "$work.merge.log" 2>&1 \
  || { cat "$work.merge.log"; rm -f "$work.merge.log"; exit 1; }
rm -f "$work.merge.log"
echo "corpus: $(ls "$here/corpus" | wc -l) inputs"
exit $rc
