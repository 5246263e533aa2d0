#!/bin/sh
# Runs `attn demo` and compares its output with the transcript PyTorch printed for the same steps
# (tests/golden/demo_transcript.txt, written by tests/golden/gen_demo_transcript.py).
attn="$1"
expected="$2"
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
"$attn" demo > "$out" || { echo "attn demo exited with status $?"; exit 1; }
if diff -u "$expected" "$out"; then
    echo "attn demo matches PyTorch's transcript ($(wc -l < "$expected") lines)"
else
    echo "attn demo differs from PyTorch's transcript (- PyTorch, + attn)"
    exit 1
fi
