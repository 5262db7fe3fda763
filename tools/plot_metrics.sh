#!/usr/bin/env bash
# Plots a metrics CSV written by tg::train::MetricsWriter (train/metrics.h) to a PNG with
# gnuplot: top panel loss vs step (plus every other column whose name ends in "loss", e.g.
# val_loss, as joined points), bottom panel loss_scale vs step on a log axis (left out when the file has
# no loss_scale column). Columns are found by name in the header, so their order does not matter;
# empty cells (an extra column on rows without a value) are skipped, nan/inf leave gaps.
#
#   tools/plot_metrics.sh run/metrics.csv                # writes run/metrics.png
#   tools/plot_metrics.sh --log-loss run/metrics.csv out.png
#
# Exit status: 0 on success, 2 for bad usage, 1 for a missing/unreadable file, a CSV without a
# step or loss column or without data rows, a missing gnuplot, or a gnuplot failure.
set -euo pipefail

usage() {
  cat >&2 <<'EOF'
usage: plot_metrics.sh [--log-loss] metrics.csv [out.png]
  Plots loss and loss_scale against step from a metrics CSV (header line with column names,
  including step and loss) to out.png (default: metrics.csv with .csv replaced by .png).
  --log-loss   log-scale y axis for the loss panel
EOF
  exit 2
}

log_loss=0
args=()
for arg in "$@"; do
  case "$arg" in
    --log-loss) log_loss=1 ;;
    -h | --help) usage ;;
    -*) echo "plot_metrics.sh: unknown option '$arg'" >&2; usage ;;
    *) args+=("$arg") ;;
  esac
done
[ "${#args[@]}" -ge 1 ] && [ "${#args[@]}" -le 2 ] || usage
csv=${args[0]}
out=${args[1]:-${csv%.csv}.png}
[ "$out" != "$csv" ] || out="$csv.png"

if [ ! -f "$csv" ] || [ ! -r "$csv" ]; then
  echo "plot_metrics.sh: no such readable file: $csv" >&2
  exit 1
fi
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "plot_metrics.sh: gnuplot not found (Debian: apt-get install gnuplot-nox)" >&2
  exit 1
fi

# 1-based index of the column named $1 in the header, or nothing.
column_of() {
  head -n 1 "$csv" | tr -d '\r' | awk -F, -v name="$1" \
    '{ for (i = 1; i <= NF; i++) if ($i == name) { print i; exit } }'
}
step_col=$(column_of step)
loss_col=$(column_of loss)
scale_col=$(column_of loss_scale)
if [ -z "$step_col" ] || [ -z "$loss_col" ]; then
  echo "plot_metrics.sh: $csv: the header needs 'step' and 'loss' columns, it is:" >&2
  head -n 1 "$csv" >&2
  exit 1
fi
if ! awk 'NR > 1 && NF > 0 { found = 1; exit } END { exit !found }' "$csv"; then
  echo "plot_metrics.sh: $csv has no data rows (only a header)" >&2
  exit 1
fi
# Other loss columns (val_loss, test_loss, ...): "index name" per line.
extra_losses=$(head -n 1 "$csv" | tr -d '\r' | awk -F, \
  '{ for (i = 1; i <= NF; i++) if ($i != "loss" && $i ~ /loss$/) print i, $i }')

# pngcairo (antialiased) when this gnuplot has it, else the libgd png terminal.
if gnuplot -e 'set terminal' 2>&1 | grep -qw pngcairo; then
  terminal="pngcairo size 1000,800 noenhanced"
else
  terminal="png size 1000,800 noenhanced"
fi

# A gnuplot single-quoted string: ' is doubled.
gp_quote() { printf "'%s'" "${1//\'/\'\'}"; }
csv_q=$(gp_quote "$csv")
out_q=$(gp_quote "$out")
title_q=$(gp_quote "$(basename "$csv")")

loss_plot="plot $csv_q skip 1 using $step_col:$loss_col with lines lw 1.5 title 'loss'"
while read -r index name; do
  [ -n "$index" ] || continue
  loss_plot+=", '' skip 1 using $step_col:$index with linespoints pt 7 ps 0.8 title $(gp_quote "$name")"
done <<<"$extra_losses"

panels=2
[ -n "$scale_col" ] || panels=1

script=$(
  cat <<EOF
set terminal $terminal
set output $out_q
set datafile separator ','
set datafile missing ''
set key top right
set grid
set lmargin 12
set multiplot layout $panels,1 title $title_q
set ylabel 'loss'
$([ "$panels" -eq 1 ] && echo "set xlabel 'step'")
$([ "$log_loss" -eq 1 ] && echo "set logscale y")
$loss_plot
EOF
)
if [ "$panels" -eq 2 ]; then
  script+=$(
    cat <<EOF

unset logscale y
set logscale y 2
set format y '%g'
set xlabel 'step'
set ylabel 'loss scale'
unset key
plot $csv_q skip 1 using $step_col:$scale_col with steps lw 1.5 title 'loss_scale'
EOF
  )
fi
script+=$'\nunset multiplot\nset output\n'

if ! printf "%s\n" "$script" | gnuplot; then
  echo "plot_metrics.sh: gnuplot failed" >&2
  exit 1
fi
if [ ! -s "$out" ]; then
  echo "plot_metrics.sh: gnuplot wrote no image to $out" >&2
  exit 1
fi
echo "wrote $out"
