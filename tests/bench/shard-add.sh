#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Benchmark: live `psctl shard add` on a ~256 MiB model under BSP. Starts pscoord,
# two psd and one workerd, measures training steps/s before the move, adds a
# third shard while the job runs, and measures how long the chunks take to land
# on it and the steps/s during and after the move. Printed, never pass/fail:
#
#   shard-add transport=ipc model_mib=... moved_mib=... seconds=... mib_per_s=...
#             steps_per_s_before=... during=... after=... ratio_during=... ...
#
#   tests/bench/shard-add.sh [--build DIR] [--transport ipc|tcp] [--seconds N]
#                            [--model SPEC] [--batch N] [--keep]
#
# seconds is the operator's view: from `psctl shard add 3` until `psctl status`
# shows every shard with incoming == 0 and shard 3 holding keys. Shards report
# their key counts in heartbeats (every lease/3, ~3.3 s at --lease-ms 10000), so
# data_seconds, taken from psd 3's own log (its last "chunk installed" line, at
# debug level), is the time the data plane needed. Steps/s come from the worker's
# per-step progress lines (ts= is CLOCK_REALTIME, as is $EPOCHREALTIME),
# interpolated between steps; status is polled every ~50 ms in all three windows
# so that polling costs the same CPU before, during and after the move. A chunk
# that psd 3 refuses is lost (never sent again): the script then says so and
# stops instead of waiting for a move that cannot finish.
set -u
export LC_ALL=C
top=$(cd "$(dirname "$0")/../.." && pwd)
build="$top/build" transport=ipc window=15 model=mlp:784-8192-7000-10 batch=16 keep=0
usage() { sed -n '3,23p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --seconds) window=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "shard-add: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $transport in ipc|tcp) ;; *) echo "shard-add: --transport is ipc or tcp" >&2; exit 2 ;; esac
[[ $window =~ ^[1-9][0-9]*$ ]] || { echo "shard-add: --seconds takes a positive number" >&2; exit 2; }
BENCH=shard-add
source "$top/tests/bench/lib.sh"

if [ $transport = tcp ]; then
  base=$((20000 + RANDOM % 20000))
  COORD="tcp://127.0.0.1:$base"
  shard_ep() { echo "tcp://127.0.0.1:$((base + $1))"; }
else
  COORD="ipc://$RUN/coord.sock"
  shard_ep() { echo "ipc://$RUN/psd-$1.sock"; }
fi

# --- helpers ---------------------------------------------------------------
status() { "$PSCTL" --coord "$COORD" --json status >"$RUN/status.json" 2>/dev/null; }
now() { echo "$EPOCHREALTIME"; }
# epoch_of(ts): seconds since 1970 of a log line's ts= value (UTC, ms precision;
# days from civil date in the proleptic Gregorian calendar).
EPOCH_OF='function epoch_of(ts,   y, m, d, yy, era, yoe, doy, doe) {
  y = substr(ts, 1, 4) + 0; m = substr(ts, 6, 2) + 0; d = substr(ts, 9, 2) + 0
  yy = y - (m <= 2); era = int(yy / 400); yoe = yy - era * 400
  doy = int((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  doe = yoe * 365 + int(yoe / 4) - int(yoe / 100) + doy
  return (era * 146097 + doe - 719468) * 86400 + substr(ts, 12, 2) * 3600 + substr(ts, 15, 2) * 60 + substr(ts, 18, 6)
}'
# The worker's progress lines as "EPOCH-SECONDS STEP".
steps_file() {
  awk "$EPOCH_OF"'
    /msg="progress"/ {
      ts = ""; st = ""
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^ts=/) ts = substr($i, 4)
        else if ($i ~ /^step=/) st = substr($i, 6)
      }
      if (ts != "" && st != "") printf "%.3f %d\n", epoch_of(ts), st
    }' "$RUN/w1.log"
}
# steps_at T: the worker's step count at time T, interpolated between progress lines.
steps_at() {
  steps_file | awk -v T="$1" '
    { t[NR] = $1; s[NR] = $2 }
    END {
      if (NR == 0 || T < t[1]) { print 0; exit }
      for (i = 1; i < NR; i++)
        if (T >= t[i] && T < t[i + 1]) { printf "%.4f\n", s[i] + (s[i + 1] - s[i]) * (T - t[i]) / (t[i + 1] - t[i]); exit }
      print s[NR]
    }'
}
# rate T0 T1: steps/s between T0 and T1.
rate() { awk -v a="$(steps_at "$1")" -v b="$(steps_at "$2")" -v t0="$1" -v t1="$2" 'BEGIN { printf "%.3f\n", (b - a) / (t1 - t0) }'; }
# longest_step T0 T1: the longest interval between progress lines that overlaps [T0, T1].
longest_step() {
  steps_file | awk -v a="$1" -v b="$2" '
    NR > 1 && $1 >= a && p <= b { if ($1 - p > mx) mx = $1 - p }
    { p = $1 } END { printf "%.3f\n", mx }'
}
# mean_step T0 T1: mean interval between the progress lines inside [T0, T1].
mean_step() {
  steps_file | awk -v a="$1" -v b="$2" '
    $1 >= a && $1 <= b { if (n == 0) { f = $1; fs = $2 } l = $1; ls = $2; n++ }
    END { if (ls > fs) printf "%.3f\n", (l - f) / (ls - fs); else print "nan" }'
}
last_progress_after() {  # true once the worker logged a step after time $1
  steps_file | awk -v T="$1" '$1 > T { found = 1 } END { exit !found }'
}
# poll_until_time END: polls status every ~50 ms until END (seconds, as
# $EPOCHREALTIME), the same load as during the move, so that the baseline
# windows pay for polling too.
poll_until_time() {
  local end_us
  end_us=$(awk -v e="$1" 'BEGIN { printf "%.0f", e * 1000000 }')
  while (( ${EPOCHREALTIME/./} < end_us )); do
    status && jq -e '(.shards | all(.incoming == 0)) and any(.shards[]; .id == 3 and .keys > 0)' "$RUN/status.json" >/dev/null
    sleep 0.05  # poll interval of the measurement window
  done
}
logs_step() { steps_file | awk -v n="$1" '$2 >= n { f = 1 } END { exit !f }'; }  # worker reached step $1
moved() { status && jq -e '(.shards | all(.incoming == 0)) and any(.shards[]; .id == 3 and .keys > 0)' "$RUN/status.json"; }

