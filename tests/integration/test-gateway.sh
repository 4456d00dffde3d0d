#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# psgate, the edge clients' one front door, over CURVE: pscoord and the two
# shards admit no edge key at all (their allow-list lists the cluster's keys
# and psgate's, role gateway), so every round these edge workers finish went
# through psgate, the only address they have: two of them, as behind one
# name, half the clients through each, the rounds counting both halves. The
# maps they get name the shards by id alone. An edge client dialling pscoord directly is refused;
# messages an edge client may not send, messages without an address and
# garbage get a clear error from psgate, which keeps serving; killed and
# started again mid-job, psgate lets the clients go on, and the job ends above
# the bar.
source "$(dirname "$0")/lib.sh"
PSGATE=$PSNET_BUILD/ps/psgate/psgate
COORD="ipc://$RUN/coord.sock" GATE="ipc://$RUN/gate.sock" GATE2="ipc://$RUN/gate2.sock"
ROUNDS=30
K=$RUN/cluster KE=$RUN/edge KG=$RUN/gate
for kr in pscoord:server psd:server psgate:gateway admin:admin; do
  "$PSCTL" keys gen "${kr%%:*}" --role "${kr##*:}" --dir "$K" >/dev/null || { ok 1 "psctl keys gen ${kr%%:*}"; exit 1; }
done
"$PSCTL" keys gen edge --role edge --dir "$KE" >/dev/null || { ok 1 "psctl keys gen edge"; exit 1; }
mkdir -p "$KG" && cp "$K/psgate.key" "$K/pscoord.pub" "$KG/" && cp "$KE/allow" "$KG/allow" && cp "$K/psgate.pub" "$KE/"
ok $? "three key folders: the cluster's (no edge key), psgate's (the edge keys), the clients' (psgate's public key)"
PSCTL_K=("$PSCTL" --keys "$K" --coord "$COORD")

psnet_start pscoord "$PSCOORD" --listen "$COORD" --mode fed --shards 2 --rounds $ROUNDS --fraction 1 \
  --min-clients 3 --min-available 4 --round-timeout 10 --lease-ms 5000 --chunk-kb 64 \
  --train-limit 4000 --test-limit 1000 --keys "$K"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD" --keys "$K"; done
# Two gateways, as behind one name: half the clients through each.
psnet_start psgate "$PSGATE" --listen "$GATE" --coord "$COORD" --keys "$KG" --http 127.0.0.1:0
psnet_start psgate-b "$PSGATE" --listen "$GATE2" --coord "$COORD" --keys "$KG"
for k in 0 1 2 3; do
  gw=$GATE; [ $k -ge 2 ] && gw=$GATE2
  psnet_start "e-$k" "$WORKERD" --edge --gateway "$gw" --partition $k/4 --keys "$KE"
done

psnet_wait_for 90 logs_match 'msg="round done" round=2/' 'pscoord.log'; ok $? "rounds run with every client behind psgate"
n=$(grep -c 'msg="registered" role=edge' "$RUN/pscoord.log")
[ "$n" -ge 4 ]; ok $? "pscoord registered the four edge clients through psgate ($n)"
! grep -q "psd-[12].sock" "$RUN"/e-*.log; ok $? "no client log names a shard's address"
port=$(http_port psgate)
m=$(curl -sf "http://127.0.0.1:$port/metrics")
clients=$(awk '$1 == "psnet_psgate_clients" { print $2 }' <<<"$m")
relayed=$(awk '$1 == "psnet_psgate_bytes_total{direction=\"in\"}" { print $2 }' <<<"$m")
[ "${clients:-0}" -eq 2 ] && awk -v b="${relayed:-0}" 'BEGIN { exit !(b > 0) }'
ok $? "the first psgate's /metrics: its 2 clients, ${relayed:-0} update bytes relayed"
jq -e '[.[] | select(.round > 0)][0].answered == 4' <<<"$("$PSCTL" --keys "$K" --coord "$COORD" --json round history)" >/dev/null
ok $? "round 1 counts the clients of both gateways"
awk '$1 == "psnet_psgate_shards_known" { exit !($2 == 2) }' <<<"$m"; ok $? "psgate learnt both shards from the maps"
lint=$(promtool check metrics <<<"$m" 2>&1); ok $? "psgate's /metrics passes promtool check metrics ${lint:+($lint)}"

# psgate killed and started again: the clients go on through the new one.
done_before=$(grep -c 'msg="round done"' "$RUN/pscoord.log")
# Started again once the old one is gone: while it lives, its socket is taken.
kill -9 "$PID_psgate" && psnet_wait_exit "$PID_psgate" 10
ok $? "psgate killed (-9) mid-job"
[ "$done_before" -lt $ROUNDS ]; ok $? "psgate killed mid-job (after $done_before of $ROUNDS rounds)"
psnet_start psgate2 "$PSGATE" --listen "$GATE" --coord "$COORD" --keys "$KG"
psnet_wait_for 90 bash -c "[ \$(grep -c 'msg=\"round done\"' '$RUN/pscoord.log') -ge $((done_before + 2)) ]"
ok $? "rounds go on after psgate's kill -9 and restart"

# The cluster itself admits no edge key (even with pscoord's public key).
KD=$RUN/direct; mkdir -p "$KD" && cp "$KE/edge.key" "$K/pscoord.pub" "$KD/"
psnet_start e-direct "$WORKERD" --edge --coord "$COORD" --keys "$KD" --connect-timeout 3
psnet_wait_for 20 bash -c "! kill -0 $PID_e_direct 2>/dev/null"
grep -q 'refused\|not in its allow-list' "$RUN/e-direct.log"; ok $? "an edge client dialling pscoord directly is refused"

# Bad input at the front door: clear errors, psgate keeps serving.
poke() { PSPOKE_KEYS=$KE PSPOKE_KEY=edge PSPOKE_SERVER=psgate "$PSPOKE" "$GATE" "$@" 2>&1; }
out=$(poke status); grep -q 'reason=this is psgate.*--gateway' <<<"$out"; ok $? "a message without an address: $out"
out=$(PSPOKE_TO=coord poke status); grep -q 'status=denied .*does not send STATUS to pscoord' <<<"$out"
ok $? "an operator's request from an edge client is refused: $out"
out=$(PSPOKE_TO=coord poke garbage); grep -q 'status=malformed' <<<"$out"; ok $? "garbage is refused: $out"
out=$(PSPOKE_TO=77 poke pull); grep -q 'status=unavailable .*no shard map with shard 77' <<<"$out"
ok $? "a shard psgate knows nothing of: $out"
out=$(PSPOKE_TO=1 poke garbage); grep -q 'status=malformed' <<<"$out"; ok $? "and garbage for a shard stops at psgate: $out"

out=$("${PSCTL_K[@]}" job wait --wait 240); rc=$?
acc=$(acc_of "$out")
[ $rc -eq 0 ] && awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.60) }'
ok $? "the job through psgate finishes above 0.60 on the subset ($out)"
hist=$("${PSCTL_K[@]}" --json round history)
jq -e "[.[] | select(.round > 0)] | length == $ROUNDS" <<<"$hist" >/dev/null
ok $? "psctl round history lists the $ROUNDS rounds once each"
! grep -q 'level=error' "$RUN/psgate.log" "$RUN/psgate-b.log" "$RUN"/psd-*.log
ok $? "the gateways and the shards logged no error"
