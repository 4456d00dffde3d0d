#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Secure aggregation (--secagg) with real edge processes over CURVE: five
# edge workers mask their updates with pairwise masks (X25519) and share
# their seeds (Shamir); every round goes through the key, share, mask and
# unmask exchanges, the shard unmasks only the sum, and the job reaches the
# accuracy bar. A client that stops mid-job is left out of the rounds that
# sample it and they still aggregate (its pairwise masks never enter them, or
# are removed with its rebuilt mask key), and once resumed it takes part
# again; a plain update pushed by hand under a sampled client's id is
# refused, with a reason, and the shard keeps serving. The scheme's arithmetic (equal to plain FedAvg within the
# quantisation bound; one of five dropping after its masked update; what the
# shard holds of one client uncorrelated with its update) is checked in
# tests/unit/test-secagg.c.
source "$(dirname "$0")/lib.sh"
COORD="ipc://$RUN/coord.sock"
ROUNDS=8
K=$RUN/keys
for kr in pscoord:server psd:server edge:edge admin:admin; do
  "$PSCTL" keys gen "${kr%%:*}" --role "${kr##*:}" --dir "$K" >/dev/null || { ok 1 "psctl keys gen ${kr%%:*}"; exit 1; }
done
PSCTL_K=("$PSCTL" --keys "$K")

psnet_start pscoord "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds $ROUNDS --fraction 1 \
  --min-clients 3 --min-available 5 --round-timeout 10 --lease-ms 20000 --shard-lease-ms 5000 --chunk-kb 64 \
  --secagg --secagg-timeout 2 --train-limit 3000 --test-limit 500 --keys "$K"
psnet_start psd "$PSD" --id 1 --listen "ipc://$RUN/psd.sock" --coord "$COORD" --keys "$K"
for k in 0 1 2 3 4; do psnet_start "e-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/5 --keys "$K"; done

psnet_wait_for 90 logs_match 'msg="round done" round=2/' 'pscoord.log'; ok $? "secure rounds run over CURVE"
grep -q 'msg="secure aggregation keys" number=[0-9]* keys=5 sampled=5 threshold=3' "$RUN/pscoord.log"
ok $? "pscoord routes the five clients' keys (threshold 3 of 5)"
grep -q 'msg="secure aggregation unmask" number=[0-9]* survivors=5 dropped=0 shares=5 threshold=3' "$RUN/pscoord.log"
ok $? "and rebuilds the seeds from the survivors' shares"
grep -q 'msg="round unmasked" number=[0-9]* survivors=5 dropped=0' "$RUN/psd.log"
ok $? "the shard unmasks the sum"
n=$(grep -l 'msg="secure aggregation revealed"' "$RUN"/e-*.log | wc -l)
[ "$n" -eq 5 ]; ok $? "every edge worker masks and then reveals its shares ($n of 5)"

# One client stops: the rounds that sample it go on without it.
pid=$PID_e_4
id=$(sed -n "s/.*msg=\"registered\" role=edge id=\([0-9]*\) pid=$pid .*/\1/p" "$RUN/pscoord.log")
kill -STOP "$pid"
poke() {  # a plain update as the stopped client into the open round
  local num
  num=$("${PSCTL_K[@]}" --coord "$COORD" --json round status | jq -r 'select(.phase == "training") | .number')
  [ -n "$num" ] || return 1
  out=$(PSPOKE_SENDER=$id PSPOKE_CLOCK=$num PSPOKE_VALUE=0.01 PSPOKE_KEYS=$K PSPOKE_KEY=edge PSPOKE_SERVER=psd "$PSPOKE" "ipc://$RUN/psd.sock" push-value 1 16384)
  ! grep -q 'status=\(denied\|stale\)' <<<"$out"
}
out=""
[ -n "$id" ] && psnet_wait_for 60 poke
grep -q 'status=dtype .*updates come masked' <<<"$out"
ok $? "a plain update in a secure job is refused, with a reason (client ${id:-?}: $out)"
psnet_wait_for 60 logs_match 'msg="secure aggregation keys" number=[0-9]* keys=4 sampled=5' 'pscoord.log'
ok $? "a round that samples the stopped client goes on with the four others' keys"
psnet_wait_for 60 logs_match 'msg="round unmasked" number=[0-9]* survivors=4' 'psd.log'
ok $? "and is unmasked over the four"
kill -CONT "$pid"
out=$(PSPOKE_KEYS=$K PSPOKE_KEY=edge PSPOKE_SERVER=psd "$PSPOKE" "ipc://$RUN/psd.sock" status 2>&1); grep -q 'type=' <<<"$out"; ok $? "the shard keeps serving"

out=$("${PSCTL_K[@]}" --coord "$COORD" job wait --wait 240); rc=$?
acc=$(sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p' <<<"$out")
[ $rc -eq 0 ] && awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.60) }'
ok $? "the secure job finishes above 0.60 on the subset ($out)"
hist=$("${PSCTL_K[@]}" --coord "$COORD" --json round history)
jq -e "[.[] | select(.round > 0)] | length == $ROUNDS and all(.answered >= 3)" <<<"$hist" >/dev/null
ok $? "psctl round history lists the $ROUNDS secure rounds, each with at least 3 updates"
# Resumed, the client drops what it trained for a round gone by and takes
# part again (it once waited on that round's peers for ever).
jq -e '[.[] | select(.round > 0)] as $r | ($r | map(.answered) | index(4)) as $i |
  $i != null and ($r[$i + 1:] | any(.answered == 5))' <<<"$hist" >/dev/null
ok $? "the resumed client is in the rounds again: $(jq -c '[.[] | select(.round > 0) | .answered]' <<<"$hist")"
! grep -q 'level=error' "$RUN/psd.log"; ok $? "the shard logged no error"
