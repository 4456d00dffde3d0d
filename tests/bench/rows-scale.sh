#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A table of 5 x 10^7 rows (issue 34's scale target): 16 floats and their
# Adagrad state a row, over 3 shards, filled by one Python worker through
# libpsnet (tests/bench/rows_scale.py). Prints each shard's rows, the table's
# bytes (psnet_psd_table_bytes) and its resident memory against the rows'
# own bytes (16 + 16 floats a row: the target is at most 1.15 x those + 64
# MiB); then a checkpoint of it saved while the worker trains on (how long,
# and the longest step meanwhile: the tables are frozen while they are
# written), and restored onto 3 fresh shards (how long each took; a sample
# of rows read back bit for bit). Never pass/fail.
#
#   tests/bench/rows-scale.sh [--build DIR] [--rows 50000000] [--keep]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build rows=50000000 keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--build DIR] [--rows N] [--keep]" >&2; exit 2 ;;
  esac
done
BENCH=rows-scale
source "$top/tests/bench/lib.sh"
python_client numpy
CK=$RUN/checkpoints
rss_mib() { awk '/^VmRSS:/ { printf "%.0f", $2 / 1024 }' "/proc/$1/status"; }
cluster() {  # cluster TAG [PSCOORD OPTIONS...]: pscoord and three shards serving /metrics
  local tag=$1 i; shift
  coord="ipc://$RUN/$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$coord" --workers 1 --shards 3 --checkpoint-dir "$CK" \
    --checkpoint-timeout 600 "$@"
  for i in 1 2 3; do
    psnet_start "psd-$tag-$i" "$PSD" --id "$i" --listen "ipc://$RUN/psd-$tag-$i.sock" --coord "$coord" \
      --http 127.0.0.1:0
  done
}
shard_report() {  # shard_report TAG: each shard's rows, table bytes and resident memory
  local tag=$1 i pid port m n bytes rss own
  for i in 1 2 3; do
    pid_var="PID_psd_${tag}_$i"; pid=${!pid_var}
    port=$(sed -n 's/.*msg="serving http" address=[^ ]* port=\([0-9]*\).*/\1/p' "$RUN/psd-$tag-$i.log" | head -1)
    m=$(curl -sf "http://127.0.0.1:$port/metrics")
    n=$(awk '$1 == "psnet_psd_table_rows{table=\"e\"}" { print $2 }' <<<"$m")
    bytes=$(awk '$1 == "psnet_psd_table_bytes{table=\"e\"}" { print $2 }' <<<"$m")
    rss=$(rss_mib "$pid")
    own=$(awk -v n="$n" 'BEGIN { printf "%.0f", n * 32 * 4 / 1048576 }')
    awk -v i="$i" -v n="$n" -v b="$bytes" -v r="$rss" -v o="$own" 'BEGIN {
      printf "shard %d: rows=%d table_MiB=%.0f rss_MiB=%d rows_own_MiB=%d rss/(1.15 x own + 64)=%.3f\n",
        i, n, b / 1048576, r, o, r / (1.15 * o + 64) }'
  done
}

cluster fill --mode asp --replicas 1 --model mlp:4-1 --tables e:16:adagrad
/usr/bin/python3 "$top/tests/bench/rows_scale.py" run "$coord" "$rows" "$RUN/sample.npz" "$PSCTL" big \
  || die "the worker failed (logs in $RUN)"
shard_report fill
grep -h 'msg="checkpoint written"' "$RUN"/psd-fill-*.log | sed 's/^.*msg=/  /'
du -sh "$CK/big" | awk '{ print "checkpoint on disk: " $1 }'
psnet_stop_all

cluster back --restore big
/usr/bin/python3 "$top/tests/bench/rows_scale.py" check "$coord" "$RUN/sample.npz" || die "the sample differs"
grep -h 'msg="restored"' "$RUN"/psd-back-*.log | sed 's/^.*msg=/  /'
shard_report back
