#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Operability of every program: --help, bad flags, config files, unreachable
# peers (bounded wait, names the address), a missing dataset, psctl status.
source "$(dirname "$0")/lib.sh"

for b in "$PSCOORD" "$PSD" "$WORKERD" "$PSCTL"; do
  n=$(basename "$b")
  out=$("$b" --help 2>&1); rc=$?
  ok $(( rc != 0 )) "$n --help exits 0"
  grep -q "Usage: $n" <<<"$out"; ok $? "$n --help prints usage"
  grep -q -- "--config" <<<"$out"; ok $? "$n --help lists --config"
  out=$("$b" --no-such-flag 2>&1); rc=$?
  ok $(( rc != 2 )) "$n rejects an unknown flag with exit 2"
  grep -q "unknown option '--no-such-flag'" <<<"$out"; ok $? "$n names the unknown flag"
  grep -q -- "--log-level" <<<"$("$b" --help 2>&1)"; ok $? "$n --help lists --log-level"
  [ "$n" = psctl ] && set -- status || set --
  out=$("$b" "$@" --log-level loud 2>&1); rc=$?
  ok $(( rc != 2 )) "$n refuses an unknown log level with exit 2"
  grep -q "$n: unknown log level 'loud'" <<<"$out"; ok $? "$n says which"
done

# --version names the release and the git revision built (what users quote in a report).
release=$(sed -n "s/^ *version: '\([^']*\)'.*/\1/p" "$PSNET_SRC/meson.build" | head -n 1)
rev=$(git -C "$PSNET_SRC" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
for b in "$PSCOORD" "$PSD" "$WORKERD" "$PSCTL" "$PSNET_BUILD/ps/psgate/psgate"; do
  n=$(basename "$b") out=$("$b" --version 2>&1)
  [ "$out" = "$n $release (git $rev)" ]; ok $? "$n --version says the release and the revision ($out)"
done

# --log-format json (or PSNET_LOG_FORMAT=json): a JSON object a line, the same fields.
out=$("$PSD" --id 1 --listen "ipc://$RUN/json.sock" --coord "ipc://$RUN/nobody.sock" --connect-timeout 1 \
  --log-format json 2>&1)
jq -e -s 'length >= 2 and all(.[]; (.ts | test("^[0-9-]+T[0-9:.]+Z$")) and .daemon == "psd" and .shard == 1 and
  (.level | IN("info", "warning", "error")) and (.msg | type) == "string")' <<<"$out" >/dev/null
ok $? "psd --log-format json writes one JSON object a line with ts, level, daemon, shard and msg ($(head -c 300 <<<"$out"))"
jq -e -s --arg e "ipc://$RUN/json.sock" 'any(.[]; .msg == "listening" and .endpoint == $e and .threads == 1) and
  any(.[]; .level == "error" and (.msg | test("did not answer within 1 s")))' <<<"$out" >/dev/null
ok $? "its pairs are fields (numbers as numbers), its error says why"
out=$(PSNET_LOG_FORMAT=json "$WORKERD" --coord "ipc://$RUN/nobody.sock" --connect-timeout 1 2>&1)
jq -e -s 'length >= 1 and all(.[]; .daemon == "workerd")' <<<"$out" >/dev/null
ok $? "PSNET_LOG_FORMAT=json does the same for workerd ($(head -c 200 <<<"$out"))"
out=$("$PSCOORD" --log-format yaml 2>&1); rc=$?
[ $rc = 2 ] && grep -q "pscoord: unknown log format 'yaml' (logfmt or json)" <<<"$out"; ok $? "an unknown log format is refused, saying which ($out)"

