#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Live shard scaling under BSP: psctl shard add while training moves chunks
# (values and optimizer state) to the new shard, psctl shard remove moves a
# shard's chunks away; workers follow MOVED to the new map. With a fixed seed,
# the run ends with weights bit-identical, clock by clock, to a run without
# any migration: no push was lost or applied twice.
source "$(dirname "$0")/lib.sh"

trace() { cat "$@" | sed -n 's/.*msg="pulled" clock=\([0-9]*\) checksum=\([0-9a-f]*\).*/\1 \2/p' | sort -u; }
JOB=(--workers 2 --mode bsp --epochs 4 --chunk-kb 16 --optim adam --lr 0.001 "${SUBSET[@]}")

# Reference: 2 shards, no migration.
COORD="ipc://$RUN/ref-coord.sock"
psnet_start ref-coord "$PSCOORD" --listen "$COORD" --shards 2 "${JOB[@]}"
for i in 1 2; do psnet_start "ref-psd-$i" "$PSD" --id $i --listen "ipc://$RUN/ref-psd-$i.sock" --coord "$COORD"; done
for i in 1 2; do psnet_start "ref-w$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "reference run ($out)"
psnet_stop_all
trace "$RUN"/ref-w*.log >"$RUN/ref"

# The same job; shard 3 is added at clock >= 60, shard 1 removed at clock >= 200.
COORD="ipc://$RUN/coord.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --shards 2 "${JOB[@]}"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD"; done
for i in 1 2; do psnet_start "w$i" "$WORKERD" --coord "$COORD" --trace-pulls --progress-ms 100; done
psnet_wait_for 30 logs_match 'msg="pulled" clock=20 ' 'w1.log'; ok $? "training started"
psnet_start psd-3 "$PSD" --id 3 --listen "ipc://$RUN/psd-3.sock" --coord "$COORD"
psnet_wait_for 10 bash -c "'$PSCTL' --coord '$COORD' --json status | jq -e '.shards[] | select(.id == 3) | .in_map == false'"
ok $? "a psd started during the job waits on standby"
psnet_wait_for 30 logs_match 'msg="pulled" clock=60 ' 'w1.log'; ok $? "training reached clock 60"
out=$("$PSCTL" --coord "$COORD" shard add "ipc://$RUN/psd-3.sock" 2>&1); ok $? "psctl shard add ADDRESS of psd 3 ($out)"
moved() { "$PSCTL" --coord "$COORD" --json status | jq -e "$1"; }
psnet_wait_for 20 moved '.shards[] | select(.id == 3) | .keys > 0 and .incoming == 0'; ok $? "shard 3 received its chunks"
psnet_wait_for 30 logs_match 'msg="pulled" clock=200 ' 'w1.log'; ok $? "training went on to clock 200"
out=$("$PSCTL" --coord "$COORD" shard remove 1 2>&1); ok $? "psctl shard remove 1 ($out)"
psnet_wait_for 20 moved '.shards[] | select(.id == 1) | .keys == 0 and .in_map == false'; ok $? "shard 1 handed all its chunks over"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes ($out)"
accuracy_at_least "$out" 0.75; ok $? "accuracy >= 0.75 on the subset"
trace "$RUN"/w*.log >"$RUN/mig"

n=$(wc -l <"$RUN/ref")
[ "$n" -ge 300 ]; ok $? "the reference traced $n clocks"
cmp -s "$RUN/ref" "$RUN/mig"; ok $? "weights bit-identical to the run without migration at every clock"
grep -q 'moved shard=\|msg="shard map" epoch=' "$RUN"/w*.log; ok $? "the workers followed the new maps"
grep -q 'msg="refused request"' "$RUN"/psd-*.log; ok $(( $? == 0 )) "no shard refused a request"
