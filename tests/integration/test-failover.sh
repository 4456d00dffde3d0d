#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Replicated shards: every key lives on its primary and on a backup (--replicas
# 2, the default with two shards or more). The same BSP job runs three times on
# fresh daemons: undisturbed; with a primary killed (-9) mid-run, its backups
# taking over; with pscoord stopped (SIGSTOP) long enough for the shards' leases
# to run out. BSP is deterministic, so a push lost or applied twice changes the
# final weights: all three runs must end with the same weights digest. The
# undisturbed run's workers send their tensors in frames (PSNET_SHM=off), a
# key a message (PSNET_PART_KIB=1, forwarded to the backups part by part), the
# others through shared memory, so the digests also say that both carry the
# same pushes through a fail-over; so do two runs with --wire bf16, whose
# pushes reach the backups as bf16. Under
# ASP, with a shard killed, every key is updated exactly once per push. With
# three copies, two shards killed one after the other end the same. A job
# that keeps one copy fails at once, with the reason, when a shard dies.
source "$(dirname "$0")/lib.sh"

# Under --lr-schedule cosine every update's rate depends on the progress its
# pushes carried, so a backup that applied a forwarded push or a parked copy at
# another rate would change the digest too.
JOB=(--workers 2 --shards 3 --mode bsp --epochs 2 --batch 64 --lr-schedule cosine "${SUBSET[@]}")

# start_cluster TAG [JOB OPTIONS...]: pscoord, three shards (options PSD_ARGS) and two workers of run TAG.
PSD_ARGS=()
start_cluster() {
  local tag=$1; shift
  COORD="ipc://$RUN/coord-$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" "${JOB[@]}" "$@"
  for i in 1 2 3; do
    psnet_start "psd-$tag-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$tag-$i.sock" --coord "$COORD" "${PSD_ARGS[@]}"
  done
  for i in 1 2; do psnet_start "workerd-$tag-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
}
# digest_of TAG: the final weights' digest pscoord logged for run TAG.
digest_of() { sed -n 's/.*msg="job done".* weights=\([0-9a-f]*\).*/\1/p' "$RUN/pscoord-$1.log" | tail -1; }
pulled() { logs_match "msg=\"pulled\" clock=$2 " "workerd-$1-1.log"; }

# 1. Undisturbed, in frames, in parts.
PSNET_SHM=off PSNET_PART_KIB=1 start_cluster a
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "an undisturbed job with 3 shards finishes ($out)"
grep -q 'replicas=2' "$RUN/pscoord-a.log"; ok $? "two copies of every key by default with three shards"
want=$(digest_of a)
[ -n "$want" ]; ok $? "pscoord reports the final weights' digest ($want)"
logs_match 'msg="shared memory session started"' 'psd-a-*.log'; ok $(( $? == 0 )) "run a sent frames (no session)"
psnet_stop_all

# 2. A primary killed at clock 40: its backups lead from the next map on; the
# shard started again takes its place back.
start_cluster b
psnet_wait_for 60 pulled b 40; ok $? "run b trains to clock 40"
kill -KILL "$PID_psd_b_1"; ok $? "SIGKILL shard 1"
psnet_wait_for 10 logs_match 'msg="fail-over" shard_id=1' 'pscoord-b.log'; ok $? "pscoord fails shard 1 over to its backups"
# Started again with its id, shard 1 comes back empty and takes its old place.
psnet_start psd-b-1r "$PSD" --id 1 --listen "ipc://$RUN/psd-b-1.sock" --coord "$COORD"
psnet_wait_for 10 logs_match 'msg="shard takes a lost shard.s place" shard_id=1 ' 'pscoord-b.log'
ok $? "shard 1, started again, takes the lost shard's place in the map"
back() { "$PSCTL" --coord "$COORD" --json status |
         jq -e '.shards[] | select(.id == 1) | .in_map and .keys > 0 and .incoming == 0' >/dev/null; }
