#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checkpoints. A BSP job on two shards is saved mid-run (psctl checkpoint save)
# and finishes; the checkpoint is restored onto three shards (psctl checkpoint
# restore) and the job finishes there with the same final weights, bit for
# bit, and so it does restored into a pscoord given no job flags. Under ASP, --checkpoint-every saves while training and --checkpoint-keep
# prunes; every file of an ASP checkpoint holds exactly W x B updates per key
# (a consistent cut at clock B), and it restores. SSP is saved too. A file
# with one byte changed is refused by name and checksum (the job fails at once
# with it), and psctl checkpoint list shows it damaged. A disk that fills during a save leaves the previous checkpoint
# whole (a small tmpfs; root only).
source "$(dirname "$0")/lib.sh"

CK="$RUN/checkpoints"
# Passes of 20 steps (1,280 images a worker): the save at clock 30 or later
# falls past the first pass, where a restored worker must take the batches
# the uninterrupted run took (a pass's order is not the previous pass's
# shuffled again).
JOB=(--workers 2 --mode bsp --epochs 10 --batch 64 --train-limit 2560 --test-limit 2000)

# start_cluster TAG SHARDS [PSCOORD OPTIONS...]: pscoord and SHARDS shards of run TAG.
start_cluster() {
  local tag=$1 n=$2; shift 2
  COORD="ipc://$RUN/coord-$tag.sock"
  psnet_start "pscoord-$tag" "$PSCOORD" --listen "$COORD" --checkpoint-dir "$CK" --shards "$n" "${JOB[@]}" "$@"
  start_shards "$tag" "$n"
}
start_workers() {  # start_workers TAG [WORKERD OPTIONS...]
  local tag=$1 i; shift
  for i in 1 2; do psnet_start "workerd-$tag-$i" "$WORKERD" --coord "$COORD" --trace-pulls "$@"; done
}
digest_of() { sed -n 's/.*msg="job done".* weights=\([0-9a-f]*\).*/\1/p' "$RUN/pscoord-$1.log" | tail -1; }
pulled() { logs_match "msg=\"pulled\" clock=$2 " "workerd-$1-1.log"; }
# entries DIR: one line per key of every shard file of checkpoint DIR: "tensor chunk steps clock".
entries() {
  python3 - "$1" <<'PY'
import glob, struct, sys, zlib
for f in sorted(glob.glob(sys.argv[1] + "/shard-*.ckpt")):
    b = open(f, "rb").read()
    assert b[:8] == b"PSNETCK1", f
    n, = struct.unpack_from("<I", b, 20)
    head = bytearray(b[:64 + 56 * n]); head[60:64] = b"\0\0\0\0"
    assert zlib.crc32(head) == struct.unpack_from("<I", b, 60)[0], f + ": header checksum"
    for i in range(n):
        t, c, ln, nl, steps, clock, off, size, crc = struct.unpack_from("<IIIIQqQQI", b, 64 + 56 * i)
        assert zlib.crc32(b[off:off + size]) == crc, f + ": record checksum"
        print(t, c, steps, clock)
PY
}

