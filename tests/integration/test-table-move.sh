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
# Under ASP, where the end depends on arrival order, a shard added mid-run
# takes its rows and the job ends with each on one copy; two Python
# workers pushing a gradient of 1 to rows of their own every clock while a
# shard is added see each push applied once, none lost.
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

# 5. ASP: shard 3 added at clock 20 takes the rows it now leads or backs;
# the senders tell it what each worker's pushes left with them, so a push
# sent again under the new map is cut there as it would have been at home.
JOB=(--workers 2 --mode asp --model dlrm:6:4-16-8:16-1 --data "$DATA" --batch 256 --epochs 3)
run e 2
psnet_wait_for 60 pulled e 20; ok $? "run e (ASP) trains to clock 20"
psd e 3
psnet_wait_for 10 bash -c "'$PSCTL' --coord '$COORD' --json status | jq -e '.shards[] | select(.id == 3)' >/dev/null"
out=$("$PSCTL" --coord "$COORD" shard add 3 2>&1); ok $? "psctl shard add 3 under ASP ($out)"
psnet_wait_for 30 whole 3; ok $? "all three shards say their rows are whole under the new map"
logs_match 'msg="table rows moved here" rows=[1-9]' 'psd-e-3.log'; ok $? "shard 3 took its rows"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job goes on to its end on three shards ($out)"
read -r rows backups <<<"$(copies e 1 2 3)"
[ "$rows" -gt 1000 ] && [ "$rows" = "$backups" ]; ok $? "every row has one copy on another shard ($rows rows, $backups copies)"
grep -q 'push not applied\|level=error' "$RUN"/w-e-*.log; ok $(( $? == 0 )) "no worker saw a push refused for good"
psnet_stop_all

# 7. ASP, each push applied once through a move: two Python workers push a
# gradient of 1 to 400 SGD rows of their own each clock (rows-once.py),
# 1,000 clocks; once both passed clock 20, shard 3 is added (two copies),
# or a shard of a one-copy job is removed (its rows handed over), while
# they push: an exchange under way when the map changes is sent again
# under the new one, cut by what its rows' old primary noted. Each row must
# end at exactly 1,000 steps of w -= lr: none lost, none applied twice.
# The same under SSP (ssp:2) with a shard added: the new shard answers pulls
# only once it knows each worker's clocks done (its senders tell it).
py_env
for run in "add asp" "remove asp" "add ssp:2"; do
  read -r how mode <<<"$run"
  COORD="ipc://$RUN/k-$how-${mode%:*}.sock"
  if [ $how = add ]; then n=2 copies=2 after=3; else n=3 copies=1 after=2; fi
  how_tag=$how-${mode%:*}
  psnet_start "pscoord-k-$how_tag" "$PSCOORD" --listen "$COORD" --shards $n --workers 2 --mode "$mode" --model mlp:4-1 \
    --tables e:1:sgd:lr=0.5:init=0 --replicas $copies
  for ((i = 1; i <= n; i++)); do psd "k-$how_tag" "$i"; done
  mkdir -p "$RUN/k-$how_tag"
  touch "$RUN/k-$how_tag/killed" # no pause at clock 20: the map changes while they push
  for r in 0 1; do
    "${PY[@]}" "$PSNET_SRC/tests/integration/rows-once.py" "$COORD" "$RUN/k-$how_tag" "$r" 1000 \
      >"$RUN/k-$how_tag-$r.out" 2>"$RUN/k-$how_tag-$r.log" &
    eval "PY_k_$r=\$!"
  done
  psnet_wait_for 60 sh -c "[ \"\$(cat '$RUN/k-$how_tag/clock-0' 2>/dev/null)\" -ge 20 ] && [ \"\$(cat '$RUN/k-$how_tag/clock-1' 2>/dev/null)\" -ge 20 ]"
  ok $? "two Python workers (${mode^^}, $copies cop$([ $copies = 1 ] && echo y || echo ies)) push to clock 20"
  if [ $how = add ]; then
    psd "k-$how_tag" 3
    psnet_wait_for 10 bash -c "'$PSCTL' --coord '$COORD' --json status | jq -e '.shards[] | select(.id == 3)' >/dev/null"
  fi
  at=$(cat "$RUN/k-$how_tag/clock-0")
  out=$("$PSCTL" --coord "$COORD" shard $how 3 2>&1); ok $? "psctl shard $how 3 while they push (at clock $at: $out)"
  psnet_wait_for 30 whole $after
  ok $? "the rows are whole under the new map (the workers at clock $(cat "$RUN/k-$how_tag/clock-0") then)"
  for r in 0 1; do
    pid_var="PY_k_$r"; wait "${!pid_var}"; rc=$?
    ok $rc "$(grep -h '^ok: \|^FAIL' "$RUN/k-$how_tag-$r.out" || tail -n 3 "$RUN/k-$how_tag-$r.log" | tr '\n' ' ')"
  done
  psnet_stop_all
done
