#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checkpoints of federated jobs. A FedAdam job (server state: two moments per
# value) is saved between two rounds (psctl checkpoint save, and every 2
# rounds with --checkpoint-every) and runs to its end; restored onto another
# number of shards, it goes on from the checkpoint's round and ends with the
# same model as the uninterrupted run, bit for bit, its history holding every
# round once. A private job's checkpoint keeps the privacy spent. A fedasync
# job is saved between two buffers and restored. Each edge process starts
# once the one before it has registered, so that every run gives the same
# partition the same client id.
source "$(dirname "$0")/lib.sh"
CK="$RUN/checkpoints"
ROUNDS=8
JOB=(--mode fed --strategy fedadam --rounds $ROUNDS --fraction 1 --min-clients 3 --min-available 3
  --round-timeout 30 --local-epochs 2 --chunk-kb 16 --train-limit 12000 --test-limit 500)

# start_run TAG SHARDS [PSCOORD OPTIONS...]: pscoord and SHARDS shards of run TAG.
start_run() {
  local tag=$1 n=$2; shift 2
  COORD="ipc://$RUN/coord-$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" --checkpoint-dir "$CK" --shards "$n" "${JOB[@]}" "$@"
  start_shards "$tag" "$n"
}
# start_edges TAG: three edge processes, one after the other.
start_edges() {
  for k in 0 1 2; do
    psnet_start "edge-$1-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/3 --alpha 0.5
    psnet_wait_for 30 logs_match 'msg="registered"' "edge-$1-$k.log" || return 1
  done
}
# saved_then_restored TAG RTAG SHARDS N WHAT: run TAG saves auto-N (every N
# rounds) and stops; run RTAG restores it and finishes ($out).
saved_then_restored() {
  start_run "$1" "$3" --checkpoint-every "$4"
  start_edges "$1"; ok $? "three edge workers registered in turn"
  psnet_wait_for 60 logs_match "msg=\"checkpoint saved\" name=auto-$4 " "pscoord-$1.log"
  ok $? "$5 is saved after $4 rounds"
  psnet_stop_all
  start_run "$2" "$3" --restore "auto-$4"
  start_edges "$2"; ok $? "three edge workers registered in turn"
  out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "$5, restored, finishes ($out)"
}
digest_of() { sed -n 's/.*msg="job done".* weights=\([0-9a-f]*\).*/\1/p' "$RUN/pscoord-$1.log" | tail -1; }
rounds_in() { jq -c '[.[] | select(.round > 0) | .round]' <<<"$1"; }

# 1. The uninterrupted run, saved after round 1 or so, and every 2 rounds.
start_run a 2 --checkpoint-every 2 --checkpoint-keep 5
start_edges a; ok $? "three edge workers registered in turn"
psnet_wait_for 60 logs_match 'msg="round done" round=1/' 'pscoord-a.log'; ok $? "run a aggregates a round"
# A save asked while an automatic one is being written is refused with "wait
# for it": as an operator would, wait until that one is saved, then ask again.
save_mid() {
  local i busy
  for i in 1 2 3 4 5; do
    out=$("$PSCTL" --coord "$COORD" checkpoint save mid 2>&1) && return 0
    busy=$(sed -n 's/.*checkpoint \(auto-[0-9]*\) is being written.*/\1/p' <<<"$out")
    [ -n "$busy" ] || return 1
    psnet_wait_for 30 logs_match "msg=\"checkpoint saved\" name=$busy " 'pscoord-a.log' || return 1
  done
  return 1
}
save_mid; ok $? "psctl checkpoint save mid ($out)"
B=$(sed -n 's/.*saved: clock \([0-9]*\),.*/\1/p' <<<"$out")
[ -n "$B" ] && [ "$B" -ge 1 ] && [ "$B" -lt $ROUNDS ]; ok $? "cut after round $B, between two rounds"
[ -f "$CK/mid/MANIFEST" ] && [ -f "$CK/mid/shard-1.ckpt" ] && [ -f "$CK/mid/shard-2.ckpt" ]
ok $? "a manifest and one file per shard"
logs_match "msg=\"checkpoint written\" name=mid clock=$B " 'psd-a-1.log' &&
  ! logs_match 'msg="checkpoint refused"' 'psd-a-*.log'; ok $? "written by the shards with no round open"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "run a finishes ($out)"
