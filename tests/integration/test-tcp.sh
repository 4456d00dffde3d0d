#!/usr/bin/env bash
# The same cluster over tcp:// on loopback (the transport between hosts).
source "$(dirname "$0")/lib.sh"

port() { echo $((20000 + (RANDOM % 20000))); }
base=$(port)
COORD="tcp://127.0.0.1:$base"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 2 --shards 2 --mode asp --epochs 2 "${SUBSET[@]}"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "tcp://127.0.0.1:$((base + i))" --coord "$COORD"; done
for i in 1 2; do psnet_start "workerd-$i" "$WORKERD" --coord "$COORD"; done
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job over tcp finishes ($out)"
accuracy_at_least "$out" 0.70; ok $? "accuracy >= 0.70 on the subset, 2 epochs"
json=$("$PSCTL" --coord "$COORD" --json status)
jq -e '.shards | map(.endpoint | startswith("tcp://127.0.0.1:")) | all' <<<"$json" >/dev/null; ok $? "the shards advertise tcp endpoints"
