#!/bin/sh
# The GPT-2 example (examples/gpt2_model.c) and its files, without Python: a random model saved
# with --save (Hugging Face's layout) loads back to the same logits and tokens, bit for bit, from
# its directory, from the file with config.json beside it, with --config, and without config.json
# (sizes read off the shapes, heads of 64); bad files and arguments give exit status 1 (input) or 2
# (usage) with one line on stderr.
# usage: gpt2_model_files.sh EXAMPLE_GPT2_MODEL
exe="$1"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

prompt=1,2,3,60,0,7,7,7
shape="--layers 2 --embd 128 --heads 2 --vocab 61 --context 32" # heads of 64: the loader infers them
"$exe" $shape --seed 3 --prompt $prompt --tokens 6 --save "$tmp/m" --logits-out "$tmp/a.npy" --json --quiet \
    > "$tmp/a.json" || fail "random model with --save"
[ -s "$tmp/m/model.safetensors" ] && [ -s "$tmp/m/config.json" ] || fail "--save wrote no model.safetensors and config.json"

# same logits (bit for bit) and tokens from the saved files, found four ways
same() { # what, then the options that find the model
    what="$1"
    shift
    if ! "$exe" "$@" --prompt $prompt --tokens 6 --logits-out "$tmp/b.npy" --json --quiet > "$tmp/b.json" 2> "$tmp/err"; then
        fail "$what: $(cat "$tmp/err")"
    elif ! cmp -s "$tmp/a.npy" "$tmp/b.npy"; then
        fail "$what: the logits differ from the saved model's"
    elif [ "$(sed 's/.*"tokens"/tokens/' "$tmp/a.json")" != "$(sed 's/.*"tokens"/tokens/' "$tmp/b.json")" ]; then
        fail "$what: the tokens differ: $(cat "$tmp/a.json") / $(cat "$tmp/b.json")"
    else
        echo "ok   $what: same logits and tokens"
    fi
}
same "directory" --model "$tmp/m"
same "file, config.json beside it" --model "$tmp/m/model.safetensors"
mkdir "$tmp/bare" && cp "$tmp/m/model.safetensors" "$tmp/bare/" && cp "$tmp/m/config.json" "$tmp/cfg.json"
same "--config elsewhere" --model "$tmp/bare" --config "$tmp/cfg.json"
same "no config.json (sizes from the shapes)" --model "$tmp/bare"

# expect STATUS WHAT WORD -- COMMAND...: the status, one line on stderr containing WORD
expect() {
    want="$1" what="$2" word="$3"
    shift 4
    "$@" > /dev/null 2> "$tmp/err"
    got=$?
    if [ "$got" -ne "$want" ] || [ "$(wc -l < "$tmp/err")" -ne 1 ] || ! grep -q -- "$word" "$tmp/err"; then
        fail "$what: exit status $got (expected $want), stderr: $(cat "$tmp/err")"
    else
        echo "ok   $what -> $got: $(cat "$tmp/err")"
    fi
}
sed 's/"n_head": 2/"n_head": 3/' "$tmp/m/config.json" > "$tmp/bad_heads.json"
sed 's/"n_embd": 128/"n_embd": 64/' "$tmp/m/config.json" > "$tmp/bad_embd.json"
sed 's/"activation_function": "gelu_new"/"activation_function": "relu"/' "$tmp/m/config.json" > "$tmp/bad_act.json"
printf '{"n_head": 2,' > "$tmp/bad_json.json"
head -c 4000 "$tmp/m/model.safetensors" > "$tmp/truncated.safetensors"
expect 1 "missing model" "none" -- "$exe" --model "$tmp/none"
expect 1 "not a safetensors file" "cfg.json" -- "$exe" --model "$tmp/cfg.json" --config "$tmp/cfg.json"
expect 1 "truncated safetensors file" "truncated" -- "$exe" --model "$tmp/truncated.safetensors" --config "$tmp/cfg.json"
expect 1 "heads that do not divide n_embd" "n_head" -- "$exe" --model "$tmp/bare" --config "$tmp/bad_heads.json"
expect 1 "config.json against the shapes" "n_embd" -- "$exe" --model "$tmp/bare" --config "$tmp/bad_embd.json"
expect 1 "an activation GPT-2 does not use" "relu" -- "$exe" --model "$tmp/bare" --config "$tmp/bad_act.json"
expect 1 "config.json that is not JSON" "JSON" -- "$exe" --model "$tmp/bare" --config "$tmp/bad_json.json"
expect 1 "missing --config" "cannot open" -- "$exe" --model "$tmp/bare" --config "$tmp/none.json"
expect 1 "token id outside the vocabulary" "vocabulary" -- "$exe" --model "$tmp/m" --prompt 1,61 --tokens 1
expect 1 "prompt and new tokens past the context" "context" -- "$exe" --model "$tmp/m" --prompt-len 30 --tokens 3
expect 1 "--save under a missing directory" "cannot create" -- "$exe" $shape --tokens 0 --save "$tmp/no/such/dir"
expect 1 "random model of a bad shape" "n_head" -- "$exe" --layers 1 --embd 10 --heads 3 --vocab 5 --context 4
expect 2 "malformed --prompt" "--prompt" -- "$exe" --model "$tmp/m" --prompt 1,,2
expect 2 "unknown --kv-dtype" "kv-dtype" -- "$exe" --model "$tmp/m" --kv-dtype f8
expect 2 "unknown option" "frob" -- "$exe" --frob
expect 2 "--tokens not a number" "tokens" -- "$exe" --tokens many
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "all checks passed"
