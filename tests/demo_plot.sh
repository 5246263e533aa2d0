#!/bin/sh
# attn demo --plot DIR: the walkthrough unchanged, the chapter's 14 attention-weight matrices as
# labelled CSV files (always: rows of softmax weights sum to 1, causal ones are zero above the
# diagonal, the labels are the tokens), PNG heatmaps with each plotter present (skipped for a
# plotter that is not), and clear errors: no plotter (exit 1, the CSV files still written), a
# plotter that fails, a DIR that is a file or cannot be created, options misused (exit 2).
# usage: demo_plot.sh ATTN TRANSCRIPT [PYTHON]   (PYTHON: tried for matplotlib besides python3)
attn="$1"
transcript="$2"
python="${3:-python3}"
tmp=$(mktemp -d) || exit 1
trap 'chmod -R u+w "$tmp"; rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

sentence="01_self_attention 02_self_attention_v1 03_self_attention_v2 04_causal 05_causal_dropout 07_wrapper_head0
07_wrapper_head1 09_multihead_head0 09_multihead_head1"
causal="04_causal 07_wrapper_head0 07_wrapper_head1 09_multihead_head0 09_multihead_head1 10_multihead_embedded_head0
10_multihead_embedded_head1 11_nn_multihead_head0 11_nn_multihead_head1 11_nn_multihead_average"
all="$sentence 10_multihead_embedded_head0 10_multihead_embedded_head1 11_nn_multihead_head0 11_nn_multihead_head1
11_nn_multihead_average"

# check_csv DIR: every matrix's file, labels and values
check_csv() {
    for m in $all; do
        f="$1/$m.csv"
        [ -s "$f" ] || { fail "$f is missing"; continue; }
        n=$(awk -F, 'NR == 1 { n = NF - 1 } END { print n }' "$f")
        rows=$(($(wc -l < "$f") - 1))
        bad=$(awk -F, -v n="$n" 'NR > 1 && (NF != n + 1 || $1 == "") { print NR }' "$f")
        [ "$rows" -eq "$n" ] && [ -z "$bad" ] && { [ "$n" -eq 6 ] || [ "$n" -eq 8 ]; } ||
            fail "$f: not a labelled square matrix ($rows rows, $n columns, bad lines: $bad)"
        if [ "$m" != 05_causal_dropout ]; then # softmax rows sum to 1 (dropout rescales them)
            awk -F, 'NR > 1 { s = 0; for (i = 2; i <= NF; i++) s += $i; if (s < 0.9999 || s > 1.0001) exit 1 }' "$f" ||
                fail "$f: a row does not sum to 1"
        fi
    done
    for m in $causal 05_causal_dropout; do
        awk -F, 'NR > 1 { for (i = NR + 1; i <= NF; i++) if ($i != 0) exit 1 }' "$1/$m.csv" 2> /dev/null ||
            fail "$1/$m.csv: a weight above the diagonal is not 0"
    done
    for m in $sentence; do
        [ "$(head -n 1 "$1/$m.csv")" = "query/key,Your,journey,starts,with,one,step" ] &&
            [ "$(cut -d, -f1 "$1/$m.csv" | tr '\n' ' ')" = "query/key Your journey starts with one step " ] ||
            fail "$1/$m.csv: the tokens are not the labels"
    done
    # the first matrix against the walkthrough's printed weights (4 decimals)
    awk -F, 'NR == 2 { printf "%.4f %.4f\n", $2, $7 }' "$1/01_self_attention.csv" | grep -q '^0.2098 0.1452$' ||
        fail "$1/01_self_attention.csv: the first row is not the walkthrough's [0.2098, ..., 0.1452]"
}

check_png() {
    for m in $all; do
        [ "$(head -c 4 "$1/$m.png" 2> /dev/null | od -An -c | tr -d ' ')" = "211PNG" ] || fail "$1/$m.png is not a PNG file"
    done
}

