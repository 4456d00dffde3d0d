#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The daemons as services: every daemon's /metrics passes promtool check
# metrics; /healthz answers while the loop runs and /readyz only once the
# daemon serves; the HTTP endpoint is bounded (methods, header size, number of
# connections); systemd's notification protocol: READY=1 once ready, STATUS=
# lines, WATCHDOG=1 at half the watchdog interval, STOPPING=1 on SIGTERM.
source "$(dirname "$0")/lib.sh"

command -v promtool >/dev/null; ok $? "promtool is installed (Debian's prometheus package)"
rev=$(git -C "$PSNET_SRC" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
get() { curl -s -m 5 -o "$RUN/body" -w '%{http_code}' "http://127.0.0.1:$1$2"; }

COORD="ipc://$RUN/coord.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 1 --shards 1 --epochs 20 "${SUBSET[@]}" \
  --http 127.0.0.1:0
has_port() { [ -n "$(http_port "$1")" ]; }
psnet_wait_for 10 has_port pscoord
psnet_wait_for 10 bash -c "curl -sf -m 5 http://127.0.0.1:$(http_port pscoord)/metrics >'$RUN/early'"
! grep -q '^psnet_pscoord_accuracy \|^psnet_pscoord_checkpoint_clock \|^psnet_pscoord_checkpoint_timestamp_seconds \|^psnet_pscoord_worker_loss' "$RUN/early" &&
  grep -q '^psnet_pscoord_failovers_total 0' "$RUN/early"
ok $? "before a job runs: no accuracy, checkpoint or loss series (not NaN ones); fail-overs counted from 0"
psnet_start psd-1 "$PSD" --id 1 --listen "ipc://$RUN/psd-1.sock" --coord "$COORD" --http 127.0.0.1:0
psnet_start workerd "$WORKERD" --coord "$COORD" --http 127.0.0.1:0 --progress-ms 100
psnet_wait_for 30 grep -q 'msg="progress"' "$RUN/workerd.log"; ok $? "a job trains with HTTP on every daemon"
for d in pscoord psd-1 workerd; do
  port=$(http_port $d)
  [ -n "$port" ]; ok $? "$d logs its HTTP port ($port)"
  code=$(get "$port" /metrics); [ "$code" = 200 ]; ok $? "$d: /metrics answers 200"
  out=$(promtool check metrics <"$RUN/body" 2>&1); ok $? "$d: promtool check metrics passes ${out:+($out)}"
  ! grep -v '^#' "$RUN/body" | grep -q 'NaN'; ok $? "$d: no series is NaN $(grep -v '^#' "$RUN/body" | grep NaN | head -n 3 | tr '\n' ' ')"
  awk '$1 == "#" && $2 == "TYPE" && $4 == "counter" && $3 !~ /_total$/ { bad = bad " " $3 } END { if (bad) print bad; exit bad != "" }' "$RUN/body"
  ok $? "$d: every counter's name ends in _total"
  grep -q "^psnet_build_info{daemon=\"${d%-1}\",.*revision=\"$rev\"" "$RUN/body"
  ok $? "$d: psnet_build_info names the daemon and the revision built ($rev)"
  # process_* as Prometheus' client libraries write them, against what ps and /proc say of the same process.
  pid=$(eval echo "\$PID_${d//-/_}")
  started=$(date -d "$(ps -o lstart= -p "$pid")" +%s) fds=$(ls "/proc/$pid/fd" | wc -l)
  rss=$(ps -o rss= -p "$pid") cpu=$(ps -o cputimes= -p "$pid")
  awk -v st="$started" -v fds="$fds" -v rss="$rss" -v cpu="$cpu" '
    { v[$1] = $2 }
    END { d = v["process_start_time_seconds"] - st
          exit !(d > -2 && d < 2 && v["process_open_fds"] >= fds - 4 && v["process_open_fds"] <= fds + 4 &&
                 v["process_max_fds"] >= v["process_open_fds"] && v["process_resident_memory_bytes"] > rss * 1024 / 2 &&
                 v["process_resident_memory_bytes"] < rss * 1024 * 2 && v["process_virtual_memory_bytes"] >= v["process_resident_memory_bytes"] &&
                 v["process_cpu_seconds_total"] >= cpu - 0.01 && v["process_cpu_seconds_total"] <= cpu + 2) }' "$RUN/body"
  ok $? "$d: process_* agree with ps and /proc (started $started, $fds fds, $rss KiB resident, $cpu s CPU: $(grep '^process_' "$RUN/body" | tr '\n' ' '))"
  [ "$(get "$port" /healthz)" = 200 ] && [ "$(get "$port" /readyz)" = 200 ]; ok $? "$d: /healthz and /readyz answer 200"
done
pp=$(http_port psd-1) cp=$(http_port pscoord) wp=$(http_port workerd)
get "$pp" /metrics >/dev/null
awk '/^psnet_psd_pushes_total / { exit !($2 > 0) }' "$RUN/body"; ok $? "psd counts pushes"
grep -q '^psnet_psd_push_latency_seconds_bucket{le="+Inf"} [1-9]' "$RUN/body"; ok $? "psd has a push latency histogram"
# A worker's figures reach pscoord with its heartbeat (one a second).
coord_has() { get "$cp" /metrics >/dev/null && grep -q "$1" "$RUN/body"; }
psnet_wait_for 10 coord_has '^psnet_pscoord_worker_samples_total{worker="1"} [1-9]'; ok $? "pscoord counts each worker's samples"
grep -q '^# TYPE psnet_pscoord_worker_samples_total counter' "$RUN/body" && ! grep -q '_per_second' "$RUN/body"
ok $? "as a counter: rates are PromQL's, no per-second gauges"
grep -q '^psnet_pscoord_job_state{state="running"} 1' "$RUN/body"; ok $? "pscoord reports the job's state"
get "$wp" /metrics >/dev/null
grep -q '^psnet_workerd_state{state="training"} 1' "$RUN/body"; ok $? "workerd reports that it trains"

[ "$(get "$pp" /nowhere)" = 404 ]; ok $? "an unknown path is 404"
code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$pp/metrics"); [ "$code" = 405 ]; ok $? "POST is 405"
code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' -H "X-Big: $(head -c 9000 /dev/zero | tr '\0' a)" "http://127.0.0.1:$pp/metrics")
[ "$code" = 431 ]; ok $? "9 KiB of headers is 431 ($code)"
# 80 connections held open at once: the server keeps 64, closes the rest at
# once (well before its 5 s idle timeout) and still answers afterwards.
/usr/bin/python3 - "$pp" >"$RUN/conns" <<'PY'
import select, socket, sys, time
port = int(sys.argv[1]); socks = []
for _ in range(80):
    s = socket.create_connection(("127.0.0.1", port)); socks.append(s)
closed, end = set(), time.monotonic() + 1.0
while time.monotonic() < end:
    ready, _, _ = select.select([s for s in socks if s not in closed], [], [], 0.1)
    for s in ready:
        if s.recv(1) == b"":
            closed.add(s)
print(len(closed))
PY
closed=$(cat "$RUN/conns"); [ "${closed:-0}" -eq 16 ]; ok $? "the 16 connections beyond 64 are closed at once ($closed of 80)"
[ "$(get "$pp" /healthz)" = 200 ]; ok $? "and the endpoint still answers"
out=$("$PSCTL" --coord "$COORD" job stop); ok $? "stop the job"
psnet_stop_all

# /readyz before the daemon serves: a psd whose pscoord is not there yet.
psnet_start lonely "$PSD" --id 5 --listen "ipc://$RUN/lonely.sock" --coord "ipc://$RUN/nobody.sock" \
  --connect-timeout 60 --http 127.0.0.1:0
psnet_wait_for 10 bash -c "grep -q 'msg=\"serving http\"' '$RUN/lonely.log'"
lp=$(http_port lonely)
[ "$(get "$lp" /healthz)" = 200 ]; ok $? "a psd waiting for pscoord is healthy"
code=$(get "$lp" /readyz); [ "$code" = 503 ] && grep -q "not ready: registering with pscoord" "$RUN/body"; ok $? "but not ready ($code: $(cat "$RUN/body"))"
# psctl probe, the image's health check (no HTTP client in the image): the
# same answers, as its exit status.
out=$("$PSCTL" probe "127.0.0.1:$lp" 2>&1); ok $? "psctl probe: healthy, exit 0 ($out)"
[ "$out" = "127.0.0.1:$lp/healthz: 200 ok" ]; ok $? "it prints the address, path and answer"
out=$("$PSCTL" probe --ready "http://127.0.0.1:$lp" 2>&1); rc=$?
[ $rc = 1 ] && grep -q "/readyz: 503 not ready: registering with pscoord" <<<"$out"; ok $? "psctl probe --ready: not ready, exit 1 ($out)"
out=$("$PSCTL" probe --json ":$lp"); jq -e '.status == 200 and .body == "ok"' <<<"$out" >/dev/null
ok $? "psctl probe --json ($out)"
out=$("$PSCTL" probe no-port 2>&1); [ $? = 2 ] && grep -q "is no HTTP address" <<<"$out"; ok $? "an address that is none: exit 2 ($out)"
psnet_stop_all
out=$("$PSCTL" probe --timeout 2 "127.0.0.1:$lp" 2>&1); [ $? = 1 ] && grep -q "Connection refused" <<<"$out"
ok $? "nothing listening: exit 1, saying why ($out)"

# systemd's notification protocol, with a watchdog of 2 s.
/usr/bin/python3 "$PSNET_SRC/tests/integration/notify-listen.py" "$RUN/notify.sock" "$RUN/notify" 30 &
listener=$!
psnet_wait_for 5 test -S "$RUN/notify.sock"
COORD="ipc://$RUN/coord2.sock"
NOTIFY_SOCKET=$RUN/notify.sock WATCHDOG_USEC=2000000 psnet_start pscoord2 "$PSCOORD" --listen "$COORD" --workers 1 --shards 1
psnet_wait_for 5 grep -q '^READY=1' "$RUN/notify"; ok $? "pscoord says READY=1"
psnet_wait_for 5 bash -c "test \$(grep -c '^WATCHDOG=1' '$RUN/notify') -ge 3"; ok $? "and pings the watchdog every second"
psnet_wait_for 10 grep -q '^STATUS=job 1 waiting: 0 shards, 0 workers' "$RUN/notify"; ok $? "and a STATUS line"
kill -TERM "$PID_pscoord2"
psnet_wait_for 5 grep -q '^STOPPING=1' "$RUN/notify"; ok $? "SIGTERM: STOPPING=1"
kill "$listener" 2>/dev/null; wait "$listener" 2>/dev/null
