#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Garbage, truncated, oversized and unknown-key messages sent to psd and pscoord
# while a job trains: each gets an error reply naming the problem, the daemons
# keep serving, and the job still finishes.
source "$(dirname "$0")/lib.sh"

COORD="ipc://$RUN/coord.sock" SHARD="ipc://$RUN/psd-1.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 1 --shards 1 --epochs 8 "${SUBSET[@]}"
psnet_start psd-1 "$PSD" --id 1 --listen "$SHARD" --coord "$COORD"
psnet_start workerd "$WORKERD" --coord "$COORD"
psnet_wait_for 30 grep -q 'msg="training"' "$RUN/workerd.log"; ok $? "the job is training"

expect() {  # expect ENDPOINT CASE PATTERN DESCRIPTION
  local out; out=$("$PSPOKE" "$1" "$2" 1 200704 2>&1)
  grep -qE -- "$3" <<<"$out"; ok $? "$4 ($out)"
}
expect "$SHARD" garbage 'status=malformed' "psd: random bytes get a malformed error"
expect "$SHARD" empty 'status=malformed' "psd: an empty frame gets a malformed error"
expect "$SHARD" truncated 'status=malformed' "psd: a truncated header gets a malformed error"
expect "$SHARD" version 'status=version.*99' "psd: another protocol version is refused, naming it"
expect "$SHARD" unknown-type 'status=unknown-type' "psd: an unknown message type is refused"
expect "$SHARD" oversized 'status=size.*bytes' "psd: an oversized frame is refused with its size"
expect "$SHARD" missing-frame 'status=malformed' "psd: a PUSH missing a frame is refused"
expect "$SHARD" unknown-tensor 'status=unknown-key.*999' "psd: an unknown tensor is refused, naming it"
expect "$SHARD" bad-len 'status=size' "psd: a key with the wrong length is refused"
expect "$SHARD" wrong-job 'status=invalid.*4242' "psd: a request for another job is refused"
expect "$SHARD" status 'status=unknown-type' "psd: a control message is refused"
expect "$SHARD" pull 'type=2 status=ok frames=1' "psd: a valid PULL is still answered"
alive "$PID_psd_1"; ok $? "psd is still running"

expect "$COORD" garbage 'status=malformed' "pscoord: random bytes get a malformed error"
expect "$COORD" empty 'status=malformed' "pscoord: an empty frame gets a malformed error"
expect "$COORD" truncated 'status=malformed' "pscoord: a truncated header gets a malformed error"
expect "$COORD" version 'status=version' "pscoord: another protocol version is refused"
expect "$COORD" unknown-type 'status=unknown-type' "pscoord: an unknown message type is refused"
expect "$COORD" pull 'status=unknown-type' "pscoord: a data-plane message is refused"
expect "$COORD" register-bad 'status=malformed.*REGISTER carries no body, it takes reg' "pscoord: a REGISTER without body is refused"
expect "$COORD" v1 'status=version.*version 1, this one speaks version 2' "pscoord: a protocol-version-1 peer is told so"
expect "$SHARD" v1 'status=version.*version 1, this one speaks version 2' "psd: a protocol-version-1 peer is told so"
expect "$COORD" status 'type=21 status=ok' "pscoord: a valid STATUS is still answered"
alive "$PID_pscoord"; ok $? "pscoord is still running"

out=$("$PSCTL" --coord "$COORD" job wait --wait 120); ok $? "the job finishes ($out)"
accuracy_at_least "$out" 0.70; ok $? "with a sane accuracy"
shard_errors() { "$PSCTL" --coord "$COORD" --json status | jq -e '.shards[0].errors >= 11'; }
psnet_wait_for 10 shard_errors; ok $? "psd counted the 11 refused requests in its status"
grep -q 'msg="refused request"' "$RUN/psd-1.log"; ok $? "psd logged the refusals"