psnet_wait_for 30 back; ok $? "its keys arrive from their primaries (empty at first, never fresh values)"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes without shard 1 ($out)"
got=$(digest_of b)
[ -n "$got" ] && [ "$got" = "$want" ]; ok $? "final weights identical to the undisturbed run ($got = $want)"
logs_match 'msg="shared memory session started"' 'psd-b-*.log'; ok $? "run b's workers went through shared memory"
logs_match 'msg="chunk sent".*as=backup|moved_out=[1-9]' 'psd-b-*.log' || \
  logs_match 'map epoch=.* incoming=0' 'psd-b-[23].log'
ok $? "the survivors rebuilt the lost copies"
grep -q 'push not applied' "$RUN"/workerd-b-*.log; ok $(( $? == 0 )) "no push was refused for good"
psnet_stop_all

# 2b. Three copies of every key, two shards killed one after the other: the
# first kill takes a primary and a backup of every other key, the second
# leaves one shard holding the whole model; the weights are still the
# undisturbed run's.
start_cluster f --replicas 3
psnet_wait_for 60 pulled f 40; ok $? "run f (--replicas 3) trains to clock 40"
kill -KILL "$PID_psd_f_2"; ok $? "SIGKILL shard 2"
psnet_wait_for 10 logs_match 'msg="fail-over" shard_id=2' 'pscoord-f.log'; ok $? "its keys fail over"
c=$(sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' "$RUN/workerd-f-1.log" | tail -1)
psnet_wait_for 60 pulled f $((c + 40)); ok $? "training goes on to clock $((c + 40))"
kill -KILL "$PID_psd_f_3"; ok $? "SIGKILL shard 3"
psnet_wait_for 10 logs_match 'msg="fail-over" shard_id=3' 'pscoord-f.log'; ok $? "shard 1 leads every key"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes on one shard ($out)"
got=$(digest_of f)
[ -n "$got" ] && [ "$got" = "$want" ]; ok $? "final weights identical to the undisturbed run ($got = $want)"
grep -q 'push not applied' "$RUN"/workerd-f-*.log; ok $(( $? == 0 )) "no push was refused for good"
kill -TERM "$PID_psd_f_1" && psnet_wait_exit "$PID_psd_f_1" 3
ok $? "shard 1 stops at once: nothing held for the shards that left the map"
psnet_stop_all

# 2c. --wire bf16: a primary forwards the worker's bf16 frames to its
# backups (half the bytes) and each side widens them the same way: run g
# (frames, undisturbed) and run h (shared memory, a primary killed) end alike.
PSD_ARGS=(--http 127.0.0.1:0)
PSNET_SHM=off start_cluster g --wire bf16
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "an undisturbed --wire bf16 job finishes ($out)"
want16=$(digest_of g)
fwd_ok=0 fwd=""
for i in 1 2 3; do
  body=$(curl -s -m 5 "http://127.0.0.1:$(http_port psd-g-$i)/metrics")
  rx=$(awk '$1 == "psnet_psd_received_bytes_total" { print $2 }' <<<"$body")
  tx=$(awk '$1 == "psnet_psd_forwarded_bytes_total" { print $2 }' <<<"$body")
  fwd="$fwd $i:$rx/$tx"
  awk -v rx="${rx:-0}" -v tx="${tx:--1}" 'BEGIN { exit !(rx > 0 && rx == tx) }' || fwd_ok=1
done
ok $fwd_ok "each primary forwarded the bf16 bytes it received, not twice as many f32 (received/forwarded:$fwd)"
psnet_stop_all
PSD_ARGS=()
start_cluster h --wire bf16
psnet_wait_for 60 pulled h 40; ok $? "run h (--wire bf16, shared memory) trains to clock 40"
kill -KILL "$PID_psd_h_1"; ok $? "SIGKILL shard 1"
psnet_wait_for 10 logs_match 'msg="fail-over" shard_id=1' 'pscoord-h.log'; ok $? "its keys fail over"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the bf16 job finishes without shard 1 ($out)"
got=$(digest_of h)
[ -n "$got" ] && [ "$got" = "$want16" ]; ok $? "final weights identical to the undisturbed bf16 run ($got = $want16)"
psnet_stop_all

# 3. pscoord stopped: the shards' leases run out and they stop acknowledging;
# pscoord continued, nothing was lost (no fail-over: pscoord did not see them go).
start_cluster c
psnet_wait_for 60 pulled c 40; ok $? "run c trains to clock 40"
kill -STOP "$PID_pscoord_c"; ok $? "SIGSTOP pscoord"
for i in 1 2 3; do
  psnet_wait_for 10 grep -q 'not acknowledging' "$RUN/psd-c-$i.log"; ok $? "shard $i stops acknowledging once its lease ran out"
done
c_stop=$(sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' "$RUN/workerd-c-1.log" | tail -1)
kill -CONT "$PID_pscoord_c"; ok $? "SIGCONT pscoord"
psnet_wait_for 10 logs_match 'lease held again' 'psd-c-1.log'; ok $? "shard 1 acknowledges again"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes ($out)"
grep -q 'msg="fail-over"' "$RUN/pscoord-c.log"; ok $(( $? == 0 )) "no fail-over: pscoord did not run, so it saw no shard go"
got=$(digest_of c)
[ -n "$got" ] && [ "$got" = "$want" ]; ok $? "final weights identical to the undisturbed run ($got = $want; stopped at clock $c_stop)"
psnet_stop_all

# 4. ASP: pushes are applied as they come, so the weights depend on timing;
# instead every push is counted: each key led by a shard must have been updated
# exactly once per push the workers made (one per clock each), kill or not.
JOB=(--workers 2 --shards 3 --mode asp --epochs 2 --batch 64 "${SUBSET[@]}")
start_cluster e
psnet_wait_for 60 pulled e 40; ok $? "run e (ASP) trains to clock 40"
kill -KILL "$PID_psd_e_2"; ok $? "SIGKILL shard 2"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the ASP job finishes without shard 2 ($out)"
pushes=$(sed -n 's/.*msg="worker finished training" worker=[0-9]* clock=\([0-9]*\).*/\1/p' "$RUN/pscoord-e.log" |
         awk '{ s += $1 } END { print s + 0 }')
counted() { "$PSCTL" --coord "$COORD" --json status |
            jq -e --argjson n "$pushes" '[.shards[] | select(.in_map)] | length == 2 and
                                         all(.min_steps == $n and .max_steps == $n)'; }
psnet_wait_for 10 counted
ok $? "every key was updated once per acknowledged push: $pushes, none lost, none twice ($("$PSCTL" --coord "$COORD" --json status | jq -c '[.shards[] | select(.in_map) | [.id, .min_steps, .max_steps]]'))"
psnet_stop_all

# 5. One copy of each key: a dead shard's keys are gone, and the job says so at once.
JOB=(--workers 2 --shards 3 --mode bsp --epochs 2 --batch 64 "${SUBSET[@]}")
start_cluster d --replicas 1
psnet_wait_for 60 pulled d 20; ok $? "run d (--replicas 1) trains to clock 20"
kill -KILL "$PID_psd_d_2"; ok $? "SIGKILL shard 2"
psnet_wait_for 10 sh -c "'$PSCTL' --coord '$COORD' --json status | grep -q '\"state\":\"failed\"'"
ok $? "the job fails within seconds, not after a time-out"
"$PSCTL" --coord "$COORD" --json status | grep -q 'only copy of key.*--replicas'
ok $? "the reason names the lost key and --replicas"
psnet_wait_exit "$PID_workerd_d_1" 5 && psnet_wait_exit "$PID_workerd_d_2" 5
ok $? "the workers leave on their own, their step with the dead shard given up (not at --round-timeout)"
