#!/bin/sh
# run.sh - runs libFuzzer targets built with ATTN_BUILD_FUZZ=ON (what `make fuzz` calls).
#
#   fuzz/run.sh BUILD_DIR SECONDS [TARGET...]      (default: every BUILD_DIR/fuzz/fuzz_* binary)
#
# For each target: copies fuzz/corpus/TARGET/ (without its crash-* reproducers, which the tests
# replay) to BUILD_DIR/fuzz-work/TARGET/corpus, fuzzes that copy for SECONDS seconds (with
# fuzz/dict/TARGET.dict when it exists), then merges whatever adds coverage back into
# fuzz/corpus/TARGET/ (-merge=1 -use_counters=0: only inputs reaching new edges are added) and
# prints one line: seconds, runs, coverage (cov/ft), corpus size and new entries. Inputs that crash
# or fail an invariant are left in BUILD_DIR/fuzz-work/TARGET/ as crash-*, leak-*, timeout-* or
# oom-*, and the script exits 1. Extra libFuzzer flags can be given in FUZZ_FLAGS. With
# ATTN_FUZZ_SKIP set (known open bugs the differential targets then steer around, see
# fuzz/README.md), new inputs that fail without it are not merged into the corpus.
set -u
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -lt 2 ]; then
    echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
    exit 2
fi
build=$1
seconds=$2
shift 2
targets=$*
if [ -z "$targets" ]; then
    for bin in "$build"/fuzz/fuzz_*; do
        [ -x "$bin" ] && targets="$targets ${bin##*/fuzz_}"
    done
fi
if [ -z "$targets" ]; then
    echo "run.sh: no fuzz_* programs in $build/fuzz (configure with -DATTN_BUILD_FUZZ=ON and clang)" >&2
    exit 2
fi

status=0
for t in $targets; do
    bin=$build/fuzz/fuzz_$t
    corpus=$here/corpus/$t
    work=$build/fuzz-work/$t
    if [ ! -x "$bin" ]; then
        echo "run.sh: $bin is missing" >&2
        status=1
        continue
    fi
    rm -rf "$work/corpus" "$work/known"
    rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$work"/slow-unit-*
    mkdir -p "$work/corpus" "$corpus"
    # crash-* files reproduce bugs (they are replayed by the tests); they are not seeds.
    find "$corpus" -maxdepth 1 -type f ! -name 'crash-*' -exec cp {} "$work/corpus"/ \;
    dict=""
    [ -f "$here/dict/$t.dict" ] && dict="-dict=$here/dict/$t.dict"
    start=$(date +%s)
    # shellcheck disable=SC2086
    "$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=30 -rss_limit_mb=2048 \
        -artifact_prefix="$work/" $dict ${FUZZ_FLAGS:-} "$work/corpus" > "$work/fuzz.log" 2>&1
    rc=$?
    elapsed=$(($(date +%s) - start))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$work/fuzz.log" | tail -n 1)
    before=$(find "$corpus" -type f | wc -l)
    find "$corpus" -type f | sort > "$work/before.txt"
    # Only inputs that reach new code (edges, not hit counts) join the committed corpus.
    # shellcheck disable=SC2086
    "$bin" -merge=1 -use_counters=0 $dict "$corpus" "$work/corpus" > "$work/merge.log" 2>&1
    if [ -n "${ATTN_FUZZ_SKIP:-}" ]; then
        # The tests replay the corpus without ATTN_FUZZ_SKIP: new inputs that fail without it show
        # a known bug and are moved to BUILD_DIR/fuzz-work/TARGET/known/ instead.
        mkdir -p "$work/known"
        find "$corpus" -type f | sort | comm -13 "$work/before.txt" - | while read -r f; do
            if ! env -u ATTN_FUZZ_SKIP "$bin" "$f" > /dev/null 2>&1; then
                mv "$f" "$work/known/"
            fi
        done
        echo "  $(find "$work/known" -type f | wc -l) new inputs fail without ATTN_FUZZ_SKIP: moved to $work/known"
    fi
    after=$(find "$corpus" -type f | wc -l)
    printf '%-12s %5ss  %10s runs  %-20s  corpus %4d files (+%d new)\n' "$t" "$elapsed" "${runs:-?}" \
        "${cov:-cov: ? ft: ?}" "$after" $((after - before))
    if [ $rc -ne 0 ]; then
        found=$(ls "$work" | grep -E '^(crash|leak|timeout|oom|slow-unit)-')
        echo "  FAILED (exit $rc): see $work/fuzz.log; reproducers in $work:" $found >&2
        status=1
    fi
done
exit $status
