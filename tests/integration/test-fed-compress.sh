#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Uplink compression (--compress) with real edge processes: top-k with error
# feedback sends a tenth of each chunk's values (8 bytes each, a fifth of the
# f32 bytes), the shard decodes and aggregates them, the job still learns,
# and the bytes sent and saved are reported per round (psctl round history,
# pscoord's log) and per client (/metrics); a plain update in a compressed
# job, and a top-k frame with its indices out of order, are refused with a
# reason while the shard keeps serving. Each codec's round trip, error bound
# and error feedback are checked in tests/unit/test-compress.c.
source "$(dirname "$0")/lib.sh"
COORD="ipc://$RUN/coord.sock"
ROUNDS=8
psnet_start pscoord "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds $ROUNDS --fraction 1 \
  --min-clients 2 --min-available 3 --round-timeout 10 --chunk-kb 64 --compress topk:0.1 \
  --train-limit 3000 --test-limit 500
psnet_start psd "$PSD" --id 1 --listen "ipc://$RUN/psd.sock" --coord "$COORD"
psnet_start e-0 "$WORKERD" --edge --coord "$COORD" --partition 0/3 --http 127.0.0.1:0
for k in 1 2; do psnet_start "e-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/3; done

psnet_wait_for 60 logs_match 'msg="round done" round=2/' 'pscoord.log'; ok $? "compressed rounds run"
# One client stops: the round that samples it waits for it (until
# --round-timeout), and a plain update under its id is refused meanwhile.
pid=$PID_e_2
id=$(sed -n "s/.*msg=\"registered\" role=edge id=\([0-9]*\) pid=$pid .*/\1/p" "$RUN/pscoord.log")
kill -STOP "$pid"
poke() {
  local num
  num=$("$PSCTL" --coord "$COORD" --json round status | jq -r 'select(.phase == "training") | .number')
  [ -n "$num" ] || return 1
  out=$(PSPOKE_SENDER=$id PSPOKE_CLOCK=$num PSPOKE_VALUE=0.01 "$PSPOKE" "ipc://$RUN/psd.sock" push-value 1 16384)
  ! grep -q 'status=\(denied\|stale\)' <<<"$out"
}
out=""
[ -n "$id" ] && psnet_wait_for 30 poke
grep -q 'status=dtype .*come topk' <<<"$out"
ok $? "a plain update in a compressed job is refused, with a reason (client ${id:-?}: $out)"
out=$("$PSPOKE" "ipc://$RUN/psd.sock" status 2>&1); grep -q 'type=' <<<"$out"; ok $? "the shard keeps serving"
port=$(sed -n 's/.*msg="serving http" address=[^ ]* port=\([0-9]*\).*/\1/p' "$RUN/e-0.log" | head -1)
m=$(curl -fsS -m 5 "http://127.0.0.1:$port/metrics")
grep -q '^psnet_edge_update_bytes_total [1-9]' <<<"$m" && grep -q '^psnet_edge_update_raw_bytes_total [1-9]' <<<"$m"
ok $? "an edge worker's /metrics count the bytes of its updates as sent and as f32"
kill -CONT "$pid"

out=$("$PSCTL" --coord "$COORD" job wait --wait 180); rc=$?
acc=$(sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p' <<<"$out")
[ $rc -eq 0 ] && awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.55) }'
ok $? "the compressed job finishes above 0.55 on the subset ($out)"
hist=$("$PSCTL" --coord "$COORD" --json round history)
ratio=$(jq -r '[.[] | select(.round > 0)] | ((map(.bytes_up) | add) / (map(.bytes_raw) | add))' <<<"$hist")
awk -v r="$ratio" 'BEGIN { exit !(r >= 0.19 && r <= 0.21) }'
ok $? "round history: top-k 0.1 sends $ratio of the f32 bytes (0.2: a tenth of the values, 8 bytes each)"
"$PSCTL" --coord "$COORD" round history | head -1 | grep -q 'MIB_UP'; ok $? "psctl round history shows the MiB sent"
grep -q 'msg="round done" .* bytes_up=[1-9][0-9]* bytes_raw=[1-9][0-9]*' "$RUN/pscoord.log"
ok $? "pscoord logs each round's bytes"
line=$(grep -h 'msg="leaving"' "$RUN/e-0.log")
sent=$(sed -n 's/.* bytes_sent=\([0-9]*\).*/\1/p' <<<"$line") raw=$(sed -n 's/.* bytes_raw=\([0-9]*\).*/\1/p' <<<"$line")
awk -v s="${sent:-0}" -v r="${raw:-0}" 'BEGIN { exit !(r > 0 && s / r >= 0.19 && s / r <= 0.21) }'
ok $? "an edge worker's count: $sent bytes sent for $raw as f32"
