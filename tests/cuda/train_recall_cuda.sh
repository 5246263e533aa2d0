#!/bin/sh
# The training example with the attention on the GPU follows the CPU run: the same loss at every
# step to 1e-3 (relative, float32 rounding through 100 AdamW steps), and it learns the task.
# usage: train_recall_cuda.sh EXAMPLE. Exits 77 (skipped) without a usable GPU.
exe=$1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
"$exe" --steps 100 --csv "$tmp/cpu.csv" > "$tmp/cpu.out" || { cat "$tmp/cpu.out"; exit 1; }
if ! "$exe" --steps 100 --csv "$tmp/gpu.csv" --device cuda > "$tmp/gpu.out" 2> "$tmp/gpu.err"; then
    if grep -q "no usable GPU\|no libattn_cuda\|cuBLASLt was not found" "$tmp/gpu.err"; then
        [ -n "${ATTN_CUDA_REQUIRE_GPU:-}" ] && { cat "$tmp/gpu.err"; exit 1; }
        echo "SKIP: $(cat "$tmp/gpu.err")"
        exit 77
    fi
    cat "$tmp/gpu.out" "$tmp/gpu.err"
    exit 1
fi
tail -n 1 "$tmp/cpu.out"
tail -n 1 "$tmp/gpu.out"
paste -d, "$tmp/cpu.csv" "$tmp/gpu.csv" | awk -F, 'NR > 1 {
    d = $2 - $5; if (d < 0) d = -d
    if (d > 1e-3 * ($2 > 1 ? $2 : 1)) { printf "step %s: CPU loss %s, GPU loss %s\n", $1, $2, $5; bad = 1 }
} END { exit bad }'
