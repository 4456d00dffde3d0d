#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Limits and membership, checked where messages arrive, probed as an attacker on
# the same host would: a push of NaNs from a stranger and from a member, pushes
# that say the job is at a progress outside 0..1 (its learning rate's input),
# a member's push for clock 2^40, a member's finite push of 3e38 gradients
# (--max-grad-norm), connections that begin a message and go silent (and the
# memory they held), a
# federated update's int8 and top-k frames pushed to a training job, a 1 GiB frame, one push of 20 x 100 MiB frames, big frames at pscoord, 20,000
# pulls for clock 2^40 (a bounded log of them), 2,000 connections at a hard limit of 1024 descriptors,
# registering under a live shard's id, a worker that heartbeats but never
# pushes (BSP), and a model bigger than the shards' memory. Each gets a bound
# and a clear error, the daemons keep serving, and the model is not poisoned.
source "$(dirname "$0")/lib.sh"

rss_mb() { awk '/VmRSS/ { print int($2 / 1024) }' "/proc/$1/status"; }
# rss_below PID MIB: the process's resident memory is under MIB (for psnet_wait_for).
rss_below() { [ "$(rss_mb "$1")" -lt "$2" ]; }
# Under AddressSanitizer freed memory waits in a quarantine (256 MiB by default),
# which the memory checks below would count: keep it small.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=4"
# Starts a daemon with a limit of 1024 open files, soft and hard: it cannot raise it.
start_low() { local name=$1; shift; psnet_start "$name" bash -c 'ulimit -n 1024 && exec "$@"' _ "$@"; }

COORD="ipc://$RUN/coord.sock" SHARD="ipc://$RUN/psd-1.sock"
start_low pscoord "$PSCOORD" --listen "$COORD" --workers 1 --shards 1 --mode asp --epochs 6 "${SUBSET[@]}" \
  --max-grad-norm 1000 --idle-timeout 2
start_low psd-1 "$PSD" --id 1 --listen "$SHARD" --coord "$COORD" --http 127.0.0.1:0 --idle-timeout 2
psnet_start workerd "$WORKERD" --coord "$COORD" --progress-ms 100
psnet_wait_for 30 grep -q 'msg="progress"' "$RUN/workerd.log"; ok $? "an ASP job trains"
status() { "$PSCTL" --coord "$COORD" --json status; }
len=$(status | jq '[.job.chunk_floats, 200704] | min')
wid=$(status | jq '.workers[0].id')

out=$(PSPOKE_SENDER=999 "$PSPOKE" "$SHARD" push-nan 1 "$len")
grep -q "status=stale .*worker 999 is not a member" <<<"$out"; ok $? "a stranger's push of NaNs is refused, not applied ($out)"
out=$(PSPOKE_SENDER=$wid "$PSPOKE" "$SHARD" push-nan 1 "$len")
grep -q "status=not-finite .*holds NaN or infinity" <<<"$out"; ok $? "a member's push of NaNs is refused whole ($out)"
out=$(PSPOKE_SENDER=$wid PSPOKE_BF16=1 "$PSPOKE" "$SHARD" push-nan 1 "$len")
grep -q "status=not-finite .*holds NaN or infinity" <<<"$out"; ok $? "and as bf16 (--wire bf16) too ($out)"
for p in nan 2.5 -1; do
  out=$(PSPOKE_SENDER=$wid PSPOKE_PROGRESS=$p PSPOKE_VALUE=100 "$PSPOKE" "$SHARD" push-value 1 "$len")
  grep -q "status=invalid .*progress $p is not a share of the job (0 to 1)" <<<"$out"
  ok $? "a member's push that says it is at progress $p is refused, not applied ($out)"
done
# Frames a federated update may carry are not a training job's: an int8 frame
# (4 + len bytes) read as len floats would run past its end.
for codec in int8 topk; do
  out=$(PSPOKE_SENDER=$wid PSPOKE_CODEC=$codec PSPOKE_VALUE=100 "$PSPOKE" "$SHARD" push-value 1 "$len")
  grep -q "status=invalid .*codec $codec on a push of a training job" <<<"$out"
  ok $? "a member's push of $codec frames to a dense job is refused, not applied ($out)"