# expect STATUS WHAT WORD -- COMMAND...: the status, and for failures one line on stderr holding WORD
expect() {
    want="$1" what="$2" word="$3"
    shift 4
    "$@" > "$tmp/out" 2> "$tmp/err"
    got=$?
    if [ "$got" -ne "$want" ]; then
        fail "$what: exit status $got, expected $want: $(cat "$tmp/err")"
    elif [ "$want" -ne 0 ] && { [ "$(wc -l < "$tmp/err")" -ne 1 ] || ! grep -q -- "$word" "$tmp/err"; }; then
        fail "$what: expected one line on stderr with '$word', got: $(cat "$tmp/err")"
    else
        echo "ok   $what -> $got $(cat "$tmp/err")"
    fi
}

# 1. no plotter at all (an empty PATH, a Python that does not exist): CSV written, exit 1
mkdir "$tmp/empty"
expect 1 "no plotter" "gnuplot" -- env PATH="$tmp/empty" "$attn" demo --plot "$tmp/none" --python "$tmp/empty/python3"
check_csv "$tmp/none"
cmp -s "$tmp/out" "$transcript" || fail "the walkthrough printed with --plot differs from the transcript"

# 2. each plotter that is present
plotted=0
if gnuplot --version > /dev/null 2>&1; then
    expect 0 "--plotter gnuplot" "" -- "$attn" demo --plot "$tmp/gnuplot" --plotter gnuplot
    check_csv "$tmp/gnuplot"
    check_png "$tmp/gnuplot"
    plotted=1
else
    echo "skip --plotter gnuplot: gnuplot is not installed"
    expect 1 "--plotter gnuplot without gnuplot" "gnuplot" -- "$attn" demo --plot "$tmp/gnuplot" --plotter gnuplot
fi
for py in "$python" python3; do
    if "$py" -c 'import matplotlib' > /dev/null 2>&1; then
        expect 0 "--plotter matplotlib --python $py" "" -- "$attn" demo --plot "$tmp/mpl" --plotter matplotlib --python "$py"
        check_csv "$tmp/mpl"
        check_png "$tmp/mpl"
        plotted=1
        break
    fi
    echo "skip --plotter matplotlib --python $py: it cannot import matplotlib"
done
if [ "$plotted" -eq 1 ]; then
    expect 0 "--plot (auto)" "" -- "$attn" demo --plot "$tmp/auto" --python "$python"
    check_png "$tmp/auto"
    head -n -1 "$tmp/out" > "$tmp/walk"
    cmp -s "$tmp/walk" "$transcript" || fail "the walkthrough printed with --plot differs from the transcript"
    tail -n 1 "$tmp/out" | grep -q "14 heatmaps drawn" || fail "--plot did not say where the heatmaps are"
fi

# 3. a plotter that fails, and one that writes nothing
printf '#!/bin/sh\n[ "$1" = -c ] && exit 0\ncat > /dev/null\nexit 3\n' > "$tmp/failing_python"
printf '#!/bin/sh\ncat > /dev/null\nexit 0\n' > "$tmp/idle_python"
chmod +x "$tmp/failing_python" "$tmp/idle_python"
expect 1 "matplotlib failing" "exit status 3" -- "$attn" demo --plot "$tmp/f" --plotter matplotlib --python "$tmp/failing_python"
expect 1 "a plotter that writes nothing" "wrote no" -- "$attn" demo --plot "$tmp/i" --plotter matplotlib --python "$tmp/idle_python"

# 4. bad DIR, misused options
: > "$tmp/file"
expect 1 "--plot on a file" "not a directory" -- "$attn" demo --plot "$tmp/file"
expect 1 "--plot under a missing directory" "cannot create" -- "$attn" demo --plot "$tmp/no/such/dir"
if [ "$(id -u)" -ne 0 ]; then
    mkdir "$tmp/ro" && chmod 555 "$tmp/ro"
    expect 1 "--plot in a read-only directory" "not writable" -- "$attn" demo --plot "$tmp/ro"
fi
[ -s "$tmp/out" ] && fail "a bad --plot DIR printed the walkthrough"
expect 2 "--plotter without --plot" "--plot" -- "$attn" demo --plotter gnuplot
expect 2 "--plotter of an unknown name" "--plotter" -- "$attn" demo --plot "$tmp/x" --plotter excel
expect 2 "--plot without DIR" "--plot" -- "$attn" demo --plot
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "all checks passed"
