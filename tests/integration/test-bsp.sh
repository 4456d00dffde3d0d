#!/usr/bin/env bash
# BSP on a real cluster (2 shards, 2 workers, loopback ipc): the accuracy bar on
# a CI-sized subset, every worker pulls bit-identical weights at each clock, the
# demo's model (one large tensor, three small) is spread evenly over the two
# shards, and --lr-schedule cosine takes the learning rate down to almost 0 by
# the last clock.
source "$(dirname "$0")/lib.sh"

COORD="ipc://$RUN/coord.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 2 --shards 2 --mode bsp --epochs 3 --lr-schedule cosine "${SUBSET[@]}"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD"; done
for i in 1 2; do psnet_start "workerd-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the BSP job finishes ($out)"
accuracy_at_least "$out" 0.80; ok $? "accuracy >= 0.80 on the 12k-image subset, 3 epochs"

json=$("$PSCTL" --coord "$COORD" --json status)
jq -e '([.shards[].bytes] | add / 2) as $s | all(.shards[].bytes; . >= 0.9 * $s and . <= 1.1 * $s)' <<<"$json" >/dev/null
ok $? "each shard holds half the bytes within 10% ($(jq -c '[.shards[].bytes]' <<<"$json"))"
jq -e 'all(.shards[].pushes; . > 0)' <<<"$json" >/dev/null; ok $? "and both were pushed to"
# lr 0.02 x 2 workers at the start; (1 + cos(pi (E - 1) / E)) / 2 of it at the
# last of E clocks, about 3e-5 for the ~280 clocks here.
jq -e '.job.lr_schedule == "cosine" and all(.shards[].lr; . > 0 and . < 0.04 * 0.001)' <<<"$json" >/dev/null
ok $? "cosine: the last update's lr is a small fraction of the start's ($(jq -c '[.shards[].lr]' <<<"$json"))"
"$PSCTL" --coord "$COORD" status | grep -q 'lr_schedule=cosine'; ok $? "psctl status names the schedule"

extract() { sed -n 's/.*msg="pulled" clock=\([0-9]*\) checksum=\([0-9a-f]*\).*/\1 \2/p' "$1" | sort -k1,1; }
extract "$RUN/workerd-1.log" >"$RUN/c1"; extract "$RUN/workerd-2.log" >"$RUN/c2"
n1=$(wc -l <"$RUN/c1"); n2=$(wc -l <"$RUN/c2")
joined=$(join "$RUN/c1" "$RUN/c2" | wc -l)
[ "$joined" -ge 200 ]; ok $? "both workers traced the same clocks ($joined in common; $n1 and $n2 traced)"
diffs=$(join "$RUN/c1" "$RUN/c2" | awk '$2 != $3' | wc -l)
[ "$diffs" -eq 0 ]; ok $? "identical weights at every clock ($diffs differ)"
distinct=$(cut -d' ' -f2 "$RUN/c1" | sort -u | wc -l)
[ "$distinct" -ge $((n1 / 2)) ]; ok $? "the weights change from clock to clock ($distinct distinct checksums)"
