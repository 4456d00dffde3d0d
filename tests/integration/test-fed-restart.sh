#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A federated job survives a pscoord restart (--state-dir): pscoord is killed
# with SIGKILL after a few private rounds and started again on the same state
# directory. It takes the rounds done, their history and the privacy spent
# from its state file, the edge workers register again, and the job ends
# after exactly --rounds aggregated rounds (none run twice, none lost from
# the history) with epsilon that of all of them (the RDP accountant computed
# independently, tests/integration/rdp-reference.py), not of the rounds since
# the restart. Then pscoord is killed between the shards' aggregation of a
# round and its record of it: the round counts once all the same.
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

# The window between the shards' aggregation and pscoord's record: pscoord
# dies (PSNET_TEST_DIE_CLOSING) once the first of two shards has answered
# round 3's close, so the shards hold the aggregated round and the state file
# does not call it done. Written ahead, the close goes to the shards again:
# each aggregates round 3 once (again: answered without applying), and the
# round is counted once in the history and in epsilon.
psnet_stop_all
COORD="ipc://$RUN/coord-w.sock"
ARGS=(--listen "$COORD" --state-dir "$RUN/state-w" --mode fed --shards 2 --rounds 6 --fraction 0.6
  --min-clients 2 --min-available 3 --round-timeout 10 --lease-ms 3000 --shard-lease-ms 5000 --chunk-kb 64
  --dp-clip 0.05 --dp-noise $NOISE --dp-delta $DELTA --train-limit 3000 --test-limit 500)
PSNET_TEST_DIE_CLOSING=3 psnet_start pscoord-w "$PSCOORD" "${ARGS[@]}"
for i in 1 2; do psnet_start "psd-w$i" "$PSD" --id $i --listen "ipc://$RUN/psd-w$i.sock" --coord "$COORD"; done
for k in 0 1 2; do psnet_start "ew-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/3; done
psnet_wait_exit "$PID_pscoord_w" 90; ok $? "pscoord dies with round 3's close answered by one shard"
grep -q 'msg="round done" round=3/' "$RUN/pscoord-w.log"; [ $? -ne 0 ]; ok $? "round 3 was not recorded done"
n=$(cat "$RUN"/psd-w*.log | grep -c 'msg="round aggregated" .*round=3 ')
[ "$n" -ge 1 ]; ok $? "and at least one shard had aggregated it ($n of 2)"
psnet_start pscoord-w2 "$PSCOORD" "${ARGS[@]}"
psnet_wait_for 30 logs_match 'msg="round closing again after pscoord.s restart" number=[0-9]* round=3 ' 'pscoord-w2.log'
ok $? "the restarted pscoord sends round 3's close again"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes ($out)"
for i in 1 2; do
  a=$(grep -c 'msg="round aggregated" .*round=3 ' "$RUN/psd-w$i.log")
  again=$(grep -c 'msg="round closed again: aggregated already"' "$RUN/psd-w$i.log")
  [ "$a" -eq 1 ]; ok $? "shard $i applied round 3 once ($a; answered the close again without applying: $again)"
done
hist=$("$PSCTL" --coord "$COORD" --json round history)
jq -e '[.[] | select(.round > 0) | .round] == [range(1; 7)]' <<<"$hist" >/dev/null
ok $? "the history lists rounds 1 to 6 once each: $(jq -c '[.[] | select(.round > 0) | .round]' <<<"$hist")"
total=$(cat "$RUN"/psd-w1.log | grep -c 'msg="round aggregated"')
[ "$total" -eq 6 ]; ok $? "shard 1 aggregated 6 rounds, as many as the history lists ($total)"
eps=$("$PSCTL" --coord "$COORD" --json status | jq -r '.job.fed.epsilon')
want=$(rdp_reference "$NOISE" "$DELTA" $(rdp_rates "$hist" 0.6))
within "$eps" "$want" 1e-5
ok $? "epsilon $eps counts round 3 once: that of all 6 rounds (the reference gives $want)"
