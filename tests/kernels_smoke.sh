#!/bin/sh
# The kernel timing programs of bench/ at a small head dim: each exits 0, prints the portable
# kernels' rows of numbers (every CPU has them) and a sink (a sum of the outputs, printed so that the
# work is not optimised away) that is a finite number: a kernel or a walk that reads garbage, or
# makes NaN or infinity, fails.
#   decode PROG: bench/decode_kernels.c at D = 32 in both modes, a generic row for each cache type
#   flash PROG:  bench/flash_kernels.c at D = 32, in L2 and over 20 tiles with the prefetch, a generic row
# usage: kernels_smoke.sh decode|flash PROG
kind="$1"
prog="$2"
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp"' EXIT
failures=0
case "$kind" in
    decode) runs="32:f16,q8_0,q4_0 32_stream:f16,q8_0,q4_0" ;;
    flash) runs="32: 32_20_prefetch:" ;;
    *) echo "usage: $0 decode|flash PROG" >&2; exit 2 ;;
esac
for run in $runs; do
    args=$(echo "${run%%:*}" | tr _ ' ')
    if ! "$prog" $args > "$tmp" 2>&1; then
        echo "FAIL $kind $args: exit status $?"; cat "$tmp"; failures=$((failures + 1)); continue
    fi
    labels=$(echo "${run#*:}" | tr , ' ')
    for t in ${labels:-""}; do
        if ! grep -Eq "^generic +${t:+$t +}[0-9]+\.[0-9]+( +[0-9]+\.[0-9]+)* *$" "$tmp"; then
            echo "FAIL $kind $args: no generic ${t:+$t }row of numbers in:"; cat "$tmp"; failures=$((failures + 1))
        fi
    done
    sink=$(sed -n 's/^(sink \(.*\))$/\1/p' "$tmp")
    if ! awk -v s="$sink" 'BEGIN { exit !(s ~ /^-?[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?$/) }'; then
        echo "FAIL $kind $args: sink '$sink' is not a finite number"; cat "$tmp"; failures=$((failures + 1))
    else
        echo "ok $kind $args (sink $sink)"
    fi
done
[ "$failures" -eq 0 ]
