#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# workerd's built-in click model lr:D (issue 34; docs/tables.md) against the
# same model as a plain PyTorch loop in one process (tests/bench/lr_torch.py:
# nn.EmbeddingBag(sparse=True) + Adagrad for the ids, Linear + SGD for the
# dense part), on one synthetic click log (psnet-clicklog, its planted best
# AUC printed), the same batch and epochs: samples per second and test AUC of
# one workerd on one shard, and of two workers on two shards (BSP, as the
# demo), with the ratio to PyTorch's. Never pass/fail.
#
#   tests/bench/lr.sh [--build DIR] [--rows N] [--epochs E] [--batch B] [--keep]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build rows=1000000 epochs=2 batch=256 keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--build DIR] [--rows N] [--epochs E] [--batch B] [--keep]" >&2; exit 2 ;;
  esac
done
BENCH=lr
source "$top/tests/bench/lib.sh"
python_client numpy torch
"$build/worker/data/psnet-clicklog" --out "$RUN/clicks" --train-rows "$rows" --test-rows $((rows / 10)) \
  >"$RUN/clicklog.out" 2>&1 || die "psnet-clicklog failed: $(cat "$RUN/clicklog.out")"
best=$(sed -n 's/.*best_auc=\([0-9.]*\).*/\1/p' "$RUN/clicklog.out")
dense=$(sed -n 's/.* dense=\([0-9]*\).*/\1/p' "$RUN/clicklog.out")
echo "lr: $rows samples to train, $((rows / 10)) to test, planted best AUC $best, batch $batch, $epochs epochs"
torch_line=$(/usr/bin/python3 "$top/tests/bench/lr_torch.py" "$RUN/clicks" "$batch" "$epochs") ||
  die "the PyTorch loop failed"
echo "lr: $torch_line"
torch_sps=$(sed -n 's/.*samples_per_s=\([0-9]*\).*/\1/p' <<<"$torch_line")
for n in 1 2; do
  coord="ipc://$RUN/coord-$n.sock"
  mode=asp; [ "$n" = 2 ] && mode=bsp
  psnet_start "pscoord-$n" "$PSCOORD" --listen "$coord" --workers "$n" --shards "$n" --mode "$mode" \
    --model "lr:$dense" --data "$RUN/clicks" --batch "$batch" --epochs "$epochs"
  for i in $(seq 1 "$n"); do
    psnet_start "psd-$n-$i" "$PSD" --id "$i" --listen "ipc://$RUN/psd-$n-$i.sock" --coord "$coord"
  done
  for i in $(seq 1 "$n"); do psnet_start "w-$n-$i" "$WORKERD" --coord "$coord"; done
  "$PSCTL" --coord "$coord" job wait --wait 1800 >/dev/null || die "the lr:$dense job failed (logs in $RUN)"
  sps=$(cat "$RUN"/w-"$n"-*.log | sed -n 's/.*msg="trained" .* samples_per_s=\([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s }')
  auc=$(cat "$RUN"/w-"$n"-*.log | sed -n 's/.*msg="evaluated" .* auc=\([0-9.]*\) .*/\1/p')
  awk -v n="$n" -v m="$mode" -v s="$sps" -v t="$torch_sps" -v a="$auc" -v b="$best" 'BEGIN {
    printf "lr: psnet %d workerd, %d psd, %s: samples_per_s=%d (%.2f x PyTorch'"'"'s loop) auc=%s (best %s)\n",
           n, n, m, s, s / t, a, b }'
  psnet_stop_all
done
