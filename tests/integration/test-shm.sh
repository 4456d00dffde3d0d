#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Same-host shared memory (common/net/shm.h): a worker on a shard's host hands
# it a sealed memfd once, then pushes and pulls through it. The same BSP job
# (cosine schedule) run with the workers' tensors in shared memory (pushed and
# pulled in place), with their own buffers copied through it (PSNET_SHM=copy),
# with frames (PSNET_SHM=off), in
# parts of one key (PSNET_PART_KIB=1: every push and pull of a round in several
# requests) in frames and through shared memory, and against shards started
# with --no-shm pulls bit-identical weights at every clock and ends with the
# same digest. Then, probed as a stranger on the same
# host would: bad hellos (an unsealed memfd, a file, a lying size, too much
# memory, no descriptor, garbage) are refused with the reason; requests that
# name no session, another worker's, bytes outside the memory, or NaNs in it
# are refused with the reason; the shard keeps serving and the job trains on.
source "$(dirname "$0")/lib.sh"

JOB=(--workers 2 --shards 2 --mode bsp --epochs 2 --lr-schedule cosine "${SUBSET[@]}")
# run TAG [PSD OPTIONS...]: the job on fresh daemons; job wait's answer in $out.
run() {
  local tag=$1 i; shift
  COORD="ipc://$RUN/coord-$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" "${JOB[@]}"
  for i in 1 2; do psnet_start "psd-$tag-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$tag-$i.sock" --coord "$COORD" "$@"; done
  for i in 1 2; do psnet_start "workerd-$tag-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
  out=$("$PSCTL" --coord "$COORD" job wait --wait 300)
}
digest_of() { sed -n 's/.*msg="job done".* weights=\([0-9a-f]*\).*/\1/p' "$RUN/pscoord-$1.log" | tail -1; }
extract() { sed -n 's/.*msg="pulled" clock=\([0-9]*\) checksum=\([0-9a-f]*\).*/\1 \2/p' "$1" | sort -k1,1; }
sessions() { cat "$RUN"/psd-"$1"-*.log | grep -c 'msg="shared memory session started"'; }
# same A B: the workers of runs A and B pulled the same weights at every clock.
same() {
  extract "$RUN/workerd-$1-1.log" >"$RUN/$1.sum"; extract "$RUN/workerd-$2-1.log" >"$RUN/$2.sum"
  joined=$(join "$RUN/$1.sum" "$RUN/$2.sum" | wc -l); diffs=$(join "$RUN/$1.sum" "$RUN/$2.sum" | awk '$2 != $3' | wc -l)
  [ "$joined" -ge 100 ] && [ "$diffs" -eq 0 ]
}

run on
ok $? "the BSP job through shared memory finishes ($out)"
accuracy_at_least "$out" 0.75; ok $? "and learns (accuracy >= 0.75 on the subset, 2 epochs)"
n=$(sessions on); [ "$n" -eq 4 ]; ok $? "each worker opened a session with each shard ($n sessions)"
grep -q "no shared memory" "$RUN"/workerd-on-*.log; ok $(( $? == 0 )) "no worker fell back to frames"
n=$(cat "$RUN"/workerd-on-*.log | grep -c 'msg="tensors in shared memory')
[ "$n" -eq 2 ]; ok $? "both workers' tensors lie in the memory they share ($n)"
logs_match 'msg="shared memory session ended" worker=[12] .*reason="the worker closed it"' 'psd-on-1.log'
ok $? "a worker that leaves ends its session"
want=$(digest_of on); psnet_stop_all

PSNET_SHM=copy run copy
ok $? "the same job with the workers' own buffers copied through shared memory (PSNET_SHM=copy) finishes ($out)"
n=$(sessions copy); [ "$n" -eq 4 ]; ok $? "through shared memory ($n sessions)"
n=$(cat "$RUN"/workerd-copy-*.log | grep -c 'msg="tensors in shared memory'); [ "$n" -eq 0 ]
ok $? "the tensors in the workers' own buffers ($n in shared memory)"
same on copy; ok $? "identical weights at every clock in place and copied ($joined clocks, $diffs differ)"
got=$(digest_of copy); [ -n "$got" ] && [ "$got" = "$want" ]; ok $? "the same final digest ($got = $want)"
psnet_stop_all

