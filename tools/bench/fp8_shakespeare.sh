#!/usr/bin/env bash
# FP8 training against bf16 on the tiny Shakespeare acceptance run (tools/bench/gpt_shakespeare.sh:
# train_gpt's defaults, 1500 steps of 32 x 64 characters): the same run in bf16 and in FP8 with
# each recipe (--precision=fp8 --fp8_recipe=delayed|current|block), each with a metrics CSV. Prints
# each run's final validation loss, its difference from bf16 and the mean step time, writes a
# plot of the four loss curves (training loss per step, validation loss every 100 steps), and exits
# 1 when an FP8 run's final validation loss is not within 2% of bf16's (the FP8 issue's bar).
#
#   tools/bench/fp8_shakespeare.sh [out_dir] [train_gpt flags...]
#
# out_dir (default /tmp/fp8_shakespeare) receives <run>.csv, <run>.log and fp8_vs_bf16.png.
# Runs go one after another with the machine's threads; extra flags for bazel go in BAZEL_FLAGS.
# PLOT_ONLY=1 skips the runs and reports and plots the logs and CSVs already in out_dir.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-/tmp/fp8_shakespeare}"
shift || true
mkdir -p "${out}"
runs=(bf16 delayed current block)
[ "${PLOT_ONLY:-0}" = 1 ] || bazel build ${BAZEL_FLAGS:-} //tools:train_gpt >&2
for run in "${runs[@]}"; do
  [ "${PLOT_ONLY:-0}" = 1 ] && break
  if [ "${run}" = bf16 ]; then
    precision=(--precision=bf16)
  else
    precision=(--precision=fp8 "--fp8_recipe=${run}")
  fi
  bazel-bin/tools/train_gpt --data=data/tinyshakespeare.txt --print_every=250 --sample_tokens=0 \
    --eval_every=100 "${precision[@]}" --metrics="${out}/${run}.csv" "$@" >"${out}/${run}.log" 2>&1 || {
    cat "${out}/${run}.log"; exit 1; }
done

final() { sed -n 's/^val loss \([0-9.]*\) after.*/\1/p' "${out}/$1.log"; }
step_ms() {  # mean ms per step from the elapsed_s column (evaluation time included)
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
           { last = $col["elapsed_s"]; n = $col["step"] } END { printf "%.1f", 1000 * last / n }' "$1"
}
bf16="$(final bf16)"
status=0
printf "%-8s %10s %10s %10s\n" run "val loss" "vs bf16" "ms/step"
for run in "${runs[@]}"; do
  val="$(final "${run}")"
  rel="$(awk -v v="${val}" -v b="${bf16}" 'BEGIN { printf "%+.2f%%", 100 * (v - b) / b }')"
  printf "%-8s %10s %10s %10s\n" "${run}" "${val}" "${rel}" "$(step_ms "${out}/${run}.csv")"
  if [ "${run}" != bf16 ] && ! awk -v v="${val}" -v b="${bf16}" 'BEGIN { exit !(v <= 1.02 * b) }'; then
    echo "FAIL: ${run}'s validation loss ${val} is not within 2% of bf16's ${bf16}"
    status=1
  fi
done

# The four curves: training loss (lines) and validation loss (points), from each CSV's columns.
plot=""
for run in "${runs[@]}"; do
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
       { print $col["step"], $col["loss"] > "'"${out}/${run}"'.train"
         if ($col["val_loss"] != "") print $col["step"], $col["val_loss"] > "'"${out}/${run}"'.val" }' \
    "${out}/${run}.csv"
  plot+="'${out}/${run}.train' with lines title '${run} train', "
  plot+="'${out}/${run}.val' with linespoints pt 7 title '${run} val', "
done
gnuplot <<EOF
set terminal pngcairo size 900,500 noenhanced
set output '${out}/fp8_vs_bf16.png'
set title 'tiny Shakespeare GPT: bf16 and FP8 recipes (train_gpt defaults, 1500 steps)'
set xlabel 'step'
set ylabel 'loss (nats per character)'
set yrange [1.3:3.5]
set key top right
plot ${plot%, }
EOF
echo "wrote ${out}/fp8_vs_bf16.png"
exit "${status}"
