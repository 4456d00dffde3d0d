#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Flower quickstart's CNN (conv 6x5x5, pool, conv 16x5x5, pool, 120, 84,
# 10) trained by federated rounds on the same 10 partitions of Fashion-MNIST,
# once by 10 C edge clients (workerd --edge --data DIR_k) and once by 10
# Python clients (psnet.fed.start_client, one process each, their fit() the
# same local SGD in PyTorch): the final accuracy of each (the same test set)
# and the mean round time, and their ratio; the CPU a client spends a round,
# and of a Python client's how much its fit() took and psnet.fed the rest.
# The model is psnet's JSON of layers, so both kinds of client can train it.
# --channels-last: the Python clients' model in torch's channels_last memory
# layout (one line of the user's code, a faster fit() on a CPU).
#   tests/bench/fed-python-vs-c.sh [--build DIR] [--rounds R] [--clients N] [--limit N] [--channels-last] [--keep]
set -u
BENCH=fed-python-vs-c
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build rounds=5 clients=10 limit=20000 keep=0 layout=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --channels-last) layout=(channels_last); shift ;;
    --keep) keep=1; shift ;;
    *) echo "$BENCH: unknown option $1" >&2; exit 2 ;;
  esac
done
source "$top/tests/bench/lib.sh"
python_client
DATA=${PSNET_DATA:-/usr/share/datasets/fashion-mnist}

# The partitions, as NumPy pairs each client reads whole (the same for both runs).
/usr/bin/python3 - "$DATA" "$RUN/parts" "$clients" "$limit" <<'EOF' || exit 1
import os, sys
import numpy as np
from psnet import data
src, out, n, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
x, y = data.load(src, "train", limit)
tx, ty = data.load(src, "test", 2000)
perm = np.random.default_rng(42).permutation(len(x))
x, y = x[perm], y[perm]
k = len(x) // n
for c in range(n):
    d = os.path.join(out, str(c))
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, "x_train.npy"), (x[c * k:(c + 1) * k] * 255).round().astype(np.uint8).reshape(-1, 28, 28))
    np.save(os.path.join(d, "y_train.npy"), y[c * k:(c + 1) * k].astype(np.int64))
    np.save(os.path.join(d, "x_test.npy"), (tx * 255).round().astype(np.uint8).reshape(-1, 28, 28))
    np.save(os.path.join(d, "y_test.npy"), ty.astype(np.int64))
EOF
cat >"$RUN/net.json" <<'EOF'
{"name": "flower-quickstart", "input": [1, 28, 28], "layers": [
  {"type": "conv2d", "out": 6, "kernel": 5}, {"type": "relu"}, {"type": "maxpool", "kernel": 2},
  {"type": "conv2d", "out": 16, "kernel": 5}, {"type": "relu"}, {"type": "maxpool", "kernel": 2},
  {"type": "flatten"}, {"type": "linear", "out": 120}, {"type": "relu"},
  {"type": "linear", "out": 84}, {"type": "relu"}, {"type": "linear", "out": 10}]}
EOF
JOB=(--mode fed --model "$RUN/net.json" --data "$RUN/parts/0" --rounds "$rounds" --fraction 1 --min-clients "$clients"
     --min-available "$clients" --round-timeout 300 --local-epochs 1 --batch 32 --lr 0.05 --chunk-kb 64)

run() {  # run KIND: one job; prints "accuracy seconds-per-round cpu-per-round fit-cpu-per-round"
  local kind=$1 coord="ipc://$RUN/$1.sock"
  psnet_start "pscoord-$kind" "$PSCOORD" --listen "$coord" --shards 2 "${JOB[@]}"
  for i in 1 2; do psnet_start "psd-$kind-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$kind-$i.sock" --coord "$coord"; done
  for c in $(seq 0 $((clients - 1))); do
    if [ "$kind" = c ]; then
      psnet_start "edge-$kind-$c" "$WORKERD" --edge --coord "$coord" --data "$RUN/parts/$c"
    else
      PSNET_LOG_LEVEL=warning /usr/bin/python3 "$top/tests/bench/fed_client.py" "$coord" "$RUN/parts/$c" "$RUN/net.json" "${layout[@]}" \
        >"$RUN/py-$c.log" 2>&1 &
    fi
  done
  local out
  out=$("$PSCTL" --coord "$coord" job wait --wait 1200) || { echo "$BENCH: the $kind job failed: $out" >&2; return 1; }
  local acc secs
  acc=$(sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p' <<<"$out")
  secs=$("$PSCTL" --coord "$coord" --json round history | jq '[.[] | select(.round > 0) | .seconds] | add / length')
  psnet_stop_all
  wait
  # A client's CPU seconds a round: a C client's whole process (workerd logs
  # it as it leaves; its start-up and data loading included), a Python
  # client's over start_client (psnet.fed's Stats: cpu_s, of it fit_cpu_s in
  # the user's fit()). The mean over the clients.
  local cpu fit=-
  if [ "$kind" = c ]; then
    cpu=$(sed -n 's/.*msg="leaving" rounds=\([0-9]*\) .*process_cpu_s=\([0-9.]*\).*/\2 \1/p' "$RUN"/edge-c-*.log |
      awk '$2 > 0 { s += $1 / $2; n++ } END { if (n) printf "%.3f", s / n; else print "-" }')
  else
    read -r cpu fit < <(for f in "$RUN"/py-*.log; do tail -n 1 "$f"; done |
      jq -rs 'map(select(.rounds > 0)) | if length == 0 then "- -" else
        "\(map(.cpu_s / .rounds) | add / length * 1000 | round / 1000) \(map(.fit_cpu_s / .rounds) | add / length * 1000 | round / 1000)" end')
  fi
  echo "$acc $secs ${cpu:--} ${fit:--}"
}
read -r acc_c s_c cpu_c _ < <(run c) || exit 1
read -r acc_py s_py cpu_py fit_py < <(run py) || exit 1
echo "Flower quickstart CNN, $clients clients, $rounds rounds, FedAvg, local SGD (1 epoch, batch 32, lr 0.05)${layout:+, the model of the Python clients channels_last}"
echo "C clients (workerd --edge):      accuracy $acc_c   $(printf %.2f "$s_c") s a round   CPU a round per client $cpu_c s (the whole process)"
echo "Python clients (psnet.fed):      accuracy $acc_py   $(printf %.2f "$s_py") s a round   CPU a round per client $cpu_py s, of it $fit_py s in fit()"
awk -v c="$cpu_py" -v f="$fit_py" \
  'BEGIN { if (c > 0) printf "psnet.fed besides fit(): %.3f s CPU a round per client (%.1f%% of the client'"'"'s)\n", c - f, 100 * (c - f) / c }'
awk -v a="$acc_py" -v b="$acc_c" -v s="$s_py" -v t="$s_c" \
  'BEGIN { printf "Python against C: accuracy %+.2f points (target within 1), round time %.2fx (target at most 1.3)\n", 100 * (a - b), s / t }'
