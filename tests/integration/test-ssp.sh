#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SSP(s): with one deliberately slow worker, no pull is answered for a clock more
# than s ahead of the slowest worker (the shards log every answered SSP pull
# with the slowest member's clock; checked on every line), the bound is
# actually reached, and the job still trains.
source "$(dirname "$0")/lib.sh"

S=2
COORD="ipc://$RUN/coord.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 3 --shards 2 --mode ssp:$S --epochs 3 --chunk-kb 64 \
  "${SUBSET[@]}"
for i in 1 2; do
  psnet_start "psd-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD" --log-level debug
done
psnet_start workerd-1 "$WORKERD" --coord "$COORD"
psnet_start workerd-2 "$WORKERD" --coord "$COORD"
psnet_start workerd-slow "$WORKERD" --coord "$COORD" --step-delay-ms 15
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the SSP job finishes ($out)"
accuracy_at_least "$out" 0.75; ok $? "accuracy >= 0.75 on the subset"

cat "$RUN"/psd-*.log | sed -n 's/.*msg="ssp pull" worker=\([0-9]*\) clock=\([0-9]*\) slowest=\([0-9]*\) staleness=\([0-9]*\).*/\1 \2 \3 \4/p' >"$RUN/ssp"
n=$(wc -l <"$RUN/ssp")
[ "$n" -ge 300 ]; ok $? "the shards logged the answered pulls ($n)"
bad=$(awk -v s=$S '$2 - $3 > s' "$RUN/ssp" | wc -l)
[ "$bad" -eq 0 ]; ok $? "no pull answered more than $S clocks ahead of the slowest ($bad violations)"
at_bound=$(awk -v s=$S '$2 - $3 == s' "$RUN/ssp" | wc -l)
[ "$at_bound" -ge 10 ]; ok $? "fast workers ran up to the bound ($at_bound pulls at exactly $S ahead)"
# The slow worker really was slow: the others waited for it.
grep -q "msg=\"trained\"" "$RUN/workerd-slow.log"; ok $? "the slow worker trained to the end"
