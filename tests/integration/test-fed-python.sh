#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# psnet.fed: federated clients with the user's own fit() and evaluate()
# (Flower's NumPyClient contract) against real daemons. Simulated Python
# clients train a job to its end with the accuracy they test; results that
# are no update (a wrong shape, NaN, a bad count, an exception) are refused
# for their round with the reason, told to pscoord, which counts them and
# closes the round without waiting for its time-out; C edge workers and
# Python clients are counted in the same rounds; a client with a CURVE key
# (start_client with key=) joins a cluster with --keys; the Flower
# quickstart port in examples/ runs as it is. (Clients that attack:
# test-fed-robust.)
source "$(dirname "$0")/lib.sh"

py_env
export PATH=$PSNET_BUILD/ps/pscoord:$PSNET_BUILD/ps/psd:$PSNET_BUILD/ps/psctl:$PATH
FP=$PSNET_SRC/tests/integration/fed-python.py
PYCHECK_SCRIPT=$FP
FEDJOB=(--mode fed --model mlp:784-64-10 --fraction 1 --local-epochs 1 --lr 0.05 --chunk-kb 64 "${SUBSET[@]}")

pycheck refuse refuse

# 1. Four simulated clients, two of which return a wrong shape and NaN in
# their first two rounds: refused here, counted by pscoord, the rounds go on.
start_cluster sim 2 "${FEDJOB[@]}" --rounds 6 --min-clients 2 --min-available 4 --round-timeout 60
pycheck sim sim "$COORD" 4 0 4 "$RUN/sim.json" bad
out=$("$PSCTL" --coord "$COORD" job wait --wait 30); ok $? "the job is done ($out)"
acc=$(jq -r .accuracy "$RUN/sim.json" 2>/dev/null)
[ -n "$acc" ] && within "$(acc_of "$out")" "$acc" 0.000001
ok $? "its accuracy is the one the Python client's evaluate() measured ($acc)"
accuracy_at_least "$out" 0.70; ok $? "6 rounds of 4 Python clients reach >= 0.70 on the subset"
hist=$("$PSCTL" --coord "$COORD" --json round history)
jq -e '[.[] | select(.round > 0) | .refused] == [2, 2, 0, 0, 0, 0] and
  all(.[] | select(.round > 0); .answered + .refused == .sampled and .seconds < 30)' <<<"$hist" >/dev/null
ok $? "rounds 1 and 2 count 2 refused beside 2 answered, and close without waiting for --round-timeout ($(jq -c '[.[] | [.answered, .refused, .seconds]]' <<<"$hist"))"
"$PSCTL" --coord "$COORD" --json round status | jq -e '.refused == 4' >/dev/null; ok $? "psctl round status counts the 4 refusals"
grep -q 'msg="update refused by its client" edge=[0-9]* number=[0-9]* reason="tensor 0 (0.weight) has shape \[10, 784\]; the job.s is \[64, 784\]"' \
  "$RUN/pscoord-sim.log"; ok $? "pscoord logs the wrong shape's reason"
grep -q 'msg="update refused by its client" edge=[0-9]* number=[0-9]* reason="tensor 1 (0.bias) holds NaN or infinity"' \
  "$RUN/pscoord-sim.log"; ok $? "and the NaN's"
psnet_stop_all

# 2. C and Python clients in one round: two workerd --edge, two Python;
# after each round all four test its model on their own data
# (--fraction-evaluate 1: the C clients on their quarter of the test set).
start_cluster mix 2 "${FEDJOB[@]}" --rounds 3 --min-clients 4 --min-available 4 --round-timeout 60 \
  --fraction-evaluate 1
for k in 0 1; do psnet_start "edge-$k" "$WORKERD" --edge --coord "$COORD" --partition $k/4; done
pycheck mix sim "$COORD" 2 2 4 "$RUN/mix.json"
out=$("$PSCTL" --coord "$COORD" job wait --wait 60); ok $? "a job of C and Python clients is done ($out)"
hist=$("$PSCTL" --coord "$COORD" --json round history)
jq -e '[.[] | select(.round > 0) | .answered] == [4, 4, 4]' <<<"$hist" >/dev/null
ok $? "each of its 3 rounds counted 2 C and 2 Python updates ($(jq -c '[.[] | .answered]' <<<"$hist"))"
jq -e 'all(.[] | select(.round > 0); .fed_clients == 4 and .fed_examples == 5000 and .fed_accuracy > 0.5)' \
  <<<"$hist" >/dev/null
