#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# BSP on a real cluster (2 shards, 2 workers, loopback ipc): the accuracy bar on
# a CI-sized subset, every worker pulls bit-identical weights at each clock, the
# demo's model (one large tensor, three small) is spread evenly over the two
# shards, and --lr-schedule cosine takes the learning rate down to almost 0 by
# the last clock. Then the same job with --wire bf16, and with --sparsify 0.1.
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

# The same job with --wire bf16: workers push and pull half the bytes, the
# shards keep f32 values, every worker still pulls the same weights at each
# clock, and the accuracy stays with the f32 run's.
mb() { sed -n "s/.*msg=\"trained\" .* $2=\([0-9.]*\).*/\1/p" "$RUN/$1.log" | tail -1; }
acc32=$(acc_of "$out"); push32=$(mb workerd-1 pushed_mb); pull32=$(mb workerd-1 pulled_mb)
psnet_stop_all
COORD="ipc://$RUN/coord-bf16.sock"
psnet_start pscoord-bf16 "$PSCOORD" --listen "$COORD" --workers 2 --shards 2 --mode bsp --epochs 3 \
  --lr-schedule cosine --wire bf16 "${SUBSET[@]}"
start_shards bf16 2 "$COORD"
for i in 1 2; do psnet_start "workerd-bf16-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the BSP job with --wire bf16 finishes ($out)"
acc16=$(acc_of "$out")
awk -v a="$acc16" -v b="$acc32" 'BEGIN { d = a - b; exit !(a > 0 && d < 0.02 && d > -0.02) }'
ok $? "its accuracy is within 0.02 of f32's on this subset ($acc16 against $acc32)"
push16=$(mb workerd-bf16-1 pushed_mb); pull16=$(mb workerd-bf16-1 pulled_mb)
awk -v a="$push16" -v b="$push32" -v c="$pull16" -v d="$pull32" \
  'BEGIN { exit !(b > 0 && d > 0 && a / b > 0.45 && a / b < 0.55 && c / d > 0.45 && c / d < 0.55) }'
ok $? "a worker pushed and pulled half the bytes (pushed $push16 MB against $push32, pulled $pull16 against $pull32)"
extract "$RUN/workerd-bf16-1.log" >"$RUN/b1"; extract "$RUN/workerd-bf16-2.log" >"$RUN/b2"
joined=$(join "$RUN/b1" "$RUN/b2" | wc -l); diffs=$(join "$RUN/b1" "$RUN/b2" | awk '$2 != $3' | wc -l)
[ "$joined" -ge 200 ] && [ "$diffs" -eq 0 ]; ok $? "identical weights at every clock ($joined clocks, $diffs differ)"
psnet_stop_all

# The same job with --sparsify 0.1: each push carries the largest tenth of each
# chunk's gradients as (index, value) pairs, the rest kept on the worker for
# its next push. Workers still pull identical weights at every clock, push a
# fifth of the bytes, and the accuracy stays near the dense run's. A member's
# top-k frame with indices out of order, or a NaN, is refused whole.
COORD="ipc://$RUN/coord-topk.sock"
psnet_start pscoord-topk "$PSCOORD" --listen "$COORD" --workers 2 --shards 2 --mode bsp --epochs 3 \
  --lr-schedule cosine --sparsify 0.1 "${SUBSET[@]}"
start_shards topk 2 "$COORD"
for i in 1 2; do psnet_start "workerd-topk-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
psnet_wait_for 60 logs_match 'msg="pulled" clock=5 ' 'workerd-topk-1.log'; ok $? "a --sparsify job trains"
len=$("$PSCTL" --coord "$COORD" --json status | jq '.job.chunk_floats')
wid=$("$PSCTL" --coord "$COORD" --json status | jq '.workers[0].id')
for sh in 1 2; do  # key (0,0) is on one of them; the other answers MOVED
  out=$(PSPOKE_SENDER=$wid PSPOKE_CODEC=topk-disorder "$PSPOKE" "ipc://$RUN/psd-topk-$sh.sock" push-value 1 "$len")
  grep -q "status=moved" <<<"$out" || break
done
grep -q "status=invalid .*indices out of order or range" <<<"$out"; ok $? "a member's top-k frame out of order is refused ($out)"
out=$(PSPOKE_SENDER=$wid PSPOKE_CODEC=topk PSPOKE_VALUE=nan "$PSPOKE" "ipc://$RUN/psd-topk-$sh.sock" push-value 1 "$len")
grep -q "status=not-finite" <<<"$out"; ok $? "and one with a NaN ($out)"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the BSP job with --sparsify 0.1 finishes ($out)"
acck=$(acc_of "$out")
awk -v a="$acck" -v b="$acc32" 'BEGIN { d = a - b; exit !(a > 0 && d < 0.03 && d > -0.03) }'
ok $? "its accuracy is within 0.03 of the dense run's on this subset ($acck against $acc32)"
pushk=$(mb workerd-topk-1 pushed_mb)
awk -v a="$pushk" -v b="$push32" 'BEGIN { exit !(b > 0 && a / b > 0.15 && a / b < 0.25) }'
ok $? "a worker pushed a fifth of the dense bytes ($pushk MB against $push32)"
"$PSCTL" --coord "$COORD" status | grep -q 'sparsify=0.1'; ok $? "psctl status names it"
extract "$RUN/workerd-topk-1.log" >"$RUN/k1"; extract "$RUN/workerd-topk-2.log" >"$RUN/k2"
joined=$(join "$RUN/k1" "$RUN/k2" | wc -l); diffs=$(join "$RUN/k1" "$RUN/k2" | awk '$2 != $3' | wc -l)
[ "$joined" -ge 200 ] && [ "$diffs" -eq 0 ]; ok $? "identical weights at every clock ($joined clocks, $diffs differ)"
