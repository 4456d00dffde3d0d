#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Benchmark: federated rounds, what they send and what they cost.
#
# Bytes: the same federated job (mlp:784-256-10, N virtual clients in one
# workerd --edge --simulate process, all sampled each round, iid split of the
# CI subset, one shard) once per upload format: f32, bf16, int8, top-k 0.1,
# top-k 0.01 and --secagg. Per format: the mean bytes of one client's update
# as pscoord counted them (round history bytes_up / answered), their ratio to
# f32 (the baseline measured in the same run), the shard's bytes received
# (psnet_psd_bytes_in_total... from its log), the final accuracy and the mean
# round seconds. --secagg's control messages (keys, sealed shares, unmasking
# shares) travel through pscoord on top: their size per client is computed
# from the message layout (secagg_ctl_bytes, below), not measured.
#
# Scale: one process of --scale-clients virtual clients (default 1000),
# --scale-fraction of them sampled per round (default 0.1): the round seconds
# and the peak memory (VmHWM) of pscoord, the shard and the edge process. Then
# --processes real edge processes (default 200; 0 leaves it out), each
# workerd --edge --partition K/N, all sampled: the same figures, the edge
# memory the most the processes held together (the sum of their VmHWM,
# sampled every half second) and per process.
#
# Printed, never pass/fail:
#   fed-bytes codec=C clients=N bytes_per_client=B ratio_to_f32=R accuracy=A round_s=S
#   fed-scale clients=N sampled=K round_s=S pscoord_mib=.. psd_mib=.. edge_mib=.. bytes_per_client=B
#   fed-scale processes=N sampled=K round_s=S pscoord_mib=.. psd_mib=.. edges_mib=.. per_edge_mib=..
#             bytes_per_client=B start_s=S
#
#   tests/bench/fed-rounds.sh [--build DIR] [--clients N] [--rounds R] [--scale-clients N]
#                             [--scale-fraction F] [--processes N] [--keep]
set -u
export LC_ALL=C
top=$(cd "$(dirname "$0")/../.." && pwd)
build="$top/build" clients=10 rounds=10 sclients=1000 sfraction=0.1 procs=200 keep=0
usage() { sed -n '3,32p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --scale-clients) sclients=$2; shift 2 ;;
    --scale-fraction) sfraction=$2; shift 2 ;;
    --processes) procs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fed-rounds: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
BENCH=fed-rounds
source "$top/tests/bench/lib.sh"

