#!/bin/sh
# `attn bench` on small problems of every kind it times: each run must pass its check against the
# scalar reference (the bench exits 1 when the kernels disagree), print its one-line summary, and
# end with a JSON object whose median and fastest times are positive, fastest <= median; and the
# number of runs without --repeat (more than 5 for a short call) and with it.
# usage: bench_smoke.sh ATTN
attn="$1"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0

# run LABEL WORDS_EXPECTED_IN_THE_SUMMARY -- ARGS...
run() {
    what="$1"
    want="$2"
    shift 3
    if ! "$attn" bench --repeat 3 --threads 2 --json "$@" > "$tmp/out" 2> "$tmp/err"; then
        echo "FAIL $what: exit status $?"; cat "$tmp/err"; failures=$((failures + 1)); return
    fi
    if ! grep -q "$want" "$tmp/out"; then
        echo "FAIL $what: no '$want' in:"; cat "$tmp/out"; failures=$((failures + 1)); return
    fi
    times=$(tail -n 1 "$tmp/out" | sed -n 's/.*"median_ms": \([0-9.e+-]*\), "fastest_ms": \([0-9.e+-]*\),.*/\1 \2/p')
    if ! echo "$times" | awk '{ exit !(NF == 2 && $1 > 0 && $2 > 0 && $2 <= $1) }'; then
        echo "FAIL $what: median and fastest not as expected ('$times') in:"; cat "$tmp/out"
        failures=$((failures + 1)); return
    fi
    echo "ok   $what: $(head -n 1 "$tmp/out" | cut -c1-150)"
}

agrees="agrees with the reference"
run "sdpa" "$agrees" -- --heads 2 --len-q 40 --len-kv 70 --head-dim 32
run "sdpa causal GQA" "$agrees" -- --heads 4 --kv-heads 2 --len-q 70 --len-kv 70 --head-dim 64 --causal
run "sdpa forward+backward" "forward+backward.*$agrees" -- --heads 2 --len-q 50 --len-kv 50 --head-dim 32 --backward
run "sdpa causal local window" "causal window=24,0 .*$agrees" -- --heads 2 --len-q 90 --head-dim 32 --causal --window 24,0
run "sdpa local window forward+backward" "window=16,5 .*forward+backward.*$agrees" -- --heads 2 --len-q 60 --len-kv 75 --head-dim 32 --window 16,5 --backward
run "sdpa bf16" "$agrees" -- --heads 2 --len-q 64 --len-kv 64 --head-dim 64 --dtype bf16
run "mha" "mha F32 B=1 E=64 H=4 L=30" -- --op mha --embed-dim 64 --heads 4 --len-q 30 # (no reference check)
# a bf16 module's row against the peak of the instructions its products run on (AUTO's table), or
# none where that peak cannot be measured (the emulated build's tiles)
run "mha bf16" "mha BF16 B=1 E=64 H=4 L=70" -- --op mha --embed-dim 64 --heads 4 --len-q 70 --dtype bf16
json=$(tail -n 1 "$tmp/out")
case "$json" in
    *'"isa": "avx512bf16"'*) peak='"vdpbf16ps"' ;;
    *'"isa": "amxbf16"'*) peak='"tdpbf16ps"' ;;
    *'"isa": "avx512'*) peak='"FMA (512-bit)"' ;;
    *'"isa": "avx2"'*) peak='"FMA (256-bit)"' ;;
    *) peak=null ;;
esac
if ! echo "$json" | grep -qF -e "\"peak_instr\": $peak" -e '"peak_instr": null'; then
    echo "FAIL mha bf16: peak_instr is not $peak in: $json"; failures=$((failures + 1))
fi
for kv in f32 f16 bf16 q8_0 q4_0; do
    run "decode $kv" "kv=$kv.*$agrees" -- --op decode --heads 8 --kv-heads 2 --len-kv 300 --head-dim 64 --kv-dtype $kv
done
for dt in f32 bf16; do # (no reference check)
    run "mha-decode $dt" "mha-decode B=2 E=64 H=4 S=100 dtype=$dt kv=$dt" -- --op mha-decode --batch 2 --embed-dim 64 --heads 4 --len-kv 100 --dtype $dt
done
run "mha-decode f16 q8_0" "dtype=f16 kv=q8_0" -- --op mha-decode --embed-dim 64 --heads 2 --len-kv 40 --dtype f16 --kv-dtype q8_0
# without --repeat a call whose warm-up took under 50 ms takes more than 5 runs (as many as fit in
# 0.25 s, at most 1000), a longer one 5; --repeat R takes R
for given in "" "--repeat 7"; do
    if ! "$attn" bench --heads 2 --len-q 16 --len-kv 16 --head-dim 32 --json $given > "$tmp/out" 2> "$tmp/err"; then
        echo "FAIL runs ($given): exit status $?"; cat "$tmp/err"; failures=$((failures + 1)); continue
    fi
    runs=$(tail -n 1 "$tmp/out" | sed -n 's/.*"repeat": \([0-9]*\),.*/\1/p')
    warm=$(tail -n 1 "$tmp/out" | sed -n 's/.*"warmup_ms": \([0-9.e+-]*\),.*/\1/p')
    if [ -z "$given" ] && ! echo "$runs $warm" | awk '{ exit !(NF == 2 && ($2 * 5 < 250 ? $1 > 5 && $1 <= 1000 : $1 == 5)) }'; then
        echo "FAIL runs: without --repeat, a warm-up of '$warm' ms and '$runs' runs"; failures=$((failures + 1))
    elif [ -n "$given" ] && [ "$runs" != 7 ]; then
        echo "FAIL runs: --repeat 7 took '$runs' runs"; failures=$((failures + 1))
    else
        echo "ok   runs ($given): $runs"
    fi
done
if [ "$failures" -ne 0 ]; then echo "$failures failures"; exit 1; fi
