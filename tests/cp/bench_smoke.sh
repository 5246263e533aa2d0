#!/bin/sh
# bench_smoke.sh MPIEXEC ATTN_CP RUN_CP: a short `attn-cp bench` on 2 ranks (both layouts, causal,
# forward and backward, JSON) must succeed and print every rank's row and the model; a usage error
# must exit with status 2 and a message.
set -u
mpiexec=$1 tool=$2 run=$3
out=$(sh "$run" "$mpiexec" 2 "$tool" -- bench --len 301 --heads 2 --head-dim 16 --causal --layout both \
    --backward --repeat 2 --json 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "bench_smoke: attn-cp bench exited with $rc" >&2; exit 1; }
for want in "zigzag, causal, forward" "contiguous, causal, backward" "balance:" "hidden from Lloc" '"runs": ['; do
    echo "$out" | grep -qF "$want" || { echo "bench_smoke: the output lacks '$want'" >&2; exit 1; }
done
[ "$(echo "$out" | grep -c '^   [01] ')" -eq 8 ] || { echo "bench_smoke: expected 2 ranks x 4 runs" >&2; exit 1; }
sh "$run" "$mpiexec" 1 "$tool" -- bench --len 0 > /dev/null 2>&1
rc=$?
[ $rc -eq 2 ] || { echo "bench_smoke: a usage error exited with $rc, not 2" >&2; exit 1; }
exit 0