# run TAG NCLIENTS FRACTION ROUNDS [PSCOORD OPTIONS...]: one job to its end;
# leaves the round history in $RUN/TAG.json and the result in $RUN/TAG.out.
# The clients are one workerd --edge --simulate NCLIENTS process, or with
# PROCS=1 NCLIENTS workerd --edge processes.
run() {
  local tag=$1 n=$2 frac=$3 r=$4; shift 4
  COORD="ipc://$RUN/coord-$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds "$r" --fraction "$frac" \
    --min-clients 2 --min-available "$n" --round-timeout 120 --train-limit 6000 --test-limit 2000 "$@"
  psnet_start "psd-$tag" "$PSD" --id 1 --listen "ipc://$RUN/psd-$tag.sock" --coord "$COORD"
  local epids=() k
  if [ "${PROCS:-0}" = 1 ]; then
    for ((k = 0; k < n; k++)); do
      psnet_start "edge-$tag-$k" "$WORKERD" --edge --coord "$COORD" --partition "$k/$n" --connect-timeout 300
      epids+=($!)
    done
  else
    psnet_start "edge-$tag" "$WORKERD" --edge --coord "$COORD" --simulate "$n" --connect-timeout 120
    epids=($!)
  fi
  local coord_pid psd_pid
  local u=${tag//-/_}
  eval "coord_pid=\$PID_pscoord_$u psd_pid=\$PID_psd_$u"
  sample_hwm "$RUN/edge-$tag.hwm" "${epids[@]}" &
  "$PSCTL" --coord "$COORD" job wait --wait 1800 >"$RUN/$tag.out" 2>&1 || die "$tag: $(cat "$RUN/$tag.out")"
  "$PSCTL" --coord "$COORD" --json round history >"$RUN/$tag.json" || die "$tag: no round history"
  HWM="$(hwm_mib "$coord_pid") $(hwm_mib "$psd_pid")"
  psnet_stop_all
  wait
  HWM="$HWM $(cat "$RUN/edge-$tag.hwm" 2>/dev/null)"
}
per_client() { jq -r '[.[] | select(.round > 0)] | ((map(.bytes_up) | add) / (map(.answered) | add) | floor)' "$1"; }
round_s() { jq -r '[.[] | select(.round > 0) | .seconds] | (add / length * 1000 | round / 1000)' "$1"; }
acc() { sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p' "$1"; }

# --secagg's control bytes per client and round with n clients in it: stage 1
# two keys and a count up, stage 2 the peers' two keys down and n-1 boxes up,
# stage 3 the peers' mask keys and n-1 boxes down, stage 4 n shares up (32
# bytes each, a client id and a flag), framing aside.
secagg_ctl_bytes() { awk -v n="$1" 'BEGIN { box = 24 + 16 + 80 + 8; print 72 + n * 70 + (n - 1) * box + n * 38 + (n - 1) * box + n * 40 }'; }

base=""
for codec in none bf16 int8 topk:0.1 topk:0.01 secagg; do
  tag=${codec//[:.]/-}
  if [ "$codec" = secagg ]; then opt=(--secagg); else opt=(--compress "$codec"); fi
  run "$tag" "$clients" 1 "$rounds" "${opt[@]}"
  b=$(per_client "$RUN/$tag.json")
  [ -n "$base" ] || base=$b
  extra=""
  [ "$codec" = secagg ] && extra=" secagg_control_bytes_computed=$(secagg_ctl_bytes "$clients")"
  printf 'fed-bytes codec=%s clients=%s bytes_per_client=%s ratio_to_f32=%.4f accuracy=%s round_s=%s%s\n' "$codec" \
    "$clients" "$b" "$(awk -v a="$b" -v b="$base" 'BEGIN { print (b > 0 ? a / b : 0) }')" "$(acc "$RUN/$tag.out")" \
    "$(round_s "$RUN/$tag.json")" "$extra"
done

run scale "$sclients" "$sfraction" 3
read -r cm pm em <<<"$HWM"
printf 'fed-scale clients=%s sampled=%s round_s=%s pscoord_mib=%s psd_mib=%s edge_mib=%s bytes_per_client=%s\n' \
  "$sclients" "$(jq -r '[.[] | select(.round > 0) | .sampled] | max' "$RUN/scale.json")" \
  "$(round_s "$RUN/scale.json")" "$cm" "$pm" "$em" "$(per_client "$RUN/scale.json")"

# An edge process of a CPU-only build (-Dcuda=disabled) peaks at ~60 MiB; one
# that links cuBLAS holds ~195 MiB of it whatever its backend: check first.
per_proc=60
ldd "$WORKERD" 2>/dev/null | grep -q libcublas && per_proc=215
avail=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
if [ "$procs" -gt 0 ] && [ $((procs * per_proc)) -gt $((avail * 8 / 10)) ]; then
  echo "fed-scale processes=$procs skipped: about $((procs * per_proc)) MiB needed (${per_proc} MiB each$(
    [ $per_proc = 60 ] || echo ': this build links cuBLAS, a -Dcuda=disabled build needs 60')), $avail MiB available"
  procs=0
fi
if [ "$procs" -gt 0 ]; then
  t0=$SECONDS
  PROCS=1 run procs "$procs" 1 3
  read -r cm pm em <<<"$HWM"
  # start_s: from the first process started to the end of the last round,
  # less the rounds: starting, loading the data and joining.
  printf 'fed-scale processes=%s sampled=%s round_s=%s pscoord_mib=%s psd_mib=%s edges_mib=%s per_edge_mib=%s bytes_per_client=%s start_s=%s\n' \
    "$procs" "$(jq -r '[.[] | select(.round > 0) | .sampled] | max' "$RUN/procs.json")" \
    "$(round_s "$RUN/procs.json")" "$cm" "$pm" "$em" "$(awk -v a="$em" -v n="$procs" 'BEGIN { printf "%.1f", a / n }')" \
    "$(per_client "$RUN/procs.json")" \
    "$(jq -r --argjson t $((SECONDS - t0)) '$t - ([.[] | select(.round > 0) | .seconds] | add) | round' "$RUN/procs.json")"
fi
