#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Table rows on two copies (issue 34; docs/tables.md, "Backups and
# fail-over"): a BSP job of workerd's DLRM, whose table of 8-float rows
# with Adagrad state lives on three shards, keeps every row on its primary
# and on one backup (--replicas 2, pscoord's default for it). BSP is
# deterministic, so a clock of rows lost or applied twice changes the end:
# the same job runs undisturbed, with a shard killed (-9) mid-run, and with
# a shard stopped (SIGSTOP) until pscoord fails it over, the workers' step
# under way on it sent again to the survivors; every run must end with the
# undisturbed run's dense weights (pscoord's digest), test loss and AUC, and
# the same rows, Adagrad state included in the updates that made them. Each
# shard counts the copies it holds: every row the map keeps has exactly one,
# before and after a fail-over (the survivors send their rows to their new
# backups again; a second shard killed after that leaves the last one with
# every row); the killed shard started again takes its place, and the rows
# it now leads or backs move to it (docs/tables.md). Two
# shards lost together, or a job that keeps one copy of its rows losing one,
# fail the job at once, with the reason. A table that drops rows (ttl) keeps
# exactly one copy of each row it holds through a fail-over.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/lib-tables.sh"

JOB=(--workers 2 --mode bsp --model dlrm:6:4-16-8:16-1 --data "$DATA" --batch 256 --epochs 3)

# 1. Undisturbed.
run a 3
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "an undisturbed DLRM job on 3 shards finishes ($out)"
grep -q 'replicas=2' "$RUN/pscoord-a.log"; ok $? "two copies of every row by default (BSP, 3 shards)"
want=$(ends a)
[ "$(wc -l <<<"$want")" -ge 2 ]; ok $? "it reports its digest and evaluation ($(tr '\n' ' ' <<<"$want"))"
read -r rows backups <<<"$(copies a 1 2 3)"
[ "$rows" -gt 1000 ] && [ "$rows" = "$backups" ]; ok $? "every row has one copy on another shard ($rows rows, $backups copies)"
out=$("$PSCTL" --coord "$COORD" export "$RUN/a.safetensors" 2>&1); ok $? "psctl export ($out)"
psnet_stop_all

# 2. A shard killed (-9) at clock 20: the rows it led go on from their copies.
run b 3
psnet_wait_for 60 pulled b 20; ok $? "run b trains to clock 20"
kill -KILL "$PID_psd_b_1"; ok $? "SIGKILL shard 1"
psnet_wait_for 10 logs_match 'msg="fail-over" shard_id=1' 'pscoord-b.log'; ok $? "pscoord fails shard 1 over"
# Started again at once, it takes the lost shard's place, empty, as soon as
# the survivors' rows are whole again (at once if they are by then): the
# rows it now leads or backs move to it.
psnet_start psd-b-1r "$PSD" --id 1 --listen "ipc://$RUN/psd-b-1.sock" --coord "$COORD" --http 127.0.0.1:0
psnet_wait_for 20 logs_match 'msg="shard takes a lost shard.s place" shard_id=1' 'pscoord-b.log'
ok $? "shard 1, started again, takes the lost shard's place"
echo "# it waited on standby first: $(grep -c 'shard 1 waits on standby' "$RUN/pscoord-b.log")"
psnet_wait_for 30 whole 3; ok $? "and all three say their rows are whole under the map with it"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes on three shards ($out)"
got=$(ends b)
[ "$got" = "$want" ]; ok $? "with the undisturbed run's digest, test loss and AUC ($(tr '\n' ' ' <<<"$got"))"
logs_match 'msg="table rows promoted" rows=[1-9]' 'psd-b-[23].log'
ok $? "the survivors lead the lost shard's rows from their copies"
logs_match 'msg="table rows sent to their backups again" rows=[1-9]' 'psd-b-[23].log'
ok $? "and send the rows they lead to their backups again"
read -r rows backups <<<"$(copies b 1r 2 3)"
[ "$rows" -gt 1000 ] && [ "$rows" = "$backups" ]; ok $? "every row again has one copy ($rows rows, $backups copies)"
out=$("$PSCTL" --coord "$COORD" export "$RUN/b.safetensors" 2>&1); ok $? "psctl export ($out)"
out=$(same_rows "$RUN/a.safetensors" "$RUN/b.safetensors"); ok $? "the undisturbed run's rows, bit for bit ($out)"
grep -q 'push not applied\|level=error' "$RUN"/w-b-*.log; ok $(( $? == 0 )) "no worker saw a push refused for good"
psnet_stop_all