# psctl's groups of commands: --help lists them; a group alone or a wrong word says so.
out=$("$PSCTL" job --help); rc=$?
[ $rc = 0 ] && grep -q "^Usage: psctl job COMMAND" <<<"$out" && [ "$(grep -c '^  job ' <<<"$out")" = 4 ]
ok $? "psctl job --help lists job's four commands ($rc)"
out=$("$PSCTL" shard -h); grep -q "shard add" <<<"$out" && grep -q "shard remove" <<<"$out"; ok $? "so does psctl shard -h"
out=$("$PSCTL" checkpoint 2>&1); rc=$?
[ $rc = 2 ] && grep -q "psctl checkpoint: missing command" <<<"$out" && grep -q "checkpoint restore" <<<"$out"
ok $? "psctl checkpoint alone exits 2 and lists what it takes"
out=$("$PSCTL" job frobnicate 2>&1); rc=$?
[ $rc = 2 ] && grep -q "unknown command 'job frobnicate' (see psctl job --help)" <<<"$out"; ok $? "psctl job frobnicate is refused ($out)"

# bash completion: psctl's written by psctl from its tables (and installed), the daemons' from their --help.
"$PSCTL" completion bash >"$RUN/psctl.bash"; ok $? "psctl completion bash"
cmp -s "$RUN/psctl.bash" "$PSNET_BUILD/deploy/completion/psctl"; ok $? "the build's completion file is that script"
out=$("$PSCTL" completion zsh 2>&1); [ $? = 2 ] && grep -q "no completion for shell 'zsh'" <<<"$out"; ok $? "psctl completion zsh is refused"
complete_words() { # SCRIPT WORD...: what bash offers for the last word
  bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); f=$(complete -p "$(basename "$1")" | sed -n "s/.*-F \([^ ]*\).*/\1/p"); "$f"; echo "${COMPREPLY[*]}"' _ "$@"
}
[ "$(complete_words "$RUN/psctl.bash" psctl jo)" = job ]; ok $? "psctl jo<TAB> completes job"
out=$(complete_words "$RUN/psctl.bash" psctl --coord x job "")
[ "$out" = "submit mode stop wait" ]; ok $? "psctl --coord x job <TAB> offers its commands ($out)"
out=$(complete_words "$RUN/psctl.bash" psctl job submit --mo)
[ "$out" = "--model --mode --momentum" ]; ok $? "psctl job submit --mo<TAB> offers the job's options ($out)"
meson install -C "$PSNET_BUILD" --no-rebuild --quiet --destdir "$RUN/root" >"$RUN/install.log" 2>&1
comp=$(find "$RUN/root" -path '*/share/bash-completion/completions/*' -printf '%f\n' | sort | tr '\n' ' ')
[ "$comp" = "pscoord psctl psd psgate workerd " ]; ok $? "meson install puts each program's completion where bash-completion looks ($comp)"
out=$(complete_words "$PSNET_SRC/deploy/completion/psnet-daemons.bash" "$PSD" --lis)
[ "$out" = "--listen" ]; ok $? "psd --lis<TAB> completes --listen, read from psd --help ($out)"

out=$("$PSD" --id 1 --lease-ms 3 2>&1); grep -q "unknown option '--lease-ms'" <<<"$out"; ok $? "psd refuses a pscoord flag"
out=$("$PSD" --id 1 --max-msg 0 2>&1); rc=$?
[ $rc = 2 ] && grep -q "psd: --max-msg must be at least 1024 bytes (got 0)" <<<"$out"; ok $? "psd refuses --max-msg 0, saying why ($out)"
out=$("$PSCOORD" --mode fast 2>&1); rc=$?
ok $(( rc == 0 )) "pscoord refuses --mode fast"; grep -q "bad --mode 'fast'" <<<"$out"; ok $? "pscoord says why"
out=$("$PSCOORD" --epochs abc 2>&1); ok $(( $? == 0 )) "pscoord refuses a non-number"

printf '[pscoord]\nno_such_key = 1\n' >"$RUN/bad.conf"
out=$("$PSCOORD" --config "$RUN/bad.conf" 2>&1); rc=$?
ok $(( rc == 0 )) "a config file with an unknown key is refused"
grep -q "no_such_key" <<<"$out"; ok $? "the refusal names the key"

