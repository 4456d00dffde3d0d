#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A federated job survives a pscoord restart (--state-dir): pscoord is killed
# with SIGKILL after a few private rounds and started again on the same state
# directory. It takes the rounds done, their history and the privacy spent
# from its state file, the edge workers register again, and the job ends
# after exactly --rounds aggregated rounds (none run twice, none lost from
# the history) with epsilon that of all of them (the RDP accountant computed
# independently, tests/integration/rdp-reference.py), not of the rounds since
# the restart.
source "$(dirname "$0")/lib.sh"
COORD="ipc://$RUN/coord.sock"
ROUNDS=8 NOISE=1.1 DELTA=1e-5
ARGS=(--listen "$COORD" --state-dir "$RUN/state" --mode fed --shards 1 --rounds $ROUNDS --fraction 0.6
  --min-clients 2 --min-available 3 --round-timeout 10 --lease-ms 3000 --shard-lease-ms 5000 --chunk-kb 64
  --dp-clip 0.05 --dp-noise $NOISE --dp-delta $DELTA --train-limit 3000 --test-limit 500)

psnet_start pscoord "$PSCOORD" "${ARGS[@]}"
psnet_start psd "$PSD" --id 1 --listen "ipc://$RUN/psd.sock" --coord "$COORD"
for k in 0 1 2; do psnet_start "e-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/3; done

psnet_wait_for 60 logs_match 'msg="round done" round=3/' 'pscoord.log'; ok $? "three private rounds done"
kill -KILL "$PID_pscoord" && psnet_wait_exit "$PID_pscoord" 10; ok $? "SIGKILL pscoord"
logged=$(grep -c 'msg="round done"' "$RUN/pscoord.log")
psnet_start pscoord2 "$PSCOORD" "${ARGS[@]}"
psnet_wait_for 20 logs_match 'msg="federated rounds from the state file" rounds_done=' 'pscoord2.log'
before=$(sed -n 's/.*msg="federated rounds from the state file" rounds_done=\([0-9]*\) .*/\1/p' "$RUN/pscoord2.log")
# A round is on disk before it is logged done: the kill may fall between.
[ -n "$before" ] && [ "$before" -ge "$logged" ] && [ "$before" -le $((logged + 1)) ]
ok $? "the new pscoord takes the rounds done from its state file: $before, every one logged done ($logged) is there"

out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes after the restart ($out)"
after=$(grep -c 'msg="round done"' "$RUN/pscoord2.log")
[ $((before + after)) -eq $ROUNDS ]; ok $? "$before rounds before and $after after the restart make the $ROUNDS"
hist=$("$PSCTL" --coord "$COORD" --json round history)
jq -e "[.[] | select(.round > 0) | .round] == [range(1; $ROUNDS + 1)]" <<<"$hist" >/dev/null
ok $? "the history lists rounds 1 to $ROUNDS once each: $(jq -c '[.[] | select(.round > 0) | .round]' <<<"$hist")"
eps=$("$PSCTL" --coord "$COORD" --json status | jq -r '.job.fed.epsilon')
want=$(rdp_reference "$NOISE" "$DELTA" $(rdp_rates "$hist" 0.6))
within "$eps" "$want" 1e-5  # psctl's JSON gives epsilon to 6 digits
ok $? "epsilon $eps is that of all $ROUNDS rounds (the reference gives $want)"
jq -e "[.[] | select(.round > 0) | .epsilon] | . == sort and length == $ROUNDS" <<<"$hist" >/dev/null
ok $? "and grows round by round across the restart"
! grep -q 'level=error' "$RUN/pscoord2.log" "$RUN/psd.log"; ok $? "no errors logged"