# 2b. Two shards killed one after the other, the second once the survivors
# said every row is back on two copies: the last shard holds every row,
# as the undisturbed run has it (the rows it got again from the other).
run f 3
psnet_wait_for 60 pulled f 20; ok $? "run f trains to clock 20"
kill -KILL "$PID_psd_f_1"; ok $? "SIGKILL shard 1"
psnet_wait_for 20 whole 2
ok $? "both survivors tell pscoord their rows are on two copies again under map epoch 2 (psctl --json status)"
kill -KILL "$PID_psd_f_2"; ok $? "SIGKILL shard 2"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes on shard 3 alone ($out)"
got=$(ends f)
[ "$got" = "$want" ]; ok $? "with the undisturbed run's digest, test loss and AUC ($(tr '\n' ' ' <<<"$got"))"
out=$("$PSCTL" --coord "$COORD" export "$RUN/f.safetensors" 2>&1) && out=$(same_rows "$RUN/a.safetensors" "$RUN/f.safetensors")
ok $? "the undisturbed run's rows, bit for bit ($out)"
psnet_stop_all

# 3. A shard stopped at clock 20: the workers' requests to it hang until
# pscoord fails it over; what they had under way goes to the survivors.
run c 3
psnet_wait_for 60 pulled c 20; ok $? "run c trains to clock 20"
kill -STOP "$PID_psd_c_2"; ok $? "SIGSTOP shard 2"
psnet_wait_for 10 logs_match 'msg="fail-over" shard_id=2' 'pscoord-c.log'; ok $? "pscoord fails shard 2 over"
kill -KILL "$PID_psd_c_2"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes on two shards ($out)"
got=$(ends c)
[ "$got" = "$want" ]; ok $? "with the undisturbed run's digest, test loss and AUC ($(tr '\n' ' ' <<<"$got"))"
logs_match 'msg="shard map" epoch=2 ' 'w-c-*.log'
ok $? "the workers went on under the new map"
# Whether a rows exchange was under way at the fail-over is timing (the
# unit test test-rows sends one again by hand); said, not checked.
echo "# rows exchanges sent again after a fail-over: run b $(cat "$RUN"/w-b-*.log | grep -c 'table rows sent again'), run c $(cat "$RUN"/w-c-*.log | grep -c 'table rows sent again')"
out=$("$PSCTL" --coord "$COORD" export "$RUN/c.safetensors" 2>&1) && out=$(same_rows "$RUN/a.safetensors" "$RUN/c.safetensors")
ok $? "the undisturbed run's rows, bit for bit ($out)"
psnet_stop_all

