# SPDX-License-Identifier: Apache-2.0
# What the cluster benchmarks in tests/bench share; sourced once their options
# are read, with BENCH (the script's name, for messages), top, build and keep
# set. Checks the daemons of $build and jq, makes RUN (the daemons' sockets
# and logs), loads deploy/local/cluster.sh and, on exit, stops every daemon
# started and removes RUN (kept, and said so, after a failure or with --keep;
# kept too with BENCH_KEEP_RUN=1, where RUN holds the results) and the paths
# in BENCH_SCRATCH.
PSCOORD=$build/ps/pscoord/pscoord PSD=$build/ps/psd/psd PSCTL=$build/ps/psctl/psctl
WORKERD=$build/worker/workerd/workerd
for b in "$PSCOORD" "$PSD" "$PSCTL" "$WORKERD"; do
  [ -x "$b" ] || { echo "$BENCH: $b is missing (ninja -C $build)" >&2; exit 1; }
done
command -v jq >/dev/null || { echo "$BENCH: jq is missing" >&2; exit 1; }
RUN=$(mktemp -d "/tmp/psnet-bench-$BENCH.XXXXXX") || exit 1
BENCH_SCRATCH=() BENCH_KEEP_RUN=0
source "$top/deploy/local/cluster.sh"
bench_cleanup() {
  local rc=$?
  psnet_stop_all
  [ ${#BENCH_SCRATCH[@]} -eq 0 ] || rm -rf "${BENCH_SCRATCH[@]}"
  if [ $rc -ne 0 ] || [ "$keep" = 1 ]; then
    echo "$BENCH: logs are in $RUN" >&2
  elif [ "$BENCH_KEEP_RUN" != 1 ]; then
    rm -rf "$RUN"
  fi
  return $rc
}
trap bench_cleanup EXIT
trap 'exit 143' TERM INT
die() { echo "$BENCH: $*" >&2; exit 1; }
# python_client MODULE...: Debian's python3 with MODULEs (numpy, torch), and
# this build's Python package and libpsnet for it (PYTHONPATH, PSNET_LIB).
python_client() {
  local m
  for m in "$@"; do
    /usr/bin/python3 -c "import $m" 2>/dev/null || die "python3-$m is missing (Debian's)"
  done
  export PYTHONPATH=$top/python PSNET_LIB=$build/worker/client/libpsnet.so
  [ -f "$PSNET_LIB" ] || die "$PSNET_LIB is missing (ninja -C $build)"
}
# flower_venv DIR: a virtual environment with Flower (flwr) and NumPy in DIR,
# made the first time (Debian's python3-venv and a network), for a
# side-by-side benchmark only; sets FLOWER_PY to its python.
flower_venv() {
  if ! "$1/bin/python" -c 'import flwr' 2>/dev/null; then
    /usr/bin/python3 -c 'import ensurepip' 2>/dev/null ||
      die "Flower needs Debian's python3-venv (apt-get install python3-venv)"
    echo "$BENCH: installing Flower into $1 (for this benchmark only)" >&2
    /usr/bin/python3 -m venv "$1" && "$1/bin/pip" install -q "flwr>=1.13,<2" numpy >&2 ||
      die "cannot install Flower into $1"
  fi
  FLOWER_PY=$1/bin/python
}

# cpu_s PID: the CPU seconds (user + system, all threads) a running process has used.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / hz }' "/proc/$1/stat" 2>/dev/null; }
# hwm_mib PID: the peak memory (VmHWM) of a running process, in MiB.
hwm_mib() { awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null; }
# sample_hwm FILE PID...: keeps FILE at the most the processes held together
# (the sum of the VmHWM of those still running; one process: its peak) until
# all have left. Run it in the background.
sample_hwm() {
  local out=$1 most=0 sum; shift
  while sum=$(for p in "$@"; do hwm_mib "$p"; echo; done | awk 'NF { s += $1; n++ } END { if (n) printf "%.1f", s }') &&
        [ -n "$sum" ]; do
    most=$(awk -v a="$most" -v b="$sum" 'BEGIN { print (b > a ? b : a) }')
    echo "$most" >"$out"
    sleep 0.5  # sampling period of a measurement, not a synchronisation
  done
}
