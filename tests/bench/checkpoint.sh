#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Benchmark: checkpoint save and restore of a large model against dd to the
# same disk in the same run. A BSP job of a 256 MiB MLP (784-8192-7400-10, SGD
# with momentum: 512 MiB of values and state) on two shards and one worker is
# saved once it trained two clocks; the shards' write times (their logs: each
# writes its file in its thread pool while training goes on) give the save's
# GB/s. Then a fresh cluster restores it (--restore) and the shards' load
# times give the restore's. dd writes (conv=fsync) and reads the same number
# of bytes in the same directory; with root, the page cache is dropped before
# each read. Leases are long: building a 256 MiB model stalls a shard's loop
# for seconds on a small machine.
#
# Printed, never pass/fail:
#   checkpoint bytes=B save_s=.. save_GBps=.. dd_write_GBps=.. ratio=..
#              restore_s=.. restore_GBps=.. dd_read_GBps=.. ratio=.. cut_wait_ms=..
#
#   tests/bench/checkpoint.sh [--build DIR] [--dir DIR] [--model mlp:...] [--keep]
set -u
export LC_ALL=C
top=$(cd "$(dirname "$0")/../.." && pwd)
build="$top/build" base=/var/tmp model=mlp:784-8192-7400-10 keep=0
usage() { sed -n '3,19p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --dir) base=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "checkpoint: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
BENCH=checkpoint
source "$top/tests/bench/lib.sh"
CK=$(mktemp -d "$base/psnet-bench-ckpt.XXXXXX") || die "cannot make a directory in $base"
BENCH_SCRATCH=("$CK")
drop_caches() { [ "$(id -u)" = 0 ] && sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; }
# max_field MSG KEY FILES...: the largest KEY=N over the lines of FILES that log msg="MSG".
max_field() { local m=$1 k=$2; shift 2; grep -h "msg=\"$m\"" "$@" | sed -n "s/.* $k=\([0-9]*\).*/\1/p" | sort -n | tail -1; }
gbps() { awk -v b="$1" -v ms="$2" 'BEGIN { printf "%.2f", (ms > 0 ? b / ms / 1e6 : 0) }'; }

start() {  # start TAG [PSCOORD OPTIONS...]
  local tag=$1; shift
  COORD="ipc://$RUN/coord-$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" --checkpoint-dir "$CK" --workers 1 --shards 2 --mode bsp \
    --model "$model" --epochs 1 --batch 32 --train-limit 6400 --test-limit 1000 --shard-lease-ms 60000 --lease-ms 60000 "$@"
  for i in 1 2; do psnet_start "psd-$tag-$i" "$PSD" --id $i --listen "ipc://$RUN/psd-$tag-$i.sock" --coord "$COORD"; done
  psnet_start "w-$tag" "$WORKERD" --coord "$COORD" --trace-pulls
}

start a
psnet_wait_for 300 grep -q 'msg="pulled" clock=2 ' "$RUN/w-a.log" || die "the job did not reach clock 2"
"$PSCTL" --coord "$COORD" checkpoint save big --wait 600 >"$RUN/save.out" 2>&1 || die "save failed: $(cat "$RUN/save.out")"
psnet_stop_all
bytes=$(cat "$CK"/big/shard-*.ckpt | wc -c)
save_ms=$(max_field "checkpoint written" ms "$RUN"/psd-a-*.log)        # cut + write
wait_ms=$(max_field "checkpoint snapshot" wait_ms "$RUN"/psd-a-*.log)  # the cut alone
write_ms=$((save_ms - wait_ms))
dd if=/dev/zero of="$CK/dd.bin" bs=4M count=$(( (bytes + 4194303) / 4194304 )) conv=fsync 2>"$RUN/dd-w.txt" ||
  die "dd write failed"
ddw=$(awk '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) { print $(i - 1) } }' "$RUN/dd-w.txt" | tail -1)
ddw_gbps=$(awk -v b="$(stat -c %s "$CK/dd.bin")" -v s="$ddw" 'BEGIN { printf "%.2f", b / s / 1e9 }')

drop_caches
start b --restore big
psnet_wait_for 300 grep -q 'msg="job started"' "$RUN/pscoord-b.log" || die "the restored job did not start"
psnet_wait_for 300 sh -c "[ \$(grep -c 'msg=\"shard restored\"' '$RUN/pscoord-b.log') -ge 2 ]" || die "no restore"
restore_ms=$(max_field "shard restored" ms "$RUN/pscoord-b.log")
psnet_stop_all
drop_caches
dd if="$CK/dd.bin" of=/dev/null bs=4M 2>"$RUN/dd-r.txt" || die "dd read failed"
ddr=$(awk '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) { print $(i - 1) } }' "$RUN/dd-r.txt" | tail -1)
ddr_gbps=$(awk -v b="$(stat -c %s "$CK/dd.bin")" -v s="$ddr" 'BEGIN { printf "%.2f", b / s / 1e9 }')
# A restore reads every key on both shards (primary and backup copies): twice the bytes.
save_gbps=$(gbps "$bytes" "$write_ms") restore_gbps=$(gbps $((2 * bytes)) "$restore_ms")
printf 'checkpoint bytes=%s save_s=%.2f save_GBps=%s dd_write_GBps=%s ratio=%.2f restore_s=%.2f restore_GBps=%s dd_read_GBps=%s ratio=%.2f cut_wait_ms=%s\n' \
  "$bytes" "$(awk -v m="$write_ms" 'BEGIN { print m / 1000 }')" "$save_gbps" "$ddw_gbps" \
  "$(awk -v a="$save_gbps" -v b="$ddw_gbps" 'BEGIN { print (b > 0 ? a / b : 0) }')" \
  "$(awk -v m="$restore_ms" 'BEGIN { print m / 1000 }')" "$restore_gbps" "$ddr_gbps" \
  "$(awk -v a="$restore_gbps" -v b="$ddr_gbps" 'BEGIN { print (b > 0 ? a / b : 0) }')" "$wait_ms"
