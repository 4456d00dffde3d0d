#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Table rows moved between live shards (issue 34; docs/tables.md, "Shards
# added and removed"): a BSP job of workerd's DLRM, whose table of 8-float
# rows with Adagrad state lives on the shards, gets a shard added mid-run
# (psctl shard add), loses one to psctl shard remove with two copies of
# each row (its backups take over), and, keeping one copy, hands a removed
# shard's rows over. BSP is deterministic, so a clock of rows lost or
# applied twice changes the end: each run must end with the undisturbed
# run's dense weights (pscoord's digest), test loss and AUC, and the same
# rows, bit for bit, each on as many copies as the map keeps. A table of
# bounded rows (max-rows) moves too, each shard within its bound after.
# Rows move only where they can be cut by clock: under ASP, shard add is
# refused with the reason.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/lib-tables.sh"

JOB=(--workers 2 --mode bsp --model dlrm:6:4-16-8:16-1 --data "$DATA" --batch 256 --epochs 3)
# same TAG SHARDS...: the undisturbed run's digest, evaluation and rows.
same() {
  local tag=$1 got out; shift
  got=$(ends "$tag")
  [ "$got" = "$want" ]; ok $? "run $tag: the undisturbed run's digest, test loss and AUC ($(tr '\n' ' ' <<<"$got"))"
  out=$("$PSCTL" --coord "$COORD" export "$RUN/$tag.safetensors" 2>&1) && out=$(same_rows "$RUN/a.safetensors" "$RUN/$tag.safetensors")
  ok $? "run $tag: the undisturbed run's rows, bit for bit ($out)"
}

# 1. Undisturbed, on two shards.
run a 2
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "an undisturbed DLRM job on 2 shards finishes ($out)"
want=$(ends a)
[ "$(wc -l <<<"$want")" -ge 2 ]; ok $? "it reports its digest and evaluation ($(tr '\n' ' ' <<<"$want"))"
out=$("$PSCTL" --coord "$COORD" export "$RUN/a.safetensors" 2>&1); ok $? "psctl export ($out)"
psnet_stop_all

# 2. Shard 3 added at clock 20: the rows it now leads or backs come to it.
run b 2
psnet_wait_for 60 pulled b 5; ok $? "run b trains"
psd b 3
psnet_wait_for 10 bash -c "'$PSCTL' --coord '$COORD' --json status | jq -e '.shards[] | select(.id == 3) | .in_map == false'"
ok $? "a psd started during the job waits on standby"
psnet_wait_for 60 pulled b 20; ok $? "run b trains to clock 20"
# A shard whose --memory-limit its share of the rows would pass is refused.
psnet_start psd-b-4 "$PSD" --id 4 --listen "ipc://$RUN/psd-b-4.sock" --coord "$COORD" --memory-limit 200000
psnet_wait_for 10 bash -c "'$PSCTL' --coord '$COORD' --json status | jq -e '.shards[] | select(.id == 4)' >/dev/null"
out=$("$PSCTL" --coord "$COORD" shard add 4 2>&1)
[ $? -ne 0 ] && grep -q 'passes its --memory-limit' <<<"$out"; ok $? "psctl shard add of a shard too small for its rows is refused ($out)"
out=$("$PSCTL" --coord "$COORD" shard add 3 2>&1); ok $? "psctl shard add 3 ($out)"
psnet_wait_for 30 whole 3; ok $? "all three shards say their rows are whole under the new map"
logs_match 'msg="table rows moved here" rows=[1-9]' 'psd-b-3.log'; ok $? "shard 3 took its rows ($(grep -o 'msg="table rows moved here".*' "$RUN/psd-b-3.log" | head -1))"
logs_match 'msg="table rows moved" rows_sent=[1-9]' 'psd-b-1.log' && logs_match 'msg="table rows moved" rows_sent=[1-9]' 'psd-b-2.log'
ok $? "shards 1 and 2 sent them"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes on three shards ($out)"
read -r rows backups <<<"$(copies b 1 2 3)"
[ "$rows" -gt 1000 ] && [ "$rows" = "$backups" ]; ok $? "every row has one copy on another shard ($rows rows, $backups copies)"
sent=$(($(metric b 1 psnet_psd_rows_moved_total) + $(metric b 2 psnet_psd_rows_moved_total)))
got=$(metric b 3 psnet_psd_rows_moved_in_total)
# A row asked for by a push that came before its turn is sent twice, taken once.
[ "$got" -gt 1000 ] && [ "$sent" -ge "$got" ]; ok $? "shards 1 and 2 sent the rows shard 3 took (/metrics: $sent sent, $got taken)"
same b
psnet_stop_all

