#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sparse tables (issue 34; docs/tables.md): a job's --tables are checked by
# psctl and pscoord; a sparse logistic regression whose per-id weights are a
# psnet table (psnet.torch.EmbeddingBag) trains on a synthetic click log
# over two shards and ends with PyTorch's nn.EmbeddingBag(sparse=True) +
# torch.optim.Adagrad rows, torch.optim.SGD's dense layer and its test AUC;
# a table pushed twice for a clock is applied once; bad rows messages (NaN,
# wrong sizes, an unknown table, a stranger) are refused with their reason,
# nothing of them applied, the shards serving on.
source "$(dirname "$0")/lib.sh"

py_env
export PSPOKE # the Python checks send hand-made messages with it
CL=$PSNET_BUILD/worker/data/psnet-clicklog
DATA=$RUN/clicks
"$CL" --out "$DATA" --train-rows 12000 --test-rows 4000 --fields 6 --vocab 2000 --dense 4 --seed 5 \
  >"$RUN/clicklog.out" 2>&1
ok $? "a click log of 12,000 samples, 6 fields of 2,000 ids ($(tail -1 "$RUN/clicklog.out"))"

# http_cluster NAME: pscoord-NAME at $COORD and two shards serving /metrics.
http_cluster() {
  COORD="ipc://$RUN/$1.sock"
  psnet_start "pscoord-$1" "$PSCOORD" --listen "$COORD" --shards 2
  for i in 1 2; do
    psnet_start "psd-$1-$i" "$PSD" --id "$i" --listen "ipc://$RUN/psd-$1-$i.sock" --coord "$COORD" --http 127.0.0.1:0
  done
}

# What a job cannot hold, said before anything starts.
http_cluster tables
out=$("$PSCTL" --coord "$COORD" job submit --model mlp:4-1 --mode fed --replicas 1 --tables w:1 2>&1)
[ $? -ne 0 ] && grep -q "tables is for training jobs" <<<"$out"
ok $? "tables in a federated job are refused, saying why ($out)"
out=$("$PSCTL" --coord "$COORD" job submit --model mlp:4-1 --mode asp --tables w:1 2>&1)
[ $? -ne 0 ] && grep -q "needs --replicas 1" <<<"$out"
ok $? "tables with backups are refused, saying why ($out)"
out=$("$PSCTL" --coord "$COORD" job submit --model mlp:4-1 --mode asp --replicas 1 --tables w:1:momentum 2>&1)
[ $? -ne 0 ] && grep -q "optimizer 'momentum'" <<<"$out"
ok $? "a table with an unknown optimizer is refused, naming it ($out)"

PYCHECK_SCRIPT=$PSNET_SRC/tests/integration/torch-tables.py \
  pycheck lr lr "$COORD" "$DATA" "$RUN/lr.json" "ipc://$RUN/psd-tables-1.sock" "ipc://$RUN/psd-tables-2.sock"
out=$("$PSCTL" --coord "$COORD" job wait --wait 30 2>&1)
grep -q "state=done" <<<"$out"; ok $? "the job ends done ($out)"
out=$("$PSCTL" --coord "$COORD" export "$RUN/lr.safetensors" 2>&1)
ok $? "psctl export with a table ($out)"
PYCHECK_SCRIPT=$PSNET_SRC/tests/integration/torch-tables.py pycheck export export "$RUN/lr.safetensors" "$RUN/lr.json.npz"
rows=0
for i in 1 2; do
  m=$(curl -sf "http://127.0.0.1:$(http_port "psd-tables-$i")/metrics")
  n=$(awk '$1 == "psnet_psd_table_rows{table=\"w\"}" { print $2 }' <<<"$m")
  pushed=$(awk '$1 == "psnet_psd_rows_pushed_total" { print $2 }' <<<"$m")
  refused=$(awk '$1 == "psnet_psd_rows_refused_total" { print $2 }' <<<"$m")
  lint=$(promtool check metrics <<<"$m" 2>&1)
  [ "${n:-0}" -gt 1000 ] && [ "${pushed:-0}" -ge "$n" ] && [ "${refused:-0}" -ge 1 ] && [ -z "$lint" ]
  ok $? "shard $i's /metrics: table w holds ${n:-?} rows, ${pushed:-?} pushed, ${refused:-?} refused; promtool check metrics ${lint:-clean}"
  rows=$((rows + ${n:-0}))
done
want=$(jq -r .trained "$RUN/lr.json" 2>/dev/null)
[ "$rows" = "$want" ]; ok $? "the shards hold exactly the rows the job pushed ($rows; $want)"
psnet_stop_all

