#!/bin/sh
# The attn command on bad input: a one-line message on stderr, exit status 1 (input that cannot be
# processed) or 2 (usage), never a crash, and an existing output file left untouched.
# usage: cli_errors.sh ATTN FIXTURE_DIR
attn="$1"
d="$2"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect STATUS DESCRIPTION -- COMMAND...
expect() {
    want="$1"
    what="$2"
    shift 3
    "$@" > "$tmp/stdout" 2> "$tmp/stderr"
    got=$?
    lines=$(wc -l < "$tmp/stderr")
    if [ "$got" -ne "$want" ]; then
        echo "FAIL $what: exit status $got, expected $want"; cat "$tmp/stderr"; failures=$((failures + 1))
    elif [ "$want" -ne 0 ] && { [ "$lines" -ne 1 ] || ! grep -q '^attn' "$tmp/stderr"; }; then
        echo "FAIL $what: expected one line on stderr starting with 'attn', got:"; cat "$tmp/stderr"
        failures=$((failures + 1))
    else
        echo "ok   $what -> $got: $(head -c 160 "$tmp/stderr")"
    fi
}

mha="$attn mha --state $d/state.safetensors --heads 2"
expect 2 "no command" -- $attn
expect 2 "unknown command" -- $attn frobnicate
expect 0 "--help" -- $attn --help
expect 0 "--version" -- $attn --version
for c in demo mha sdpa; do expect 0 "$c --help" -- $attn $c --help; done
expect 2 "mha without required options" -- $attn mha --heads 2
expect 2 "mha --heads not a number" -- $attn mha --state $d/state.safetensors --heads two --query $d/q.npy --out $tmp/o.npy
expect 2 "mha unknown option" -- $mha --query $d/q.npy --out $tmp/o.npy --frob
expect 2 "mha option given twice" -- $mha --query $d/q.npy --query $d/q.npy --out $tmp/o.npy
expect 2 "mha --causal with --attn-mask" -- $mha --query $d/q.npy --causal --attn-mask $d/mask_bad.npy --out $tmp/o.npy
expect 2 "mha --dropout without --seed" -- $mha --query $d/q.npy --dropout 0.1 --out $tmp/o.npy
expect 2 "mha --dropout out of range" -- $mha --query $d/q.npy --dropout 1.5 --seed 1 --out $tmp/o.npy
expect 2 "mha --per-head-weights without --weights-out" -- $mha --query $d/q.npy --per-head-weights --out $tmp/o.npy
expect 2 "mha --dtype not a float type" -- $mha --query $d/q.npy --dtype q8_0 --out $tmp/o.npy
expect 2 "mha --isa unknown" -- $mha --query $d/q.npy --isa sse9 --out $tmp/o.npy
expect 0 "mha --dtype bf16" -- $mha --query $d/q.npy --dtype bf16 --out $tmp/o_bf16.npy
expect 1 "mha missing state file" -- $attn mha --state $tmp/none.safetensors --heads 2 --query $d/q.npy --out $tmp/o.npy
expect 1 "mha state with a wrong shape" -- $attn mha --state $d/state_bad_shape.safetensors --heads 2 --query $d/q.npy --out $tmp/o.npy
expect 1 "mha heads do not divide embed_dim" -- $attn mha --state $d/state.safetensors --heads 3 --query $d/q.npy --out $tmp/o.npy
expect 1 "mha state file that is not safetensors" -- $attn mha --state $d/q.npy --heads 2 --query $d/q.npy --out $tmp/o.npy
expect 1 "mha missing query" -- $mha --query $tmp/none.npy --out $tmp/o.npy
expect 1 "mha truncated query" -- $mha --query $d/q_truncated.npy --out $tmp/o.npy
expect 1 "mha float64 query" -- $mha --query $d/q_f64.npy --out $tmp/o.npy
expect 1 "mha query of the wrong width" -- $mha --query $d/q_e5.npy --out $tmp/o.npy
expect 1 "mha mask of the wrong shape" -- $mha --query $d/q.npy --attn-mask $d/mask_bad.npy --out $tmp/o.npy
expect 1 "mha mask of an integer dtype" -- $mha --query $d/q.npy --attn-mask $d/mask_i64.npy --out $tmp/o.npy
expect 1 "mha output in a missing directory" -- $mha --query $d/q.npy --out $tmp/no/such/dir/o.npy
expect 0 "mha valid call" -- $mha --query $d/q.npy --key-padding-mask $d/kpm.npy --out $tmp/o.npy --weights-out $tmp/w.npy

# A failing run must leave an existing output file exactly as it was.
printf 'precious' > "$tmp/keep.npy"
expect 1 "mha failing after the inputs were read" -- $mha --query $d/q.npy --attn-mask $d/mask_bad.npy --out $tmp/keep.npy
if [ "$(cat "$tmp/keep.npy")" != "precious" ]; then echo "FAIL the existing output file was changed"; failures=$((failures + 1)); fi
expect 1 "mha weights to a missing directory" -- $mha --query $d/q.npy --out $tmp/keep2.npy --weights-out $tmp/no/w.npy
if ls -a "$tmp" | grep -q '\.tmp$'; then echo "FAIL a temporary file was left behind"; failures=$((failures + 1)); fi

