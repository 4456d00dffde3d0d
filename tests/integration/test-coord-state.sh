#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# pscoord's state on disk (--state-dir). The same replicated BSP job runs
# twice on fresh daemons: undisturbed; and with a primary killed (-9) and
# pscoord killed (-9) right after it published the fail-over, then started
# again on the same state directory. The new pscoord loads the job, the map
# (the fail-over's epoch) and the members, takes back the peers that register
# again without restarting the job, and the job ends with the undisturbed
# run's weights, bit for bit (BSP is deterministic: an update lost or applied
# twice would show), and with its accuracy by epoch. A second pscoord on a directory in use is refused, and a
# damaged state file stops pscoord with the reason.
source "$(dirname "$0")/lib.sh"

JOB=(--workers 2 --shards 3 --mode bsp --epochs 2 --batch 64 "${SUBSET[@]}")

# start_coord TAG NAME: pscoord NAME of run TAG, state in $RUN/state-TAG.
start_coord() {
  COORD="ipc://$RUN/coord-$1.sock"
  psnet_start "$2" "$PSCOORD" --listen "$COORD" --state-dir "$RUN/state-$1" "${JOB[@]}"
}
# start_cluster TAG: pscoord, three shards and two workers of run TAG.
start_cluster() {
  start_coord "$1" "pscoord-$1"
  for i in 1 2 3; do
    psnet_start "psd-$1-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$1-$i.sock" --coord "$COORD"
  done
  for i in 1 2; do psnet_start "workerd-$1-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
}
digest_of() { sed -n 's/.*msg="job done".* weights=\([0-9a-f]*\).*/\1/p' "$RUN/$1.log" | tail -1; }
pulled() { logs_match "msg=\"pulled\" clock=$2 " "workerd-$1-1.log"; }

# 1. Undisturbed.
start_cluster a
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "an undisturbed job with --state-dir finishes ($out)"
want=$(digest_of pscoord-a)
[ -n "$want" ]; ok $? "the final weights' digest ($want)"
[ -f "$RUN/state-a/pscoord.state" ] && [ -f "$RUN/state-a/lock" ] && ! ls "$RUN"/state-a/*.tmp >/dev/null 2>&1
ok $? "the state directory holds the state and the lock, no temporary file"
psnet_stop_all

# 2. A primary killed at clock 40; pscoord killed as soon as it published the
# fail-over (the lost copies are being rebuilt); pscoord started again.
start_cluster b
psnet_wait_for 60 pulled b 40; ok $? "run b trains to clock 40"
kill -KILL "$PID_psd_b_1"; ok $? "SIGKILL shard 1"
psnet_wait_for 10 logs_match 'msg="fail-over" shard_id=1' 'pscoord-b.log'
kill -KILL "$PID_pscoord_b"; ok $? "SIGKILL pscoord right after the fail-over"
epoch=$(sed -n 's/.*msg="fail-over" shard_id=1 .*map_epoch=\([0-9]*\).*/\1/p' "$RUN/pscoord-b.log" | tail -1)
[ -n "$epoch" ]; ok $? "the fail-over published map epoch $epoch"
start_coord b pscoord-b2
psnet_wait_for 10 logs_match "msg=\"state loaded\" job=1 state=running .*map_epoch=$epoch " 'pscoord-b2.log'
ok $? "the new pscoord loads the running job and map epoch $epoch"
psnet_wait_for 20 sh -c "[ \$(grep -c 'registered again after pscoord.s restart' '$RUN/pscoord-b2.log') -ge 4 ]"
ok $? "the two surviving shards and both workers register again and are taken back"
grep -q 'msg="job started"' "$RUN/pscoord-b2.log"; ok $(( $? == 0 )) "the job goes on: it is not started again"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes ($out)"
got=$(digest_of pscoord-b2)
[ -n "$got" ] && [ "$got" = "$want" ]; ok $? "final weights identical to the undisturbed run ($got = $want)"
st=$("$PSCTL" --coord "$COORD" --json status)
jq -e '.job.failovers == 1' <<<"$st" >/dev/null; ok $? "psctl status still counts the fail-over ($(jq -c .job.failovers <<<"$st"))"
jq -e '[.history.epochs[].epoch] == [1, 2] and (.history.epochs[-1].accuracy - .job.accuracy | fabs) < 1e-6' \
  <<<"$st" >/dev/null
ok $? "the accuracy by epoch survives the restart: epochs 1 and 2, the last the job's ($(jq -c '[.history.epochs[] | [.epoch, .accuracy]]' <<<"$st"))"
grep -q 'push not applied' "$RUN"/workerd-b-*.log; ok $(( $? == 0 )) "no push was refused for good"

# 3. One pscoord per state directory; a damaged state stops pscoord with the reason.
"$PSCOORD" --listen "ipc://$RUN/coord-x.sock" --state-dir "$RUN/state-b" >"$RUN/pscoord-x.log" 2>&1
[ $? -eq 2 ] && grep -q "state-b is in use by another pscoord (pid $PID_pscoord_b2)" "$RUN/pscoord-x.log"
ok $? "a second pscoord on the same state directory exits 2 naming the holder"
psnet_stop_all
size=$(stat -c %s "$RUN/state-b/pscoord.state")
printf '\x5a' | dd of="$RUN/state-b/pscoord.state" bs=1 seek=$((size - 3)) conv=notrunc status=none
"$PSCOORD" --listen "ipc://$RUN/coord-y.sock" --state-dir "$RUN/state-b" >"$RUN/pscoord-y.log" 2>&1
[ $? -eq 2 ] && grep -q 'pscoord.state: pscoord state checksum mismatch (stored [0-9a-f]*, computed [0-9a-f]*)' \
  "$RUN/pscoord-y.log"
ok $? "a damaged state file: pscoord exits 2, naming the file and both checksums"
