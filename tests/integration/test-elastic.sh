#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# BSP with a changing membership: a worker started mid-run joins at the clock
# boundary pscoord picks and contributes from its first clock; a worker killed
# with SIGKILL stops holding the barrier once its lease expires; every worker
# pulls bit-identical weights at every clock throughout; the job still meets
# the accuracy bar. Epochs are the job's: the joiner does not run every epoch
# again, every member stops at the clock the schedule gives for 6 passes over
# the data by all workers together, and one worker evaluates the final weights.
source "$(dirname "$0")/lib.sh"

COORD="ipc://$RUN/coord.sock"
LEASE=1000
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 2 --shards 2 --mode bsp --epochs 6 --chunk-kb 64 \
  --lease-ms $LEASE "${SUBSET[@]}"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD"; done
for i in 1 2; do psnet_start "workerd-$i" "$WORKERD" --coord "$COORD" --trace-pulls --progress-ms 100; done
psnet_wait_for 30 logs_match 'msg="pulled" clock=50 ' 'workerd-1.log'; ok $? "two workers train"

psnet_start workerd-3 "$WORKERD" --coord "$COORD" --trace-pulls --progress-ms 100
psnet_wait_for 20 logs_match 'msg="boundary" from_clock=[0-9]+ joined=1' 'pscoord.log'; ok $? "pscoord picks a boundary for the joiner"
F=$(sed -n 's/.*msg="boundary" from_clock=\([0-9]*\) joined=1.*/\1/p' "$RUN/pscoord.log" | head -1)
psnet_wait_for 20 logs_match 'msg="training" rank=2/3' 'workerd-3.log'; ok $? "the joiner trains as rank 2 of 3"
grep -q "msg=\"training\" rank=2/3 .* clock=$F\$" "$RUN/workerd-3.log"; ok $? "it starts at the boundary clock $F"
first=$(sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' "$RUN/workerd-3.log" | head -1)
[ "$first" = "$F" ]; ok $? "its first pull is for clock $F (got ${first:-none})"
psnet_wait_for 20 logs_match "msg=\"pulled\" clock=$((F + 20)) " 'workerd-3.log'; ok $? "the joiner advances with the others"
grep -q 'push not applied' "$RUN/workerd-3.log"; ok $(( $? == 0 )) "none of its pushes was refused"
grep -q "msg=\"membership\" epoch=[0-9]* workers=3 from_clock=$F" "$RUN/psd-1.log"; ok $? "the shards switch membership at clock $F"

# Kill worker 2; the barrier must go on within the lease.
kill -KILL "$PID_workerd_2"; t_kill=$(date +%s%N)
c_kill=$(sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' "$RUN/workerd-1.log" | tail -1)
psnet_wait_for 20 logs_match "msg=\"pulled\" clock=$((c_kill + 5)) " 'workerd-1.log'; ok $? "training goes on after SIGKILL"
t_go=$(date +%s%N); waited=$(( (t_go - t_kill) / 1000000 ))
[ $waited -le $((LEASE + 3000)) ]; ok $? "the barrier waited ${waited} ms for the dead worker (lease ${LEASE} ms)"
grep -q 'msg="lease expired" role=worker' "$RUN/pscoord.log"; ok $? "pscoord expired its lease"

out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes ($out)"
accuracy_at_least "$out" 0.80; ok $? "accuracy >= 0.80 on the subset"

# The job's schedule: 6 x 12,000 samples; after the last change (the killed
# worker's share going to the others) each clock trains W x 64 more.
read -r B S W < <(sed -n 's/.*msg="schedule" base_clock=\([0-9]*\) samples_before=\([0-9]*\) workers=\([0-9]*\).*/\1 \2 \3/p' \
  "$RUN/pscoord.log" | tail -1)
[ -n "${W:-}" ]; ok $? "pscoord counts the samples trained when the killed worker's share moves (base ${B:-?})"
E=$(( B + (6 * 12000 - S + W * 64 - 1) / (W * 64) ))
ends=$(sed -n 's/.*msg="worker finished training" worker=[0-9]* clock=\([0-9]*\).*/\1/p' "$RUN/pscoord.log" | sort -u)
[ "$ends" = "$E" ]; ok $? "both members finish at the job's end clock $E (got $(echo $ends))"
steps3=$(sed -n 's/.*msg="trained" steps=\([0-9]*\) .*/\1/p' "$RUN/workerd-3.log")
[ "$steps3" = $((E - F)) ]; ok $? "the joiner trains only the clocks from $F to $E (${steps3:-?} steps), not 6 epochs of its own"
n=$(cat "$RUN"/workerd-*.log | grep -c 'msg="evaluated"')
[ "$n" = 1 ]; ok $? "one worker evaluates the final weights ($n evaluations)"

extract() { sed -n 's/.*msg="pulled" clock=\([0-9]*\) checksum=\([0-9a-f]*\).*/\1 \2/p' "$1" | sort -k1,1; }
for w in 1 2 3; do extract "$RUN/workerd-$w.log" >"$RUN/c$w"; done
j13=$(join "$RUN/c1" "$RUN/c3" | wc -l); d13=$(join "$RUN/c1" "$RUN/c3" | awk '$2 != $3' | wc -l)
j12=$(join "$RUN/c1" "$RUN/c2" | wc -l); d12=$(join "$RUN/c1" "$RUN/c2" | awk '$2 != $3' | wc -l)
[ "$j13" -ge 50 ] && [ "$d13" -eq 0 ]; ok $? "worker 1 and the joiner pulled identical weights at $j13 common clocks ($d13 differ)"
[ "$j12" -ge 50 ] && [ "$d12" -eq 0 ]; ok $? "worker 1 and the killed worker agreed at $j12 common clocks ($d12 differ)"