# 1. BSP on two shards, saved at about clock 30 (in the second pass or later);
# the run goes on to its end.
start_cluster a 2
start_workers a
psnet_wait_for 60 pulled a 30; ok $? "run a trains to clock 30"
out=$("$PSCTL" --coord "$COORD" checkpoint save mid 2>&1); ok $? "psctl checkpoint save mid ($out)"
B=$(sed -n 's/.*saved: clock \([0-9]*\),.*/\1/p' <<<"$out")
[ -n "$B" ] && [ "$B" -ge 30 ]; ok $? "the checkpoint is at a clock boundary past 30 (clock $B)"
[ -f "$CK/mid/MANIFEST" ] && [ -f "$CK/mid/shard-1.ckpt" ] && [ -f "$CK/mid/shard-2.ckpt" ] && \
  ! ls "$CK"/mid/*.tmp >/dev/null 2>&1
ok $? "a manifest and one file per shard, no temporary file left"
keys=$(entries "$CK/mid" | awk -v b="$B" '$4 == b' | wc -l)
all=$(entries "$CK/mid" | wc -l)
[ "$all" -gt 0 ] && [ "$keys" = "$all" ]; ok $? "every key of the BSP checkpoint stands at clock $B ($keys of $all)"
out=$("$PSCTL" --coord "$COORD" checkpoint save mid 2>&1); ok $(( $? == 0 )) "a second save under the same name is refused ($out)"
out=$("$PSCTL" --coord "$COORD" checkpoint save ../x 2>&1); ok $(( $? == 0 )) "a name that is a path is refused ($out)"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "run a finishes ($out)"
want=$(digest_of a)
[ -n "$want" ]; ok $? "final weights of the uninterrupted run ($want)"
out=$("$PSCTL" --coord "$COORD" checkpoint list); ok $? "psctl checkpoint list"
grep -qE "^mid +$B " <<<"$out"; ok $? "the list shows mid at clock $B"
stop_shards() {  # stop_shards TAG N: each shard stops on SIGTERM with status 0
  for i in $(seq 1 "$2"); do
    v="PID_psd_$1_$i"; kill -TERM "${!v}"; wait "${!v}"; ok $? "shard $i of run $1 exits cleanly"
  done
}
stop_shards a 2
psnet_stop_all

# 2. Restored onto three shards: the job goes on from clock B and ends with
# the same weights as run a, bit for bit.
start_cluster b 3
out=$("$PSCTL" --coord "$COORD" checkpoint restore mid 2>&1); ok $? "psctl checkpoint restore mid ($out)"
start_workers b
psnet_wait_for 30 logs_match 'msg="shard restored"' 'pscoord-b.log'; ok $? "the shards load their keys"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the restored job finishes on three shards ($out)"
first=$(sed -n 's/.*msg="pulled" clock=\([0-9]*\) .*/\1/p' "$RUN/workerd-b-1.log" | head -1)
[ "$first" = "$B" ]; ok $? "workers resume at the checkpoint's clock ($first = $B)"
got=$(digest_of b)
[ -n "$got" ] && [ "$got" = "$want" ]; ok $? "final weights identical to the uninterrupted run ($got = $want)"
st=$("$PSCTL" --coord "$COORD" status); grep -q "restored_from=mid" <<<"$st"; ok $? "psctl status says where the job came from"
stop_shards b 3
psnet_stop_all

# 2b. Restored into a pscoord given no job flags (not --workers 2): the job
# waits for the checkpoint's two workers and ends the same, bit for bit.
COORD="ipc://$RUN/coord-n.sock"
psnet_start pscoord-n "$PSCOORD" --listen "$COORD" --checkpoint-dir "$CK" --shards 2
start_shards n 2
out=$("$PSCTL" --coord "$COORD" checkpoint restore mid 2>&1); ok $? "restore into a pscoord without job flags ($out)"
grep -q 'msg="job restored".* workers=2' "$RUN/pscoord-n.log"; ok $? "it takes the checkpoint's 2 workers"
start_workers n
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "that restored job finishes ($out)"
got=$(digest_of n)
[ -n "$got" ] && [ "$got" = "$want" ]; ok $? "final weights identical to the uninterrupted run ($got = $want)"
stop_shards n 2
psnet_stop_all

# 3. One byte changed in a shard's file: the restore fails at once, naming the
# file, the key and the checksums.
cp -r "$CK/mid" "$CK/bad"
size=$(stat -c %s "$CK/bad/shard-1.ckpt")
printf '\x5a' | dd of="$CK/bad/shard-1.ckpt" bs=1 seek=$((size - 100)) conv=notrunc status=none
start_cluster c 2 --restore bad
start_workers c
psnet_wait_for 30 logs_match 'msg="job failed"' 'pscoord-c.log'; ok $? "a corrupted checkpoint fails the job at once"
logs_match 'job failed.*shard-1.ckpt: key \([0-9]+,[0-9]+\): checksum mismatch \(stored [0-9a-f]+, computed [0-9a-f]+\)' \
  'pscoord-c.log'; ok $? "the reason names the file, the key and both checksums"
# psctl checkpoint list reads every byte (in pscoord's thread pool) and shows
# the damaged one as such, the good one as checked.
listed() { list=$("$PSCTL" --coord "$COORD" checkpoint list) && ! grep -q 'not yet' <<<"$list"; }
psnet_wait_for 60 listed; ok $? "every checkpoint checked ($(tr '\n' '|' <<<"$list"))"
grep -qE '^bad +cannot be restored: .*shard-1.ckpt: key \([0-9]+,[0-9]+\): checksum mismatch' <<<"$list"
ok $? "the list shows bad as damaged, naming the file and the key"
grep -qE "^mid +$B .* yes " <<<"$list"; ok $? "and mid as checked"
[ "$("$PSCTL" --coord "$COORD" --json checkpoint list | jq -r '.checkpoints[] | select(.name == "mid") | .checked')" = true ]
ok $? "--json says checked: true for mid"
psnet_stop_all
"$PSCOORD" --listen "ipc://$RUN/coord-x.sock" --checkpoint-dir "$CK" --restore nosuch >"$RUN/pscoord-x.log" 2>&1
[ $? -ne 0 ] && grep -q 'checkpoint nosuch: no such checkpoint' "$RUN/pscoord-x.log"
ok $? "pscoord --restore of a missing checkpoint exits with the reason"