done
# A member's push for clock 2^40 would make each of its later pushes a
# duplicate here, dropped: refused, counted.
out=$(PSPOKE_SENDER=$wid PSPOKE_CLOCK=1099511627776 PSPOKE_VALUE=0.001 "$PSPOKE" "$SHARD" push-value 1 "$len")
grep -q "status=invalid .*push for clock 1099511627776 is [0-9]* clocks ahead of worker $wid's last push of key (0,0)" <<<"$out"
ok $? "a member's push for clock 2^40 is refused, not applied ($out)"
# A member's finite gradients of 3e38 would wreck the model (loss 2.30259 for
# good): refused by the job's --max-grad-norm, counted.
out=$(PSPOKE_SENDER=$wid PSPOKE_VALUE=3e38 "$PSPOKE" "$SHARD" push-value 1 "$len")
grep -q "status=invalid .*an L2 norm of .*e+[0-9]*, above the job's --max-grad-norm 1000" <<<"$out"
ok $? "a member's push of finite 3e38 gradients is refused under --max-grad-norm 1000 ($out)"
port=$(sed -n 's/.*msg="serving http" address=[^ ]* port=\([0-9]*\).*/\1/p' "$RUN/psd-1.log" | head -1)
curl -sf "http://127.0.0.1:$port/metrics" | grep -q '^psnet_psd_refused_total{reason="grad_norm"} 1$'
ok $? "and counted in psnet_psd_refused_total{reason=\"grad_norm\"}"
dups() { curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "psnet_psd_duplicate_pushes_total" { print $2 }'; }
steps0=$(status | jq '.workers[0].clock') dup0=$(dups)
psnet_wait_for 30 bash -c "[ \$(\"$PSCTL\" --coord \"$COORD\" --json status | jq '.workers[0].clock') -gt $((steps0 + 20)) ]"
dup1=$(dups)
[ -n "$dup0" ] && [ "$dup0" = "$dup1" ]
ok $? "the worker's own pushes go on being applied, none taken for duplicates (clock $steps0 -> $(status | jq '.workers[0].clock'), duplicates $dup0 -> $dup1)"
alive "$PID_psd_1"; ok $? "and the shard serves on"

rss0=$(rss_mb "$PID_psd_1")
out=$(PSPOKE_WAIT_MS=1000 "$PSPOKE" "$SHARD" huge 1 "$len"); ok $(( $? != 3 )) "a 1 GiB frame gets no answer: the connection is dropped"
psnet_wait_for 5 grep -q 'connection closed (the peer left, or sent a frame over the limit of [0-9]* bytes)' "$RUN/psd-1.log"
ok $? "psd logs the drop with its frame limit"
out=$(PSPOKE_WAIT_MS=1000 PSPOKE_COUNT=20 "$PSPOKE" "$SHARD" frames 1 26214400); ok $(( $? != 3 )) "one push of 20 x 100 MiB frames is dropped"
rss1=$(rss_mb "$PID_psd_1")
[ $((rss1 - rss0)) -lt 150 ]; ok $? "psd's memory stayed put (${rss0} -> ${rss1} MiB)"
out=$("$PSPOKE" "$SHARD" pull 1 "$len"); grep -q "type=2 status=ok" <<<"$out"; ok $? "psd still serves a pull"

rss0=$(rss_mb "$PID_pscoord")
out=$(PSPOKE_WAIT_MS=1000 PSPOKE_COUNT=40 "$PSPOKE" "$COORD" frames 1 76800); ok $(( $? != 3 )) "40 frames of 300 KiB to pscoord: dropped (control messages are small)"
rss1=$(rss_mb "$PID_pscoord")
[ $((rss1 - rss0)) -lt 50 ]; ok $? "pscoord's memory stayed put (${rss0} -> ${rss1} MiB)"
out=$("$PSPOKE" "$COORD" status); grep -q "type=21 status=ok" <<<"$out"; ok $? "pscoord still answers"
out=$(PSPOKE_WAIT_MS=1000 "$PSPOKE" "$COORD" huge 1 "$len"); ok $(( $? != 3 )) "a 1 GiB frame to pscoord gets no answer: the connection is dropped"
psnet_wait_for 5 grep -q 'connection closed (the peer left, or sent a frame over the control limit of 262144 bytes)' "$RUN/pscoord.log"
ok $? "pscoord logs the drop with its frame limit (before: nothing)"
# One message of many frames, each under the frame limit: libzmq hands a
# message over only once it is whole, so it was read whole before it could
# be refused (a 2,000-frame message of 458 MiB took pscoord from 18 to
# 2,090 MiB). The daemons now follow the frames' sizes as they arrive and drop
# the connection as soon as the message begun passes their bound (pscoord
# 1 MiB; psd its job's model and state twice over, and twice --max-msg): the
# peak stays put. A message under the bound that is not the job's is refused
# with a reason, and what it held goes back to the system.
hwm_mb() { awk '/VmHWM/ { print int($2 / 1024) }' "/proc/$1/status"; }
stall=$PSNET_SRC/tests/integration/zmtp-stall.py
hwm0=$(hwm_mb "$PID_pscoord")
out=$(python3 "$stall" --message "$COORD" 480000000 240000)
[[ $out == closed* ]] && awk '{ exit !($2 < 16 * 1048576) }' <<<"$out"
ok $? "one message of 2,000 frames of 234 KiB to pscoord (458 MiB) is dropped before 16 MiB of it are sent ($out)"
hwm1=$(hwm_mb "$PID_pscoord")
[ $((hwm1 - hwm0)) -lt 30 ]; ok $? "and pscoord's peak memory stayed put (${hwm0} -> ${hwm1} MiB)"
grep -q 'dropped a connection: it began a message larger than this daemon takes .* bound=1048576' "$RUN/pscoord.log"
ok $? "pscoord logs the drop with its bound"
rss0=$(rss_mb "$PID_pscoord")
out=$(PSPOKE_WAIT_MS=20000 PSPOKE_COUNT=3 "$PSPOKE" "$COORD" frames 1 60000)
grep -q "status=malformed .*carries 3 payload frames" <<<"$out"
ok $? "a message of 3 frames of 234 KiB to pscoord (under the bound) is refused with a reason ($out)"
bound=$(curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "psnet_message_bound_bytes" { print $2 }')
[ -n "$bound" ] && [ "$bound" -gt $((32 << 20)) ] && [ "$bound" -lt $((64 << 20)) ]
ok $? "psd's bound follows its job and --max-msg (psnet_message_bound_bytes $bound)"
hwm0=$(hwm_mb "$PID_psd_1")
out=$(python3 "$stall" --message "$SHARD" 536870912 8388608)
[[ $out == closed* ]] && awk -v b="$bound" '{ exit !($2 <= b + 16 * 1048576) }' <<<"$out"
ok $? "one push of 64 frames of 8 MiB to psd (512 MiB) is dropped once past the bound ($out)"
hwm1=$(hwm_mb "$PID_psd_1")
[ $((hwm1 - hwm0)) -lt 120 ]; ok $? "and psd's peak memory grew by less than the bound and a little (${hwm0} -> ${hwm1} MiB)"
curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "psnet_connections_dropped_total" && $2 >= 1 { f = 1 } END { exit !f }'
ok $? "counted in psd's psnet_connections_dropped_total"
rss0=$(rss_mb "$PID_psd_1")
out=$(PSPOKE_WAIT_MS=20000 PSPOKE_COUNT=4 "$PSPOKE" "$SHARD" frames 1 2097152)
grep -q "status=malformed .*carries 4 payload frames" <<<"$out"
ok $? "one push of 4 frames of 8 MiB to psd (under the bound, each frame under --max-msg) is refused with a reason ($out)"
psnet_wait_for 10 rss_below "$PID_psd_1" $((rss0 + 100))
ok $? "and psd's memory returns to within 100 MiB of where it was (${rss0} -> $(rss_mb "$PID_psd_1") MiB)"
# ZMTP 1.0 frames otherwise, and libzmq still speaks it: a peer that does is
# dropped, since its messages could not be bounded.
for ep in "$SHARD" "$COORD"; do
  out=$(python3 "$stall" --zmtp1 "$ep" 5); ok $? "a ZMTP 1.0 peer of ${ep##*/} is dropped ($out)"
done

# A message begun and never finished (1,000 bytes of a 100 KiB frame, under
# both frame limits, then silence) is dropped after --idle-timeout 2 s (the
# first ping 0.67 s in, 2 s to answer), by psd and by pscoord; the worker's
# own connections, idle between requests, stay (the job finishes below).
for ep in "$SHARD" "$COORD"; do
  out=$(python3 "$stall" "$ep" 20)
  [[ $out == closed* ]] && awk '{ exit !($2 >= 2 && $2 < 10) }' <<<"$out"
  ok $? "a half-sent frame to ${ep##*/} is dropped after the idle timeout ($out)"
done
# A message that comes a 16-byte frame every quarter second keeps the idle
# time-out from firing (each whole frame counts as traffic): held for good
# before, growing. Past --idle-timeout it must have come at 4 KiB a second,
# else it is dropped at its next bytes.
for ep in "$SHARD" "$COORD"; do
  out=$(python3 "$stall" --trickle "$ep" 20)
  [[ $out == closed* ]] && awk '{ exit !($2 >= 2 && $2 < 10) }' <<<"$out"
  ok $? "a message trickled a frame at a time to ${ep##*/} is dropped after the idle timeout ($out)"
done
# 200 of them, each a 4 MiB frame begun: what psd held for them (about 2 MiB
# each where pages are huge) goes back to the system once they are dropped
# (jemalloc keeps freed pages otherwise: 650 MiB stayed before).
rss0=$(rss_mb "$PID_psd_1")
out=$(python3 "$stall" "$SHARD" 30 200 4194304)
ok $? "200 half-sent 4 MiB frames to psd are all dropped ($out)"
psnet_wait_for 10 rss_below "$PID_psd_1" $((rss0 + 100))
ok $? "and psd's memory returns to within 100 MiB of where it was (${rss0} -> $(rss_mb "$PID_psd_1") MiB)"


# 2,000 connections where 1,024 descriptors are all there is: before, libzmq
# aborted both daemons (Too many open files (src/ipc_listener.cpp:325)). Past
# the budget (896 here) connections are closed as they are accepted; the
# probe connected first, and the job's own connections, are served.
out=$(PSPOKE_COUNT=2000 "$PSPOKE" "$SHARD" flood 1 "$len"); ok $? "2,000 connections to psd at ulimit -n 1024, and it answers ($out)"
out=$(PSPOKE_COUNT=2000 "$PSPOKE" "$COORD" flood); ok $? "2,000 connections to pscoord, and it answers ($out)"
alive "$PID_psd_1" && alive "$PID_pscoord"; ok $? "both are still running"
for d in psd-1 pscoord; do
  grep -q 'msg="refused a connection: past the connection budget .* budget=896 limit=1024' "$RUN/$d.log"
  ok $? "$d logs the connections it refused past its budget, with the budget and the limit"
  n=$(grep -c 'msg="refused a connection' "$RUN/$d.log")
  [ "$n" -lt 200 ]; ok $? "$d's log of them is bounded ($n lines)"
done
m=$(curl -sf "http://127.0.0.1:$port/metrics")
grep -q '^psnet_connections_refused_total [1-9]' <<<"$m" && grep -q '^psnet_connection_budget 896$' <<<"$m"
ok $? "psd counts them in /metrics ($(grep '^psnet_connections_refused_total' <<<"$m"))"

# Another psd taking shard 1's id while shard 1 lives: refused, shard 1 stays.
out=$("$PSD" --id 1 --listen "ipc://$RUN/impostor.sock" --coord "$COORD" --connect-timeout 3 2>&1); rc=$?
ok $(( rc == 0 )) "a second psd --id 1 gives up (exit $rc)"
grep -q "shard id 1 is held by a live shard at $SHARD" <<<"$out"; ok $? "and says which shard holds the id"
status | jq -e ".shards | length == 1 and .[0].endpoint == \"$SHARD\"" >/dev/null; ok $? "shard 1 kept its place"
grep -q 'shard re-registered' "$RUN/pscoord.log"; ok $(( $? == 0 )) "shard 1 never flapped"

out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job finishes ($out)"
accuracy_at_least "$out" 0.70; ok $? "and the model was not poisoned"
grep -q 'push refused\|refused request' "$RUN/workerd.log"; ok $(( $? == 0 )) "the real worker saw none of it"
psnet_stop_all

# BSP with a worker that heartbeats but never pushes: evicted after --stall-timeout.
COORD="ipc://$RUN/coord2.sock"
psnet_start pscoord2 "$PSCOORD" --listen "$COORD" --workers 2 --shards 1 --mode bsp --epochs 3 --stall-timeout 3 \
  "${SUBSET[@]}"
psnet_start psd2 "$PSD" --id 1 --listen "ipc://$RUN/psd2.sock" --coord "$COORD"
# The good worker's steps take 15 ms at least (workerd's test knob), so that
# the job is still running (about 8 s) when a newcomer registers after the
# eviction below.
psnet_start good "$WORKERD" --coord "$COORD" --progress-ms 200 --step-delay-ms 15
psnet_start stuck "$WORKERD" --coord "$COORD" --step-delay-ms 600000
psnet_wait_for 30 grep -q 'msg="progress"' "$RUN/good.log"; ok $? "a BSP job with a worker that never pushes"
status2() { "$PSCTL" --coord "$COORD" --json status; }
len=$(status2 | jq '[.job.chunk_floats, 200704] | min')
gid=$(status2 | jq ".workers[] | select(.pid == $PID_good) | .id")
out=$(PSPOKE_SENDER=$gid PSPOKE_COUNT=20000 "$PSPOKE" "ipc://$RUN/psd2.sock" pull-future 1 "$len")
grep -q "answered=20000 of 20000 invalid=20000 .*clocks ahead" <<<"$out"; ok $? "20,000 pulls for clock 2^40 are refused, none parked ($out)"
# One peer's refusals for one reason get 5 lines a second (20 for all peers
# together): the rest of the second is left to the others' (test-metrics).
lines=$(grep -c 'msg="refused request"' "$RUN/psd2.log")
[ "$lines" -gt 0 ] && [ "$lines" -lt 2000 ] &&
  grep -q 'msg="more refused requests than 5 in a second from one peer for one reason: the rest of this second.s from it are left out of this log' "$RUN/psd2.log"
ok $? "the shard's log holds $lines refusal lines for them, not 20,000, and says the rest are left out"
parked=$(status2 | jq '.shards[0].parked'); [ "$parked" -le 4 ]; ok $? "the shard holds $parked parked pulls"
psnet_wait_for 30 grep -q 'msg="evicted a worker the others waited on for [0-9]* s (--stall-timeout 3 s)"' \
  "$RUN/pscoord2.log"; ok $? "pscoord evicts the worker the others wait on, saying why"
# Each newcomer that never pushes would stall the members for --stall-timeout
# again: a stream of them (new processes, or one stolen key) would hold the job
# still. After the job's k-th eviction new workers wait --stall-timeout x
# 2^(k-1) (here 3 s from the eviction) and are told so; workers that were
# members register again as before.
out=$("$PSPOKE" "$COORD" register-worker)
grep -q "status=resource .*job 1 evicted 1 worker that stalled the others; new workers are admitted again in [1-3] s" <<<"$out"
ok $? "a new worker right after the eviction is told to wait ($out)"
psnet_wait_exit "$PID_stuck" 20; ok $? "the evicted worker is not let back in: it stops"
grep -q 'was evicted from job 1' "$RUN/stuck.log"; ok $? "and says why"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job goes on and finishes ($out)"
psnet_stop_all

# A model bigger than the shards' memory: the job fails before it starts, saying why.
COORD="ipc://$RUN/coord3.sock"
big=mlp:65536-65536-65536-65536-65536-65536-65536-65536-65536-65536-65536-65536-65536-65536-65536-10
psnet_start pscoord3 "$PSCOORD" --listen "$COORD" --workers 1 --shards 1 --model "$big"
psnet_start psd3 "$PSD" --id 1 --listen "ipc://$RUN/psd3.sock" --coord "$COORD" --memory-limit $((1 << 30))
psnet_start w3 "$WORKERD" --coord "$COORD"
out=$("$PSCTL" --coord "$COORD" job wait --wait 30); rc=$?
ok $(( rc == 0 )) "a 224 GiB model on a 1 GiB shard: the job fails ($out)"
grep -q 'state=failed reason="the model needs .* [KMGT]iB of values and optimizer state; shard 1 would hold' <<<"$out"; ok $? "psctl says why"
psnet_wait_exit "$PID_w3" 10; ok $? "the worker leaves"
wait "$PID_w3"; ok $(( $? == 0 )) "with a non-zero exit"
out=$("$PSCTL" --coord "$COORD" job submit --model "$big" 2>&1); ok $(( $? == 0 )) "submitting it again is refused at once"
grep -q "resource" <<<"$out"; ok $? "as a resource error ($out)"
