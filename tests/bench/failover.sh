#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Benchmark: fail-over time. N times: a fresh cluster (pscoord, three psd, two
# workerd, BSP, two copies of every key) trains to clock 30, one shard (in turn
# 1, 2, 3) is killed with SIGKILL, and three moments are taken:
#
#   promoted  pscoord published the map in which the backups lead (its log);
#   resumed   a worker pulled a clock two past the last one it had pulled
#             before the kill (one more could have closed just before it):
#             every key, the promoted ones included, closed a clock again (its
#             log); this bounds the first push applied on a new primary from
#             above, by about one clock;
#   restored  psctl status shows every shard of the map with nothing incoming:
#             the lost copies are rebuilt (polled every ~50 ms).
#
# Printed, never pass/fail: one line per kill, then the median and the worst:
#
#   failover kills=N shard_lease_ms=600 promoted_ms median=... worst=...
#            resumed_ms median=... worst=... restored_ms median=... worst=...
#
#   tests/bench/failover.sh [--build DIR] [--kills N] [--shard-lease-ms MS] [--keep]
set -u
export LC_ALL=C
top=$(cd "$(dirname "$0")/../.." && pwd)
build="$top/build" kills=20 lease=600 keep=0
usage() { sed -n '3,22p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --kills) kills=$2; shift 2 ;;
    --shard-lease-ms) lease=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "failover: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $kills =~ ^[1-9][0-9]*$ && $lease =~ ^[1-9][0-9]*$ ]] || { echo "failover: --kills and --shard-lease-ms take positive numbers" >&2; exit 2; }
BENCH=failover
source "$top/tests/bench/lib.sh"

# ms_of TS: milliseconds since the epoch of a log line's ts= (UTC, ms).
ms_of() { date -u -d "$1" +%s%3N; }
now_ms() { local t=$EPOCHREALTIME; echo $(( ${t%.*} * 1000 + 10#${t#*.} / 1000 )); }
last_clock() { sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' "$1" | tail -1; }
restored() {
  "$PSCTL" --coord "$COORD" --json status |
    jq -e '[.shards[] | select(.in_map)] | length == 2 and all(.incoming == 0 and .map_epoch >= 2)' >/dev/null
}

P=() R=() S=()
for ((k = 0; k < kills; k++)); do
  dir="$RUN/$k"; mkdir -p "$dir"
  COORD="ipc://$dir/coord.sock"
  psnet_start "pscoord-$k" "$PSCOORD" --listen "$COORD" --workers 2 --shards 3 --mode bsp --epochs 50 \
    --train-limit 12000 --test-limit 2000 --shard-lease-ms "$lease"
  for i in 1 2 3; do psnet_start "psd-$k-$i" "$PSD" --id $i --listen "ipc://$dir/psd-$i.sock" --coord "$COORD"; done
  for i in 1 2; do psnet_start "w-$k-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
  psnet_wait_for 60 grep -q 'msg="pulled" clock=30 ' "$RUN/w-$k-1.log" || die "run $k did not reach clock 30"
  victim=$((k % 3 + 1)); pid_var="PID_psd_${k}_$victim"
  # The last clock pulled is read after the kill: read before it, a clock or two
  # pulled between the read and the kill passed for "resumed" within milliseconds.
  t0=$(now_ms); kill -KILL "${!pid_var}"
  before=$(last_clock "$RUN/w-$k-1.log")
  psnet_wait_for 10 grep -q 'msg="fail-over"' "$RUN/pscoord-$k.log" || die "run $k: no fail-over"
  psnet_wait_for 10 sh -c "[ \$(sed -n 's/.*msg=\"pulled\" clock=\([0-9]*\) .*/\1/p' '$RUN/w-$k-1.log' | tail -1) -gt $((before + 1)) ]" ||
    die "run $k: training did not resume"
  until restored; do
    [ $(( $(now_ms) - t0 )) -lt 30000 ] || die "run $k: copies not rebuilt in 30 s"
    sleep 0.05  # status poll interval: the resolution of "restored"
  done
  t_rest=$(now_ms)
  t_prom=$(ms_of "$(sed -n 's/^ts=\([^ ]*\) .*msg="fail-over".*/\1/p' "$RUN/pscoord-$k.log" | head -1)")
  t_res=$(ms_of "$(awk -v b="$before" 'match($0, /msg="pulled" clock=[0-9]+ /) {
      c = substr($0, RSTART + 19, RLENGTH - 20) + 0; if (c > b + 1) { sub(/^ts=/, ""); print $1; exit } }' "$RUN/w-$k-1.log")")
  P+=($((t_prom - t0))) S+=($((t_res - t0))) R+=($((t_rest - t0)))
  echo "failover kill=$k shard=$victim promoted_ms=${P[-1]} resumed_ms=${S[-1]} restored_ms=${R[-1]}"
  psnet_stop_all
done
stat() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { printf "median=%d worst=%d", v[int((NR + 1) / 2)], v[NR] }'; }
echo "failover kills=$kills shard_lease_ms=$lease promoted_ms $(stat "${P[@]}") resumed_ms $(stat "${S[@]}")" \
     "restored_ms $(stat "${R[@]}")"
