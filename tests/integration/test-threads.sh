#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# psd --threads: a chunk's optimizer step, the finite check, the BSP mean and
# the shared-memory copies are cut between threads (common/pfor.h). Each value
# is computed alone, so the same BSP job (two workers, one shard: 1 MiB
# chunks, long enough to be cut) pulls bit-identical weights at every clock
# and ends with the same digest on 1 thread and on 4, through shared memory
# and in frames; the shard says it cut loops; bad counts are refused.
source "$(dirname "$0")/lib.sh"

JOB=(--workers 2 --shards 1 --mode bsp --epochs 2 --lr-schedule cosine "${SUBSET[@]}")
# run TAG [PSD OPTIONS...]: the job on fresh daemons; job wait's answer in $out.
run() {
  local tag=$1 i; shift
  COORD="ipc://$RUN/coord-$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" "${JOB[@]}"
  psnet_start "psd-$tag" "$PSD" --id 1 --listen "ipc://$RUN/psd-$tag.sock" --coord "$COORD" --http 127.0.0.1:0 "$@"
  for i in 1 2; do psnet_start "workerd-$tag-$i" "$WORKERD" --coord "$COORD" --trace-pulls; done
  out=$("$PSCTL" --coord "$COORD" job wait --wait 300)
}
digest_of() { sed -n 's/.*msg="job done".* weights=\([0-9a-f]*\).*/\1/p' "$RUN/pscoord-$1.log" | tail -1; }
extract() { sed -n 's/.*msg="pulled" clock=\([0-9]*\) checksum=\([0-9a-f]*\).*/\1 \2/p' "$1" | sort -k1,1; }
# same A B: the first workers of runs A and B pulled the same weights at every clock.
same() {
  extract "$RUN/workerd-$1-1.log" >"$RUN/$1.sum"; extract "$RUN/workerd-$2-1.log" >"$RUN/$2.sum"
  joined=$(join "$RUN/$1.sum" "$RUN/$2.sum" | wc -l); diffs=$(join "$RUN/$1.sum" "$RUN/$2.sum" | awk '$2 != $3' | wc -l)
  [ "$joined" -ge 100 ] && [ "$diffs" -eq 0 ]
}
# metric TAG NAME: NAME's value on run TAG's shard (while it runs).
metric() { curl -s -m 5 "http://127.0.0.1:$(http_port "psd-$1")/metrics" | awk -v m="$2" '$1 == m { print $2 }'; }

run t1
ok $? "the BSP job on a shard with one thread finishes ($out)"
logs_match 'msg="listening" .* threads=1' 'psd-t1.log'; ok $? "the shard says threads=1"
cut=$(metric t1 psnet_psd_parallel_loops_total); [ "$cut" = 0 ]; ok $? "and cuts no loop ($cut)"
want=$(digest_of t1); psnet_stop_all

run t4 --threads 4
ok $? "the same job on a shard with --threads 4 finishes ($out)"
logs_match 'msg="listening" .* threads=4' 'psd-t4.log'; ok $? "the shard says threads=4"
ncpu=$(nproc)
if [ "$ncpu" -lt 4 ]; then
  logs_match "level=warning .*--threads 4 is more than the $ncpu CPUs" 'psd-t4.log'
  ok $? "and warns that 4 threads are more than its $ncpu CPUs"
else
  logs_match 'is more than the .* CPUs' 'psd-t4.log'; ok $(( $? == 0 )) "and, with $ncpu CPUs, does not warn"
fi
[ "$(metric t4 psnet_psd_threads)" = 4 ]; ok $? "psnet_psd_threads is 4"
cut=$(metric t4 psnet_psd_parallel_loops_total); [ "${cut:-0}" -gt 1000 ]; ok $? "loops were cut between the threads ($cut)"
same t1 t4; ok $? "identical weights at every clock on 1 and 4 threads ($joined clocks, $diffs differ)"
got=$(digest_of t4); [ -n "$got" ] && [ "$got" = "$want" ]; ok $? "the same final digest ($got = $want)"
psnet_stop_all

PSNET_SHM=off run t4f --threads 4
ok $? "in frames (PSNET_SHM=off) on 4 threads ($out)"
same t1 t4f; ok $? "identical weights at every clock ($joined clocks, $diffs differ)"
psnet_stop_all

for n in 0 65 x; do
  err=$("$PSD" --threads "$n" --listen "ipc://$RUN/bad.sock" 2>&1); rc=$?
  [ $rc -eq 2 ] && grep -q -- "--threads" <<<"$err"; ok $? "--threads $n is refused, exit 2 ($(head -1 <<<"$err"))"
done