ok $? "after each round 4 clients tested its model on their own 5,000 examples ($(jq -c '[.[] | [.fed_clients, .fed_examples, .fed_accuracy]]' <<<"$hist"))"
# pscoord's figure for round 2 against the example-weighted mean of the four answers it logged.
want=$(grep 'msg="round tested by a client" edge=[0-9]* round=2 ' "$RUN/pscoord-mix.log" |
  sed 's/.*accuracy=\([0-9.]*\) .*examples=\([0-9]*\).*/\1 \2/' | awk '{ s += $1 * $2; n += $2 } END { if (n) printf "%.6f", s / n }')
got=$(jq -r '[.[] | select(.round == 2)][0].fed_accuracy' <<<"$hist")
[ -n "$want" ] && awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(d < 1e-4 && d > -1e-4) }'
ok $? "round 2's federated accuracy $got is the example-weighted mean of the clients' answers ($want)"
grep -q 'msg="evaluated" .* own=1' "$RUN/edge-0.log"; ok $? "a C client tests on its own share of the test set"
psnet_stop_all

# 3. A client with its CURVE key (start_client key=) joins a cluster with
# --keys through psgate (gateway=), in the same rounds as a C edge worker
# that dials pscoord directly.
K=$RUN/keys
for kr in pscoord:server psd:server edge:edge admin:admin psgate:gateway strategy:strategy; do
  "$PSCTL" keys gen "${kr%%:*}" --role "${kr##*:}" --dir "$K" >/dev/null || ok 1 "psctl keys gen ${kr%%:*}"
done
COORD="ipc://$RUN/keys.sock"
psnet_start pscoord-keys "$PSCOORD" --listen "$COORD" --shards 1 "${FEDJOB[@]}" --rounds 2 --min-clients 2 \
  --min-available 2 --round-timeout 60 --keys "$K"
psnet_start psd-keys "$PSD" --id 1 --listen "ipc://$RUN/psd-keys.sock" --coord "$COORD" --keys "$K"
psnet_start edge-keys "$WORKERD" --edge --coord "$COORD" --partition 0/2 --keys "$K"
psnet_start psgate-keys "$PSNET_BUILD/ps/psgate/psgate" --listen "ipc://$RUN/gate.sock" --coord "$COORD" --keys "$K"
"${PY[@]}" - "ipc://$RUN/gate.sock" "$K/edge.key" >"$RUN/keys.out" 2>"$RUN/keys.log" <<'EOF'
import sys
sys.argv = [sys.argv[0], "x"] + sys.argv[1:]
import importlib.util, os
spec = importlib.util.spec_from_file_location("fp", os.path.join(os.environ["PSNET_SRC"], "tests/integration/fed-python.py"))
fp = importlib.util.module_from_spec(spec); spec.loader.exec_module(fp)
from psnet import fed
xs, ys, xt, yt = fp.load()
st = fed.start_client(gateway=sys.argv[2], client=fp.MlpClient(1, 2, xs, ys, xt, yt), key=sys.argv[3], timeout_s=120)
print("state", st["state"], "counted", st["counted"])
EOF
grep -q '^state done counted 2$' "$RUN/keys.out"
ok $? "start_client with key= through psgate is counted in both rounds of a job with --keys ($(cat "$RUN/keys.out" | tr '\n' ' '))"
out=$(PSNET_LOG_LEVEL=error "${PY[@]}" - "$COORD" <<'EOF' 2>&1
import sys
from psnet import fed
try:
    fed.start_client(coord=sys.argv[1], client=fed.NumPyClient(), connect_timeout_s=3)
    print("joined")
except OSError as e:
    print("refused:", e)
EOF
)
grep -q '^refused:' <<<"$out"; ok $? "a client without a key is not let in, and says so ($(grep -m1 '^refused:' <<<"$out"))"
# Only a strategy key reads a client's update or pushes a round's delta,
# and only in a --strategy custom job (this one is fedavg).
poke_psd() { PSPOKE_KEYS=$K PSPOKE_KEY=$1 PSPOKE_SERVER=psd "$PSPOKE" "ipc://$RUN/psd-keys.sock" "${@:2}" 1 16384 2>&1; }
for key in edge admin; do
  out=$(PSPOKE_UPDATE_OF=1 poke_psd $key pull)
  grep -q 'status=denied .*reason=a client.s update is read, and a round.s delta pushed, by the job.s strategy process only' <<<"$out"
  ok $? "a shard refuses an $key key's read of a client's update ($out)"
done
out=$(PSPOKE_DELTA=1 PSPOKE_SENDER=1 poke_psd edge push-value); grep -q 'status=denied .*reason=a client.s update is read' <<<"$out"
ok $? "and an edge key's push of a round's delta ($out)"
out=$(PSPOKE_UPDATE_OF=1 poke_psd strategy pull); grep -q "status=denied .*reason=this job's strategy is fedavg" <<<"$out"
ok $? "a strategy key reads no update of a job without --strategy custom ($out)"
out=$(PSPOKE_DELTA=1 PSPOKE_SENDER=1 poke_psd strategy push-value); grep -q "status=invalid .*reason=this job's strategy is fedavg" <<<"$out"
ok $? "nor pushes a delta into one ($out)"
out=$(poke_psd strategy push-value); grep -q 'status=denied .*reason=a federated job is served' <<<"$out"
ok $? "nor an update: it pushes deltas only ($out)"
out=$(poke_psd edge pull); grep -q 'type=' <<<"$out"; ok $? "the shard keeps serving ($out)"
psnet_stop_all

