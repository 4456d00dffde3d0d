#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A Python worker's training speed with its tensors in the memory it shares
# with the shards (PSNET_SHM=on: pushed and pulled in place), in its own
# buffers copied through the shards' memory (copy) and in frames (off),
# beside workerd --backend cpu on the same job, in the same run, runs
# interleaved. Each run: pscoord --workers 1 --shards 2, two psd and one
# worker, the job's --epochs over --train-limit images; the figure is the
# worker's own "trained" time (start-up and data loading left out) and
# samples/s from it, the median over --runs. Never pass/fail.
#
#   tests/bench/python-worker.sh [--build DIR] [--model mlp:784-1024-1024-10] [--batch 64]
#                                [--mode asp] [--epochs 1] [--train-limit 20000] [--runs 3] [--keep]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build model=mlp:784-1024-1024-10 batch=64 mode=asp epochs=1 limit=20000 runs=3 keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --train-limit) limit=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--build DIR] [--model M] [--batch N] [--mode M] [--epochs N] [--train-limit N] [--runs N] [--keep]" >&2
       exit 2 ;;
  esac
done
BENCH=python-worker
source "$top/tests/bench/lib.sh"
python_client torch numpy

acc_of() { sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p' <<<"$1"; }
# one_run KIND N: trains the job once with worker KIND (workerd, or py-on,
# py-copy, py-off), whose log is $RUN/KIND-N.log (psnet_start's name for
# workerd's); prints "seconds samples accuracy".
one_run() {
  local kind=$1 n=$2 i out s steps
  local coord="ipc://$RUN/$kind-$n.sock" log="$RUN/$kind-$n.log"
  psnet_start "pscoord-$kind-$n" "$PSCOORD" --listen "$coord" --workers 1 --shards 2 --mode "$mode" \
    --model "$model" --batch "$batch" --epochs "$epochs" --train-limit "$limit"
  for i in 1 2; do
    psnet_start "psd-$kind-$n-$i" "$PSD" --id "$i" --listen "ipc://$RUN/psd-$kind-$n-$i.sock" --coord "$coord"
  done
  case $kind in
    workerd) psnet_start "$kind-$n" "$WORKERD" --coord "$coord" --backend cpu ;;
    py-*) PSNET_SHM=${kind#py-} /usr/bin/python3 -m psnet.worker --coord "$coord" >"$log.out" 2>"$log" &
          PSNET_PIDS+=("$!") ;;
  esac
  out=$("$PSCTL" --coord "$coord" job wait --wait 600) || die "$kind: the job did not end ($out)"
  grep -q "state=done" <<<"$out" || die "$kind: the job failed ($out)"
  s=$(sed -n 's/.*msg="trained".* seconds=\([0-9.]*\).*/\1/p' "$log" | head -1)
  steps=$(sed -n 's/.*msg="trained".* steps=\([0-9]*\).*/\1/p' "$log" | head -1)
  [ -n "$s" ] && [ -n "$steps" ] || die "$kind: no \"trained\" line in $log"
  case $kind in
    py-on) grep -q 'msg="tensors in shared memory"' "$log" || die "py-on: its tensors are not in shared memory" ;;
    py-copy|py-off) ! grep -q 'msg="tensors in shared memory"' "$log" || die "$kind: tensors in shared memory" ;;
  esac
  echo "$s $((steps * batch)) $(acc_of "$out")"
  psnet_stop_all
}

kinds=(workerd py-on py-copy py-off)
echo "$BENCH: $model, batch $batch, $mode, $epochs epoch(s) of $limit images, 1 worker, 2 shards (ipc), $runs runs; $(nproc) CPUs"
declare -A secs samples accs
for n in $(seq 1 "$runs"); do
  for k in "${kinds[@]}"; do
    read -r s m a < <(one_run "$k" "$n")
    secs[$k]+="$s " samples[$k]=$m accs[$k]+="$a "
  done
done
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ref=$(median <<<"${secs[py-on]}")
for k in "${kinds[@]}"; do
  med=$(median <<<"${secs[$k]}")
  awk -v k="$k" -v m="$med" -v n="${samples[$k]}" -v all="${secs[$k]}" -v acc="${accs[$k]}" -v ref="$ref" \
    'BEGIN { printf "%s: %-8s %7.2f s  %8.0f samples/s  seconds/in-place %.2f  (runs: %s; accuracy %s)\n",
             "python-worker", k, m, n / m, m / ref, all, acc }'
done
# The Python worker runs the same ops on the same data in the three modes:
# the same accuracy in each is expected (a difference is worth a look).
n=$(echo "${accs[py-on]} ${accs[py-copy]} ${accs[py-off]}" | tr ' ' '\n' | sed '/^$/d' | sort -u | wc -l)
if [ "$n" -eq 1 ]; then
  echo "python-worker: the Python worker's accuracy is the same in the three modes and every run"
else
  echo "python-worker: the Python worker's accuracy differs between modes or runs ($n values)"
fi
