#!/usr/bin/env bash
# Benchmark: federated learning on a non-IID split. 100 clients (one
# workerd --edge --simulate 100 process) hold the 60,000 Fashion-MNIST
# training images split by label with Dirichlet(0.5) proportions (and, for
# reference, evenly: iid); each round samples 10 of them (--fraction 0.1),
# each trains --local-epochs on its share, and after every round an edge
# worker tests the model on the 10,000 test images (--eval-every 1). Per
# configuration: the rounds it takes to reach 0.85 test accuracy (the
# issue's target: at most 50) and the accuracy after the last round, for
# FedAvg, FedProx (mu 0.01) and FedAdam (server lr 0.01) on the Dirichlet
# split and FedAvg on the even one. The curves go to a CSV file and, where
# gnuplot is installed (Debian's gnuplot-nox), to an SVG plot.
#
# Printed, never pass/fail:
#   fed-noniid config=C rounds_to_0.85=N (or none) final_accuracy=A seconds=S
#   fed-noniid curves=FILE.csv [plot=FILE.svg]
#
#   tests/bench/fed-noniid.sh [--build DIR] [--rounds R] [--local-epochs E] [--lr LR]
#                             [--out DIR] [--keep]
set -u
export LC_ALL=C
top=$(cd "$(dirname "$0")/../.." && pwd)
build="$top/build" rounds=60 epochs=5 lr=0.05 out="" keep=0
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --local-epochs) epochs=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fed-noniid: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
PSCOORD=$build/ps/pscoord/pscoord PSD=$build/ps/psd/psd PSCTL=$build/ps/psctl/psctl WORKERD=$build/worker/workerd/workerd
for b in "$PSCOORD" "$PSD" "$PSCTL" "$WORKERD"; do
  [ -x "$b" ] || { echo "fed-noniid: $b is missing (ninja -C $build)" >&2; exit 1; }
done
RUN=$(mktemp -d /tmp/psnet-bench-noniid.XXXXXX)
out=${out:-$RUN}
mkdir -p "$out" || exit 1
source "$top/deploy/local/cluster.sh"
cleanup() {
  local rc=$?
  psnet_stop_all
  if [ $rc -ne 0 ] || [ $keep = 1 ]; then echo "fed-noniid: logs are in $RUN" >&2; elif [ "$out" != "$RUN" ]; then rm -rf "$RUN"; fi
  return $rc
}
trap cleanup EXIT
trap 'exit 143' TERM INT
die() { echo "fed-noniid: $*" >&2; exit 1; }

# run NAME ALPHA [PSCOORD OPTIONS...]: one job; its round history in $RUN/NAME.json.
run() {
  local name=$1 alpha=$2; shift 2
  local t0=$SECONDS
  COORD="ipc://$RUN/coord-$name.sock"
  psnet_start "pscoord-$name" "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds "$rounds" --fraction 0.1 \
    --min-clients 10 --min-available 100 --round-timeout 300 --local-epochs "$epochs" --lr "$lr" --batch 32 \
    --eval-every 1 "$@"
  psnet_start "psd-$name" "$PSD" --id 1 --listen "ipc://$RUN/psd-$name.sock" --coord "$COORD"
  psnet_start "edge-$name" "$WORKERD" --edge --coord "$COORD" --simulate 100 --alpha "$alpha" --connect-timeout 120
  "$PSCTL" --coord "$COORD" job wait --wait 3600 >"$RUN/$name.out" 2>&1 || die "$name: $(cat "$RUN/$name.out")"
  "$PSCTL" --coord "$COORD" --json round history >"$RUN/$name.json" || die "$name: no round history"
  psnet_stop_all
  SECS=$((SECONDS - t0))
}

configs=(fedavg-iid fedavg fedprox fedadam)
for name in "${configs[@]}"; do
  case $name in
    fedavg-iid) run "$name" iid ;;
    fedavg) run "$name" 0.5 ;;
    fedprox) run "$name" 0.5 --prox-mu 0.01 ;;
    fedadam) run "$name" 0.5 --strategy fedadam --server-lr 0.01 ;;
  esac
  hit=$(jq -r '[.[] | select(.round > 0 and .accuracy != null and .accuracy >= 0.85) | .round] | min // "none"' \
    "$RUN/$name.json")
  final=$(sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p' "$RUN/$name.out")
  echo "fed-noniid config=$name rounds_to_0.85=$hit final_accuracy=$final seconds=$SECS"
done
# round,fedavg-iid,fedavg,fedprox,fedadam
csv="$out/fed-noniid.csv"
{
  echo "round,${configs[*]}" | tr ' ' ','
  for r in $(seq 1 "$rounds"); do
    line=$r
    for name in "${configs[@]}"; do
      line="$line,$(jq -r --argjson r "$r" '[.[] | select(.round == $r) | .accuracy // empty] | first // ""' "$RUN/$name.json")"
    done
    echo "$line"
  done
} >"$csv"
plot=""
if command -v gnuplot >/dev/null; then
  plot="$out/fed-noniid.svg"
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
plot "$csv" using 1:2 with lines lw 2 title "FedAvg, iid", \
     "" using 1:3 with lines lw 2 title "FedAvg, Dirichlet(0.5)", \
     "" using 1:4 with lines lw 2 title "FedProx mu 0.01, Dirichlet(0.5)", \
     "" using 1:5 with lines lw 2 title "FedAdam, Dirichlet(0.5)"
EOF
fi
echo "fed-noniid curves=$csv${plot:+ plot=$plot}"
