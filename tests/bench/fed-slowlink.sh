#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Benchmark: federated rounds over slow, lossy links. Every edge client sits
# behind a link of its own to psgate (tests/bench/linkemu.py, a TCP proxy
# that shapes each connection: rate, one-way delay, and loss as its effect on
# a TCP stream, Mathis et al.; tc netem needs sch_netem and root, which this
# benchmark does not assume):
#   - --clients edge processes (default 100) behind 10 Mbit/s, 50 ms, 1% loss
#     (a stream moves at 1.41 Mbit/s);
#   - --slow more (default 5) behind 1 Mbit/s, 300 ms, no loss.
# Each client is a workerd --edge process of its own (the -Dedge=true
# build's, from --edge-build, when there is one), as devices are: the
# virtual clients of one --simulate process pull side by side only up to
# its pull buffers (4 per --parallel model), and share its cores.
# The same job (mlp:784-256-10, --fraction of the clients a round, default
# 0.2) once per upload format: f32, bf16, int8, top-k 0.1. Per format: the
# mean round seconds, one client's update bytes, the accuracy after the
# rounds, and how many sampled clients answered / came late / dropped.
# Then stragglers: f32 and int8 again with --round-timeout short enough that
# a slow client's f32 update (pull 0.8 MB, push 0.8 MB at 1 Mbit/s: ~13 s)
# misses it and its int8 one (~8 s) does not.
#
# Printed, never pass/fail:
#   slowlink codec=C sampled=K round_s=S bytes_per_client=B accuracy=A answered=N late=L dropped=D failed=F
#   slowlink stragglers codec=C round_timeout=T round_s=S answered=N late=L dropped=D failed=F slow_counted=X
# (round_s: the aggregated rounds'; the counts: every round run, a failed one
# run again with a fresh sample included; slow_counted: updates of the slow
# clients counted.)
#
# With --flower, then Flower (flwr, in a virtual environment of this
# benchmark's own: --venv, default ~/.cache/psnet/flower-venv) over the same
# two links (one linkemu per kind in front of its gRPC server, each client's
# connection shaped apart), the same clients (bench-fedsplit: psnet's IID
# shares), the same MLP from psnet's initial weights, local SGD as psnet's
# edge workers (lr 0.02, batch 64, 1 epoch), FedAvg with the same fraction:
#   slowlink flower codec=f32 sampled=K round_s=S bytes_per_client=B accuracy=A
# (Flower uploads f32 only; B is the update's payload, gRPC's framing not
# counted; round_s leaves out round 1, which waits for the clients to start;
# accuracy on the same 2,000 test images; its server serves every sampled
# client at once, --max-workers, not its default of cores + 4, which over
# these links makes a round 2.5x as long.) Flower's clients run as threads,
# 10 to a process (--flower-per-process), so that no one interpreter's lock
# serialises a hundred of them; --flower-only leaves psnet's runs out.
#
#   tests/bench/fed-slowlink.sh [--build DIR] [--edge-build DIR] [--clients N] [--slow N] [--fraction F] [--rounds R]
#                               [--straggler-timeout S] [--flower] [--flower-only] [--flower-per-process N]
#                               [--venv DIR] [--keep]
set -u
export LC_ALL=C
top=$(cd "$(dirname "$0")/../.." && pwd)
build="$top/build" ebuild="$top/build-edge" clients=100 slow=5 fraction=0.2 rounds=4 stimeout=12 keep=0 flower=0
only_flower=0 per_process=10
venv=${XDG_CACHE_HOME:-$HOME/.cache}/psnet/flower-venv
usage() { sed -n '3,47p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --edge-build) ebuild=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    --fraction) fraction=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --straggler-timeout) stimeout=$2; shift 2 ;;
    --flower) flower=1; shift ;;
    --flower-only) flower=1 only_flower=1; shift ;;
    --flower-per-process) per_process=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fed-slowlink: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
BENCH=fed-slowlink
source "$top/tests/bench/lib.sh"
PSGATE=$build/ps/psgate/psgate
[ -x "$PSGATE" ] || die "$PSGATE is missing (ninja -C $build)"
EDGE_WORKERD=$WORKERD
[ -x "$ebuild/worker/workerd/workerd" ] && EDGE_WORKERD=$ebuild/worker/workerd/workerd
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
n=$((clients + slow))

