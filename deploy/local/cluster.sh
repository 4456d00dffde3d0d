# SPDX-License-Identifier: Apache-2.0
# Shell helpers to run a local psnet cluster (sourced by deploy/local/demo and
# the integration tests): start daemons with logs in a run directory, wait for
# conditions with a deadline, stop everything with escalating signals.

PSNET_PIDS=()

# psnet_start NAME CMD...: starts CMD in the background, stderr+stdout to $RUN/NAME.log.
psnet_start() {
  local name=$1; shift
  "$@" >"$RUN/$name.log" 2>&1 &
  PSNET_PIDS+=($!)
  eval "PID_${name//-/_}=$!"
}

# psnet_wait_for SECONDS CMD...: runs CMD until it succeeds, or fails after SECONDS.
psnet_wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then return 1; fi
    # Wait on the condition's own progress: a short pause between polls.
    sleep 0.1  # poll interval of a condition with a deadline
  done
}

# psnet_wait_exit PID SECONDS: waits for PID to exit; returns 1 if it did not.
psnet_wait_exit() {
  local pid=$1 deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.1  # poll interval of a condition with a deadline
  done
  return 0
}

# psnet_stop_all: SIGTERM everything started, then SIGKILL what is left after 5 s.
psnet_stop_all() {
  local p
  for p in "${PSNET_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PSNET_PIDS[@]}"; do
    psnet_wait_exit "$p" 5 || kill -KILL "$p" 2>/dev/null || true
  done
  for p in "${PSNET_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PSNET_PIDS=()
}
