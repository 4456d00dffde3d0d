#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# workerd's built-in click models (issue 34; docs/tables.md), lr:D or
# dlrm:F:BOT:TOP, against the same model as a plain PyTorch loop in one
# process (tests/bench/clicks_torch.py: nn.EmbeddingBag(sparse=True) +
# Adagrad for the ids, SGD for the dense part), on one synthetic click log
# (psnet-clicklog, its planted best AUC printed), the same batch and epochs:
# samples per second and test AUC of one workerd on one shard, and of two
# workers on two shards (BSP, as the demo), with two copies of each row and
# with one, with the ratio to PyTorch's.
# Never pass/fail.
#
#   tests/bench/clicks.sh [--model lr|dlrm|dlrm:F:BOT:TOP] [--build DIR] [--rows N] [--epochs E] [--batch B]
#                         [--seeds K] [--tables TEXT] [--keep]
#
# --tables: psnet's table instead of the model's default (e.g. with cache=2,
# the hot-row cache: the bytes pulled a step fall, and the AUC shows what the
# staleness costs; PyTorch's loop is the same either way).
#
# --model dlrm is the demo's dlrm:F:D-16-8:16-1 (1 epoch by default); --model
# dlrm:F:D-...:... another DLRM, on a log of its F fields and D dense features
# (e.g. the paper's Criteo shape dlrm:26:13-512-256-64:512-256-1 --batch 2048).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build rows=1000000 epochs= batch=256 keep=0 kind=lr seeds=3 psnet_aucs= tables=()
while [ $# -gt 0 ]; do
  case $1 in
    --model) kind=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --tables) tables=(--tables "$2"); shift 2 ;;
    --build) build=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--model lr|dlrm|dlrm:F:BOT:TOP] [--build DIR] [--rows N] [--epochs E] [--batch B] [--seeds K]" \
         "[--tables TEXT] [--keep]" >&2
       exit 2 ;;
  esac
done
# --model dlrm:F:D-...:...: that model, on a log of F fields and D dense features.
arch= log_shape=()
case $kind in
  lr) epochs=${epochs:-2} ;;
  dlrm) epochs=${epochs:-1} ;;
  dlrm:*)
    arch=$kind kind=dlrm epochs=${epochs:-1}
    IFS=':-' read -r _ f d _ <<<"$arch"
    log_shape=(--fields "$f" --dense "$d") ;;
  *) echo "$0: --model lr, dlrm or dlrm:F:BOT:TOP, not '$kind'" >&2; exit 2 ;;
esac
BENCH=$kind
source "$top/tests/bench/lib.sh"
python_client numpy torch
"$build/worker/data/psnet-clicklog" --out "$RUN/clicks" --train-rows "$rows" --test-rows $((rows / 10)) "${log_shape[@]}" \
  >"$RUN/clicklog.out" 2>&1 || die "psnet-clicklog failed: $(cat "$RUN/clicklog.out")"
best=$(sed -n 's/.*best_auc=\([0-9.]*\).*/\1/p' "$RUN/clicklog.out")
dense=$(sed -n 's/.* dense=\([0-9]*\).*/\1/p' "$RUN/clicklog.out")
fields=$(sed -n 's/.* fields=\([0-9]*\).*/\1/p' "$RUN/clicklog.out")
model=lr:$dense
[ "$kind" = dlrm ] && model=${arch:-dlrm:$fields:$dense-16-8:16-1}
echo "$kind: $model, $rows samples to train, $((rows / 10)) to test, planted best AUC $best, batch $batch, $epochs epochs"
# AUC varies with the initial values and the order of batches (a few 0.001
# for dlrm): PyTorch's loop and psnet's one-worker job each run with --seeds
# seeds, their means compared; the samples/s is the first run's.
torch_sps= torch_aucs=
for k in $(seq 1 "$seeds"); do
  torch_line=$(/usr/bin/python3 "$top/tests/bench/clicks_torch.py" "$model" "$RUN/clicks" "$batch" "$epochs" "$k") ||
    die "the PyTorch loop failed"
  echo "$kind: seed $k: $torch_line"
  [ -n "$torch_sps" ] || torch_sps=$(sed -n 's/.*samples_per_s=\([0-9]*\).*/\1/p' <<<"$torch_line")
  torch_aucs+=" $(sed -n 's/.* auc=\([0-9.]*\).*/\1/p' <<<"$torch_line")"
