#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The CPU training step of the built-in models (cnn, vit; and the demo MLP)
# on psnet's CPU backend (bench-kernels: forward, loss, backward, every
# gradient in the host buffers a worker pushes) against PyTorch's step of
# the same model on the same cores (tests/bench/torch_models_step.py,
# Debian's python3-torch), in the same run. Prints both and the ratio
# (psnet ms / torch ms: below 1 is faster). Never pass/fail.
#
#   tests/bench/models-cpu.sh [--build DIR] [--batch 64] [--threads 2] [--steps 30]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build batch=64 threads=2 steps=30
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--batch N] [--threads N] [--steps N]" >&2; exit 2 ;;
  esac
done
bench=$build/tests/bench-kernels
[ -x "$bench" ] || { echo "models-cpu: $bench is missing (ninja -C $build)" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "models-cpu: python3-torch is missing" >&2; exit 1; }
echo "models-cpu: batch $batch, $threads threads, median of $steps steps; $(nproc) CPUs"
for m in cnn vit mlp:784-256-10; do
  line=$("$bench" --backend cpu --threads "$threads" --model "$m" --batch "$batch" --steps "$steps")
  ours=$(sed -n 's/.*ms_per_step=\([0-9.]*\).*/\1/p' <<<"$line")
  theirs=$(/usr/bin/python3 "$top/tests/bench/torch_models_step.py" --models "$m" --batch "$batch" \
    --threads "$threads" --steps "$steps" | sed -n 's/.*"ms_per_step": \([0-9.]*\).*/\1/p')
  awk -v m="$m" -v a="$ours" -v b="$theirs" \
    'BEGIN { printf "models-cpu: %-16s psnet %8.3f ms  torch %8.3f ms  psnet/torch %.2f\n", m, a, b, a / b }'
done
