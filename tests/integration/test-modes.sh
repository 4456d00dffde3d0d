#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# BSP determinism (two runs with the same seed give bit-identical weights at
# every clock), a lone worker reading its own pushes under ASP and SSP (its
# rounds in parts of a key, to shards with backups, which acknowledge late:
# the same weights at every clock as under BSP), mode switches between
# clocks (bsp -> ssp:2 -> bsp), and psctl worker drain.
source "$(dirname "$0")/lib.sh"

extract() { sed -n 's/.*msg="pulled" clock=\([0-9]*\) checksum=\([0-9a-f]*\).*/\1 \2/p' "$1" | sort -u -k1,1; }
run_bsp() {  # run_bsp NAME: a short BSP run; traces in $RUN/NAME-w*.log
  local coord="ipc://$RUN/$1-coord.sock"
  psnet_start "$1-coord" "$PSCOORD" --listen "$coord" --workers 2 --shards 2 --epochs 1 --chunk-kb 64 "${SUBSET[@]}"
  for i in 1 2; do psnet_start "$1-psd-$i" "$PSD" --id $i --listen "ipc://$RUN/$1-psd-$i.sock" --coord "$coord"; done
  for i in 1 2; do psnet_start "$1-w$i" "$WORKERD" --coord "$coord" --trace-pulls; done
  "$PSCTL" --coord "$coord" job wait --wait 120 >/dev/null
}
run_bsp a; ok $? "first BSP run"
run_bsp b; ok $? "second BSP run, same seed"
cat "$RUN"/a-w*.log | sed -n 's/.*msg="pulled" clock=\([0-9]*\) checksum=\([0-9a-f]*\).*/\1 \2/p' | sort -u >"$RUN/a"
cat "$RUN"/b-w*.log | sed -n 's/.*msg="pulled" clock=\([0-9]*\) checksum=\([0-9a-f]*\).*/\1 \2/p' | sort -u >"$RUN/b"
na=$(wc -l <"$RUN/a")
[ "$na" -ge 90 ]; ok $? "the runs traced $na clocks"
cmp -s "$RUN/a" "$RUN/b"; ok $? "the two runs pulled bit-identical weights at every clock"
psnet_stop_all

# run_one NAME MODE: one worker, two shards (each the other's backup: the
# default --replicas 2), a round's keys in parts of a key (64 KiB chunks,
# PSNET_PART_KIB=64: more parts per shard than the client keeps in flight).
run_one() {
  local coord="ipc://$RUN/$1-coord.sock"
  psnet_start "$1-coord" "$PSCOORD" --listen "$coord" --workers 1 --shards 2 --mode "$2" --epochs 1 --chunk-kb 64 \
    "${SUBSET[@]}"
  for i in 1 2; do psnet_start "$1-psd-$i" "$PSD" --id $i --listen "ipc://$RUN/$1-psd-$i.sock" --coord "$coord"; done
  PSNET_PART_KIB=64 psnet_start "$1-w" "$WORKERD" --coord "$coord" --trace-pulls
  "$PSCTL" --coord "$coord" job wait --wait 120 >/dev/null
  extract "$RUN/$1-w.log" >"$RUN/$1"
  psnet_stop_all
}
run_one one-bsp bsp; ok $? "a lone worker's BSP job"
grep -q 'replicas=2' "$RUN/one-bsp-coord.log"; ok $? "its shards hold each other's backups"
for m in asp ssp:1; do
  run_one "one-$m" "$m"; ok $? "the same job under $m"
  n=$(join "$RUN/one-bsp" "$RUN/one-$m" | wc -l); d=$(join "$RUN/one-bsp" "$RUN/one-$m" | awk '$2 != $3' | wc -l)
  [ "$n" -ge 90 ] && [ "$d" -eq 0 ]
  ok $? "under $m the worker pulls what it pushed: the BSP run's weights at every clock ($n clocks, $d differ)"
done
parts=$(sed -n 's/.*msg="stopped" .* push_parts=\([0-9]*\) .*/\1/p' "$RUN/one-asp-psd-1.log")
[ "${parts:-0}" -gt 0 ]; ok $? "in parts (shard 1 took ${parts:-no} parts)"

COORD="ipc://$RUN/coord.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 3 --shards 2 --mode bsp --epochs 8 --chunk-kb 64 "${SUBSET[@]}"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD"; done
for i in 1 2 3; do psnet_start "workerd-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
psnet_wait_for 30 logs_match 'msg="pulled" clock=30 ' 'workerd-1.log'; ok $? "a 3-worker BSP job trains"

out=$("$PSCTL" --coord "$COORD" job mode ssp:2); ok $? "psctl job mode ssp:2 ($out)"
psnet_wait_for 10 logs_match 'msg="boundary" from_clock=[0-9]+ joined=0 start_clock=[0-9]+ mode=ssp:2' 'pscoord.log'
ok $? "pscoord switches to ssp:2 at a boundary"
psnet_wait_for 10 logs_match 'msg="membership" .* mode=ssp:2' 'psd-1.log'; ok $? "the shards follow"
c1=$(sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' "$RUN/workerd-1.log" | tail -1)
psnet_wait_for 20 logs_match "msg=\"pulled\" clock=$((c1 + 30)) " 'workerd-1.log'; ok $? "training goes on under ssp:2"
out=$("$PSCTL" --coord "$COORD" job mode bsp); ok $? "psctl job mode bsp"
psnet_wait_for 10 logs_match 'msg="boundary" from_clock=[0-9]+ joined=0 start_clock=[0-9]+ mode=bsp' 'pscoord.log'
ok $? "pscoord switches back to bsp at a boundary"
B=$(sed -n 's/.*msg="boundary" from_clock=\([0-9]*\) joined=0 start_clock=[0-9]* mode=bsp.*/\1/p' "$RUN/pscoord.log" | tail -1)
psnet_wait_for 20 logs_match "msg=\"pulled\" clock=$((B + 30)) " 'workerd-2.log'; ok $? "training goes on under bsp from clock $B"

# Drain worker 3: it leaves after its step, the others go on.
id3=$("$PSCTL" --coord "$COORD" --json status | jq -r '.workers[] | select(.pid == '"$PID_workerd_3"') | .id')
out=$("$PSCTL" --coord "$COORD" worker drain "$id3"); ok $? "psctl worker drain $id3 ($out)"
psnet_wait_exit "$PID_workerd_3" 20; ok $? "the drained worker exits"
grep -q 'drain requested' "$RUN/workerd-3.log"; ok $? "it logged the drain"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes with the other two ($out)"
accuracy_at_least "$out" 0.80; ok $? "accuracy >= 0.80 on the subset"
for w in 1 2; do extract "$RUN/workerd-$w.log" >"$RUN/m$w"; done
j=$(join "$RUN/m1" "$RUN/m2" | awk -v b="$B" '$1 >= b' | wc -l)
d=$(join "$RUN/m1" "$RUN/m2" | awk -v b="$B" '$1 >= b && $2 != $3' | wc -l)
[ "$j" -ge 50 ] && [ "$d" -eq 0 ]; ok $? "under BSP again, workers pull identical weights ($j clocks, $d differ)"
grep -q 'push not applied' "$RUN"/workerd-*.log; ok $(( $? == 0 )) "no push was refused across the switches"
