#!/usr/bin/env bash
# Training speed on a busy machine against fair share: tools/bench:train_step at 2 threads beside
# N = 0, 1, 2 busy processes (each a shell loop that never sleeps), REPS rounds each, median step
# time per model. A process with T threads among N busy ones on C cores is owed T / (N + T) of
# the machine when N + T > C, so its fair-share step time is the quiet one times (N + T) / C
# (1 below that); the report divides the measured step by it (1.0 = exactly fair; issue 32's
# target is 1.5 at most).
#
#   tools/bench/load_share.sh                      # mlp and cnn in f32, 3 rounds
#   MODELS=mlp,gpt REPS=5 tools/bench/load_share.sh
#   GOMP_SPINCOUNT=1000 tools/bench/load_share.sh  # another libgomp wait policy, for comparison
#   THREAD_GOVERNOR=false tools/bench/load_share.sh  # train_step --cpu_thread_governor=false
#
# Extra flags for bazel go in BAZEL_FLAGS (e.g. --config=cpu). Prints the CPU model and core
# count first; runs on any Linux with bash and awk.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build ${BAZEL_FLAGS:-} //tools/bench:train_step >&2
bin=bazel-bin/tools/bench/train_step
models="${MODELS:-mlp,cnn}"
reps="${REPS:-3}"
steps="${STEPS:-20}"
threads=2
cores="$(nproc)"
echo "$(lscpu | sed -n 's/^Model name: *//p'), ${cores} cores; ${threads} threads; models ${models};" \
  "${reps} rounds; steps ${steps}; thread governor ${THREAD_GOVERNOR:-true} GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-unset} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}"

busy=()
stop_busy() { [ "${#busy[@]}" -eq 0 ] || kill "${busy[@]}" 2>/dev/null || true; busy=(); }
trap stop_busy EXIT

# step_ms MODEL: the median over REPS rounds of train_step's median ms/step.
step_ms() {
  for _ in $(seq "${reps}"); do
    OMP_NUM_THREADS="${threads}" "${bin}" --models="$1" --dtypes=f32 --steps="${steps}" \
      --cpu_thread_governor="${THREAD_GOVERNOR:-true}" 2>&1 |
      awk -v m="$1" '$1 == m { print $3 }'
  done | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

declare -A quiet
printf "%-5s %6s %10s %10s %8s\n" model busy "ms/step" "fair ms" ratio
for n in 0 1 2; do
  stop_busy
  for _ in $(seq "${n}"); do
    bash -c 'while :; do :; done' &
    busy+=("$!")
  done
  sleep 1
  for model in ${models//,/ }; do
    ms="$(step_ms "${model}")"
    [ "${n}" -eq 0 ] && quiet[${model}]="${ms}"
    fair="$(awk -v q="${quiet[${model}]}" -v n="${n}" -v t="${threads}" -v c="${cores}" \
      'BEGIN { f = (n + t) / c; printf "%.2f", q * (f > 1 ? f : 1) }')"
    printf "%-5s %6s %10s %10s %8s\n" "${model}" "${n}" "${ms}" "${fair}" \
      "$(awk -v m="${ms}" -v f="${fair}" 'BEGIN { printf "%.2f", m / f }')"
  done
done