# 4. Two shards killed at once: the second leaves before the survivor has
# put the rows of the first fail-over back on two copies, so a row may have
# lost both; the job fails at once, saying so, rather than train on without it.
run e 3
psnet_wait_for 60 pulled e 10; ok $? "run e trains to clock 10"
kill -KILL "$PID_psd_e_1" "$PID_psd_e_2"; ok $? "SIGKILL shards 1 and 2 together"
psnet_wait_for 10 sh -c "'$PSCTL' --coord '$COORD' --json status | grep -q '\"state\":\"failed\"'"
ok $? "the job fails within seconds"
"$PSCTL" --coord "$COORD" --json status | grep -q 'a row may have lost every copy'
ok $? "the reason says a row may have lost every copy ($("$PSCTL" --coord "$COORD" --json status | grep -o '"reason":"[^"]*"' | head -1))"
psnet_stop_all

# 6. A table that drops rows (ttl=3: a row not pushed for 3 clocks goes):
# each clock's copy says which rows the primary dropped, so the backups
# drop them too, and after a fail-over, and the killed shard taking its
# place again, every row led has exactly one copy on another shard, no row
# dropped coming back as a copy.
run g 3 --tables ids:8:adagrad:lr=0.1:ttl=3
psnet_wait_for 60 pulled g 20; ok $? "run g (ttl=3, two copies) trains to clock 20"
kill -KILL "$PID_psd_g_1"; ok $? "SIGKILL shard 1"
psnet_wait_for 10 logs_match 'msg="fail-over" shard_id=1' 'pscoord-g.log'; ok $? "pscoord fails shard 1 over"
psnet_wait_for 30 whole 2; ok $? "both survivors say their rows are on two copies again"
# Started again, it takes the lost shard's place: the rows move to it with
# the clock each was last pushed at.
psnet_start psd-g-1r "$PSD" --id 1 --listen "ipc://$RUN/psd-g-1.sock" --coord "$COORD" --http 127.0.0.1:0
psnet_wait_for 20 logs_match 'msg="shard takes a lost shard.s place" shard_id=1' 'pscoord-g.log'
ok $? "shard 1, started again, takes the lost shard's place"
psnet_wait_for 30 whole 3; ok $? "and all three say their rows are whole under the map with it"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes on three shards ($out)"
evicted=0
for i in 1r 2 3; do
  evicted=$(( evicted + $(metric g $i 'psnet_psd_table_rows_evicted_total{table="ids",reason="ttl"}') ))
done
read -r rows backups <<<"$(copies g 1r 2 3)"
[ "$evicted" -gt 100 ] && [ "$rows" -gt 100 ] && [ "$rows" = "$backups" ]
ok $? "the shards dropped $evicted rows unpushed for 3 clocks, and each of the $rows rows they hold has one copy ($backups copies)"
grep -q 'push not applied\|level=error' "$RUN"/w-g-*.log; ok $(( $? == 0 )) "no worker saw a push refused for good"
psnet_stop_all

# 7. A table per field (six), all of a step's tables pulled and pushed in
# one exchange: a shard killed at clock 20 ends as the undisturbed run of
# the same tables, the exchange under way sent again, every table at once.
TABLES=f0:8:adagrad:lr=0.1,f1:8:adagrad:lr=0.1,f2:8:adagrad:lr=0.1,f3:8:adagrad:lr=0.1,f4:8:adagrad:lr=0.1,f5:8:adagrad:lr=0.1
run h 3 --tables "$TABLES"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "an undisturbed run with a table per field finishes ($out)"
want6=$(ends h)
out=$("$PSCTL" --coord "$COORD" export "$RUN/h.safetensors" 2>&1); ok $? "psctl export ($out)"
psnet_stop_all
run i 3 --tables "$TABLES"
psnet_wait_for 60 pulled i 20; ok $? "run i trains to clock 20"
kill -KILL "$PID_psd_i_2"; ok $? "SIGKILL shard 2"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes on two shards ($out)"
got=$(ends i)
[ "$got" = "$want6" ] && [ "$(wc -l <<<"$got")" -ge 2 ]
ok $? "with the undisturbed run's digest, test loss and AUC ($(tr '\n' ' ' <<<"$got"))"
out=$("$PSCTL" --coord "$COORD" export "$RUN/i.safetensors" 2>&1) && out=$(same_rows "$RUN/h.safetensors" "$RUN/i.safetensors")
ok $? "the undisturbed run's rows of the six tables, bit for bit ($out)"
psnet_stop_all

# 8. ASP on two copies: each push applied on a row's primary is copied to
# its backup before it is acknowledged. A shard killed mid-run: the job
# trains on; started again, the shard takes its place and the rows it now
# leads or backs move to it; the job ends with every row on exactly one
# other shard. (Which rows a push sent again finds applied is checked by
# hand in test-rows: ASP's order is the arrivals', so the end is not the
# undisturbed run's.)
JOB_BSP=("${JOB[@]}")
JOB=(--workers 2 --mode asp --model dlrm:6:4-16-8:16-1 --data "$DATA" --batch 256 --epochs 3)
run j 3
psnet_wait_for 60 pulled j 20; ok $? "run j (ASP, two copies by default) trains to clock 20"
grep -q 'replicas=2' "$RUN/pscoord-j.log"; ok $? "two copies of every row by default under ASP too"
kill -KILL "$PID_psd_j_3"; ok $? "SIGKILL shard 3"
psnet_wait_for 10 logs_match 'msg="fail-over" shard_id=3' 'pscoord-j.log'; ok $? "pscoord fails shard 3 over"
psnet_wait_for 30 whole 2; ok $? "both survivors say their rows are on two copies again"
psnet_start psd-j-3r "$PSD" --id 3 --listen "ipc://$RUN/psd-j-3.sock" --coord "$COORD" --http 127.0.0.1:0
psnet_wait_for 20 logs_match 'msg="shard takes a lost shard.s place" shard_id=3' 'pscoord-j.log'
ok $? "shard 3, started again, takes the lost shard's place under ASP"
psnet_wait_for 30 whole 3; ok $? "and all three say their rows are whole under the map with it"
logs_match 'msg="table rows moved here" rows=[1-9]' 'psd-j-3r.log'; ok $? "the rows it leads or backs moved to it"
out=$("$PSCTL" --coord "$COORD" job wait --wait 180); ok $? "the job finishes on three shards ($out)"
read -r rows backups <<<"$(copies j 1 2 3r)"
[ "$rows" -gt 1000 ] && [ "$rows" = "$backups" ]; ok $? "every row has one copy on the other shard ($rows rows, $backups copies)"
grep -q 'push not applied\|level=error' "$RUN"/w-j-*.log; ok $(( $? == 0 )) "no worker saw a push refused for good"
psnet_stop_all

# 9. ASP, nothing acknowledged lost, none applied twice: two Python workers
# push a gradient of 1 to 400 SGD rows of their own each clock, 60 clocks;
# shard 3 is killed once both reached clock 20, where they wait for it. Each row must end
# at exactly 60 steps of w -= lr (rows-once.py): a push applied and copied
# before the kill, one applied and not copied, one sent again to the
# survivors, each counted once.
py_env
COORD="ipc://$RUN/k.sock"
psnet_start pscoord-k "$PSCOORD" --listen "$COORD" --shards 3 --workers 2 --mode asp --model mlp:4-1 \
  --tables e:1:sgd:lr=0.5:init=0
for i in 1 2 3; do psd k "$i"; done
mkdir -p "$RUN/k"
for r in 0 1; do
  "${PY[@]}" "$PSNET_SRC/tests/integration/rows-once.py" "$COORD" "$RUN/k" "$r" 60 >"$RUN/k-$r.out" 2>"$RUN/k-$r.log" &
  eval "PY_k_$r=\$!"
done
psnet_wait_for 60 sh -c "[ \"\$(cat '$RUN/k/clock-0' 2>/dev/null)\" -ge 20 ] && [ \"\$(cat '$RUN/k/clock-1' 2>/dev/null)\" -ge 20 ]"
ok $? "two Python workers (ASP, two copies) push to clock 20"
kill -KILL "$PID_psd_k_3"; ok $? "SIGKILL shard 3 ($(cat "$RUN/k/clock-0") and $(cat "$RUN/k/clock-1") clocks in)"
touch "$RUN/k/killed"
for r in 0 1; do
  pid_var="PY_k_$r"; wait "${!pid_var}"; rc=$?
  ok $rc "$(grep -h '^ok: \|^FAIL' "$RUN/k-$r.out" || tail -n 3 "$RUN/k-$r.log" | tr '\n' ' ')"
done
logs_match 'msg="fail-over" shard_id=3' 'pscoord-k.log'; ok $? "pscoord failed shard 3 over meanwhile"
psnet_stop_all
JOB=("${JOB_BSP[@]}")

# 5. One copy of each row: a dead shard's rows are gone, and the job says so at once.
run d 3 --replicas 1
psnet_wait_for 60 pulled d 10; ok $? "run d (--replicas 1) trains to clock 10"
kill -KILL "$PID_psd_d_3"; ok $? "SIGKILL shard 3"
psnet_wait_for 10 sh -c "'$PSCTL' --coord '$COORD' --json status | grep -q '\"state\":\"failed\"'"
ok $? "the job fails within seconds"
"$PSCTL" --coord "$COORD" --json status | grep -q 'only copy of its table rows.*--replicas'
ok $? "the reason names the table rows and --replicas"
psnet_stop_all