PSNET_SHM=off run off
ok $? "the same job in frames (PSNET_SHM=off) finishes ($out)"
n=$(sessions off); [ "$n" -eq 0 ]; ok $? "and opens no session ($n)"
same on off; ok $? "identical weights at every clock with and without shared memory ($joined clocks, $diffs differ)"
got=$(digest_of off); [ -n "$got" ] && [ "$got" = "$want" ]; ok $? "the same final digest ($got = $want)"
psnet_stop_all

PSNET_SHM=off PSNET_PART_KIB=1 run parts
ok $? "the same job in frames, a key a message (PSNET_PART_KIB=1), finishes ($out)"
same on parts; ok $? "identical weights at every clock with pushes and pulls in parts ($joined clocks, $diffs differ)"
got=$(digest_of parts); [ -n "$got" ] && [ "$got" = "$want" ]; ok $? "the same final digest ($got = $want)"
psnet_stop_all
parts=$(sed -n 's/.*msg="stopped" .* push_parts=\([0-9]*\) .*/\1/p' "$RUN"/psd-parts-1.log)
[ "${parts:-0}" -gt 0 ]; ok $? "shard 1 took pushes in parts (${parts:-none})"

PSNET_PART_KIB=1 run shmparts
ok $? "the same job through shared memory, a key a request, finishes ($out)"
n=$(sessions shmparts); [ "$n" -eq 4 ]; ok $? "through shared memory ($n sessions)"
same on shmparts; ok $? "identical weights at every clock ($joined clocks, $diffs differ)"
got=$(digest_of shmparts); [ -n "$got" ] && [ "$got" = "$want" ]; ok $? "the same final digest ($got = $want)"
psnet_stop_all
parts=$(sed -n 's/.*msg="stopped" .* push_parts=\([0-9]*\) .*/\1/p' "$RUN"/psd-shmparts-1.log)
[ "${parts:-0}" -gt 0 ]; ok $? "shard 1 took pushes in parts from shared memory (${parts:-none})"

run noshm --no-shm
ok $? "shards started with --no-shm serve the job in frames ($out)"
grep -q 'msg="shard [12]: no shared memory (' "$RUN/workerd-noshm-1.log"; ok $? "the worker says why it sends frames"
[ ! -e "$RUN/psd-noshm-1.sock.shm" ]; ok $? "and such a shard has no PATH.shm socket"
same on noshm; ok $? "identical weights at every clock ($joined clocks, $diffs differ)"
psnet_stop_all

# A stranger on the same host, against a shard serving an ASP job.
COORD="ipc://$RUN/coord.sock" SHARD="ipc://$RUN/psd-1.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 1 --shards 1 --mode asp --epochs 6 --lease-ms 20000 "${SUBSET[@]}"
psnet_start psd-1 "$PSD" --id 1 --listen "$SHARD" --coord "$COORD"
psnet_start workerd "$WORKERD" --coord "$COORD" --progress-ms 100
psnet_wait_for 30 grep -q 'msg="progress"' "$RUN/workerd.log"; ok $? "an ASP job trains through shared memory"
status() { "$PSCTL" --coord "$COORD" --json status; }
len=$(status | jq '[.job.chunk_floats, 200704] | min')
wid=$(status | jq '.workers[0].id')
[ -S "$RUN/psd-1.sock.shm" ] && [ "$(stat -c %a "$RUN/psd-1.sock.shm")" = "$(stat -c %a "$RUN/psd-1.sock")" ]
ok $? "the shard's PATH.shm socket has its data socket's permissions"

hello() { PSPOKE_SHM_CASE=$1 "$PSPOKE" "$SHARD" shm-hello; }
out=$(hello unsealed); grep -q "answer=.*not sealed against shrinking" <<<"$out"; ok $? "an unsealed memfd is refused ($out)"
out=$(hello file); grep -q "answer=.*no memfd on shmem" <<<"$out"; ok $? "a file is refused ($out)"
out=$(hello size); grep -q "answer=.*4096 bytes where the hello says 8192" <<<"$out"; ok $? "a lying size is refused ($out)"
out=$(hello huge); grep -q "answer=.*allowed" <<<"$out"; ok $? "more memory than a shard maps is refused ($out)"
out=$(hello nofd); grep -q "answer=a hello is one" <<<"$out"; ok $? "a hello without a memfd is refused ($out)"
out=$(hello garbage); grep -q "answer=a hello is one" <<<"$out"; ok $? "garbage is refused ($out)"

