# SPDX-License-Identifier: Apache-2.0
# What the tests of table rows across shards share (test-table-failover,
# test-table-move), sourced after lib.sh: a click log of 12,000 samples for
# workerd's DLRM, and what they read of a run TAG (pscoord-TAG, psd-TAG-I,
# w-TAG-I, the job's control address in $COORD).

CL=$PSNET_BUILD/worker/data/psnet-clicklog
DATA=$RUN/clicks
"$CL" --out "$DATA" --train-rows 12000 --test-rows 4000 --fields 6 --vocab 2000 --dense 4 --seed 5 \
  >"$RUN/clicklog.out" 2>&1
ok $? "a click log of 12,000 samples, 6 fields ($(tail -1 "$RUN/clicklog.out"))"

# run TAG SHARDS [PSCOORD OPTIONS...]: pscoord of the job in JOB, SHARDS
# shards serving /metrics and two workerd of run TAG, steps of 20 ms at
# least (time to stop or change a shard mid-run).
run() {
  local tag=$1 n=$2 i; shift 2
  COORD="ipc://$RUN/$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" --shards "$n" "${JOB[@]}" "$@"
  for ((i = 1; i <= n; i++)); do psd "$tag" "$i"; done
  for i in 1 2; do psnet_start "w-$tag-$i" "$WORKERD" --coord "$COORD" --step-delay-ms 20 --trace-pulls; done
}
# psd TAG ID: shard ID of run TAG, serving /metrics (with --memory-limit
# ${LIMIT[ID]} where set).
declare -A LIMIT=()
psd() { psnet_start "psd-$1-$2" "$PSD" --id "$2" --listen "ipc://$RUN/psd-$1-$2.sock" --coord "$COORD" --http 127.0.0.1:0 \
          ${LIMIT[$2]:+--memory-limit "${LIMIT[$2]}"}; }
# ends TAG: the digest pscoord logged and the evaluations the workers logged.
ends() { sed -n 's/.*msg="job done" .* weights=\([0-9a-f]*\).*/\1/p' "$RUN/pscoord-$1.log"
  cat "$RUN"/w-"$1"-*.log | sed -n 's/.*msg="evaluated" .*\(test_loss=[0-9.]* auc=[0-9.]*\).*/\1/p'; }
pulled() { logs_match "msg=\"pulled\" clock=$2 " "w-$1-1.log"; }
# copies TAG SHARDS...: rows led and copies held, summed over the shards' /metrics.
copies() {
  local tag=$1 i rows=0 backups=0 body; shift
  for i in "$@"; do
    body=$(curl -s -m 5 "http://127.0.0.1:$(http_port "psd-$tag-$i")/metrics")
    rows=$((rows + $(awk '$1 ~ /^psnet_psd_table_rows\{/ { s += $2 } END { print s + 0 }' <<<"$body")))
    backups=$((backups + $(awk '$1 == "psnet_psd_table_backup_rows" { print $2 + 0 }' <<<"$body")))
  done
  echo "$rows $backups"
}
# metric TAG SHARD NAME: a counter of the shard's /metrics.
metric() { curl -s -m 5 "http://127.0.0.1:$(http_port "psd-$1-$2")/metrics" | awk -v n="$3" '$1 == n { print $2 + 0 }'; }
# whole N: N shards in pscoord's map (epoch 2 or later: the job's first is
# 1), each saying its rows are whole under it, not under the epoch a shard
# last heard of.
whole() { "$PSCTL" --coord "$COORD" --json status |
          jq -e --argjson n "$1" '.job.map_epoch as $e | $e >= 2 and
                 ([.shards[] | select(.in_map)] | length == $n and all(.rows_whole_epoch >= $e))' >/dev/null; }
# same_rows A B: two exports hold the same ids with the same rows, bit for bit.
same_rows() { /usr/bin/python3 "$PSNET_SRC/tests/integration/same-rows.py" "$1" "$2"; }
