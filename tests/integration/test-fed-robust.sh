#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Robust aggregation against bad clients, with psnet.fed's simulated Python
# clients (tests/integration/fed-python.py) against real daemons: with 2 of
# 10 clients attacking, FedAvg loses the model and median, Krum and
# Multi-Krum keep it.
source "$(dirname "$0")/lib.sh"

py_env
export PATH=$PSNET_BUILD/ps/pscoord:$PSNET_BUILD/ps/psd:$PSNET_BUILD/ps/psctl:$PATH
FP=$PSNET_SRC/tests/integration/fed-python.py
FEDJOB=(--mode fed --model mlp:784-64-10 --fraction 1 --local-epochs 1 --lr 0.05 --chunk-kb 64 "${SUBSET[@]}")

# Two of ten clients attack in every round (an update turned around x -10,
# one blown up x 100): FedAvg loses the model, the robust strategies keep it,
# and Multi-Krum leaves out exactly the two attackers' updates each round.
# The sanitized pass runs Multi-Krum alone: the scoring and picking code of
# the Krums, on the shards and pscoord, is the same for both, and the
# comparison of the four is the normal build's.
declare -A byz_acc
byz=(fedavg median krum multi-krum)
if [ $sanitized = 1 ]; then
  byz=(multi-krum)
  skip "FedAvg, median and Krum against the attackers" "the sanitized pass runs Multi-Krum (the same C paths); the comparison runs in the normal build's pass"
fi
for s in "${byz[@]}"; do
  start_cluster "byz-$s" 2 "${FEDJOB[@]}" --rounds 6 --min-clients 2 --min-available 10 --round-timeout 60 --strategy $s
  "${PY[@]}" "$FP" sim "$COORD" 10 0 10 "$RUN/byz-$s.json" byzantine >"$RUN/byz-$s.out" 2>"$RUN/byz-$s.log"
  out=$("$PSCTL" --coord "$COORD" job wait --wait 30)
  byz_acc[$s]=$(acc_of "$out")
  if [ $s = multi-krum ]; then
    bad=$(cat "$RUN/byz-$s.json.attackers" 2>/dev/null)
    lo=$(grep 'msg="round scored"' "$RUN/pscoord-byz-$s.log" | sed 's/.*left_out="\([0-9,]*\)".*/\1/' | sort -u)
    [ -n "$bad" ] && [ "$lo" = "$bad" ] && [ "$(grep -c 'msg="round scored"' "$RUN/pscoord-byz-$s.log")" -eq 6 ]
    ok $? "multi-krum left out the attackers' updates ($bad) and only them, in each of the 6 rounds ($(tr '\n' ' ' <<<"$lo"))"
  fi
  psnet_stop_all
done
if [ $sanitized = 0 ]; then
  awk -v a="${byz_acc[fedavg]:-1}" 'BEGIN { exit !(a < 0.5) }'
  ok $? "FedAvg with 2 attackers of 10 loses the model (accuracy ${byz_acc[fedavg]:-?} < 0.5)"
fi
for s in "${byz[@]}"; do
  [ $s = fedavg ] && continue
  awk -v a="${byz_acc[$s]:-0}" 'BEGIN { exit !(a >= 0.7) }'
  ok $? "$s keeps it (accuracy ${byz_acc[$s]:-?} >= 0.70)"
done