done
mean() { awk '{ for (i = 1; i <= NF; i++) s += $i; printf "%.4f", s / NF }' <<<"$1"; }
# One workerd on one shard (ASP) with each seed, then two on two (BSP, as the
# demo: each row on both shards, pscoord's default), and the same with one
# copy of each row (--replicas 1): the price of the backups' copies; and
# both under ASP, where each push is copied before it is acknowledged.
for tag in $(seq 1 "$seeds") bsp bsp1 asp asp1; do
  n=1 mode=asp seed=$tag copies=()
  [ "$tag" = bsp ] && n=2 mode=bsp seed=1
  [ "$tag" = bsp1 ] && n=2 mode=bsp seed=1 copies=(--replicas 1)
  [ "$tag" = asp ] && n=2 mode=asp seed=1
  [ "$tag" = asp1 ] && n=2 mode=asp seed=1 copies=(--replicas 1)
  coord="ipc://$RUN/coord-$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$coord" --workers "$n" --shards "$n" --mode "$mode" \
    --model "$model" --data "$RUN/clicks" --batch "$batch" --epochs "$epochs" --seed "$seed" "${tables[@]}" "${copies[@]}"
  for i in $(seq 1 "$n"); do
    psnet_start "psd-$tag-$i" "$PSD" --id "$i" --listen "ipc://$RUN/psd-$tag-$i.sock" --coord "$coord"
  done
  for i in $(seq 1 "$n"); do psnet_start "w-$tag-$i" "$WORKERD" --coord "$coord"; done
  "$PSCTL" --coord "$coord" job wait --wait 1800 >/dev/null || die "the $model job failed (logs in $RUN)"
  sps=$(cat "$RUN"/w-"$tag"-*.log | sed -n 's/.*msg="trained" .* samples_per_s=\([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s }')
  auc=$(cat "$RUN"/w-"$tag"-*.log | sed -n 's/.*msg="evaluated" .* auc=\([0-9.]*\) .*/\1/p')
  # MB a worker pulled a step, rows and tensors (with a table's cache=S, fewer rows).
  mbs=$(cat "$RUN"/w-"$tag"-*.log | sed -n 's/.*msg="trained" steps=\([0-9]*\) .* pulled_mb=\([0-9.]*\).*/\1 \2/p' |
    awk '{ st += $1; mb += $2 } END { printf "%.3f", st ? mb / st : 0 }')
  reps=$(sed -n 's/.* replicas=\([0-9]*\).*/\1/p' "$RUN/pscoord-$tag.log" | tail -1)
  awk -v k="$kind" -v n="$n" -v m="$mode, ${reps:-1} cop$([ "${reps:-1}" = 1 ] && echo y || echo ies)" -v s="$sps" -v t="$torch_sps" -v a="$auc" -v b="$best" -v r="$seed" \
      -v p="$mbs" 'BEGIN {
    printf "%s: psnet %d workerd, %d psd, %s, seed %d: samples_per_s=%d (%.2f x PyTorch'"'"'s loop) auc=%s (best %s) " \
           "pulled_mb_per_step=%s\n", k, n, n, m, r, s, s / t, a, b, p }'
  [ "$n" = 1 ] && psnet_aucs+=" $auc"
  psnet_stop_all
done
echo "$kind: mean test AUC over $seeds seeds: PyTorch $(mean "$torch_aucs"), psnet (1 workerd) $(mean "$psnet_aucs")," \
  "difference $(awk -v a="$(mean "$psnet_aucs")" -v b="$(mean "$torch_aucs")" 'BEGIN { printf "%+.4f", a - b }'); planted $best"
