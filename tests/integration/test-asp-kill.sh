#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ASP: a workerd killed with SIGKILL mid-run does not stop training; its lease
# expires, and the job still reaches the accuracy bar.
source "$(dirname "$0")/lib.sh"

COORD="ipc://$RUN/coord.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 3 --shards 2 --mode asp --epochs 4 \
  --lease-ms 1000 "${SUBSET[@]}"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD"; done
for i in 1 2 3; do psnet_start "workerd-$i" "$WORKERD" --coord "$COORD" --progress-ms 100; done
psnet_wait_for 30 logs_match 'msg="training" rank=2/3' 'workerd-*.log'; ok $? "three workers train"
victim=$(grep -l 'msg="training" rank=2/3' "$RUN"/workerd-*.log | head -1)
victim=$(basename "$victim" .log); vpid=$(eval echo "\$PID_${victim//-/_}")
psnet_wait_for 30 grep -q 'msg="progress" epoch=1/4 step=[1-9][0-9]' "$RUN/$victim.log"; ok $? "the victim ($victim) made progress"
kill -KILL "$vpid"; ok $? "SIGKILL $victim"
psnet_wait_for 10 grep -q 'msg="lease expired" role=worker' "$RUN/pscoord.log"; ok $? "pscoord expires its lease"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes without it ($out)"
accuracy_at_least "$out" 0.75; ok $? "accuracy >= 0.75 on the subset"
for w in workerd-1 workerd-2 workerd-3; do
  [ "$w" = "$victim" ] && continue
  grep -q 'msg="trained" steps=' "$RUN/$w.log"; ok $? "$w trained to the end"
done
