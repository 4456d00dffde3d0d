#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Benchmark: the peak memory of an edge client (target: 32 MiB with the demo
# MLP). The demo's federated job (mlp:784-64-10, clients of a tenth of
# Fashion-MNIST, 3 rounds) with two clients, partitions 0 and 1 of 10, each
# under /usr/bin/time -v; pscoord asks one of them to evaluate the final
# model (that one loads the 10,000 test images too). Run with:
#   - the -Dedge=true build's workerd (--edge-build, default build-edge);
#   - the default build's (--build, default build; its daemons run the job);
#   - the aarch64 edge build (--arm64-build, default build-arm64) under
#     qemu-user, where it and qemu-aarch64-static are there: the ARM
#     process's own peak is sampled with the emulator's memory left out
#     (tests/integration/qemu-guest-peak), and the whole qemu process's given
#     beside it.
# Printed, never pass/fail:
#   edge-memory build=NAME evaluating_mib=M other_mib=M [with_emulator: evaluating_mib=M other_mib=M]
#
#   tests/bench/edge-memory.sh [--build DIR] [--edge-build DIR] [--arm64-build DIR] [--keep]
set -u
export LC_ALL=C
top=$(cd "$(dirname "$0")/../.." && pwd)
build="$top/build" ebuild="$top/build-edge" abuild="$top/build-arm64" keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --edge-build) ebuild=$2; shift 2 ;;
    --arm64-build) abuild=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '3,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "edge-memory: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
BENCH=edge-memory
source "$top/tests/bench/lib.sh"
[ -x /usr/bin/time ] || die "GNU time is missing (apt-get install time)"
mib() { awk -v k="${1:-0}" 'BEGIN { printf "%.1f", k / 1024 }'; }
peak_kib() { sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$1"; }

# run NAME ARM WORKERD...: the job with two clients of WORKERD (ARM=1: under
# qemu-user, their own memory sampled too); prints the line.
run() {
  local name=$1 arm=$2; shift 2
  local coord="ipc://$RUN/coord-$name.sock" k gp=() qp
  psnet_start "pscoord-$name" "$PSCOORD" --listen "$coord" --mode fed --shards 1 --rounds 3 --fraction 1 \
    --min-clients 2 --min-available 2 --round-timeout 600 --model mlp:784-64-10
  psnet_start "psd-$name" "$PSD" --id 1 --listen "ipc://$RUN/psd-$name.sock" --coord "$coord"
  for k in 0 1; do
    psnet_start "e-$name-$k" /usr/bin/time -v "$@" --edge --coord "$coord" --partition "$k/10"
    if [ "$arm" = 1 ]; then
      eval "qp=\$PID_e_${name//-/_}_$k"
      psnet_wait_for 10 pgrep -P "$qp" || die "$name: no qemu process"
      "$top/tests/integration/qemu-guest-peak" "$(pgrep -P "$qp")" >"$RUN/guest-$name-$k" & gp+=($!)
    fi
  done
  "$PSCTL" --coord "$coord" job wait --wait 1800 >"$RUN/$name.out" 2>&1 || die "$name: $(cat "$RUN/$name.out")"
  for k in 0 1; do psnet_wait_for 60 grep -q 'Maximum resident' "$RUN/e-$name-$k.log" || die "$name: client $k did not end"; done
  [ ${#gp[@]} -eq 0 ] || wait "${gp[@]}"
  local ev=0 ot=1
  grep -q 'msg="evaluating the final model"' "$RUN/e-$name-1.log" && ev=1 ot=0
  if [ "$arm" = 1 ]; then
    printf 'edge-memory build=%s evaluating_mib=%s other_mib=%s with_emulator: evaluating_mib=%s other_mib=%s\n' "$name" \
      "$(mib "$(cat "$RUN/guest-$name-$ev")")" "$(mib "$(cat "$RUN/guest-$name-$ot")")" \
      "$(mib "$(peak_kib "$RUN/e-$name-$ev.log")")" "$(mib "$(peak_kib "$RUN/e-$name-$ot.log")")"
  else
    printf 'edge-memory build=%s evaluating_mib=%s other_mib=%s\n' "$name" \
      "$(mib "$(peak_kib "$RUN/e-$name-$ev.log")")" "$(mib "$(peak_kib "$RUN/e-$name-$ot.log")")"
  fi
  psnet_stop_all
}

if [ -x "$ebuild/worker/workerd/workerd" ]; then
  run edge 0 "$ebuild/worker/workerd/workerd"
else
  echo "edge-memory build=edge skipped: no $ebuild/worker/workerd/workerd (meson setup $ebuild -Dedge=true)"
fi
run default 0 "$WORKERD"
if [ -x "$abuild/worker/workerd/workerd" ] && command -v qemu-aarch64-static >/dev/null; then
  run aarch64 1 env OPENBLAS_NUM_THREADS=1 qemu-aarch64-static -L / "$abuild/worker/workerd/workerd"
else
  echo "edge-memory build=aarch64 skipped: no $abuild/worker/workerd/workerd or no qemu-aarch64-static (deploy/edge/README.md)"
fi
