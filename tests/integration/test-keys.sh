#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CURVE and the allow-list. Keys come from psctl keys gen; a cluster run with
# --keys trains over tcp. psctl with no key, with an unknown key, and a worker
# key sending an admin command are all refused (clear reasons; pscoord logs the
# key's fingerprint) while the admin key works. Roles are enforced where the
# messages arrive: an edge key cannot register as a worker, send an admin
# command, or push, pull or send chunk state to a shard of a training job; a
# worker key cannot send a shard's chunk state. SIGHUP reloads the allow-list. Without --keys a
# non-loopback tcp:// listen address is refused unless --insecure.
source "$(dirname "$0")/lib.sh"

K=$RUN/keys
for kr in pscoord:server psd:server worker:worker admin:admin edge:edge; do
  "$PSCTL" keys gen "${kr%%:*}" --role "${kr##*:}" --dir "$K" >/dev/null; ok $? "psctl keys gen ${kr%%:*} --role ${kr##*:}"
done
grep -qE '^admin .{40} admin$' "$K/allow"; ok $? "the allow-list has the admin key's line"
[ "$(stat -c %a "$K/admin.key")" = 600 ] && [ "$(stat -c %a "$K")" = 700 ]; ok $? "secret key files are 0600 in a 0700 directory"
out=$("$PSCTL" keys gen admin --role admin --dir "$K" 2>&1); ok $(( $? == 0 )) "keys gen never overwrites a key ($out)"
out=$("$PSCTL" keys gen x --role root --dir "$K" 2>&1); ok $(( $? == 0 )) "keys gen refuses an unknown role"
stranger=$("$PSCTL" --json keys gen stranger --role admin --dir "$RUN/other" | jq -r .fingerprint)
cp "$K/pscoord.pub" "$RUN/other/"
wfp=$("$PSCTL" --json keys gen late --role admin --dir "$RUN/late" | jq -r .fingerprint)

