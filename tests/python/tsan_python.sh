#!/bin/sh
# Python threads calling the binding under ThreadSanitizer (make test-tsan-python).
#   sh tests/python/tsan_python.sh BUILD_DIR [PYTHON]
# BUILD_DIR holds a libattn.so built with gcc and -DATTN_SANITIZE=thread; PYTHON (default
# /usr/bin/python3, with numpy) is started with gcc's libtsan preloaded. First a control: one
# context shared by two threads (forbidden) must be reported as a data race, else the detector is
# not seeing the library and the run proves nothing. Then tests/python/test_threads.py must pass
# with no report.
set -u
build=$1
python=${2:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
rt=$(gcc -print-file-name=libtsan.so)
lib=$build/libattn.so
[ -f "$rt" ] || { echo "no libtsan.so from gcc ($rt)"; exit 1; }
[ -f "$lib" ] || { echo "no $lib"; exit 1; }
"$python" -c "import numpy" 2>/dev/null || { echo "SKIP: $python has no numpy"; exit 0; }
log=$build/tsan_python.log
export ATTN_LIBRARY="$lib" TSAN_OPTIONS="halt_on_error=1"
LD_PRELOAD="$rt" "$python" "$here/test_threads.py" --race-control > "$log" 2>&1
rc=$?
if [ $rc -eq 0 ] || ! grep -q "WARNING: ThreadSanitizer: data race" "$log"; then
  echo "FAIL: the control race (one context on two threads) was not reported (exit $rc); see $log"
  exit 1
fi
echo "control: the shared context's race was reported (exit $rc), the detector is live"
LD_PRELOAD="$rt" "$python" "$here/test_threads.py" -v > "$log" 2>&1
rc=$?
cat "$log"
if [ $rc -ne 0 ] || grep -q "ThreadSanitizer" "$log"; then
  echo "FAIL: test_threads.py under ThreadSanitizer (exit $rc)"
  exit 1
fi
echo "test_threads.py under ThreadSanitizer: no report"