# run TAG CODEC ROUND-TIMEOUT: one job to its end behind the two kinds of link;
# history in $RUN/TAG.json, job wait's answer in $RUN/TAG.out.
run() {
  local tag=$1 codec=$2 rt=$3
  COORD="ipc://$RUN/coord-$tag.sock"
  local gport fast slowp
  gport=$(free_port) fast=$(free_port) slowp=$(free_port)
  # --lease-ms: one connection carries a client's heartbeats behind its
  # update; at 1 Mbit/s an update takes seconds to leave.
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds "$rounds" \
    --fraction "$fraction" --min-clients 2 --min-available "$n" --round-timeout "$rt" --lease-ms 60000 \
    --train-limit $((n * 100)) --test-limit 2000 --compress "$codec"
  psnet_start "psd-$tag" "$PSD" --id 1 --listen "ipc://$RUN/psd-$tag.sock" --coord "$COORD"
  psnet_start "psgate-$tag" "$PSGATE" --listen "tcp://127.0.0.1:$gport" --coord "$COORD" --max-msg 16
  psnet_start "link-$tag" /usr/bin/python3 "$top/tests/bench/linkemu.py" "$fast" "127.0.0.1:$gport" 10 50 0.01
  psnet_start "slowlink-$tag" /usr/bin/python3 "$top/tests/bench/linkemu.py" "$slowp" "127.0.0.1:$gport" 1 300 0
  psnet_wait_for 10 grep -q 'linkemu: listening' "$RUN/slowlink-$tag.log" "$RUN/link-$tag.log" || die "the link emulator did not start"
  local k
  for ((k = 0; k < n; k++)); do
    local port=$fast name=edge
    [ $k -ge "$clients" ] && port=$slowp name=edges
    psnet_start "$name-$tag-$k" "$EDGE_WORKERD" --edge --gateway "tcp://127.0.0.1:$port" --partition "$k/$n" \
      --connect-timeout 300
  done
  "$PSCTL" --coord "$COORD" job wait --wait 3600 >"$RUN/$tag.out" 2>&1 || die "$tag: $(cat "$RUN/$tag.out")"
  "$PSCTL" --coord "$COORD" --json round history >"$RUN/$tag.json" || die "$tag: no round history"
  # The slow clients' updates counted: their process's log.
  SLOW_COUNTED=$(cat "$RUN"/edges-"$tag"-*.log | grep -c 'msg="update counted"')
  psnet_stop_all
}
rounds_of() { jq '[.[] | select(.round > 0)]' "$1"; }
round_s() { rounds_of "$1" | jq -r '[.[] | .seconds] | (add / length * 100 | round / 100)'; }
per_client() { rounds_of "$1" | jq -r '((map(.bytes_up) | add) / (map(.answered) | add) | floor)'; }
counts() {  # over every round run, failed ones (run again) included
  jq -r '[.[] | select(.number > 0)] | "answered=\(map(.answered) | add) late=\(map(.late) | add) dropped=\(map(.dropped) | add) failed=\(map(select(.round == 0)) | length)"' "$1"
}
sampled() { rounds_of "$1" | jq -r 'map(.sampled) | max'; }
acc() { sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p' "$1"; }

for codec in none bf16 int8 topk:0.1; do
  [ $only_flower = 1 ] && break
  tag=${codec//[:.]/-}
  run "$tag" "$codec" 120
  printf 'slowlink codec=%s sampled=%s round_s=%s bytes_per_client=%s accuracy=%s %s\n' "$codec" \
    "$(sampled "$RUN/$tag.json")" "$(round_s "$RUN/$tag.json")" "$(per_client "$RUN/$tag.json")" \
    "$(acc "$RUN/$tag.out")" "$(counts "$RUN/$tag.json")"
done
for codec in none int8; do
  [ $only_flower = 1 ] && break
  tag=s-${codec//[:.]/-}
  run "$tag" "$codec" "$stimeout"
  printf 'slowlink stragglers codec=%s round_timeout=%s round_s=%s %s slow_counted=%s\n' "$codec" "$stimeout" \
    "$(round_s "$RUN/$tag.json")" "$(counts "$RUN/$tag.json")" "$SLOW_COUNTED"
done

# Flower over the same links: its server behind a fast and a slow linkemu.
if [ $flower = 1 ]; then
  flower_venv "$venv"
  mkdir -p "$RUN/split" && "$build/tests/bench-fedsplit" --out "$RUN/split" --clients "$n" --alpha iid \
    --train-limit $((n * 100)) >/dev/null || die "bench-fedsplit failed (ninja -C $build)"
  port=$(free_port) fast=$(free_port) slowp=$(free_port)
  "$FLOWER_PY" "$top/tests/bench/flower_fed.py" server --split "$RUN/split" --address "127.0.0.1:$port" \
    --rounds "$rounds" --clients "$n" --fraction "$fraction" --test-limit 2000 --deadline 3600 --max-workers "$n" \
    --out "$RUN/flower.json" >"$RUN/flower-server.log" 2>&1 &
  spid=$!
  psnet_start link-flower /usr/bin/python3 "$top/tests/bench/linkemu.py" "$fast" "127.0.0.1:$port" 10 50 0.01
  psnet_start slowlink-flower /usr/bin/python3 "$top/tests/bench/linkemu.py" "$slowp" "127.0.0.1:$port" 1 300 0
  psnet_wait_for 10 grep -q 'linkemu: listening' "$RUN/slowlink-flower.log" "$RUN/link-flower.log" ||
    die "the link emulator did not start"
  nproc=$(((n + per_process - 1) / per_process)) cpids=()
  for ((k = 0; k < nproc; k++)); do
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$FLOWER_PY" "$top/tests/bench/flower_fed.py" clients \
      --split "$RUN/split" --address "127.0.0.1:$fast" --slow "$slow" --slow-address "127.0.0.1:$slowp" \
      --local-epochs 1 --lr 0.02 --batch 64 --part "$k/$nproc" >"$RUN/flower-clients-$k.log" 2>&1 &
    cpids+=($!)
  done
  wait $spid || die "the Flower server failed: $(tail -5 "$RUN/flower-server.log")"
  kill "${cpids[@]}" 2>/dev/null
  psnet_stop_all
  bytes=$(awk 'NR > 0 { n = 1; for (i = 2; i <= NF; i++) n *= $i; s += n } END { print s * 4 }' "$RUN/split/model.txt")
  jq -r --arg k "$(awk -v n="$n" -v f="$fraction" 'BEGIN { k = n * f - 1e-9; printf "%d", k == int(k) ? k : int(k) + 1 }')" --arg b "$bytes" '
    .history as $h | [range(2; $h | length) | $h[.].t - $h[. - 1].t] as $d
    | "slowlink flower codec=f32 sampled=\($k) round_s=\($d | add / length * 100 | round / 100) bytes_per_client=\($b) accuracy=\($h[-1].accuracy) flwr=\(.flwr)"' \
    "$RUN/flower.json" || die "no Flower history"
fi
