#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end GPU benchmark: one CUDA workerd with 2 psd shards on this machine
# (deploy/local/demo: pscoord, ipc sockets, BSP by default) trains Fashion-MNIST; then a
# plain single-process PyTorch loop (tests/bench/torch_fmnist_loop.py) trains the
# same model with the same batch, optimizer and epochs on the same GPU (Adam for
# cnn and vit, as the demo gives them; SGD with momentum for an MLP). Prints
# both lines, where workerd's time went (batch gathering, compute = params
# upload + step + gradient download, exchange = push/pull round with the
# shards' optimizer), and the ratio of samples/s. Not pass/fail.
#   tests/bench/e2e-gpu.sh [--build DIR] [--data DIR] [--model SPEC] [--batch N]
#                          (SPEC: an MLP's widths, 784-256-10, or cnn or vit)
#                          [--epochs N] [--mode bsp|asp|ssp:S] [--no-build] [--worker-opt OPT]...
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build="$top/build" data=/usr/share/datasets/fashion-mnist model=784-256-10 batch=64 epochs=5 mode=bsp
demo_opts=() wopts=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --no-build) demo_opts+=(--no-build); shift ;;
    --worker-opt) wopts+=(--worker-opt "$2"); shift 2 ;;
    -h|--help) sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "e2e-gpu: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$top/deploy/local/demo" --build "$build" "${demo_opts[@]}" --backend cuda --workers 1 --shards 2 \
  --mode "$mode" --epochs "$epochs" --model "$([[ $model == *-* ]] && echo "mlp:$model" || echo "$model")" "${wopts[@]}" -- --data "$data" --batch "$batch" >"$log" 2>&1
rc=$?
run=$(sed -n 's/^demo: logs are in \([^ ]*\).*/\1/p' "$log" | tail -1)
if [ $rc -ne 0 ] || [ -z "$run" ]; then
  echo "e2e-gpu: the psnet run failed (rc=$rc):" >&2; tail -20 "$log" >&2; exit 1
fi
trained=$(grep -h 'msg="trained' "$run"/workerd-*.log | tail -1)
graph=$(grep -c 'captured graph' "$run"/workerd-*.log)
echo "psnet: $(tail -1 "$log") graph=$graph"
echo "psnet: $trained"
topt=(--optim sgd)
[[ $model == *-* ]] || topt=(--optim adam)
torch=$(python3 "$here/torch_fmnist_loop.py" --data "$data" --model "$model" --batch "$batch" --epochs "$epochs" "${topt[@]}") || {
  echo "e2e-gpu: the PyTorch loop failed" >&2; exit 1; }
echo "torch: $torch"
ps=$(sed -n 's/.* samples_per_s=\([0-9.]*\).*/\1/p' <<<"$trained")
ts=$(sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' <<<"$torch")
awk -v p="$ps" -v t="$ts" -v tr="$trained" 'BEGIN {
  split(tr, kv, " "); for (i in kv) { n = split(kv[i], f, "="); if (n == 2) v[f[1]] = f[2] }
  tot = v["batch_s"] + v["compute_s"] + v["exchange_s"]
  printf "e2e: psnet %s samples/s, torch %s samples/s, ratio %.2f; psnet time: batch %.0f%%, compute %.0f%%, exchange %.0f%% (of %.2f s in the loop)\n",
    p, t, p / t, 100 * v["batch_s"] / tot, 100 * v["compute_s"] / tot, 100 * v["exchange_s"] / tot, tot }'