# Unreachable peers: a bounded wait, then a message naming the address.
nowhere="ipc://$RUN/nobody.sock"
t0=$SECONDS
out=$("$WORKERD" --coord "$nowhere" --connect-timeout 1 2>&1); rc=$?
ok $(( rc == 0 )) "workerd fails when pscoord is unreachable"
grep -q "pscoord at $nowhere did not answer within 1 s" <<<"$out"; ok $? "workerd names the unreachable address"
out=$("$PSD" --id 1 --listen "ipc://$RUN/p1.sock" --coord "$nowhere" --connect-timeout 1 2>&1); rc=$?
ok $(( rc == 0 )) "psd fails when pscoord is unreachable"
grep -q "pscoord at $nowhere did not answer" <<<"$out"; ok $? "psd names the unreachable address"
out=$("$PSCTL" --coord "$nowhere" --timeout 1 status 2>&1); rc=$?
ok $(( rc == 0 )) "psctl fails when pscoord is unreachable"
grep -q "pscoord at $nowhere did not answer within 1 s" <<<"$out"; ok $? "psctl names the unreachable address"
ok $(( SECONDS - t0 > 20 )) "the three waits were bounded ($((SECONDS - t0)) s)"
grep -q "no socket at $RUN/nobody.sock" <<<"$out"; ok $? "psctl says there is no socket there ($out)"
# A socket file nobody listens on (a stopped daemon's), and another user's:
# psctl says so at once rather than waiting out --timeout 60.
/usr/bin/python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.close()' "$RUN/stale.sock"
out=$("$PSCTL" --coord "ipc://$RUN/stale.sock" --timeout 60 status 2>&1); rc=$?
[ $rc != 0 ] && grep -q "psctl: cannot reach pscoord: nobody listens on $RUN/stale.sock: a socket left by a process that stopped" <<<"$out"
ok $? "psctl says a stale socket has nobody listening ($out)"
mkdir -m 700 "$RUN/private"
/usr/bin/python3 -c 'import signal, socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); print("ok", flush=True); signal.pause()' \
  "$RUN/private/c.sock" >"$RUN/listener.out" 2>&1 & lpid=$!
psnet_wait_for 10 grep -q ok "$RUN/listener.out"
if [ "$(id -u)" = 0 ]; then
  out=$(setpriv --reuid=nobody --regid=nogroup --clear-groups "$PSCTL" --coord "ipc://$RUN/private/c.sock" --timeout 60 status 2>&1); rc=$?
  [ $rc != 0 ] && grep -q "psctl: cannot reach pscoord: permission denied on $RUN/private/c.sock" <<<"$out"
  ok $? "psctl tells another user permission denied ($out)"
else
  skip "psctl tells another user permission denied" "needs root to run psctl as another user"
fi
kill $lpid 2>/dev/null; wait $lpid 2>/dev/null
out=$("$PSCTL" 2>&1); ok $(( $? != 2 )) "psctl without a command exits 2"
# Words a program does not understand are refused, never ignored.
out=$("$PSCTL" status --json extra 2>&1); rc=$?
[ $rc = 2 ] && grep -q "psctl status: unexpected argument 'extra'" <<<"$out"; ok $? "psctl refuses a word after the command ($out)"
out=$("$PSCTL" --coord "$nowhere" job wait --wait 1 foo 2>&1); rc=$?
[ $rc = 2 ] && grep -q "unexpected argument 'foo'" <<<"$out"; ok $? "psctl job wait refuses an extra word at once ($out)"
out=$("$PSCTL" status --bogus 2>&1); rc=$?
[ $rc = 2 ] && grep -q "unknown option '--bogus'" <<<"$out"; ok $? "and an unknown option after the verb ($out)"
out=$("$WORKERD" --backend tpu 2>&1); rc=$?
[ $rc = 2 ] && grep -q "backend is cpu, cuda or auto, not 'tpu'" <<<"$out"; ok $? "workerd --backend tpu is refused ($out)"
out=$("$PSCOORD" --lr-scaling fast 2>&1); rc=$?
[ $rc = 2 ] && grep -q "bad --lr-scaling 'fast'" <<<"$out"; ok $? "pscoord --lr-scaling fast is refused ($out)"

