#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Differential privacy in a federated job (--dp-clip, --dp-noise) with real
# edge processes: every client clips its update to the clip norm; a shard
# refuses an update above it, with a reason, and keeps serving; the shards
# add the noise; the privacy spent is reported as epsilon in psctl status,
# round history and pscoord's log, and matches the RDP accountant computed
# independently (tests/integration/rdp-reference.py: exact sums and numerical
# integration, the conversion of Balle et al. 2020) for the job's Poisson
# sampling rate, noise and rounds; psctl names the sampling and accountant. (The accountant itself is checked against published
# figures in tests/unit/test-rdp.c.) The cluster speaks CURVE: edge workers
# reach the shards with keys of the edge role.
source "$(dirname "$0")/lib.sh"
COORD="ipc://$RUN/coord.sock"
CLIP=0.05 NOISE=1.1 DELTA=1e-5 ROUNDS=4
K=$RUN/keys
for kr in pscoord:server psd:server edge:edge admin:admin; do
  "$PSCTL" keys gen "${kr%%:*}" --role "${kr##*:}" --dir "$K" >/dev/null || { ok 1 "psctl keys gen ${kr%%:*}"; exit 1; }
done
PSCTL_K=("$PSCTL" --keys "$K")

# Three edge workers, each in a round with probability 0.6 (Poisson sampling:
# a round of fewer than --min-clients updates runs again).
psnet_start pscoord "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds $ROUNDS --fraction 0.6 \
  --min-clients 2 --min-available 3 --round-timeout 4 --lease-ms 20000 --shard-lease-ms 5000 --chunk-kb 64 \
  --dp-clip $CLIP --dp-noise $NOISE --dp-delta $DELTA --train-limit 3000 --test-limit 500 --keys "$K"
psnet_start psd "$PSD" --id 1 --listen "ipc://$RUN/psd.sock" --coord "$COORD" --keys "$K"
for k in 0 1 2; do psnet_start "e-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/3 --keys "$K"; done

psnet_wait_for 60 logs_match 'msg="round done" round=1/' 'pscoord.log'; ok $? "private rounds run over CURVE"
psnet_wait_for 10 logs_match 'msg="update counted" .* clipped=1' 'e-*.log'
ok $? "a client whose update is above the clip norm scales it down before sending"
grep -q "msg=\"round aggregated\" .*dp_clip=$CLIP dp_noise=$NOISE" "$RUN/psd.log"
ok $? "the shard aggregates with the clip norm and the noise"

# A client's update above the clip norm, pushed by hand under a client's id
# while it is stopped: a round that samples it stays open until
# --round-timeout (and then runs again, one update short).
pid=$PID_e_2
id=$(sed -n "s/.*msg=\"registered\" role=edge id=\([0-9]*\) pid=$pid .*/\1/p" "$RUN/pscoord.log")
kill -STOP "$pid"
poke() {  # pushes as client $id into the open round until a shard judges the update itself
  local num
  num=$("${PSCTL_K[@]}" --coord "$COORD" --json round status | jq -r 'select(.phase == "training") | .number')
  [ -n "$num" ] || return 1
  out=$(PSPOKE_SENDER=$id PSPOKE_CLOCK=$num PSPOKE_VALUE=0.01 PSPOKE_KEYS=$K PSPOKE_KEY=edge PSPOKE_SERVER=psd "$PSPOKE" "ipc://$RUN/psd.sock" push-value 1 16384)
  # denied or stale: not sampled this round, or it just closed; "examples
  # before": the client was stopped after its first part of this round's
  # update went out, so the shard holds its count (the round times out and
  # runs again).
  ! grep -q 'status=\(denied\|stale\)\|examples before' <<<"$out"
}
out=""
[ -n "$id" ] && psnet_wait_for 60 poke
grep -q 'status=invalid .*above the job.s clip norm' <<<"$out"
ok $? "a shard refuses an update above the clip norm, with a reason (client ${id:-?}: $out)"
kill -CONT "$pid"
out=$(PSPOKE_KEYS=$K PSPOKE_KEY=edge PSPOKE_SERVER=psd "$PSPOKE" "ipc://$RUN/psd.sock" status 2>&1); grep -q 'type=' <<<"$out"; ok $? "and keeps serving"

out=$("${PSCTL_K[@]}" --coord "$COORD" job wait --wait 180); ok $? "the private job finishes ($out)"
grep -q "msg=\"job privacy\" job=1 rounds=$ROUNDS epsilon=[0-9.]* delta=1e-05" "$RUN/pscoord.log"
ok $? "pscoord reports the privacy spent at the end"
st=$("${PSCTL_K[@]}" --coord "$COORD" --json status)
eps=$(jq -r '.job.fed.epsilon' <<<"$st")
hist=$("${PSCTL_K[@]}" --coord "$COORD" --json round history)
rates=$(for i in $(seq $ROUNDS); do echo 0.6; done)
want=$(rdp_reference "$NOISE" "$DELTA" $rates)
within "$eps" "$want" 1e-6
ok $? "psctl status reports epsilon $eps for $ROUNDS rounds at q = 0.6, the reference gives $want"
rs=$("${PSCTL_K[@]}" --coord "$COORD" --json round status)
jq -e '(.sampling | startswith("poisson q=0.6")) and (.accountant | test("Balle et al. 2020"))' <<<"$rs" >/dev/null
ok $? "psctl round status names the sampling and the accountant ($(jq -c '[.sampling, .accountant]' <<<"$rs"))"
jq -e "[.[] | select(.round > 0) | .epsilon] | length == $ROUNDS and (. == sort) and .[-1] == $eps" <<<"$hist" >/dev/null
ok $? "round history: epsilon grows round by round and ends at the status figure"
"${PSCTL_K[@]}" --coord "$COORD" status | grep -q "privacy spent: epsilon=" ; ok $? "psctl status prints it"
n=$(grep -c 'msg="leaving" .*clipped=[1-9]' "$RUN"/e-*.log | awk -F: '{ s += ($2 > 0) } END { print s }')
[ "$n" -ge 1 ]; ok $? "the edge workers count their clipped updates ($n of 3 clipped some)"
