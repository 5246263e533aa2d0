#!/bin/sh
# bench/decode_kernels.c at head dim 32, both modes: it exits 0, prints the portable kernels' rows
# (every CPU has them) for each cache type, and its sink (a sum of the outputs, printed so that the
# work is not optimised away) is a finite number: a kernel or a walk that reads garbage, or makes
# NaN or infinity, fails.
# usage: decode_kernels_smoke.sh DECODE_KERNELS
prog="$1"
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp"' EXIT
failures=0
for mode in "" stream; do
    if ! "$prog" 32 $mode > "$tmp" 2>&1; then
        echo "FAIL decode_kernels 32 $mode: exit status $?"; cat "$tmp"; failures=$((failures + 1)); continue
    fi
    for t in f16 q8_0 q4_0; do
        if ! grep -Eq "^generic +$t( +[0-9]+\.[0-9]+)+ *$" "$tmp"; then
            echo "FAIL decode_kernels 32 $mode: no generic $t row of numbers in:"; cat "$tmp"; failures=$((failures + 1))
        fi
    done
    sink=$(sed -n 's/^(sink \(.*\))$/\1/p' "$tmp")
    if ! awk -v s="$sink" 'BEGIN { exit !(s ~ /^-?[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?$/) }'; then
        echo "FAIL decode_kernels 32 $mode: sink '$sink' is not a finite number"; cat "$tmp"; failures=$((failures + 1))
    else
        echo "ok decode_kernels 32 $mode (sink $sink)"
    fi
done
[ "$failures" -eq 0 ]
