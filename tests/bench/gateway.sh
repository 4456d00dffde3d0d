#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Benchmark: psgate, the edge clients' one front door, against direct
# connections, on this machine, over CURVE as a real edge would run.
#
# The same federated job (mlp:784-256-10, one shard, the CI subset) twice in
# the same run, once with the clients dialling pscoord and the shard directly
# (the baseline) and once with every client behind one psgate:
#   - --clients virtual clients in one workerd --edge --simulate process
#     (default 1000), --fraction of them sampled a round (default 0.1);
#   - --processes real workerd --edge processes (default 200; 0 leaves it
#     out), all sampled; the workerd of --edge-build (a -Dedge=true build,
#     default build-edge) when it has one, lighter than a CUDA build's.
# Per run: the mean round seconds, and for psgate its peak memory, the
# clients it held, the updates it passed per second of round (answered
# updates / round seconds), the CPU seconds it used over the job (the
# clients' handshakes included) and the gigabytes it relayed (both
# directions, psnet_psgate_bytes_total); the ratio of the round time to the
# baseline's.
# Then the capacity of one psgate: --capacity virtual clients (default 2000)
# connected at once, --capacity-fraction of them sampled a round (default
# 0.25): updates per second through it. (--clients 0 leaves the comparison
# out.) The shard's lease is 5 s here: a round of hundreds of updates arriving
# at once keeps one shard busy longer than the default 600 ms.
#
# Printed, never pass/fail:
#   gateway clients=N sampled=K direct_round_s=S gateway_round_s=S ratio=R psgate_mib=M updates_per_s=U psgate_cpu_s=C psgate_gb=G
#   gateway processes=N ... (the same)
#   gateway capacity clients=N connected=C sampled=K round_s=S updates_per_s=U psgate_mib=M
#
# --pin: psgate on a core of its own, as deployed (the last core; taskset),
# everything else, in both runs, on the others.
#
#   tests/bench/gateway.sh [--build DIR] [--edge-build DIR] [--clients N] [--fraction F] [--processes N]
#                          [--capacity N] [--capacity-fraction F] [--rounds R] [--pin] [--keep]
set -u
export LC_ALL=C
top=$(cd "$(dirname "$0")/../.." && pwd)
build="$top/build" ebuild="$top/build-edge" clients=1000 fraction=0.1 procs=200 capacity=2000 cfraction=0.25 rounds=4 keep=0 pin=0
usage() { sed -n '3,35p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --edge-build) ebuild=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --fraction) fraction=$2; shift 2 ;;
    --processes) procs=$2; shift 2 ;;
    --capacity) capacity=$2; shift 2 ;;
    --capacity-fraction) cfraction=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --pin) pin=1; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gateway: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
BENCH=gateway
source "$top/tests/bench/lib.sh"
PSGATE=$build/ps/psgate/psgate
[ -x "$PSGATE" ] || die "$PSGATE is missing (ninja -C $build)"
PIN_REST=() PIN_GATE=()
if [ $pin = 1 ]; then
  ncpu=$(nproc)
  [ "$ncpu" -ge 2 ] || die "--pin needs two cores at least ($ncpu here)"
  PIN_REST=(taskset -c "0-$((ncpu - 2))") PIN_GATE=(taskset -c "$((ncpu - 1))")
  echo "gateway: psgate on core $((ncpu - 1)), everything else on cores 0-$((ncpu - 2))"
fi
EDGE_WORKERD=$WORKERD
[ -x "$ebuild/worker/workerd/workerd" ] && EDGE_WORKERD=$ebuild/worker/workerd/workerd

K=$RUN/cluster KE=$RUN/edge KG=$RUN/gate
for kr in pscoord:server psd:server psgate:gateway admin:admin; do
  "$PSCTL" keys gen "${kr%%:*}" --role "${kr##*:}" --dir "$K" >/dev/null || die "psctl keys gen"
done
"$PSCTL" keys gen edge --role edge --dir "$KE" >/dev/null || die "psctl keys gen edge"
mkdir -p "$KG" && cp "$K/psgate.key" "$K/pscoord.pub" "$KG/" && cp "$KE/allow" "$KG/allow" &&
  cp "$K/psgate.pub" "$K/pscoord.pub" "$KE/" && cat "$KE/allow" >>"$K/allow" || die "key folders"

