#!/bin/sh
# plot_loss.sh PNG CSV [CSV_WITHOUT_ATTENTION] - plots train_recall's loss curves (step,loss,accuracy)
# with gnuplot, or with python3-matplotlib when gnuplot is absent; says so and exits 0 when
# neither is installed (the plot is optional).
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 PNG CSV [CSV_WITHOUT_ATTENTION]" >&2
    exit 2
fi
png=$1 csv=$2 base=${3:-}
for f in "$csv" $base; do
    [ -r "$f" ] || { echo "$0: cannot read $f" >&2; exit 1; }
done
if command -v gnuplot > /dev/null 2>&1; then
    plot="'$csv' using 1:2 with lines lw 2 title 'causal multi-head attention'"
    [ -n "$base" ] && plot="$plot, '$base' using 1:2 with lines lw 2 title 'same model without attention'"
    gnuplot <<GP
set terminal pngcairo size 900,500 noenhanced
set output '$png'
set datafile separator ','
set key autotitle columnhead
set title 'train_recall: output the token seen 5 positions earlier (AdamW, batch 32)'
set xlabel 'step'
set ylabel 'cross-entropy loss'
set logscale y
set grid
plot $plot
GP
elif /usr/bin/python3 -c 'import matplotlib' > /dev/null 2>&1; then
    /usr/bin/python3 - "$png" "$csv" $base <<'PY'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
png, files = sys.argv[1], sys.argv[2:]
labels = ["causal multi-head attention", "same model without attention"]
plt.figure(figsize=(9, 5))
for path, label in zip(files, labels):
    rows = list(csv.DictReader(open(path)))
    plt.plot([int(r["step"]) for r in rows], [float(r["loss"]) for r in rows], lw=2, label=label)
plt.yscale("log")
plt.xlabel("step")
plt.ylabel("cross-entropy loss")
plt.title("train_recall: output the token seen 5 positions earlier (AdamW, batch 32)")
plt.grid(True)
plt.legend()
plt.savefig(png, dpi=100)
PY
else
    echo "$0: neither gnuplot nor python3-matplotlib is installed: no plot (the CSV is $csv)"
    exit 0
fi
echo "wrote $png"
