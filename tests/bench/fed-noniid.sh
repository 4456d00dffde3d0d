#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Benchmark: federated learning on a non-IID split. 100 clients (one
# workerd --edge --simulate 100 process) hold the 60,000 Fashion-MNIST
# training images split by label with Dirichlet(0.5) proportions (and, for
# reference, evenly: iid); each round samples 10 of them (--fraction 0.1),
# each trains --local-epochs on its share, and after every round an edge
# worker tests the model on the 10,000 test images (--eval-every 1). Per
# configuration: the rounds it takes to reach 0.85 test accuracy (the
# issue's target: at most 50), the accuracy after the last round, the
# seconds of the whole job and of a round (mean, the first left out), and
# the peak memory of the server (pscoord + psd) and of the clients' process,
# for FedAvg, FedProx (mu 0.01) and FedAdam (server lr 0.01) on the Dirichlet
# split and FedAvg on the even one. The curves go to a CSV file and, where
# gnuplot is installed (Debian's gnuplot-nox), to an SVG plot.
#
# --flower runs the three Dirichlet configurations in Flower too, in the same
# run: the same split and initial weights (bench-fedsplit writes psnet's),
# model, sampling, local epochs, batch and lr, with Flower's FedAvg, FedProx
# and FedAdam (tests/bench/flower_fed.py: Flower's server with centralised
# evaluation, the 100 clients as threads of one process training in NumPy).
# Flower (the flwr package from the Python package index) is installed into
# --venv DIR (default ~/.cache/psnet/flower-venv) for the benchmark only;
# that needs Debian's python3-venv and a network the first time.
#
# Printed, never pass/fail:
#   fed-noniid config=C rounds_to_0.85=N (or none) final_accuracy=A seconds=S
#              round_s=S server_mib=M clients_mib=M
#   fed-noniid curves=FILE.csv [plot=FILE.svg]
#
#   tests/bench/fed-noniid.sh [--build DIR] [--rounds R] [--local-epochs E] [--lr LR]
#                             [--flower] [--venv DIR] [--out DIR] [--keep]
set -u
export LC_ALL=C
top=$(cd "$(dirname "$0")/../.." && pwd)
build="$top/build" rounds=60 epochs=5 lr=0.05 out="" keep=0 flower=0
venv=${XDG_CACHE_HOME:-$HOME/.cache}/psnet/flower-venv
usage() { sed -n '3,32p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --local-epochs) epochs=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --flower) flower=1; shift ;;
    --venv) venv=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fed-noniid: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
BENCH=fed-noniid
source "$top/tests/bench/lib.sh"
out=${out:-$RUN}
mkdir -p "$out" || die "cannot make $out"
[ "$out" != "$RUN" ] || BENCH_KEEP_RUN=1

# After run or flower: $RUN/NAME.acc.json ([{round, accuracy}] per round),
# SECS (the whole job), ROUND_S (a round, mean), FINAL (accuracy at the end),
# MEM ("server clients", peak MiB).