# run TAG MODE(direct|gateway) N FRACTION PROCS: one job to its end; round
# history in $RUN/TAG.json; psgate's peak memory and clients in GATE_MIB, GATE_CLIENTS.
run() {
  local tag=$1 mode=$2 n=$3 frac=$4 p=$5 k
  COORD="ipc://$RUN/coord-$tag.sock"
  local gate="ipc://$RUN/gate-$tag.sock"
  psnet_start "pscoord-$tag" "${PIN_REST[@]}" "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds "$rounds" --fraction "$frac" \
    --min-clients 2 --min-available "$n" --round-timeout 300 --lease-ms 20000 --shard-lease-ms 5000 --train-limit 6000 --test-limit 2000 \
    --keys "$K"
  psnet_start "psd-$tag" "${PIN_REST[@]}" "$PSD" --id 1 --listen "ipc://$RUN/psd-$tag.sock" --coord "$COORD" --keys "$K"
  local via=(--coord "$COORD")
  if [ "$mode" = gateway ]; then
    psnet_start "psgate-$tag" "${PIN_GATE[@]}" "$PSGATE" --listen "$gate" --coord "$COORD" --keys "$KG" --http 127.0.0.1:0 \
      --max-clients $((n + 16))
    via=(--gateway "$gate")
  fi
  if [ "$p" = 1 ]; then
    for ((k = 0; k < n; k++)); do
      psnet_start "edge-$tag-$k" "${PIN_REST[@]}" "$EDGE_WORKERD" --edge "${via[@]}" --keys "$KE" --partition "$k/$n" --connect-timeout 600
    done
  else
    psnet_start "edge-$tag" "${PIN_REST[@]}" "$WORKERD" --edge "${via[@]}" --keys "$KE" --simulate "$n" --connect-timeout 300
  fi
  local gpid=""
  [ "$mode" = gateway ] && eval "gpid=\$PID_psgate_${tag//-/_}"
  "$PSCTL" --keys "$K" --coord "$COORD" job wait --wait 3600 >"$RUN/$tag.out" 2>&1 || die "$tag: $(cat "$RUN/$tag.out")"
  "$PSCTL" --keys "$K" --coord "$COORD" --json round history >"$RUN/$tag.json" || die "$tag: no round history"
  GATE_MIB=- GATE_CLIENTS=- GATE_CPU=- GATE_GB=-
  if [ -n "$gpid" ]; then
    GATE_MIB=$(hwm_mib "$gpid")
    GATE_CPU=$(cpu_s "$gpid")
    local port metrics
    port=$(sed -n 's/.*msg="serving http" address=[^ ]* port=\([0-9]*\).*/\1/p' "$RUN/psgate-$tag.log" | head -1)
    metrics=$(curl -sf "http://127.0.0.1:$port/metrics")
    GATE_CLIENTS=$(awk '$1 == "psnet_psgate_clients" { print $2 }' <<<"$metrics")
    GATE_GB=$(awk '$1 ~ /^psnet_psgate_bytes_total/ { s += $2 } END { printf "%.2f", s / 1e9 }' <<<"$metrics")
  fi
  psnet_stop_all
}
round_s() { jq -r '[.[] | select(.round > 0) | .seconds] | (add / length * 1000 | round / 1000)' "$1"; }
sampled() { jq -r '[.[] | select(.round > 0) | .sampled] | max' "$1"; }
per_s() { jq -r '[.[] | select(.round > 0)] | ((map(.answered) | add) / (map(.seconds) | add) * 10 | round / 10)' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

compare() {  # compare WHAT N FRACTION PROCS
  run "d-$1" direct "$2" "$3" "$4"
  run "g-$1" gateway "$2" "$3" "$4"
  local d g
  d=$(round_s "$RUN/d-$1.json") g=$(round_s "$RUN/g-$1.json")
  printf 'gateway %s=%s sampled=%s direct_round_s=%s gateway_round_s=%s ratio=%s psgate_mib=%s psgate_clients=%s updates_per_s=%s psgate_cpu_s=%s psgate_gb=%s\n' \
    "$1" "$2" "$(sampled "$RUN/g-$1.json")" "$d" "$g" "$(ratio "$g" "$d")" "$GATE_MIB" "$GATE_CLIENTS" \
    "$(per_s "$RUN/g-$1.json")" "$GATE_CPU" "$GATE_GB"
}

[ "$clients" -gt 0 ] && compare clients "$clients" "$fraction" 0
if [ "$procs" -gt 0 ]; then
  avail=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
  per_proc=80
  ldd "$EDGE_WORKERD" 2>/dev/null | grep -q libcublas && per_proc=215
  if [ $((procs * per_proc)) -gt $((avail * 8 / 10)) ]; then
    echo "gateway processes=$procs skipped: about $((procs * per_proc)) MiB needed, $avail MiB available"
  else
    compare processes "$procs" 1 1
  fi
fi
if [ "$capacity" -gt 0 ]; then
  run cap gateway "$capacity" "$cfraction" 0
  printf 'gateway capacity clients=%s connected=%s sampled=%s round_s=%s updates_per_s=%s psgate_mib=%s\n' "$capacity" \
    "$GATE_CLIENTS" "$(sampled "$RUN/cap.json")" "$(round_s "$RUN/cap.json")" "$(per_s "$RUN/cap.json")" "$GATE_MIB"
fi