port=$((20000 + RANDOM % 20000)); COORD="tcp://127.0.0.1:$port" SHARD="tcp://127.0.0.1:$((port + 1))"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --keys "$K" --workers 1 --shards 1 --epochs 3 "${SUBSET[@]}"
psnet_start psd-1 "$PSD" --id 1 --listen "$SHARD" --coord "$COORD" --keys "$K"
psnet_start workerd "$WORKERD" --coord "$COORD" --keys "$K" --progress-ms 100
psnet_wait_for 30 grep -q 'msg="progress"' "$RUN/workerd.log"; ok $? "a cluster with --keys trains over tcp"
out=$("$PSCTL" --coord "$COORD" --keys "$K" --json status); ok $? "the admin key works"
jq -e '.job.state == "running"' <<<"$out" >/dev/null; ok $? "and gets the status"
# The secret key file's mode: 0640 (a Kubernetes Secret mounted for a pod's
# fsGroup) is fine, 0644 is refused with the reason.
cp -a "$K" "$RUN/kmode"
chmod 640 "$RUN/kmode/admin.key"
"$PSCTL" --coord "$COORD" --keys "$RUN/kmode" status >/dev/null 2>&1; ok $? "a group-readable (0640) key file is accepted"
chmod 644 "$RUN/kmode/admin.key"
out=$("$PSCTL" --coord "$COORD" --keys "$RUN/kmode" status 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "admin.key is open to others (mode 644)" <<<"$out"; ok $? "a world-readable (0644) one is refused ($out)"

out=$("$PSCTL" --coord "$COORD" --timeout 2 status 2>&1); ok $(( $? == 0 )) "no key: refused"
grep -q "disagree on encryption" <<<"$out"; ok $? "psctl says why ($out)"
out=$("$PSCTL" --coord "$COORD" --keys "$RUN/other" --key stranger --timeout 2 status 2>&1); ok $(( $? == 0 )) "an unknown key: refused"
grep -q "refused this key" <<<"$out"; ok $? "psctl says why ($out)"
psnet_wait_for 5 grep -q "key not in the allow-list\" key=$stranger" "$RUN/pscoord.log"; ok $? "pscoord logs the unknown key's fingerprint"
out=$("$PSCTL" --coord "$COORD" --keys "$K" --key worker job stop 2>&1); ok $(( $? == 0 )) "a worker key sending an admin command: refused"
grep -q "role worker may not send JOB_STOP (admin only) (denied)" <<<"$out"; ok $? "with a clear status ($out)"
grep -q "msg=\"refused request\" reason=\"role worker may not send JOB_STOP (admin only)\" status=denied key=[0-9a-f]\{16\} name=worker" "$RUN/pscoord.log"
ok $? "pscoord logs it with the key's fingerprint"
out=$(PSPOKE_KEYS=$K PSPOKE_KEY=worker "$PSPOKE" "$COORD" history 2>&1)
grep -q "status=denied .*reason=role worker may not send HISTORY (admin only)" <<<"$out"
ok $? "a worker key asking for the job's samples: refused ($out)"
"$PSCTL" --coord "$COORD" --keys "$K" report --out "$RUN/report" >/dev/null && [ -s "$RUN/report/index.html" ]
ok $? "the admin key gets psctl report"
out=$("$PSCTL" --coord "$COORD" --keys "$K" --timeout 10 export "$RUN/keys.safetensors" 2>&1) && [ -s "$RUN/keys.safetensors" ]
ok $? "the admin key exports the job's values from the shards (psctl export: $out)"
out=$(PSPOKE_KEYS=$K PSPOKE_KEY=edge "$PSPOKE" "$COORD" register-worker 2>&1)
grep -q "status=denied .*reason=a key of role edge cannot register as a worker" <<<"$out"; ok $? "an edge key cannot register as a worker ($out)"
len=$("$PSCTL" --coord "$COORD" --keys "$K" --json status | jq .job.chunk_floats)
out=$("$PSCTL" --coord "$COORD" --keys "$K" --key edge job stop 2>&1); ok $(( $? == 0 )) "an edge key sending an admin command: refused"
grep -q "role edge may not send JOB_STOP (admin only) (denied)" <<<"$out"; ok $? "with a clear status ($out)"
out=$(PSPOKE_KEYS=$K PSPOKE_KEY=edge PSPOKE_SERVER=psd "$PSPOKE" "$SHARD" push-value 1 2>&1)
grep -q "status=denied .*reason=edge workers take part in federated jobs only" <<<"$out"
ok $? "an edge key cannot push a worker's gradient into a training job ($out)"
out=$(PSPOKE_KEYS=$K PSPOKE_KEY=edge PSPOKE_SERVER=psd "$PSPOKE" "$SHARD" pull 1 2>&1)
grep -q "status=denied .*reason=edge workers take part in federated jobs only" <<<"$out"
ok $? "nor pull its weights ($out)"
out=$(PSPOKE_KEYS=$K PSPOKE_KEY=edge PSPOKE_SERVER=psd "$PSPOKE" "$SHARD" chunk-state 1 "$len" 2>&1)
grep -q "status=denied .*reason=role edge may not send CHUNK_STATE (server only)" <<<"$out"; ok $? "nor send a shard's chunk state ($out)"
out=$(PSPOKE_KEYS=$K PSPOKE_KEY=worker "$PSPOKE" "$COORD" register-server 2>&1)
grep -q "status=denied .*reason=a key of role worker cannot register as a shard" <<<"$out"; ok $? "a worker key cannot register as a shard ($out)"
out=$(PSPOKE_KEYS=$K PSPOKE_KEY=worker PSPOKE_SERVER=psd "$PSPOKE" "$SHARD" chunk-state 1 "$len" 2>&1)
grep -q "status=denied .*reason=role worker may not send CHUNK_STATE (server only)" <<<"$out"; ok $? "a worker key cannot send a shard's chunk state ($out)"
# An operator's key reads a shard (psctl export) and writes nothing: psd's
# ZAP admits the roles of its rows of the message table.
out=$(PSPOKE_KEYS=$K PSPOKE_KEY=admin PSPOKE_SERVER=psd "$PSPOKE" "$SHARD" push-value 1 2>&1)
grep -q "status=denied .*reason=role admin may not send PUSH" <<<"$out"
ok $? "psd refuses an admin key's push with the reason ($out)"

# A key added to the allow-list takes effect on SIGHUP.
cat "$RUN/late/late.pub" >>"$K/allow"; cp "$RUN/late/late.key" "$K/"
kill -HUP "$PID_pscoord"
psnet_wait_for 5 grep -q 'msg="SIGHUP: allow-list reloaded"' "$RUN/pscoord.log"; ok $? "SIGHUP reloads the allow-list"
out=$("$PSCTL" --coord "$COORD" --keys "$K" --key late status); ok $? "the new key works after SIGHUP (fingerprint $wfp)"

out=$("$PSCTL" --coord "$COORD" --keys "$K" job wait --wait 120); ok $? "the job finishes ($out)"
accuracy_at_least "$out" 0.70; ok $? "with a sane accuracy"
psnet_stop_all

# Without --keys: tcp:// listens on loopback only, unless --insecure.
out=$("$PSD" --id 1 --listen "tcp://0.0.0.0:$((port + 2))" --coord "$COORD" 2>&1); rc=$?
[ $rc -eq 2 ]; ok $? "psd refuses tcp://0.0.0.0 without --keys (exit $rc)"
grep -q "refusing to listen on tcp://0.0.0.0:$((port + 2)) without encryption" <<<"$out"; ok $? "and says why"
out=$("$PSCOORD" --listen "tcp://0.0.0.0:$((port + 3))" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "refusing to listen" <<<"$out"; ok $? "pscoord too (exit $rc)"
psnet_start insecure "$PSCOORD" --listen "tcp://0.0.0.0:$((port + 4))" --insecure
psnet_wait_for 10 "$PSCTL" --coord "tcp://127.0.0.1:$((port + 4))" status; ok $? "--insecure listens on tcp://0.0.0.0"
