#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A sparse table's rows over the wire (issue 34): rows per second pulled and
# pushed by one Python worker through libpsnet, over 1 and 2 shards, tables
# of dim 16 and 64 (Adagrad), batches of 4,096 x 26 Zipf(1.1) ids; beside
# the same gather and scatter in one process's memory (the limit), measured
# in the same run by the same script (tests/bench/rows_bench.py); then the
# hot-row cache's bytes and AUC on a click log (tests/bench/rows_cache.py).
# Never pass/fail.
#
#   tests/bench/rows.sh [--build DIR] [--batches 40] [--keep]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build batches=40 keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--build DIR] [--batches N] [--keep]" >&2; exit 2 ;;
  esac
done
BENCH=rows
source "$top/tests/bench/lib.sh"
python_client numpy torch
for shards in 1 2; do
  coord="ipc://$RUN/coord-$shards.sock"
  psnet_start "pscoord-$shards" "$PSCOORD" --listen "$coord" --workers 1 --shards "$shards" --mode asp \
    --replicas 1 --model mlp:4-1 --tables e16:16:adagrad,e64:64:adagrad
  for i in $(seq 1 "$shards"); do
    psnet_start "psd-$shards-$i" "$PSD" --id "$i" --listen "ipc://$RUN/psd-$shards-$i.sock" --coord "$coord"
  done
  /usr/bin/python3 "$top/tests/bench/rows_bench.py" "$coord" "$shards" "$batches" ||
    die "the worker failed (logs in $RUN)"
  psnet_stop_all
done

# The hot-row cache: bytes pulled per step, hit rate and test AUC of a sparse
# logistic regression trained one epoch with the table's cache=S.
"$build/worker/data/psnet-clicklog" --out "$RUN/clicks" --train-rows 50000 --test-rows 10000 --fields 8 \
  --vocab 1000,3000,10000,30000,100000,1000,10000,100000 --seed 3 | tail -1
for s in 0 2 8 32; do
  coord="ipc://$RUN/cache-$s.sock"
  psnet_start "pscoord-cache-$s" "$PSCOORD" --listen "$coord" --shards 2
  for i in 1 2; do
    psnet_start "psd-cache-$s-$i" "$PSD" --id "$i" --listen "ipc://$RUN/psd-cache-$s-$i.sock" --coord "$coord"
  done
  /usr/bin/python3 "$top/tests/bench/rows_cache.py" "$coord" "$RUN/clicks" "$s" || die "cache=$s: the worker failed"
  psnet_stop_all
done