# A config file sets options, flags override it.
COORD="ipc://$RUN/coord.sock"
printf '# pscoord test config\n[pscoord]\nlisten = %s\nworkers = 1\nshards = 1\nepochs = 7\n' "$COORD" >"$RUN/pscoord.conf"
psnet_start pscoord "$PSCOORD" --config "$RUN/pscoord.conf" --epochs 1 "${SUBSET[@]}" --data "$RUN/no-data"
printf '[psd]\nid = 3\nlisten = ipc://%s/psd-3.sock\ncoord = %s\n' "$RUN" "$COORD" >"$RUN/psd.conf"
psnet_start psd-3 "$PSD" --config "$RUN/psd.conf"
psnet_wait_for 10 "$PSCTL" --coord "$COORD" status; ok $? "pscoord answers on the endpoint from its config file"
out=$("$PSCTL" --coord "$COORD" --json status)
grep -q '"epochs":1' <<<"$out"; ok $? "a flag overrides the config file (epochs=1)"
psnet_wait_for 10 bash -c "'$PSCTL' --coord '$COORD' --json status | grep -q '\"id\":3'"; ok $? "psd registered with the id from its config file"

# A missing dataset: the worker says how to install it and exits non-zero.
out=$(timeout 60 "$WORKERD" --coord "$COORD" 2>&1); rc=$?
ok $(( rc == 0 )) "workerd exits non-zero without the dataset"
grep -q "apt-get install dataset-fashion-mnist" <<<"$out"; ok $? "workerd says how to install the dataset"
out=$("$PSCTL" --coord "$COORD" job wait --wait 20 2>&1); rc=$?
ok $(( rc == 0 )) "psctl job wait exits non-zero for a job whose workers all failed"
grep -q "state=failed" <<<"$out"; ok $? "and says the job failed ($out)"

