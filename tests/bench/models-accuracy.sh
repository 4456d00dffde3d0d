#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The accuracy the demo reaches with each built-in model on this machine's
# CPU (two workers, two shards, BSP, the whole Fashion-MNIST), against the
# targets of issue "Train your own model": an MLP in 15 epochs 0.89 (the
# demo's mlp:784-256-10, and mlp-wide: mlp:784-512-256-10), the cnn 0.92, the
# vit 0.88. Prints, per model, the demo's settings, the accuracy
# after each epoch, the final one, the seconds and the target. Minutes per
# model: run by tests/run --bench, never pass/fail.
#
#   tests/bench/models-accuracy.sh [--build DIR] [--models "mlp mlp-wide cnn vit"] [--report DIR]
#
# --report DIR: each run's psctl report in DIR/MODEL (index.html).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build models="mlp mlp-wide cnn vit" report=
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--models \"mlp mlp-wide cnn vit\"] [--report DIR]" >&2; exit 2 ;;
  esac
done
echo "models-accuracy: $(nproc) CPUs; the demo's settings for each model (deploy/local/demo --help)"
for m in $models; do
  case $m in
    mlp) args=(--epochs 15) target=0.89 ;;
    mlp-wide) args=(--epochs 15 --model mlp:784-512-256-10) target=0.89 ;;
    cnn) args=(--model cnn) target=0.92 ;;
    vit) args=(--model vit) target=0.88 ;;
    *) echo "models-accuracy: unknown model '$m' (mlp, mlp-wide, cnn, vit)" >&2; exit 2 ;;
  esac
  [ -n "$report" ] && args+=(--report "$report/$m")
  log=$(mktemp)
  if ! line=$("$top/deploy/local/demo" --no-build --build "$build" --no-http --backend cpu "${args[@]}" 2>"$log" |
      tail -1); then
    echo "models-accuracy: $m: the demo failed:" >&2; tail -20 "$log" >&2; rm -f "$log"; exit 1
  fi
  grep -E 'demo: ([^ ]+: (Adam|SGD) at|epoch .*test accuracy)' "$log" | sed "s/^demo:/models-accuracy: $m:/" || true
  rm -f "$log"
  awk -v m="$m" -v t="$target" -v l="$line" 'BEGIN {
    match(l, /accuracy=[0-9.]+/); a = substr(l, RSTART + 9, RLENGTH - 9)
    printf "models-accuracy: %-8s %s  target %s: %s\n", m, l, t, (a + 0 >= t ? "reached" : "not reached") }'
done