poke() { "$PSPOKE" "$SHARD" "$@" 1 "$len"; }
out=$(PSPOKE_SENDER=999 poke shm-push)
grep -q "status=stale .*worker 999 is not a member" <<<"$out"; ok $? "a stranger's push through its own session is refused before it is read ($out)"
out=$(PSPOKE_SHM_TOKEN=wrong PSPOKE_SENDER=$wid poke shm-push)
grep -q "status=invalid .*no shared-memory session of worker $wid" <<<"$out"; ok $? "a push naming no session is refused ($out)"
out=$(PSPOKE_SENDER=$wid PSPOKE_SHM_AS=$((wid + 1)) poke shm-pull)
grep -q "status=invalid .*no shared-memory session of worker $((wid + 1))" <<<"$out"
ok $? "a pull naming another worker's session is refused ($(tr '\n' ' ' <<<"$out"))"
out=$(PSPOKE_SENDER=$wid PSPOKE_SHM_OFFSET=4 poke shm-push)
grep -q "status=invalid .*outside the $((len * 4)) bytes of shared memory" <<<"$out"; ok $? "bytes outside the memory are refused ($out)"
out=$(PSPOKE_SENDER=$wid PSPOKE_VALUE=nan poke shm-push)
grep -q "status=not-finite" <<<"$out"; ok $? "NaNs in shared memory are refused like NaNs in frames ($out)"
out=$(PSPOKE_SENDER=$wid poke shm-pull)
grep -q "status=ok" <<<"$out" && [ "$(sed -n 's/^shm nonzero=\([0-9]*\) .*/\1/p' <<<"$out")" -gt $((len / 2)) ]
ok $? "a pull in shared memory writes the values there ($(tr '\n' ' ' <<<"$out"))"

# A member that writes NaNs into its shared memory while the shard reads its
# push: each is refused whole if the check sees them, or applied with them as
# 0 if only the copy does; the shard's values never hold one. The worker is
# paused meanwhile and the pushes take the clocks that follow its own (a
# shard refuses a push far ahead of the worker's last): a clock its own push
# had taken is answered duplicate and the next one tried.
kill -STOP "$PID_workerd"
c=$(status | jq '.workers[0].clock') answers="" bad=0 got=0 tries=0
while [ $got -lt 20 ] && [ $tries -lt 200 ]; do
  tries=$((tries + 1))
  out=$(PSPOKE_SENDER=$wid PSPOKE_CLOCK=$c PSPOKE_VALUE=0.001 PSPOKE_SHM_SCRIBBLE=1 poke shm-push)
  st=$(sed -n 's/.*status=\([a-z-]*\).*/\1/p' <<<"$out" | head -1)
  case $st in
    duplicate) c=$((c + 1)) ;;
    ok) answers="$answers ok" got=$((got + 1)) c=$((c + 1)) ;;
    not-finite) answers="$answers not-finite" got=$((got + 1)) ;;
    *) bad=1; answers="$answers [$out]"; break ;;
  esac
done
kill -CONT "$PID_workerd"
[ $bad -eq 0 ] && [ $got -eq 20 ]; ok $? "pushes scribbled with NaNs meanwhile are taken or refused, nothing else:$answers"
out=$(PSPOKE_SENDER=$wid poke shm-pull)
grep -q "status=ok" <<<"$out" && grep -q "nonfinite=0$" <<<"$out"
ok $? "and the shard's values hold no NaN ($(tr '\n' ' ' <<<"$out"))"
zeroed=$(grep -c 'non-finite values into its shared memory while its push was applied' "$RUN/psd-1.log")
echo "# pushes caught in the copy and applied with the NaNs as 0 (logged, at most once a second): $zeroed"

alive "$PID_psd_1"; ok $? "the shard keeps serving"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes ($out)"
accuracy_at_least "$out" 0.75; ok $? "not poisoned (accuracy >= 0.75)"
logs_match 'msg="refused shared memory" .*not sealed' 'psd-1.log'; ok $? "the shard logs each refused hello with its reason"
psnet_stop_all