# --- the cluster -------------------------------------------------------------
psnet_start pscoord "$PSCOORD" --listen "$COORD" --model "$model" --workers 1 --shards 2 --mode bsp \
  --batch "$batch" --epochs 1000 --train-limit 4000 --test-limit 100 --chunk-kb 1024 --lease-ms 10000
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "$(shard_ep $i)" --coord "$COORD"; done
psnet_start w1 "$WORKERD" --coord "$COORD" --progress-ms 200

# Warm-up: the shards initialise the weights, the worker loads the data and
# takes its first steps (allocation, first touch of the pages).
psnet_wait_for 180 logs_step 10 || die "the worker did not reach step 10 within 180 s"
status || die "psctl status failed"
read -r keys0 bytes0 < <(jq -r '[(.shards | map(.keys) | add), (.shards | map(.bytes) | add)] | @tsv' "$RUN/status.json")
floats=$(awk -v spec="${model#mlp:}" 'BEGIN { n = split(spec, d, "-"); for (i = 1; i < n; i++) f += d[i] * d[i + 1] + d[i + 1]; print f }')
model_mib=$(awk -v f="$floats" 'BEGIN { printf "%.1f\n", f * 4 / 1048576 }')
state_mib=$(awk -v b="$bytes0" 'BEGIN { printf "%.1f\n", b / 1048576 }')
echo "# model $model: $floats floats = $model_mib MiB of weights; the shards hold $keys0 keys," \
  "$state_mib MiB (weights + optimizer state)"

# Before: steps/s over the window.
t0=$(now); poll_until_time "$(awk -v t="$t0" -v w="$window" 'BEGIN { printf "%.6f", t + w }')"; t1=$(now)

