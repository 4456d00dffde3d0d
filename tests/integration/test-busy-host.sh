#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A busy host does not fail jobs. A shard's short lease (--shard-lease-ms,
# 600 ms) is there for its fail-over; a shard holding the only copy of a key
# has nobody to fail over to, so a moment in which its host did not run it
# (seen: a heartbeat 641 ms late on a loaded 2-core machine) costs a pause, not
# the job: pscoord waits --lease-ms before the loss fails it. Here a one-copy
# shard is stopped (SIGSTOP, a host that does not schedule it) past its lease
# and continued: the job ends done, every round counted. A shard with a
# backup stopped the same way still fails over at its short lease. And
# one-copy jobs run to the end beside busy loops pinned to their shard's core.
source "$(dirname "$0")/lib.sh"
FED=(--mode fed --shards 2 --rounds 8 --fraction 1 --min-clients 3 --min-available 3 --round-timeout 30
  --chunk-kb 64 --train-limit 3000 --test-limit 500 --lease-ms 5000)

start() {  # start TAG PSCOORD-FLAGS...: pscoord, two shards (shard 1 on core 0) and three edge workers
  local tag=$1; shift
  COORD="ipc://$RUN/coord-$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" --http 127.0.0.1:0 "${FED[@]}" "$@"
  psnet_start "psd-$tag-1" taskset -c 0 "$PSD" --id 1 --listen "ipc://$RUN/psd-$tag-1.sock" --coord "$COORD"
  psnet_start "psd-$tag-2" "$PSD" --id 2 --listen "ipc://$RUN/psd-$tag-2.sock" --coord "$COORD"
  for k in 0 1 2; do psnet_start "e-$tag-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/3; done
}
stop_shard_1() {  # stop_shard_1 TAG PATTERN: SIGSTOP shard 1 after round 2, SIGCONT once pscoord logs PATTERN
  local tag=$1 pid
  eval "pid=\$PID_psd_${tag}_1"
  psnet_wait_for 60 logs_match 'msg="round done" round=2/' "pscoord-$tag.log"; ok $? "$tag: two rounds done"
  kill -STOP "$pid"; ok $? "$tag: shard 1 stopped (SIGSTOP)"
  psnet_wait_for 20 logs_match "$2" "pscoord-$tag.log"; ok $? "$tag: pscoord logs: $2"
  kill -CONT "$pid"; ok $? "$tag: shard 1 continued"
}

# 1. One copy of each key: stopped past its lease, the shard keeps its keys.
start sole --replicas 1
stop_shard_1 sole 'shard silent past its lease, holding the only copy of a key.* shard_id=1 '
out=$("$PSCTL" --coord "$COORD" job wait --wait 120); ok $? "the one-copy job finishes ($out)"
grep -q 'msg="shard heard from again; it keeps its keys" shard_id=1' "$RUN/pscoord-sole.log"
ok $? "pscoord hears from shard 1 again, which keeps its keys"
! grep -q 'lease expired\|fail-over' "$RUN/pscoord-sole.log"; ok $? "no lease expired, no fail-over"
n=$(grep -c 'msg="round done"' "$RUN/pscoord-sole.log")
[ "$n" -eq 8 ]; ok $? "every round was counted ($n of 8)"
port=$(http_port pscoord-sole)
m=$(curl -sf "http://127.0.0.1:$port/metrics")
grep -q '^psnet_pscoord_sole_copy_waits_total [1-9]' <<<"$m"; ok $? "the wait is counted in /metrics"
gap=$(awk '$1 == "psnet_pscoord_heartbeat_gap_max_seconds{role=\"shard\"}" { print $2 }' <<<"$m")
awk -v g="${gap:-0}" 'BEGIN { exit !(g > 0.6) }'; ok $? "the longest shard silence is in /metrics ($gap s)"
psnet_stop_all

# 2. Two copies: the same stop fails shard 1 over to its backup at the short lease.
start twice --replicas 2
stop_shard_1 twice 'msg="fail-over" shard_id=1 '
out=$("$PSCTL" --coord "$COORD" job wait --wait 120); ok $? "the replicated job finishes on the backups ($out)"
! grep -q 'holding the only copy' "$RUN/pscoord-twice.log"; ok $? "no wait for a shard whose keys have backups"
psnet_stop_all

# 3. One-copy jobs beside four busy loops pinned to shard 1's core (and four free).
hogs=()
for h in 0 1 2 3; do taskset -c 0 bash -c 'while :; do :; done' & hogs+=($!); done
for h in 4 5 6 7; do bash -c 'while :; do :; done' & hogs+=($!); done
done_n=0
for j in 1 2 3; do
  start "load$j" --replicas 1
  "$PSCTL" --coord "$COORD" job wait --wait 120 >/dev/null && done_n=$((done_n + 1))
  psnet_stop_all
done
kill "${hogs[@]}"
[ $done_n -eq 3 ]; ok $? "one-copy jobs beside eight busy loops: $done_n of 3 finished"
