#!/usr/bin/env bash
# train_mnist under PyTorch's own torchrun --max_restarts=1 (the launcher users' elastic jobs
# run under), rank 1 stopping after step 6 on the first attempt: torchrun restarts both workers
# with TORCHELASTIC_RESTART_COUNT=1, --resume=auto resumes from the checkpoint, and the run ends
# where the uninterrupted torchrun run ends; no --world_size (torchrun's WORLD_SIZE). Needs
# PyTorch (python3 -c "import torch"; TG_TORCHRUN_PYTHON names another interpreter): without it
# the test says so through skip_part (tests/skip.sh) and exits 0: tools/test.sh counts it as
# skipped, not passed.
set -euo pipefail

train_mnist="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
python="${TG_TORCHRUN_PYTHON:-python3}"
source tests/skip.sh
if ! "$python" -c "import torch.distributed.run" >/dev/null 2>&1; then
  skip_part "torchrun_elastic_test: PyTorch is not installed for $python (torchrun is part of it)"
  exit 0
fi
unset OMP_NUM_THREADS TORCHELASTIC_RESTART_COUNT

summary() { grep -E "^(\[rank 0\] )?(\[default0\]:)?(test accuracy|done:)" "$1" | sed -e 's/^\[rank 0\] //' -e 's/^\[default0\]://' -e 's/ | [0-9]* img\/s mean//' -e 's/ in [0-9]*s//' | tail -n 2; }
args=(--model=mlp --epochs=1 --train_limit=4096 --batch_size=128 --print_every=8
      --checkpoint_every=4)
torchrun=("$python" -m torch.distributed.run --standalone --nproc_per_node=2 --no_python)

echo "== torchrun, uninterrupted"
"${torchrun[@]}" "$train_mnist" "${args[@]}" --checkpoint_dir="$tmp/ref" >"$tmp/ref.log" 2>&1 ||
  { cat "$tmp/ref.log"; echo "FAIL: the uninterrupted torchrun run failed"; exit 1; }
summary "$tmp/ref.log" | tee "$tmp/ref.sum"
grep -q "after 32 steps" "$tmp/ref.sum"

cat >"$tmp/rank.sh" <<'SCRIPT'
#!/bin/sh
if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec "$@" --stop_at_step=6; fi
exec "$@"
SCRIPT
chmod +x "$tmp/rank.sh"

echo "== torchrun --max_restarts=1, rank 1 stops after step 6 on the first attempt, --resume=auto"
"${torchrun[@]}" --max_restarts=1 "$tmp/rank.sh" "$train_mnist" "${args[@]}" \
  --checkpoint_dir="$tmp/elastic" --resume=auto >"$tmp/elastic.log" 2>&1 ||
  { cat "$tmp/elastic.log"; echo "FAIL: the elastic torchrun run failed"; exit 1; }
# Rank 0's lines (torchrun prefixes them with "[default0]:" under --tee; not by default).
grep -E -- "^(\[default0\]:)?--resume=auto: " "$tmp/elastic.log" | sed -e 's/^\[default0\]://' >"$tmp/resume.lines"
printf '%s\n' "--resume=auto: no checkpoint at $tmp/elastic/checkpoint.safetensors, starting fresh" \
  "--resume=auto: resuming from $tmp/elastic/checkpoint.safetensors" | diff - "$tmp/resume.lines" ||
  { cat "$tmp/elastic.log"; echo "FAIL: the --resume=auto lines differ (expected < > got)"; exit 1; }
summary "$tmp/elastic.log" >"$tmp/elastic.sum"
diff "$tmp/ref.sum" "$tmp/elastic.sum" || { echo "FAIL: the restarted run ends elsewhere"; exit 1; }
echo "all passed"
