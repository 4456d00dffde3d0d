# SPDX-License-Identifier: Apache-2.0
# Shared by the integration tests: TAP output, a run directory, the daemons'
# paths, and cleanup that stops everything the test started (sourced).
set -u
: "${PSNET_BUILD:?run through meson test (tests/run)}"
: "${PSNET_SRC:?}"
source "$PSNET_SRC/deploy/local/cluster.sh"
PSCOORD=$PSNET_BUILD/ps/pscoord/pscoord PSD=$PSNET_BUILD/ps/psd/psd PSCTL=$PSNET_BUILD/ps/psctl/psctl
WORKERD=$PSNET_BUILD/worker/workerd/workerd PSPOKE=$PSNET_BUILD/tests/pspoke
RUN=$(mktemp -d /tmp/psnet-test.XXXXXX)
TAP_N=0 TAP_FAIL=0
export PSNET_LOG_LEVEL=${PSNET_LOG_LEVEL:-info}
# A small job sized for CI: ~2 s of training per epoch on two cores.
SUBSET=(--train-limit 12000 --test-limit 2000)

ok() {  # ok CONDITION-EXIT-CODE DESCRIPTION
  TAP_N=$((TAP_N + 1))
  local d=${2//$'\n'/ }  # one line: a newline would leave TAP a line it cannot read
  if [ "$1" -eq 0 ]; then echo "ok $TAP_N - $d"; else
    TAP_FAIL=$((TAP_FAIL + 1)); echo "not ok $TAP_N - $d"; fi
}
check() {  # check DESCRIPTION CMD...: one TAP line from CMD's exit status
  local d=$1; shift
  "$@" >/dev/null 2>&1; ok $? "$d"
}
finish() {
  psnet_stop_all
  echo "1..$TAP_N"
  if [ $TAP_FAIL -ne 0 ]; then
    echo "# logs kept in $RUN"
    for f in "$RUN"/*.log; do [ -f "$f" ] && { echo "# --- $f"; tail -n 20 "$f" | sed 's/^/# /'; }; done
  elif [ -n "${PSNET_KEEP_LOGS:-}" ]; then
    echo "# logs kept in $RUN (PSNET_KEEP_LOGS)"
  else
    rm -rf "$RUN"
  fi
  [ $TAP_FAIL -eq 0 ]
}
trap 'finish; exit $?' EXIT
trap 'exit 143' TERM INT

alive() { kill -0 "$1" 2>/dev/null; }
# job_state: prints the job's state from psctl --json.
job_state() { "$PSCTL" --coord "$COORD" --json status | sed -n 's/.*"state":"\([a-z]*\)".*/\1/p'; }
# accuracy_at_least LINE BAR: LINE holds accuracy=X; true when X >= BAR.
accuracy_at_least() { awk -v bar="$2" '{ if (match($0, /accuracy=[0-9.]+/)) { a = substr($0, RSTART + 9, RLENGTH - 9); exit !(a + 0 >= bar) } exit 1 }' <<<"$1"; }
# logs_match PATTERN GLOB: some log in $RUN matching GLOB (expanded at each call) matches PATTERN.
# py_env: the source tree's psnet for Python (PYTHONPATH, PSNET_LIB) and PY,
# the interpreter to run it with: a sanitized build's library needs its
# runtime loaded first in the (plain) interpreter, whose own allocations are
# no leaks of ours (sanitized=1 then).
py_env() {
  export PYTHONPATH=$PSNET_SRC/python PSNET_LIB=$PSNET_BUILD/worker/client/libpsnet.so
  if ldd "$PSNET_LIB" | grep -q libasan; then
    PY=(env "LD_PRELOAD=$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
        "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1" /usr/bin/python3)
    sanitized=1
  else
    PY=(/usr/bin/python3) sanitized=0
  fi
}
# skip WHAT WHY: a check this pass does not run, said as TAP's SKIP
# (tests/run counts it skipped, not passed).
skip() { TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - $1 # SKIP $2"; }
# pycheck NAME ARGS...: runs a check of the Python script $PYCHECK_SCRIPT
# (with py_env's PY); each of its "ok: " lines is a TAP line, and a failure
# (or no line at all) one failed line. Its output: $RUN/NAME.out and .log.
pycheck() {
  local name=$1; shift
  "${PY[@]}" "$PYCHECK_SCRIPT" "$@" >"$RUN/$name.out" 2>"$RUN/$name.log"; local rc=$?
  local n=0
  while IFS= read -r line; do ok 0 "${line#ok: }"; n=$((n + 1)); done < <(grep '^ok: ' "$RUN/$name.out")
  if [ $rc -ne 0 ] || [ $n -eq 0 ]; then
    ok 1 "$name: $(grep -m1 '^FAIL' "$RUN/$name.out" || tail -n 3 "$RUN/$name.log" | tr '\n' ' ')"
  fi
}
# rdp_rates HISTORY-JSON Q: the aggregated rounds' sampling rates: Q (a
# private job's Poisson sampling, --fraction) for each of them.
rdp_rates() { jq -r --arg q "$2" '[.[] | select(.round > 0) | $q] | join(" ")' <<<"$1"; }
# rdp_reference NOISE DELTA RATES...: epsilon by the independent accountant.
rdp_reference() { /usr/bin/python3 "$PSNET_SRC/tests/integration/rdp-reference.py" "$@"; }
# acc_of TEXT: the number after the last accuracy= in TEXT (job wait's answer).
acc_of() { sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p' <<<"$1"; }
# within A B REL: |A - B| <= REL x B, with B > 0.
within() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= r * b) }'; }
# start_shards TAG N: shards 1..N of run TAG (psd-TAG-I), registering with $COORD.
start_shards() {
  for i in $(seq 1 "$2"); do
    psnet_start "psd-$1-$i" "$PSD" --id "$i" --listen "ipc://$RUN/psd-$1-$i.sock" --coord "$COORD"
  done
}
# start_cluster NAME N [PSCOORD OPTIONS...]: pscoord-NAME at $COORD
# (ipc://$RUN/NAME.sock) expecting N shards, and shards 1..N of it.
start_cluster() {
  local name=$1 n=$2; shift 2
  COORD="ipc://$RUN/$name.sock"
  psnet_start "pscoord-$name" "$PSCOORD" --listen "$COORD" --shards "$n" "$@"
  start_shards "$name" "$n"
}
# http_port NAME: the port daemon NAME (its log $RUN/NAME.log) serves HTTP on.
http_port() { sed -n 's/.*msg="serving http" address=[^ ]* port=\([0-9]*\).*/\1/p' "$RUN/$1.log" | head -1; }
logs_match() { grep -qE -- "$1" "$RUN"/$2 2>/dev/null; }
# train_job NAME W [JOB OPTIONS...]: pscoord NAME (at $COORD) with two shards
# and W cpu workers (w1-NAME, ...) runs the job to its end; job wait's answer
# is in $out.
train_job() {
  local name=$1 nw=$2 i; shift 2
  start_cluster "$name" 2 --workers "$nw" "$@"
  for i in $(seq 1 "$nw"); do psnet_start "w$i-$name" "$WORKERD" --coord "$COORD" --backend cpu; done
  out=$("$PSCTL" --coord "$COORD" job wait --wait 300)
}