# psctl status, table and JSON, on a running job.
psnet_stop_all
COORD="ipc://$RUN/coord2.sock"
psnet_start pscoord2 "$PSCOORD" --listen "$COORD" --workers 1 --shards 3 --epochs 30 "${SUBSET[@]}"
for i in 1 2 3; do psnet_start "psd2-$i" "$PSD" --id $i --listen "ipc://$RUN/q$i.sock" --coord "$COORD"; done
psnet_start workerd2 "$WORKERD" --coord "$COORD" --progress-ms 200
psnet_wait_for 30 bash -c "'$PSCTL' --coord '$COORD' --json status | grep -q '\"step\":[1-9]'"
ok $? "a worker reports steps to pscoord"
out=$("$PSCTL" --coord "$COORD" status)
grep -q "^SHARD" <<<"$out" && grep -q "^WORKER" <<<"$out"; ok $? "psctl status prints shard and worker tables"
grep -qE "^1 +ipc://$RUN/q1.sock" <<<"$out"; ok $? "psctl status lists shard 1 with its address"
# Where psctl looks without --coord: $PSNET_COORD, over ~/.config/psnet/psctl.conf, under --coord and --config.
mkdir -p "$RUN/home/.config/psnet" "$RUN/xdg/psnet"
printf '[psctl]\ncoord = %s\ntimeout = 3\n' "$COORD" >"$RUN/home/.config/psnet/psctl.conf"
HOME=$RUN/home "$PSCTL" status | grep -q "^SHARD"; ok $? "psctl finds pscoord from ~/.config/psnet/psctl.conf"
printf 'coord = %s\n' "$COORD" >"$RUN/xdg/psnet/psctl.conf"
HOME=/nonexistent XDG_CONFIG_HOME=$RUN/xdg "$PSCTL" status | grep -q "^SHARD"; ok $? "or from \$XDG_CONFIG_HOME/psnet/psctl.conf"
env -u HOME PSNET_COORD="$COORD" "$PSCTL" status | grep -q "^SHARD"; ok $? "or from \$PSNET_COORD"
out=$(HOME=$RUN/home PSNET_COORD="$nowhere" "$PSCTL" --timeout 1 status 2>&1); rc=$?
[ $rc != 0 ] && grep -q "pscoord at $nowhere (from \$PSNET_COORD) did not answer" <<<"$out"
ok $? "\$PSNET_COORD wins over the file, and an error says where the address came from ($out)"
out=$(HOME=$RUN/home "$PSCTL" --coord "$nowhere" --timeout 1 status 2>&1)
grep -q "pscoord at $nowhere did not answer" <<<"$out"; ok $? "--coord wins over the file ($out)"
PSNET_COORD=$nowhere "$PSCTL" --coord "$COORD" status | grep -q "^SHARD"; ok $? "and over \$PSNET_COORD"
printf 'coord = %s\n' "$COORD" >"$RUN/explicit.conf"
PSNET_COORD=$nowhere "$PSCTL" --config "$RUN/explicit.conf" status | grep -q "^SHARD"; ok $? "so does --config FILE"
out=$(PSNET_KEYS=$RUN/no-keys "$PSCTL" --coord "$COORD" status 2>&1); rc=$?
[ $rc = 2 ] && grep -q "no key $RUN/no-keys/admin.key" <<<"$out"; ok $? "\$PSNET_KEYS sets --keys ($out)"
printf 'coord = %s\ncolour = yes\n' "$COORD" >"$RUN/home/.config/psnet/psctl.conf"
out=$(HOME=$RUN/home "$PSCTL" status 2>&1); rc=$?
[ $rc = 2 ] && grep -q "$RUN/home/.config/psnet/psctl.conf:2: unknown key 'colour'" <<<"$out"; ok $? "a key the file should not have is refused, naming file and line ($out)"
json=$("$PSCTL" --coord "$COORD" --json status)
if command -v jq >/dev/null; then
  jq -e '.shards | length == 3' <<<"$json" >/dev/null; ok $? "psctl --json is valid JSON with 3 shards"
  jq -e '([.shards[] | .keys - .backup_keys] | add) == .job.keys' <<<"$json" >/dev/null
  ok $? "the shards lead the job's $(jq .job.keys <<<"$json") keys between them"
  jq -e '([.shards[].backup_keys] | add) == .job.keys * (.job.replicas - 1) and .job.replicas == 2' <<<"$json" >/dev/null
  ok $? "and hold $(jq '.job.replicas' <<<"$json") copies of each (backups: $(jq '[.shards[].backup_keys] | add' <<<"$json"))"
  # A fair share each: the model's few large tensors are cut into smaller chunks.
  jq -e '([.shards[].bytes] | add / 3) as $s | all(.shards[].bytes; . >= 0.9 * $s and . <= 1.1 * $s)' <<<"$json" >/dev/null
  ok $? "each of 3 shards holds a third of the bytes within 10% ($(jq -c '[.shards[].bytes]' <<<"$json"))"
  jq -e '.workers[0].steps_per_s > 0 and .workers[0].loss > 0' <<<"$json" >/dev/null; ok $? "worker steps/s and loss are reported"
else
  ok 1 "jq is installed (tests/run installs it)"
fi
out=$("$PSCTL" --coord "$COORD" job stop); ok $? "psctl job stop"
psnet_wait_exit "$PID_workerd2" 20; ok $? "the worker leaves when the job is stopped"
[ "$(job_state)" = stopped ]; ok $? "the job state is stopped"
out=$("$PSCTL" --coord "$COORD" job submit --model mlp:784-32-10 --epochs 1 "${SUBSET[@]}"); ok $? "psctl job submit after a stop"
grep -q "state=waiting" <<<"$out"; ok $? "the new job waits for workers"
out=$("$PSCTL" --coord "$COORD" job submit --model mlp:784-32-10 --mode fast 2>&1); ok $(( $? == 0 )) "psctl job submit refuses a bad mode"

# SIGHUP is harmless; SIGTERM stops a daemon cleanly (exit 0, logged), whichever
# of its threads the kernel hands the signal to.
for d in psd2-1 pscoord2; do
  pid=$(eval echo "\$PID_${d//-/_}")
  for _ in 1 2 3 4 5; do kill -HUP "$pid" 2>/dev/null; done
  alive "$pid"; ok $? "$d survives SIGHUP"
  kill -TERM "$pid"
  psnet_wait_exit "$pid" 10; ok $? "$d exits on SIGTERM"
  wait "$pid"; ok $? "$d exits 0 on SIGTERM"
  grep -q 'msg="stopping" signal=' "$RUN/$d.log"; ok $? "$d logs that it stops"
done
