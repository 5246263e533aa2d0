#!/bin/sh
# cuda_table.sh ATTN: attn bench --device cuda on the target shapes (bf16, B*L = 16384, H*D = 2048,
# D in {64, 128}, L in {1024, 4096, 16384}, causal and not; the forward with --kernels sm90 too;
# forward + backward too, and with the deterministic backward at L = 4096), then one short table of
# TFLOP/s.
# Used by make test-cuda; bench/run_bench_cuda.py sets the same shapes beside PyTorch.
set -eu
attn=$1
tmp=$(mktemp)
dec=$(mktemp)
trap 'rm -f "$tmp" "$dec"' EXIT
for D in 64 128; do
    for L in 1024 4096 16384; do
        for causal in "" --causal; do
            "$attn" bench --device cuda --dtype bf16 --batch $((16384 / L)) --heads $((2048 / D)) --len-q "$L" \
                --head-dim "$D" $causal --json | tail -n 1 >> "$tmp"
        done
    done
done
# the Hopper forward (--kernels sm90: warpgroup MMA; elsewhere the same kernels as above)
for D in 64 128; do
    for L in 1024 4096 16384; do
        for causal in "" --causal; do
            "$attn" bench --device cuda --dtype bf16 --batch $((16384 / L)) --heads $((2048 / D)) --len-q "$L" \
                --head-dim "$D" $causal --kernels sm90 --json | tail -n 1 >> "$tmp"
        done
    done
done
# forward + backward (the tensor-core backward for these shapes; 10 runs each)
for D in 64 128; do
    for L in 1024 4096 16384; do
        for causal in "" --causal; do
            "$attn" bench --device cuda --dtype bf16 --batch $((16384 / L)) --heads $((2048 / D)) --len-q "$L" \
                --head-dim "$D" $causal --backward --repeat 10 --warmup 2 --json | tail -n 1 >> "$tmp"
        done
    done
done
# the deterministic backward (dQ by its own kernel, no atomics) at L = 4096
for D in 64 128; do
    for causal in "" --causal; do
        "$attn" bench --device cuda --dtype bf16 --batch 4 --heads $((2048 / D)) --len-q 4096 \
            --head-dim "$D" $causal --backward --deterministic --repeat 10 --warmup 2 --json | tail -n 1 >> "$tmp"
    done
done
echo
echo "attn bench --device cuda, bf16 (median TFLOP/s; fwd+bwd rows counted as 3.5x the forward's flops)"
printf '%-8s %-6s %-6s %-7s %-26s %10s %10s\n' pass D L causal kernel ms TFLOP/s
sed 's/[{}",]//g' "$tmp" | awk '{ for (i = 1; i < NF; i++) v[$i] = $(i + 1);
    printf "%-8s %-6s %-6s %-7s %-26s %10.3f %10.1f\n", v["backward:"] == "true" ? "fwd+bwd" : "fwd", v["D:"], v["L:"],
           v["causal:"], v["kernel:"], v["median_ms:"], v["tflops:"] }'
# decoding against a KV cache: B=8, H=32, Hkv=8, D=128, contiguous and paged (16- and 64-token pages)
for S in 4096 32768 131072; do
    for page in 0 16 64; do
        "$attn" bench --device cuda --op decode --dtype bf16 --batch 8 --heads 32 --kv-heads 8 --head-dim 128 \
            --len-kv "$S" --page-size "$page" --json | tail -n 1 >> "$dec"
    done
done
echo
echo "attn bench --device cuda --op decode, bf16, B=8 H=32 Hkv=8 D=128 (GB/s of K and V)"
printf '%-8s %-6s %10s %10s\n' S page ms GB/s
sed 's/[{}",]//g' "$dec" | awk '{ for (i = 1; i < NF; i++) v[$i] = $(i + 1);
    printf "%-8s %-6s %10.4f %10.0f\n", v["S:"], v["page_size:"], v["median_ms:"], v["gbps:"] }'