want=$(digest_of a); [ -n "$want" ]; ok $? "its final model ($want)"
# Every 2 rounds from the last checkpoint, short of the last round: after mid
# (at B) at B + 2, B + 4, ...; before it, every 2 rounds from the start, since
# rounds may close between the wait for round 1 and the save of mid (auto-B
# itself may or may not precede mid: not looked at).
autos=$(cd "$CK" && ls -d auto-* 2>/dev/null | sort -t- -k2 -n | tr '\n' ' ')
after=$(for a in $autos; do r=${a#auto-}; [ "$r" -gt "$B" ] && printf '%s ' "$a"; done)
before=$(for a in $autos; do r=${a#auto-}; [ "$r" -lt "$B" ] && printf '%s ' "$a"; done)
[ "$after" = "$(for r in $(seq $((B + 2)) 2 $((ROUNDS - 1))); do printf 'auto-%s ' "$r"; done)" ] &&
  [ "$before" = "$(for r in $(seq 2 2 $((B - 1))); do printf 'auto-%s ' "$r"; done)" ]
ok $? "--checkpoint-every 2 saved every 2 rounds from the start and after mid (at $B), not after the last ($autos)"
list=$("$PSCTL" --coord "$COORD" checkpoint list); grep -qE "^mid +$B .*fed" <<<"$list"
ok $? "psctl checkpoint list shows mid, federated, at round $B"
psnet_stop_all

# 2. Restored onto three shards: rounds B+1.. run, the model ends the same.
start_run b 3
out=$("$PSCTL" --coord "$COORD" checkpoint restore mid 2>&1); ok $? "psctl checkpoint restore mid ($out)"
start_edges b; ok $? "three edge workers registered in turn"
psnet_wait_for 30 logs_match "msg=\"federated rounds from checkpoint\" name=mid rounds_done=$B " 'pscoord-b.log'
ok $? "pscoord takes the $B rounds done from the checkpoint"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the restored job finishes on three shards ($out)"
n=$(grep -c 'msg="round done"' "$RUN/pscoord-b.log")
[ "$n" -eq $((ROUNDS - B)) ]; ok $? "it ran the $((ROUNDS - B)) rounds left ($n)"
got=$(digest_of b)
[ -n "$got" ] && [ "$got" = "$want" ]; ok $? "final model identical to the uninterrupted run ($got = $want)"
hist=$("$PSCTL" --coord "$COORD" --json round history)
[ "$(rounds_in "$hist")" = "[$(seq -s, 1 $ROUNDS)]" ]; ok $? "the history holds rounds 1 to $ROUNDS once each ($(rounds_in "$hist"))"
psnet_stop_all

# 3. A private job: the checkpoint keeps the privacy spent; the restored job's
# epsilon is that of every round, before and after.
NOISE=1.1 DELTA=1e-5 CK="$RUN/checkpoints-private"
JOB=(--mode fed --rounds 4 --fraction 0.6 --min-clients 2 --min-available 3 --round-timeout 30 --chunk-kb 64
  --dp-clip 0.05 --dp-noise $NOISE --dp-delta $DELTA --train-limit 3000 --test-limit 500)
saved_then_restored c d 1 2 "a private job"
hist=$("$PSCTL" --coord "$COORD" --json round history)
[ "$(rounds_in "$hist")" = "[1,2,3,4]" ]; ok $? "its history holds rounds 1 to 4 ($(rounds_in "$hist"))"
eps=$("$PSCTL" --coord "$COORD" --json status | jq -r '.job.fed.epsilon')
want=$(rdp_reference "$NOISE" "$DELTA" $(rdp_rates "$hist" 0.6))
within "$eps" "$want" 1e-5; ok $? "epsilon $eps is that of all 4 rounds (the reference gives $want)"
psnet_stop_all

# 4. fedasync: saved between two buffers, restored, finished.
CK="$RUN/checkpoints-async"
JOB=(--mode fedasync --buffer 2 --rounds 6 --min-available 3 --round-timeout 30 --chunk-kb 64 --train-limit 3000
  --test-limit 500)
saved_then_restored e f 2 3 "a fedasync job"
n=$(grep -c 'msg="round done"' "$RUN/pscoord-f.log")
[ "$n" -eq 3 ]; ok $? "it applied the 3 buffers left ($n)"
# Runs c and e are stopped mid-job (their shards first, which fails their job).
! grep -q 'level=error' "$RUN"/pscoord-[abdf].log "$RUN"/psd-[abdf]-*.log; ok $? "no errors logged by the runs that finished"
