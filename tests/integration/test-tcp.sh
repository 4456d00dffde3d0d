#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The same cluster over tcp:// on loopback (the transport between hosts). One
# worker sends a key a message (PSNET_PART_KIB=1), the other names no size
# (PSNET_PART_KIB=junk): it says so and keeps the default. Without --keys the
# daemons say that any local user can join; an ipc:// socket's folders are
# made for their owner alone.
source "$(dirname "$0")/lib.sh"

port() { echo $((20000 + (RANDOM % 20000))); }
base=$(port)
COORD="tcp://127.0.0.1:$base"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 2 --shards 2 --mode asp --epochs 2 "${SUBSET[@]}"
for i in 1 2; do psnet_start "psd-$i" "$PSD" --id $i --listen "tcp://127.0.0.1:$((base + i))" --coord "$COORD"; done
PSNET_PART_KIB=1 psnet_start workerd-1 "$WORKERD" --coord "$COORD"
PSNET_PART_KIB=junk psnet_start workerd-2 "$WORKERD" --coord "$COORD"
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job over tcp finishes ($out)"
grep -q 'PSNET_PART_KIB=junk is no size in KiB (1 to 4194304): parts of 1024 KiB' "$RUN/workerd-2.log"
ok $? "a worker told PSNET_PART_KIB=junk says so and keeps 1 MiB parts"
accuracy_at_least "$out" 0.70; ok $? "accuracy >= 0.70 on the subset, 2 epochs"
json=$("$PSCTL" --coord "$COORD" --json status)
jq -e '.shards | map(.endpoint | startswith("tcp://127.0.0.1:")) | all' <<<"$json" >/dev/null; ok $? "the shards advertise tcp endpoints"
grep -q "msg=\"listening on $COORD without --keys: any user of this host can connect" "$RUN/pscoord.log" &&
  grep -q "msg=\"listening on tcp://127.0.0.1:$((base + 1)) without --keys: any user of this host can connect" "$RUN/psd-1.log"
ok $? "pscoord and psd say that on loopback tcp without --keys any local user can join"
psnet_stop_all
# A daemon's ipc:// socket lies in a folder it makes for its owner alone.
psnet_start pscoord-ipc "$PSCOORD" --listen "ipc://$RUN/own/dir/coord.sock" --workers 1 --shards 1
psnet_wait_for 10 test -S "$RUN/own/dir/coord.sock"
[ "$(stat -c %a "$RUN/own")" = 700 ] && [ "$(stat -c %a "$RUN/own/dir")" = 700 ]
ok $? "the folders it made for its socket are its owner's alone ($(stat -c %a "$RUN/own" "$RUN/own/dir" | tr '\n' ' '))"
! grep -q "without --keys: any user" "$RUN/pscoord-ipc.log"; ok $? "and it gives no warning there"
psnet_stop_all
parts=$(cat "$RUN"/psd-[12].log | sed -n 's/.*msg="stopped" .* push_parts=\([0-9]*\) .*/\1/p' | awk '{ n += $1 } END { print n + 0 }')
[ "$parts" -gt 0 ]; ok $? "the shards took pushes in parts over tcp ($parts parts)"