# 4. A strategy of the user's (--strategy custom): the coordinate-wise
# median in NumPy, in a Python strategy process (psnet.fed.start_strategy)
# with its key of role strategy, in a cluster with --keys (those of 4).
# Its first answer holds NaN: refused, the round dropped and run again.
COORD="ipc://$RUN/custom.sock"
psnet_start pscoord-custom "$PSCOORD" --listen "$COORD" --shards 2 "${FEDJOB[@]}" --rounds 3 --min-clients 2 \
  --min-available 4 --round-timeout 30 --strategy custom --keys "$K"
for i in 1 2; do
  psnet_start "psd-custom-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-custom-$i.sock" --coord "$COORD" --keys "$K"
done
pycheck custom strategy "$COORD" 4 "$RUN/custom.json" "$K"
out=$("$PSCTL" --coord "$COORD" --keys "$K" job wait --wait 30); ok $? "the custom strategy's job is done ($out)"
accuracy_at_least "$out" 0.55; ok $? "3 rounds of the strategy's median train the model (>= 0.55)"
hist=$("$PSCTL" --coord "$COORD" --keys "$K" --json round history)
jq -e '[.[] | .round] == [0, 1, 2, 3] and (.[0].note | test("strategy: .*holds NaN"))' <<<"$hist" >/dev/null
ok $? "round history lists the dropped round with the strategy's reason, then 3 rounds ($(jq -c '[.[] | [.round, .note]]' <<<"$hist"))"
grep -q 'msg="round not aggregated by the strategy" number=[0-9]* reason=".*holds NaN or infinity' "$RUN/pscoord-custom.log"
ok $? "pscoord logs why the round was not aggregated"
psnet_stop_all
# A strategy process that dies while it aggregates is replaced: the next
# one to connect is asked for the same round, which completes.
start_cluster custom2 2 "${FEDJOB[@]}" --rounds 2 --min-clients 2 --min-available 2 --round-timeout 30 \
  --strategy custom
"${PY[@]}" "$FP" sim "$COORD" 2 0 2 "$RUN/custom2.json" >"$RUN/custom2-sim.out" 2>"$RUN/custom2-sim.log" &
simpid=$!
"${PY[@]}" "$FP" strategy-die "$COORD" >"$RUN/custom2-die.out" 2>"$RUN/custom2-die.log"
rc=$?
[ $rc -eq 3 ] && grep -q dying "$RUN/custom2-die.out"; ok $? "the first strategy process died while it aggregated (exit $rc)"
pycheck custom2-serve strategy-serve "$COORD"
wait $simpid; ok $? "the clients served the job to its end ($(grep -c '^ok' "$RUN/custom2-sim.out") checks passed)"
hist=$("$PSCTL" --coord "$COORD" --json round history)
jq -e '[.[] | .round] == [1, 2]' <<<"$hist" >/dev/null
ok $? "no round was dropped: the new strategy aggregated the one the first left ($(jq -c '[.[] | [.round, .note]]' <<<"$hist"))"
grep -q 'msg="strategy left while it aggregated a round"' "$RUN/pscoord-custom2.log"
ok $? "pscoord logs that the strategy left mid-round"
psnet_stop_all
for bad in "--secagg" "--dp-clip 1" "--mode fedasync"; do
  o=$(timeout 10 "$PSCOORD" --listen "ipc://$RUN/bad.sock" --shards 1 "${FEDJOB[@]}" --strategy custom $bad 2>&1)
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qi "custom" <<<"$o"
  ok $? "pscoord refuses --strategy custom with $bad, saying why ($(grep -m1 -i custom <<<"$o"))"
done

# 5. The Flower quickstart port runs as it is (its own LocalCluster).
(cd "$RUN" && PSNET_LOG_LEVEL=warning timeout 300 "${PY[@]}" "$PSNET_SRC/examples/fed_quickstart.py" --limit 6000 --rounds 2) \
  >"$RUN/quickstart.out" 2>"$RUN/quickstart.log"
grep -q '^job done: 10 updates counted, 0 refused, final accuracy 0\.[0-9]*' "$RUN/quickstart.out"
ok $? "examples/fed_quickstart.py runs as it is ($(tail -1 "$RUN/quickstart.out"))"
