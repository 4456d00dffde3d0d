#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A replicated federated job (--replicas 2) survives the loss of a shard: each
# round's close copies the chunks it changed (values and the strategy's
# state) to their backups before the shard answers pscoord. The same job runs
# twice on three shards: undisturbed, and with one shard killed (-9) once
# round 3 is done, in the round after it. Killed, the shard's backups lead
# its chunks; the round it was in is dropped and runs again (or, caught
# closing, completes without it); the job ends with every round listed once,
# each shard having applied each round at most once, and an accuracy near
# the undisturbed run's. A private run with a shard killed the same way
# spends the epsilon of the rounds it lists, by the independent reference.
source "$(dirname "$0")/lib.sh"
ROUNDS=10 NOISE=1.1 DELTA=1e-5
JOB=(--mode fed --shards 3 --replicas 2 --rounds $ROUNDS --fraction 1 --min-clients 3 --min-available 4
  --round-timeout 10 --lease-ms 3000 --chunk-kb 64 --train-limit 8000 --test-limit 1000 --seed 7)
DP=(--dp-clip 0.05 --dp-noise $NOISE --dp-delta $DELTA)

run() {  # run TAG [kill [PSCOORD OPTIONS]]: the job on three shards and four clients; job wait's answer in $out
  local tag=$1 kill=${2:-}
  shift; [ $# -gt 0 ] && shift
  COORD="ipc://$RUN/coord-$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" "${JOB[@]}" "$@"
  for i in 1 2 3; do psnet_start "psd-$tag-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$tag-$i.sock" --coord "$COORD"; done
  for k in 0 1 2 3; do
    psnet_start "e-$tag-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/4 --round-timeout 5
  done
  if [ "$kill" = kill ]; then
    psnet_wait_for 90 logs_match 'msg="round done" round=3/' "pscoord-$tag.log"; ok $? "$tag: three replicated rounds done"
    local pid
    eval "pid=\$PID_psd_${tag}_2"
    kill -9 "$pid"; ok $? "$tag: shard 2 killed (-9) in round 4"
  fi
  out=$("$PSCTL" --coord "$COORD" job wait --wait 240)
}

run calm
ok $? "the undisturbed replicated job finishes ($out)"
acc_calm=$(acc_of "$out")
n=$(cat "$RUN"/psd-calm-*.log | grep -c 'msg="round copied to the backups" number=[0-9]* states=[1-9]')
[ "$n" -eq $((3 * ROUNDS)) ]; ok $? "each shard copied each round's chunks to its backup before answering ($n of $((3 * ROUNDS)))"
psnet_stop_all

run kill kill
ok $? "the job with a shard killed finishes ($out)"
acc_kill=$(acc_of "$out")
grep -q 'msg="fail-over" shard_id=2' "$RUN/pscoord-kill.log"; ok $? "pscoord fails shard 2 over to its backups"
path=$(grep -o 'msg="round dropped" number=[0-9]* reason="shard 2 was lost"\|msg="round closing without shard 2 (lost)" number=[0-9]*' \
  "$RUN/pscoord-kill.log" | head -1)
[ -n "$path" ]; ok $? "the round shard 2 was in is dropped and run again, or closed without it ($path)"
hist=$("$PSCTL" --coord "$COORD" --json round history)
jq -e "[.[] | select(.round > 0) | .round] == [range(1; $ROUNDS + 1)]" <<<"$hist" >/dev/null
ok $? "the history lists rounds 1 to $ROUNDS once each: $(jq -c '[.[] | select(.round > 0) | .round]' <<<"$hist")"
for i in 1 3; do
  dup=$(sed -n 's/.*msg="round aggregated" number=\([0-9]*\) .*/\1/p' "$RUN/psd-kill-$i.log" | sort | uniq -d | head -1)
  [ -z "$dup" ]; ok $? "shard $i applied each round once (twice: ${dup:-none})"
done
# The round after the fail-over trains from the copies: its clients' loss is
# the undisturbed run's (a third of the model back at its start would show).
loss_of() { sed -n "s/.*msg=\"round done\" round=4\/.* loss=\([0-9.]*\) .*/\1/p" "$RUN/pscoord-$1.log"; }
l4k=$(loss_of kill) l4c=$(loss_of calm)
within "${l4k:-0}" "${l4c:-0}" 0.05; ok $? "round 4 trains from the copies: loss $l4k against the undisturbed $l4c (within 5%)"
# Which three of the four clients close a round varies from run to run: six
# undisturbed runs under ASan ended between 0.768 and 0.781, the killed ones
# 0.005 lower on average (sd of the difference 0.006), and CI once saw a
# difference of exactly 0.020. Three points is five of those deviations; a
# third of the model reset in round 4 shows in round 4's loss above. The
# accuracies have three decimals: compared in thousandths, as integers.
awk -v a="${acc_kill:-0}" -v b="${acc_calm:-0}" \
  'BEGIN { d = int(a * 1000 + 0.5) - int(b * 1000 + 0.5); if (d < 0) d = -d; exit !(b > 0 && d <= 30) }'
ok $? "accuracy $acc_kill against the undisturbed run's $acc_calm (within 3 points)"
! grep -q 'level=error' "$RUN/pscoord-kill.log" "$RUN/psd-kill-1.log" "$RUN/psd-kill-3.log"
ok $? "pscoord and the surviving shards logged no error"
psnet_stop_all

run dp kill "${DP[@]}"
ok $? "a private job with a shard killed finishes ($out)"
hist=$("$PSCTL" --coord "$COORD" --json round history)
jq -e "[.[] | select(.round > 0) | .round] == [range(1; $ROUNDS + 1)]" <<<"$hist" >/dev/null
ok $? "its history lists rounds 1 to $ROUNDS once each"
eps=$("$PSCTL" --coord "$COORD" --json status | jq -r '.job.fed.epsilon')
want=$(rdp_reference "$NOISE" "$DELTA" $(rdp_rates "$hist" 1))
within "$eps" "$want" 1e-5; ok $? "epsilon $eps is that of the $ROUNDS rounds listed (the reference gives $want)"