# 4. ASP with --checkpoint-every: saved while training, the oldest pruned; an
# ASP checkpoint at clock B holds exactly 2 x B updates of every key. pscoord
# learns the workers' clocks from their heartbeats (every 750 ms at the
# default lease): 8 epochs last several of them on a fast machine too.
JOB=(--workers 2 --mode asp --epochs 8 --batch 64 "${SUBSET[@]}")
start_cluster d 2 --checkpoint-every 10 --checkpoint-keep 1
start_workers d
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the ASP run with --checkpoint-every finishes ($out)"
saved=$(grep -c 'msg="checkpoint saved"' "$RUN/pscoord-d.log")
[ "$saved" -ge 2 ]; ok $? "automatic checkpoints saved while training ($saved)"
logs_match 'msg="checkpoint pruned"' 'pscoord-d.log'; ok $? "the oldest automatic ones are pruned"
n=$(ls -d "$CK"/auto-* | wc -l); [ "$n" = 1 ]; ok $? "--checkpoint-keep 1 keeps one ($n)"
last=$(ls -d "$CK"/auto-* | sort -t- -k2 -n | tail -1)
B=${last##*-}
bad=$(entries "$last" | awk -v w=$((2 * B)) '$3 != w' | wc -l)
[ "$(entries "$last" | wc -l)" -gt 0 ] && [ "$bad" = 0 ]; ok $? "every key of $(basename "$last") holds 2 x $B updates"
[ "$bad" = 0 ] || entries "$last" | awk -v w=$((2 * B)) '$3 != w' | head -5 | sed 's/^/# tensor chunk steps clock: /' 
psnet_stop_all
start_cluster e 2 --restore "$(basename "$last")"
start_workers e
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the ASP checkpoint restores and its job finishes ($out)"
psnet_stop_all

# 5. SSP: saved while training.
JOB=(--workers 2 --mode ssp:2 --epochs 1 --batch 64 "${SUBSET[@]}")
start_cluster f 2
# A step of this job takes under 5 ms on a fast machine: the epoch's ~94
# clocks would end before the save reached them. 20 ms before each push
# leaves the save 1.5 s of job at least.
start_workers f --step-delay-ms 20
psnet_wait_for 60 pulled f 20; ok $? "the SSP run trains to clock 20"
out=$("$PSCTL" --coord "$COORD" checkpoint save 2>&1); ok $? "an SSP checkpoint is saved, named by its clock ($out)"
B=$(sed -n 's/.*saved: clock \([0-9]*\),.*/\1/p' <<<"$out")
bad=$(entries "$CK/clock-$B" | awk -v w=$((2 * B)) '$3 != w' | wc -l)
[ -n "$B" ] && [ "$bad" = 0 ]; ok $? "every key of clock-$B holds 2 x $B updates"
[ "$bad" = 0 ] || entries "$CK/clock-$B" | awk -v w=$((2 * B)) '$3 != w' | head -5 | sed 's/^/# tensor chunk steps clock: /' 
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the SSP run finishes ($out)"
psnet_stop_all

# 6. A disk that fills during a save: the save fails with the reason, the
# previous checkpoint stays whole, nothing of the failed one is left.
if [ "$(id -u)" != 0 ]; then
  TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - full disk during a save # SKIP needs root to mount a tmpfs"
else
  small="$RUN/small"; mkdir -p "$small"
  # One checkpoint of this model takes ~1.6 MB (values and momentum): room for one.
  if mount -t tmpfs -o size=2600k tmpfs "$small"; then
    CK="$small"
    JOB=(--workers 2 --mode bsp --epochs 2 --batch 64 "${SUBSET[@]}")
    start_cluster g 2
    start_workers g
    psnet_wait_for 60 pulled g 10; ok $? "run g trains to clock 10"
    out=$("$PSCTL" --coord "$COORD" checkpoint save one 2>&1); ok $? "the first checkpoint fits ($out)"
    sum1=$(cat "$small"/one/* | cksum)
    out=$("$PSCTL" --coord "$COORD" checkpoint save two 2>&1); ok $(( $? == 0 )) "the second does not: refused ($out)"
    grep -q 'No space left on device' <<<"$out"; ok $? "the error says the disk is full"
    [ ! -e "$small/two" ]; ok $? "nothing of the failed checkpoint is left"
    [ "$(cat "$small"/one/* | cksum)" = "$sum1" ] && [ "$(entries "$small/one" | wc -l)" -gt 0 ]
    ok $? "the previous checkpoint is whole"
    out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "training went on ($out)"
    psnet_stop_all
    umount "$small"
  else
    TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - full disk during a save # SKIP cannot mount a tmpfs here"
  fi
fi