expect 2 "sdpa without required options" -- $attn sdpa --q $d/q4.npy
expect 1 "sdpa shapes that do not fit" -- $attn sdpa --q $d/q4.npy --k $d/k4_bad.npy --v $d/k4_bad.npy --out $tmp/o.npy
expect 1 "sdpa 3-d input" -- $attn sdpa --q $d/q.npy --k $d/q.npy --v $d/q.npy --out $tmp/o.npy
expect 2 "sdpa both causal alignments" -- $attn sdpa --q $d/q4.npy --k $d/q4.npy --v $d/q4.npy --out $tmp/o.npy --causal --causal-bottom-right
expect 1 "sdpa mask that does not broadcast" -- $attn sdpa --q $d/q4.npy --k $d/q4.npy --v $d/q4.npy --mask $d/mask_bad.npy --out $tmp/o.npy
expect 1 "sdpa mask of an integer dtype" -- $attn sdpa --q $d/q4.npy --k $d/q4.npy --v $d/q4.npy --mask $d/mask_i64.npy --out $tmp/o.npy
expect 0 "sdpa valid call" -- $attn sdpa --q $d/q4.npy --k $d/q4.npy --v $d/q4.npy --causal --out $tmp/o.npy --lse-out $tmp/l.npy
expect 1 "sdpa sinks of the wrong shape" -- $attn sdpa --q $d/q4.npy --k $d/q4.npy --v $d/q4.npy --sinks $d/q4.npy --out $tmp/o.npy
expect 2 "demo with an argument" -- $attn demo --frob
expect 2 "bench --dropout out of range" -- $attn bench --dropout 1
expect 2 "bench --dropout with the module" -- $attn bench --op mha --dropout 0.1
expect 2 "bench --window below -1" -- $attn bench --window -2,0
expect 2 "bench --window without a right side" -- $attn bench --window 3
expect 2 "bench --window with the module" -- $attn bench --op mha --window 3,3
expect 2 "bench --op mha-decode with a bad embed dim" -- $attn bench --op mha-decode --embed-dim 30 --heads 4
expect 2 "bench --op mha-decode with a block-type module" -- $attn bench --op mha-decode --dtype q8_0
expect 2 "bench --op mha-decode with a cache past int64" -- $attn bench --op mha-decode --len-kv 9223372036854775807
expect 2 "bench --op decode with a query past int64" -- $attn bench --op decode --batch 4611686018427387904
expect 2 "bench with a query past int64" -- $attn bench --len-q 4611686018427387904
expect 2 "bench --op mha with an input past int64" -- $attn bench --op mha --batch 4611686018427387904
expect 1 "bench --op mha-decode, a bf16 module with an f16 cache" -- $attn bench --op mha-decode --dtype bf16 --kv-dtype f16 --embed-dim 64 --heads 4 --len-kv 8
expect 2 "bench --device cuda --dropout out of range" -- $attn bench --device cuda --backward --dropout 1.5
expect 2 "bench --device cuda --op mha with a bad embed dim" -- $attn bench --device cuda --op mha --embed-dim 30 --heads 4
expect 2 "bench --device cuda --backward of a decode" -- $attn bench --device cuda --op decode --backward
expect 2 "bench --device cuda --kernels unknown" -- $attn bench --device cuda --kernels sm75
expect 2 "bench --device cuda --kernels of a decode" -- $attn bench --device cuda --op decode --kernels sm90

# An --isa this CPU (or build) cannot run: status 1, naming it and the ISAs that are available.
expect_isa() { # LABEL ARGS...
    label=$1
    shift
    expect 1 "$label --isa $isa on a CPU without it" -- $attn "$@"
    grep -q "isa $isa is not available.*(available: auto, ref, generic" "$tmp/stderr" ||
        { echo "FAIL: the message does not name $isa and the available ISAs"; failures=$((failures + 1)); }
}
for isa in amxbf16 avx512bf16 avx512vnni avx512 avx2; do
    if ! $attn sdpa --q $d/q4.npy --k $d/q4.npy --v $d/q4.npy --isa $isa --out $tmp/isa.npy > /dev/null 2>&1; then
        expect_isa sdpa sdpa --q $d/q4.npy --k $d/q4.npy --v $d/q4.npy --out $tmp/isa.npy --isa $isa
        expect_isa mha mha --state $d/state.safetensors --heads 2 --query $d/q.npy --out $tmp/isa.npy --isa $isa
        expect_isa bench bench --repeat 1 --isa $isa
        expect_isa "bench --op decode" bench --op decode --repeat 1 --isa $isa
        expect_isa "bench --op mha-decode" bench --op mha-decode --repeat 1 --isa $isa
        break
    fi
done
# An --isa name no build knows: status 2, the message naming it, from every command that takes --isa.
expect_bad_isa() { # LABEL ARGS...
    label=$1
    shift
    expect 2 "$label --isa sse9" -- $attn "$@" --isa sse9
    grep -q "isa must be auto, .*not 'sse9'" "$tmp/stderr" ||
        { echo "FAIL: the message does not name the ISAs and 'sse9'"; failures=$((failures + 1)); }
}
expect_bad_isa sdpa sdpa --q $d/q4.npy --k $d/q4.npy --v $d/q4.npy --out $tmp/isa.npy
expect_bad_isa mha mha --state $d/state.safetensors --heads 2 --query $d/q.npy --out $tmp/isa.npy
expect_bad_isa bench bench --repeat 1
expect_bad_isa "bench --op decode" bench --op decode --repeat 1
expect_bad_isa "bench --op mha-decode" bench --op mha-decode --repeat 1
if [ "$failures" -ne 0 ]; then echo "$failures failures"; exit 1; fi
echo "all CLI error checks passed"