# 3. Shard 2 of three removed (two copies): its backups lead its rows.
run c 3
psnet_wait_for 60 pulled c 20; ok $? "run c trains to clock 20"
out=$("$PSCTL" --coord "$COORD" shard remove 2 2>&1); ok $? "psctl shard remove 2 ($out)"
psnet_wait_for 30 whole 2; ok $? "the two shards left say their rows are whole under the new map"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes on two shards ($out)"
read -r rows backups <<<"$(copies c 1 3)"
[ "$rows" -gt 1000 ] && [ "$rows" = "$backups" ]; ok $? "every row has one copy on the other shard ($rows rows, $backups copies)"
same c
psnet_stop_all

# 4. One copy of each row: shard 3 removed hands its rows over.
run d 3 --replicas 1
psnet_wait_for 60 pulled d 20; ok $? "run d (--replicas 1) trains to clock 20"
out=$("$PSCTL" --coord "$COORD" shard remove 3 2>&1); ok $? "psctl shard remove 3 ($out)"
psnet_wait_for 30 whole 2; ok $? "the two shards left say their rows are whole under the new map"
logs_match 'msg="table rows moved" rows_sent=[1-9]' 'psd-d-3.log'; ok $? "shard 3 handed its rows over"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes on two shards ($out)"
read -r rows backups <<<"$(copies d 1 2 3)"
[ "$rows" -gt 1000 ] && [ "$backups" = 0 ]; ok $? "the rows are on shards 1 and 2 only, one copy each ($rows rows, $backups copies)"
same d
psnet_stop_all

# 4b. A removal whose rows would pass a shard's --memory-limit is refused,
# naming it: shard 1 holds its third of the rows within 400,000 bytes, not
# half of them.
LIMIT[1]=400000
run h 3 --replicas 1
unset 'LIMIT[1]'
psnet_wait_for 60 pulled h 20; ok $? "run h (--replicas 1, shard 1 within 400,000 bytes) trains to clock 20"
echo "# table bytes by shard: $(for i in 1 2 3; do metric h $i 'psnet_psd_table_bytes{table="ids"}'; done | tr '\n' ' ')"
out=$("$PSCTL" --coord "$COORD" shard remove 3 2>&1)
[ $? -ne 0 ] && grep -q "shard 1's share of the table rows once it is gone.*passes its --memory-limit" <<<"$out"
ok $? "psctl shard remove 3 is refused, naming shard 1 and its limit ($out)"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job goes on to its end on three shards ($out)"
psnet_stop_all

# 6. A table of at most 600 rows a shard (max-rows; the least recently
# pushed go): shard 3 added at clock 20 takes its rows, with the clock each
# was last pushed at, past its bound while they come; from the next clock
# on every shard keeps within it, and every row it holds has one copy.
run g 2 --tables ids:8:adagrad:lr=0.1:max-rows=600
psnet_wait_for 60 pulled g 20; ok $? "run g (max-rows=600) trains to clock 20"
psd g 3
psnet_wait_for 10 bash -c "'$PSCTL' --coord '$COORD' --json status | jq -e '.shards[] | select(.id == 3)' >/dev/null"
out=$("$PSCTL" --coord "$COORD" shard add 3 2>&1); ok $? "psctl shard add 3 ($out)"
psnet_wait_for 30 whole 3; ok $? "all three shards say their rows are whole under the new map"
logs_match 'msg="table rows moved here" rows=[1-9]' 'psd-g-3.log'; ok $? "shard 3 took its rows"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes on three shards ($out)"
most=0 evicted=0
for i in 1 2 3; do
  n=$(metric g $i 'psnet_psd_table_rows{table="ids"}')
  [ "$n" -gt "$most" ] && most=$n
  evicted=$(( evicted + $(metric g $i 'psnet_psd_table_rows_evicted_total{table="ids",reason="full"}') ))
done
read -r rows backups <<<"$(copies g 1 2 3)"
[ "$most" -le 600 ] && [ "$evicted" -gt 100 ] && [ "$rows" -gt 1000 ] && [ "$rows" = "$backups" ]
ok $? "each shard within 600 rows (most $most, $evicted dropped when full), each of the $rows rows with one copy ($backups copies)"
psnet_stop_all

# 5. ASP: a push sent again could not be cut by clock, so rows do not move.
JOB=(--workers 2 --mode asp --model dlrm:6:4-16-8:16-1 --data "$DATA" --batch 256 --epochs 3)
run e 2
psnet_wait_for 60 pulled e 5; ok $? "run e (ASP) trains"
psd e 3
psnet_wait_for 10 bash -c "'$PSCTL' --coord '$COORD' --json status | jq -e '.shards[] | select(.id == 3)' >/dev/null"
out=$("$PSCTL" --coord "$COORD" shard add 3 2>&1)
[ $? -ne 0 ] && grep -q 'only under BSP' <<<"$out"; ok $? "psctl shard add is refused with the reason ($out)"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "and the job goes on to its end on two shards ($out)"
psnet_stop_all