# A table's bounds: admission at the 2nd push, ttl and max-rows, counted by the shards.
http_cluster bounds
PYCHECK_SCRIPT=$PSNET_SRC/tests/integration/torch-tables.py pycheck bounds bounds "$COORD" "$DATA"
st=$("$PSCTL" --coord "$COORD" status 2>&1)
grep -q "^tables b:1:sgd t:1:sgd" <<<"$st" && grep -qE "^SHARD +ROWS +ROW-BYTES +ADMITTED +FILTERED +REFUSED +EVICTED" <<<"$st"
ok $? "psctl status names the job's tables and has each shard's rows, admitted, filtered, refused and evicted"
"$PSCTL" --coord "$COORD" --json status |
  jq -e '[.shards[] | select(.rows > 0 and .rows_admitted > 0 and .rows_filtered > 0 and .rows_evicted > 0)] | length == 2' >/dev/null &&
  "$PSCTL" --coord "$COORD" --json status | jq -e '.job.tables | test("^b:1:sgd:")' >/dev/null
ok $? "psctl --json status: each shard's counts of rows, and the job's tables with every figure"
for i in 1 2; do
  m=$(curl -sf "http://127.0.0.1:$(http_port "psd-bounds-$i")/metrics")
  metric() { awk -v k="$1" '$1 == k { print $2 }' <<<"$m"; }
  n=$(metric 'psnet_psd_table_rows{table="b"}') made=$(metric 'psnet_psd_table_rows_admitted_total{table="b"}')
  filtered=$(metric 'psnet_psd_table_pushes_filtered_total{table="b"}')
  ttl=$(metric 'psnet_psd_table_rows_evicted_total{table="t",reason="ttl"}')
  full=$(metric 'psnet_psd_table_rows_evicted_total{table="b",reason="full"}')
  refused=$(metric 'psnet_psd_table_pushes_refused_total{table="b"}')
  [ "${n:-999}" -le 300 ] && [ "${filtered:-0}" -gt 0 ] && [ "${ttl:-0}" -gt 0 ] && [ "${full:-0}" -gt 0 ] &&
    [ $(( ${made:-0} - ${full:-0} )) -eq "${n:--1}" ] && [ -z "$(promtool check metrics <<<"$m" 2>&1)" ]
  ok $? "shard $i: table b ${n:-?} rows of at most 300, ${made:-?} made, ${filtered:-?} pushes not admitted yet, ${full:-?} dropped when full, ${refused:-?} new rows refused past the bound; table t ${ttl:-?} dropped by ttl"
done
PYCHECK_SCRIPT=$PSNET_SRC/tests/integration/torch-tables.py pycheck cache cache "$COORD" "$DATA"
psnet_stop_all

# Two BSP workers against PyTorch on the combined batch, rows included.
start_cluster bsp 2
PYCHECK_SCRIPT=$PSNET_SRC/tests/integration/torch-tables.py
"${PY[@]}" "$PYCHECK_SCRIPT" bsp-worker "$COORD" "$DATA" "$RUN/bsp-a.npz" >"$RUN/bsp-a.out" 2>"$RUN/bsp-a.log" & pa=$!
"${PY[@]}" "$PYCHECK_SCRIPT" bsp-worker "$COORD" "$DATA" "$RUN/bsp-b.npz" >"$RUN/bsp-b.out" 2>"$RUN/bsp-b.log" & pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
[ $ra -eq 0 ] && [ $rb -eq 0 ]; ok $? "two Python workers train one BSP job with a table (exit $ra $rb)"
pycheck bsp-compare bsp-compare "$DATA" "$RUN/bsp-a.npz" "$RUN/bsp-b.npz"
psnet_stop_all

# Two SSP workers: rows applied as they come, a pull past the staleness waits.
start_cluster ssp 2
ssp_shards=("ipc://$RUN/psd-ssp-1.sock" "ipc://$RUN/psd-ssp-2.sock")
"${PY[@]}" "$PYCHECK_SCRIPT" ssp-worker "$COORD" "$DATA" "${ssp_shards[@]}" >"$RUN/ssp-a.out" 2>"$RUN/ssp-a.log" &
pa=$!
"${PY[@]}" "$PYCHECK_SCRIPT" ssp-worker "$COORD" "$DATA" "${ssp_shards[@]}" >"$RUN/ssp-b.out" 2>"$RUN/ssp-b.log"
rb=$?
wait $pa; ra=$?
while IFS= read -r line; do ok 0 "${line#ok: }"; done < <(cat "$RUN/ssp-a.out" "$RUN/ssp-b.out" | grep '^ok: ')
[ $ra -eq 0 ] && [ $rb -eq 0 ] && [ "$(cat "$RUN/ssp-a.out" "$RUN/ssp-b.out" | grep -c '^ok: ')" -eq 3 ]
ok $? "two SSP workers train one job with a table (exit $ra $rb$(cat "$RUN/ssp-a.out" "$RUN/ssp-b.out" | grep -m1 '^FAIL' | sed 's/^/; /'))"
psnet_stop_all
