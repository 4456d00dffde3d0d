#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A worker stopped (SIGSTOP) under BSP long enough for its lease to run out
# leaves the membership; the other trains on alone. Continued (SIGCONT), its
# pushes for its old clock are refused as from a non-member, its session
# registers again, pscoord admits it at a clock boundary, and it trains on
# from the clock it is given (its data where the job stands there), not from
# its own: no push of it is dropped as stale, and from that clock on both
# workers pull identical weights.
source "$(dirname "$0")/lib.sh"

COORD="ipc://$RUN/coord.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 2 --shards 2 --mode bsp --epochs 10 --batch 64 \
  --lease-ms 1000 "${SUBSET[@]}"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD"; done
for i in 1 2; do psnet_start "workerd-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
psnet_wait_for 30 logs_match 'msg="pulled" clock=40 ' 'workerd-2.log'; ok $? "the job trains to clock 40"
id2=$("$PSCTL" --coord "$COORD" --json status | jq -r '.workers[] | select(.pid == '"$PID_workerd_2"') | .id')
kill -STOP "$PID_workerd_2"; ok $? "SIGSTOP worker $id2"
psnet_wait_for 10 logs_match "msg=\"lease expired\" role=worker id=$id2 " 'pscoord.log'
ok $? "its lease runs out and it leaves the membership"
c=$(sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' "$RUN/workerd-1.log" | tail -1)
psnet_wait_for 30 logs_match "msg=\"pulled\" clock=$((c + 100)) " 'workerd-1.log'
ok $? "the other worker trains on alone (clock $c to $((c + 100)))"
kill -CONT "$PID_workerd_2"; ok $? "SIGCONT worker $id2"
psnet_wait_for 20 logs_match 'msg="admitted again: training on"' 'workerd-2.log'; ok $? "it is admitted again"
S=$(sed -n 's/.*msg="admitted again: training on" clock=\([0-9]*\) .*/\1/p' "$RUN/workerd-2.log" | head -1)
left=$(sed -n 's/.*msg="admitted again: training on" .*left_at=\([0-9]*\).*/\1/p' "$RUN/workerd-2.log" | head -1)
grep -q "msg=\"boundary\" from_clock=[0-9]* joined=1 start_clock=$S " "$RUN/pscoord.log"
ok $? "at the start clock pscoord gave it ($S; it had left at $left)"
[ -n "$S" ] && [ -n "$left" ] && [ "$S" -gt $((left + 100)) ]; ok $? "which is past its own clock"
# Its first pull after admission (logged once it completes: wait for it).
first_pull() {
  first=$(sed -n '/admitted again: training on/,$p' "$RUN/workerd-2.log" | sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' | head -1)
  [ -n "$first" ]
}
first=""
psnet_wait_for 20 first_pull
[ "$first" = "$S" ]; ok $? "its first pull after is of that clock ($first)"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes ($out)"
accuracy_at_least "$out" 0.80; ok $? "accuracy >= 0.80 on the subset"
grep -q 'push not applied' "$RUN/workerd-2.log"; ok $(( $? == 0 )) "no push of it was dropped as stale"
ends=$(sed -n 's/.*msg="worker finished training" worker=[0-9]* clock=\([0-9]*\).*/\1/p' "$RUN/pscoord.log" | sort -u)
[ "$(wc -w <<<"$ends")" = 1 ]; ok $? "both finish at the job's end clock ($(echo $ends))"
extract() { sed -n 's/.*msg="pulled" clock=\([0-9]*\) checksum=\([0-9a-f]*\).*/\1 \2/p' "$1" | sort -u -k1,1; }
for w in 1 2; do extract "$RUN/workerd-$w.log" >"$RUN/c$w"; done
j=$(join "$RUN/c1" "$RUN/c2" | awk -v s="$S" '$1 >= s' | wc -l)
d=$(join "$RUN/c1" "$RUN/c2" | awk -v s="$S" '$1 >= s && $2 != $3' | wc -l)
[ "$j" -ge 50 ] && [ "$d" -eq 0 ]; ok $? "from clock $S on both pulled identical weights ($j clocks, $d differ)"
