#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Federated rounds (mode fed) with real edge processes: rounds sample,
# aggregate and reach an accuracy bar on the CI subset; a sampled client that
# stops does not hang a round (it closes at --round-timeout, the client is
# reported dropped, its update comes late and is refused with a reason); too
# few updates make the round run again with a fresh sample; psctl round
# status/history (with the model tested every 4 rounds, --eval-every); a
# worker (not an edge) is refused by a federated job; an edge told to stop
# mid-pull leaves at once; virtual clients behind slow links pull side by
# side, into pull buffers, while the process's one model trains.
source "$(dirname "$0")/lib.sh"
COORD="ipc://$RUN/coord.sock"

# 1. Ten edge processes, Dirichlet(0.5) split, FedAvg, every round samples 6.
psnet_start pscoord "$PSCOORD" --listen "$COORD" --mode fed --shards 2 --rounds 12 --fraction 0.6 --min-clients 3 \
  --min-available 10 --round-timeout 30 --local-epochs 1 --lr 0.05 --chunk-kb 64 --eval-every 4 "${SUBSET[@]}"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD"; done
for k in 0 1 2 3 4 5 6 7 8 9; do
  psnet_start "edge-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/10 --alpha 0.5
done
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "a federated job of 10 edge processes finishes ($out)"
accuracy_at_least "$out" 0.70; ok $? "12 FedAvg rounds on a Dirichlet(0.5) split reach >= 0.70 on the subset"
n=$(grep -c 'msg="round done"' "$RUN/pscoord.log")
[ "$n" -eq 12 ]; ok $? "pscoord aggregated 12 rounds ($n)"
grep -q 'msg="round done" round=12/12 number=[0-9]* answered=6 sampled=6' "$RUN/pscoord.log"
ok $? "each round sampled ceil(0.6 x 10) = 6 clients and counted their 6 updates"
n=$(grep -h 'msg="round aggregated"' "$RUN"/psd-1.log | grep -c 'clients=6 ')
[ "$n" -eq 12 ]; ok $? "shard 1 aggregated every round over the 6 updates ($n)"
hist=$("$PSCTL" --coord "$COORD" --json round history)
[ "$(jq length <<<"$hist")" -eq 12 ] && [ "$(jq '[.[] | select(.round > 0)] | length' <<<"$hist")" -eq 12 ]
ok $? "psctl round history lists the 12 rounds"
jq -e 'all(.[]; .loss > 0 and .seconds > 0 and .sampled == 6)' <<<"$hist" >/dev/null
ok $? "every round has its loss, seconds and sample size"
final=$(sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p' <<<"$out")
jq -e --argjson f "${final:-0}" '[.[] | select(.accuracy != null) | .round] == [4, 8, 12] and
  (.[-1].accuracy - $f | fabs) < 1e-4 and all(.[] | select(.accuracy != null); .accuracy > 0.1)' <<<"$hist" >/dev/null
ok $? "round history: the model tested after rounds 4 and 8 (--eval-every 4) and the final one at 12 ($(jq -c '[.[] | .accuracy]' <<<"$hist"))"
for k in 0 1 2 3 4 5 6 7 8 9; do psnet_wait_exit "$(eval echo \$PID_edge_$k)" 20 || break; done; ok $? "the edge workers leave when the job is done"
grep -q 'msg="ready" partition=3/10 images=[0-9]* alpha=dirichlet' "$RUN/edge-3.log"; ok $? "each edge worker keeps its own partition"
psnet_stop_all

# 2. A client that stops mid-round: the round closes at --round-timeout with
# the others' updates; its update, sent after it resumes, is refused as late.
# Rounds take about 40 ms here: 30 of them, so that some are left when the
# stop lands (with 4, all could end between the poll and the stop).
COORD="ipc://$RUN/coord2.sock"
psnet_start pscoord2 "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds 30 --fraction 1 --min-clients 2 \
  --min-available 3 --round-timeout 3 --lease-ms 20000 --chunk-kb 64 --train-limit 3000 --test-limit 500
psnet_start psd2 "$PSD" --id 1 --listen "ipc://$RUN/psd2.sock" --coord "$COORD"
for k in 0 1 2; do psnet_start "e2-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/3; done
psnet_wait_for 30 logs_match 'msg="round done" round=1/30' 'pscoord2.log'; ok $? "the rounds run"
kill -STOP "$PID_e2_2"
psnet_wait_for 30 logs_match 'msg="round closing" .*why="--round-timeout"' 'pscoord2.log'
ok $? "a round with a stopped client closes at --round-timeout"
psnet_wait_for 10 logs_match 'msg="round done" .*answered=2 sampled=3 dropped=1' 'pscoord2.log'
ok $? "it counts the two updates that came and reports the stopped client dropped"
kill -CONT "$PID_e2_2"
psnet_wait_for 30 logs_match 'msg="update not counted" .*reason="round [0-9]+ closed before this update came' 'e2-2.log'
ok $? "the resumed client's update is refused as late, with a reason"
psnet_wait_for 10 logs_match 'msg="late update" edge=' 'pscoord2.log'; ok $? "pscoord counts it late"
"$PSCTL" --coord "$COORD" --json round history | jq -e 'any(.[]; .late >= 1 and .dropped == 1 and .answered == 2)' >/dev/null
ok $? "psctl round history shows the round with 2 answered, 1 dropped, 1 late"
out=$("$PSCTL" --coord "$COORD" job wait --wait 120); ok $? "the job finishes ($out)"
psnet_stop_all

# 3. Too few clients answer: the round runs again with a fresh sample. Forty
# rounds of ~20 ms on a fast machine: some are left when the stop lands (two
# could both end between the poll and the stop).
COORD="ipc://$RUN/coord3.sock"
psnet_start pscoord3 "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds 40 --fraction 1 --min-clients 2 \
  --min-available 2 --round-timeout 2 --lease-ms 20000 --chunk-kb 64 --train-limit 3000 --test-limit 500
psnet_start psd3 "$PSD" --id 1 --listen "ipc://$RUN/psd3.sock" --coord "$COORD"
for k in 0 1; do psnet_start "e3-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/2; done
psnet_wait_for 30 logs_match 'msg="sampled"' 'e3-1.log'; ok $? "a round samples both clients"
kill -STOP "$PID_e3_1"
psnet_wait_for 30 logs_match 'msg="round failed" .*1 of the 2 updates it needs' 'pscoord3.log'
ok $? "with 1 of the 2 updates it needs, the round fails and says why"
psnet_wait_for 10 logs_match 'msg="round dropped"' 'psd3.log'; ok $? "the shard drops the round's updates"
"$PSCTL" --coord "$COORD" --json round status | jq -e '.failed >= 1' >/dev/null; ok $? "psctl round status counts it"
kill -CONT "$PID_e3_1"
out=$("$PSCTL" --coord "$COORD" job wait --wait 120); ok $? "the rounds run again and the job finishes ($out)"
# A training worker cannot join a federated job.
out=$("$WORKERD" --coord "$COORD" --connect-timeout 5 2>&1); [ $? -ne 0 ]; ok $? "workerd without --edge is refused"
grep -q 'edge workers' <<<"$out"; ok $? "with a reason ($(grep -o 'reason="[^"]*"' <<<"$out" | head -1))"
psnet_stop_all

# 4. One process, eight virtual clients (--simulate 8), three training at
# once on their own models (--parallel 3), top-k updates with each client's
# own error feedback: each registers on its own, keeps its own share, and the
# rounds count their updates one by one.
COORD="ipc://$RUN/coord4.sock"
psnet_start pscoord4 "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds 4 --fraction 0.5 --min-clients 2 \
  --min-available 8 --round-timeout 60 --lr 0.05 --chunk-kb 64 --train-limit 6000 --test-limit 500 --compress topk:0.1
psnet_start psd4 "$PSD" --id 1 --listen "ipc://$RUN/psd4.sock" --coord "$COORD"
psnet_start sim "$WORKERD" --edge --simulate 8 --parallel 3 --alpha 0.5 --coord "$COORD"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180)
ok $? "a job of 8 clients simulated in one process finishes ($out)"
grep -q 'msg="models built" models=3 clients=8 backend=cpu' "$RUN/sim.log"; ok $? "three of them train at once"
n=$(grep -c "msg=\"registered\" role=edge id=[0-9]* pid=$PID_sim " "$RUN/pscoord4.log")
[ "$n" -eq 8 ]; ok $? "each virtual client registers with its own id ($n from pid $PID_sim)"
n=$(grep -c 'msg="ready" partition=[0-7]/8 ' "$RUN/sim.log"); [ "$n" -eq 8 ]; ok $? "each keeps its own share of 8 ($n)"
"$PSCTL" --coord "$COORD" --json round history | jq -e '[.[] | select(.round > 0)] | length == 4 and
  all(.[]; .sampled == 4 and .answered == 4 and .bytes_up * 4 < .bytes_raw)' >/dev/null
ok $? "every round samples 4 of the 8 and counts their 4 top-k updates"
psnet_wait_exit "$PID_sim" 20; ok $? "the process leaves once all its clients left"
psnet_stop_all

# 5. Stopped while it pulls: an edge process told to stop (SIGTERM) while its
# round's pull crawls over a slow link (0.5 Mbit/s: the 0.8 MB model takes
# 13 s) gives the pull up and leaves at once, not when the pull ends or at
# its --round-timeout.
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# slow_cluster N MBIT PSCOORD-OPTIONS...: pscoordN at $COORD and its one
# shard, which the clients reach through a link of MBIT Mbit/s per connection.
slow_cluster() {
  local n=$1 rate=$2 sp lp; shift 2
  sp=$(free_port) lp=$(free_port) COORD="ipc://$RUN/coord$n.sock"
  psnet_start "link$n" /usr/bin/python3 "$PSNET_SRC/tests/bench/linkemu.py" "$lp" "127.0.0.1:$sp" "$rate" 5 0
  psnet_start "pscoord$n" "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --fraction 1 --round-timeout 60 "$@"
  psnet_start "psd$n" "$PSD" --id 1 --listen "tcp://127.0.0.1:$sp" --advertise "tcp://127.0.0.1:$lp" --coord "$COORD"
  psnet_wait_for 10 logs_match 'linkemu: listening' "link$n.log"
}
# pulling NAME K: workerd NAME's /metrics counts K clients pulling.
pulling() { curl -sf "http://127.0.0.1:$(http_port "$1")/metrics" | grep -q "^psnet_edge_state{state=\"pulling\"} $2\$"; }
slow_cluster 5 0.5 --rounds 3 --min-clients 1 --min-available 1 --train-limit 1000 --test-limit 200
psnet_start e5 "$WORKERD" --edge --coord "$COORD" --round-timeout 60 --http 127.0.0.1:0
psnet_wait_for 30 pulling e5 1; ok $? "the edge is sampled and pulls on the slow link (its /metrics: state pulling)"
kill -TERM "$PID_e5"; t0=$SECONDS
psnet_wait_exit "$PID_e5" 5; ok $? "SIGTERM mid-pull: it left in $((SECONDS - t0)) s (the pull needed about 13)"
grep -q 'msg="round given up" number=[0-9]* reason=stopping' "$RUN/e5.log" && ! grep -q 'level=error' "$RUN/e5.log"
ok $? "it says the round was given up, and logs no error"
wait "$PID_e5"; ok $? "and exits 0"
psnet_stop_all

# 6. Many virtual clients behind slow links pull at once: a pull holds one
# of the process's pull buffers, not its one model (--parallel 1), so the
# four clients sampled pull side by side (each connection its own 5 Mbit/s
# link: 1.3 s for the 0.8 MB model) while the model trains those pulled.
slow_cluster 6 5 --rounds 2 --min-clients 4 --min-available 4 --train-limit 2000 --test-limit 200
psnet_start sim6 "$WORKERD" --edge --simulate 4 --parallel 1 --coord "$COORD" --http 127.0.0.1:0
psnet_wait_for 60 pulling sim6 4; ok $? "the 4 clients sampled pull at once with one model (its /metrics: 4 pulling)"
grep -q 'msg="models built" models=1 clients=4 backend=cpu pull_buffers=4' "$RUN/sim6.log"
ok $? "the process has one model and 4 pull buffers"
out=$("$PSCTL" --coord "$COORD" job wait --wait 120); ok $? "the job finishes ($out)"
"$PSCTL" --coord "$COORD" --json round history | jq -e '[.[] | select(.round > 0) | .answered] == [4, 4]' >/dev/null
ok $? "each round counts the 4 updates"
psnet_stop_all
