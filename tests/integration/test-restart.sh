#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# pscoord killed mid-run and restarted with the same flags: while it is away the
# shards keep serving pushes and pulls (training goes on), then the shards and
# the workers register again, training goes on from where it was, the job ends.
# One copy of each key (--replicas 1): with backups, a shard stops acknowledging
# once its lease runs out (test-failover), since pscoord could promote them.
source "$(dirname "$0")/lib.sh"

COORD="ipc://$RUN/coord.sock"
args=(--listen "$COORD" --workers 2 --shards 2 --replicas 1 --mode bsp --epochs 8 --lease-ms 1000 "${SUBSET[@]}")
psnet_start pscoord "$PSCOORD" "${args[@]}"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD"; done
for i in 1 2; do psnet_start "workerd-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
psnet_wait_for 30 logs_match 'msg="pulled" clock=100 ' 'workerd-1.log'; ok $? "the job trains"
kill -KILL "$PID_pscoord"; ok $? "SIGKILL pscoord"
c_kill=$(sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' "$RUN/workerd-1.log" | tail -1)
psnet_wait_for 20 logs_match "msg=\"pulled\" clock=$((c_kill + 50)) " 'workerd-1.log'
ok $? "with pscoord gone the shards serve on: 50 more clocks trained (from $c_kill)"
psnet_start pscoord-2 "$PSCOORD" "${args[@]}"
psnet_wait_for 20 logs_match 'msg="job started"' 'pscoord-2.log'; ok $? "the new pscoord restarts the job once shards and workers are back"
grep -q 'registering again' "$RUN/psd-1.log"; ok $? "shard 1 registered again"
logs_match 'registering again' 'workerd-*.log'; ok $? "the workers registered again"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes ($out)"
accuracy_at_least "$out" 0.80; ok $? "accuracy >= 0.80 on the subset"
last=$(sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' "$RUN/workerd-1.log" | tail -1)
[ "$last" -gt "$((c_kill + 100))" ]; ok $? "training went on past the restart (clock $c_kill at the kill, $last at the end)"
grep -q 'push not applied' "$RUN"/workerd-*.log; ok $(( $? == 0 )) "no push was refused"