# psd 3 joins as standby; its debug log has a line per chunk it installs.
psnet_start psd-3 "$PSD" --id 3 --listen "$(shard_ep 3)" --coord "$COORD" --log-level debug
psnet_wait_for 30 bash -c "'$PSCTL' --coord '$COORD' --json status | jq -e '.shards[] | select(.id == 3) | .in_map == false'" \
  || die "psd 3 did not register as standby"

# The move: psctl shard add 3, then poll until every chunk has landed.
t_add=$(now)
out=$("$PSCTL" --coord "$COORD" shard add 3 2>&1) || die "psctl shard add 3 failed: $out"
deadline=$((SECONDS + 120))
until moved >/dev/null 2>&1; do
  # A chunk that psd 3 refuses is not sent again: the move can never finish.
  if grep -q 'reason="chunk ([0-9]*,[0-9]*) not installed"' "$RUN/psd-3.log"; then
    die "psd 3 refused chunks, which are lost; the move cannot finish:" \
      "$(sed -n 's/.*reason="\(chunk ([0-9]*,[0-9]*) not installed\)" status=\([a-z]*\).*/\1 (\2)/p' "$RUN/psd-3.log" | paste -sd, -)"
  fi
  [ $SECONDS -ge $deadline ] && die "the chunks did not land on shard 3 within 120 s"
  sleep 0.05  # poll interval of a condition with a deadline
done
t_done=$(now)
read -r keys3 bytes3 < <(jq -r '.shards[] | select(.id == 3) | [.keys, .bytes] | @tsv' "$RUN/status.json")

# After: the same window once the move is over.
t2=$(now); poll_until_time "$(awk -v t="$t2" -v w="$window" 'BEGIN { printf "%.6f", t + w }')"; t3=$(now)
psnet_wait_for 60 last_progress_after "$t3" || die "the worker stopped making progress"
mem="# peak RSS (MiB):"
for p in pscoord psd-1 psd-2 psd-3 w1; do
  eval "pid=\$PID_${p//-/_}"
  mem+=" $p=$(awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$pid/status" 2>/dev/null)"
done
echo "$mem"

# The data plane: the last chunk psd 3 installed (its ts=, UTC, converted like the worker's).
t_last=$(awk "$EPOCH_OF"'
    /msg="chunk installed"/ { ts = substr($1, 4) }
    END { if (ts == "") exit 1; printf "%.3f\n", epoch_of(ts) }' "$RUN/psd-3.log") || die "psd 3 logged no chunk"
nmoved=$(grep -c 'msg="chunk installed"' "$RUN/psd-3.log")
grep -q 'msg="refused request"' "$RUN"/psd-*.log && echo "# note: a shard refused a request (see the logs)"

before=$(rate "$t0" "$t1"); during=$(rate "$t_add" "$t_done"); after=$(rate "$t2" "$t3")
data_during=$(rate "$t_add" "$t_last")
awk -v tr="$transport" -v mm="$model_mib" -v sm="$state_mib" -v b3="$bytes3" -v k3="$keys3" -v n="$nmoved" \
    -v ta="$t_add" -v td="$t_done" -v tl="$t_last" -v be="$before" -v du="$during" -v af="$after" -v dd="$data_during" \
    -v ms="$(mean_step "$t0" "$t1")" -v ls="$(longest_step "$t_add" "$t_done")" -v batch="$batch" 'BEGIN {
  moved = b3 / 1048576; s = td - ta; ds = tl - ta
  printf "shard-add transport=%s model_mib=%.1f state_mib=%.1f moved_mib=%.1f moved_keys=%d seconds=%.2f mib_per_s=%.1f", tr, mm, sm, moved, k3, s, moved / s
  printf " data_seconds=%.2f data_mib_per_s=%.1f", ds, (ds > 0 ? moved / ds : 0)
  printf " steps_per_s_before=%.3f during=%.3f after=%.3f ratio_during=%.2f ratio_after=%.2f\n", be, du, af, du / be, af / be
  printf "shard-add transport=%s batch=%d step_s_before=%.3f longest_step_during=%.3f stall_s=%.3f steps_per_s_data_window=%.3f chunks_logged=%d\n", tr, batch, ms, ls, ls - ms, dd, n
}'