# run NAME ALPHA [PSCOORD OPTIONS...]: the job in psnet.
run() {
  local name=$1 alpha=$2; shift 2
  local t0=$SECONDS
  COORD="ipc://$RUN/coord-$name.sock"
  psnet_start "pscoord-$name" "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds "$rounds" --fraction 0.1 \
    --min-clients 10 --min-available 100 --round-timeout 300 --local-epochs "$epochs" --lr "$lr" --batch 32 \
    --eval-every 1 "$@"
  psnet_start "psd-$name" "$PSD" --id 1 --listen "ipc://$RUN/psd-$name.sock" --coord "$COORD"
  psnet_start "edge-$name" "$WORKERD" --edge --coord "$COORD" --simulate 100 --alpha "$alpha" --connect-timeout 120
  local u=${name//-/_} cpid ppid epid server
  eval "cpid=\$PID_pscoord_$u ppid=\$PID_psd_$u epid=\$PID_edge_$u"
  sample_hwm "$RUN/$name-clients.hwm" "$epid" &
  "$PSCTL" --coord "$COORD" job wait --wait 3600 >"$RUN/$name.out" 2>&1 || die "$name: $(cat "$RUN/$name.out")"
  "$PSCTL" --coord "$COORD" --json round history >"$RUN/$name.json" || die "$name: no round history"
  server=$(awk -v a="$(hwm_mib "$cpid")" -v b="$(hwm_mib "$ppid")" 'BEGIN { printf "%.1f", a + b }')
  psnet_stop_all
  wait
  SECS=$((SECONDS - t0)) MEM="$server $(cat "$RUN/$name-clients.hwm" 2>/dev/null)"
  jq '[.[] | select(.round > 0) | {round, accuracy}]' "$RUN/$name.json" >"$RUN/$name.acc.json" ||
    die "$name: unreadable round history"
  ROUND_S=$(jq -r '[.[] | select(.round > 1) | .seconds] | (add / length * 1000 | round / 1000)' "$RUN/$name.json")
  FINAL=$(sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p' "$RUN/$name.out")
}

# The Flower side: a virtual environment with flwr, psnet's split and weights.
py=""
if [ $flower = 1 ]; then
  flower_venv "$venv"
  py=$FLOWER_PY
  mkdir -p "$RUN/split" && "$build/tests/bench-fedsplit" --out "$RUN/split" --clients 100 --alpha 0.5 ||
    die "bench-fedsplit failed (ninja -C $build)"
fi

# flower NAME STRATEGY [OPTIONS...]: the job in Flower. A round's seconds run
# from one centralised evaluation to the next (round 1 is left out, as for
# psnet: Flower's waits for the clients to start). The clients' threads each
# use one BLAS thread (on 2 cores: 0.4-0.55 s a round against 1.5-1.9 s
# with OpenBLAS's default).
flower() {
  local name=$1; shift
  local t0=$SECONDS port spid cpid
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') ||
    die "no free port"
  "$py" "$top/tests/bench/flower_fed.py" server --split "$RUN/split" --address "127.0.0.1:$port" --rounds "$rounds" \
    --out "$RUN/$name.flwr.json" --strategy "$@" >"$RUN/$name-server.log" 2>&1 &
  spid=$!
  sample_hwm "$RUN/$name-server.hwm" $spid &
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$py" "$top/tests/bench/flower_fed.py" clients --split "$RUN/split" --address "127.0.0.1:$port" \
    --local-epochs "$epochs" --lr "$lr" --batch 32 >"$RUN/$name-clients.log" 2>&1 &
  cpid=$!
  sample_hwm "$RUN/$name-clients.hwm" $cpid &
  if ! wait $spid; then
    kill $cpid 2>/dev/null
    die "$name: the Flower server failed: $(tail -5 "$RUN/$name-server.log")"
  fi
  # The clients leave when the server says goodbye; one that does not is not waited for.
  kill $cpid 2>/dev/null
  wait
  SECS=$((SECONDS - t0)) MEM="$(cat "$RUN/$name-server.hwm") $(cat "$RUN/$name-clients.hwm")"
  jq '[.history[] | select(.round > 0) | {round, accuracy}]' "$RUN/$name.flwr.json" >"$RUN/$name.acc.json" ||
    die "$name: no history from Flower"
  ROUND_S=$(jq -r '.history | ((last.t - .[1].t) / (length - 2) * 1000 | round / 1000)' "$RUN/$name.flwr.json")
  FINAL=$(jq -r '.history | last.accuracy * 10000 | round / 10000' "$RUN/$name.flwr.json")
}

configs=(fedavg-iid fedavg fedprox fedadam)
[ $flower = 1 ] && configs+=(flower-fedavg flower-fedprox flower-fedadam)
for name in "${configs[@]}"; do
  case $name in
    fedavg-iid) run "$name" iid ;;
    fedavg) run "$name" 0.5 ;;
    fedprox) run "$name" 0.5 --prox-mu 0.01 ;;
    fedadam) run "$name" 0.5 --strategy fedadam --server-lr 0.01 ;;
    flower-fedavg) flower "$name" fedavg ;;
    flower-fedprox) flower "$name" fedprox --prox-mu 0.01 ;;
    flower-fedadam) flower "$name" fedadam --server-lr 0.01 ;;
  esac
  hit=$(jq -r '[.[] | select(.accuracy != null and .accuracy >= 0.85) | .round] | min // "none"' "$RUN/$name.acc.json")
  read -r smem cmem <<<"$MEM"
  echo "fed-noniid config=$name rounds_to_0.85=$hit final_accuracy=$FINAL seconds=$SECS round_s=$ROUND_S" \
    "server_mib=$smem clients_mib=$cmem"
done
# round,<config>,...
csv="$out/fed-noniid.csv"
{
  echo "round,${configs[*]}" | tr ' ' ','
  for r in $(seq 1 "$rounds"); do
    line=$r
    for name in "${configs[@]}"; do
      line="$line,$(jq -r --argjson r "$r" '[.[] | select(.round == $r) | .accuracy // empty] | first // ""' \
        "$RUN/$name.acc.json")"
    done
    echo "$line"
  done
} >"$csv"
plot=""
if command -v gnuplot >/dev/null; then
  plot="$out/fed-noniid.svg"
  curves="'$csv' using 1:2 with lines lw 2 title 'FedAvg, iid', \
    '' using 1:3 with lines lw 2 title 'FedAvg, Dirichlet(0.5)', \
    '' using 1:4 with lines lw 2 title 'FedProx mu 0.01, Dirichlet(0.5)', \
    '' using 1:5 with lines lw 2 title 'FedAdam, Dirichlet(0.5)'"
  [ $flower = 1 ] && curves="$curves, \
    '' using 1:6 with lines lw 1 dt 2 lc 2 title 'Flower FedAvg, Dirichlet(0.5)', \
    '' using 1:7 with lines lw 1 dt 2 lc 3 title 'Flower FedProx', \
    '' using 1:8 with lines lw 1 dt 2 lc 4 title 'Flower FedAdam'"
  gnuplot <<EOF || plot=""
set terminal svg size 720,420 font "sans,11" background rgb "white"
set output "$plot"
set datafile separator ","
set title "Fashion-MNIST MLP, 100 clients, 10 per round, $epochs local epochs"
set xlabel "round"
set ylabel "test accuracy"
set yrange [0.5:0.9]
set key bottom right
set grid
set arrow from graph 0, first 0.85 to graph 1, first 0.85 nohead dashtype 2 lc rgb "gray"
plot $curves
EOF
fi
echo "fed-noniid curves=$csv${plot:+ plot=$plot}"
