#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An ARM edge client: the aarch64 cross-build of workerd (deploy/edge/README.md,
# build-arm64) under qemu-user joins a local x86-64 cluster beside an x86-64
# edge client, and every round counts both; its peak memory is printed, the
# process's own (tests/integration/qemu-guest-peak) and qemu's with it. Runs
# where the cross-build and qemu-aarch64-static are there
# (PSNET_ARM64_BUILD, default build-arm64 beside the sources:
# tests/run installs what it needs and builds it, deploy/local/install-deps
# --arm64); skipped, with the reason, elsewhere (PSNET_ARM64_WHY: tests/run's
# when that failed).
source "$(dirname "$0")/lib.sh"
ARM=${PSNET_ARM64_BUILD:-$PSNET_SRC/build-arm64}/worker/workerd/workerd
why=${PSNET_ARM64_WHY:-}
[ -x "$ARM" ] || why="${why:-no aarch64 build at $ARM (deploy/edge/README.md)}"
command -v qemu-aarch64-static >/dev/null || why="${why:-qemu-aarch64-static is not installed (qemu-user-static)}"
[ -e /lib/ld-linux-aarch64.so.1 ] || why="${why:-no aarch64 C library (libc6:arm64)}"
[ -x /usr/bin/time ] || why="${why:-no GNU time for the peak memory (the time package)}"
if [ -n "$why" ]; then
  trap - EXIT
  rm -rf "$RUN"
  echo "1..0 # SKIP $why"
  exit 0
fi
# -L /: the loader and the C library of the same libc6:arm64 (the cross
# toolchain's loader with the multiarch libc spins in pthread_create).
QEMU=(env OPENBLAS_NUM_THREADS=1 qemu-aarch64-static -L /)
"${QEMU[@]}" "$ARM" --version >/dev/null 2>&1; ok $? "the aarch64 workerd runs under qemu-user"

COORD="ipc://$RUN/coord.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --mode fed --shards 1 --rounds 3 --fraction 1 --min-clients 2 \
  --min-available 2 --round-timeout 120 --model mlp:784-64-10 --train-limit 6000 --test-limit 1000
psnet_start psd "$PSD" --id 1 --listen "ipc://$RUN/psd.sock" --coord "$COORD"
psnet_start e-x86 "$WORKERD" --edge --coord "$COORD" --partition 1/2
psnet_start e-arm /usr/bin/time -v "${QEMU[@]}" "$ARM" --edge --coord "$COORD" --partition 0/2
# The ARM process's own memory, the emulator's left out (qemu-guest-peak).
qpid="" gpid=""
psnet_wait_for 10 pgrep -P "$PID_e_arm" && qpid=$(pgrep -P "$PID_e_arm")
if [ -n "$qpid" ]; then "$PSNET_SRC/tests/integration/qemu-guest-peak" "$qpid" >"$RUN/guest.kib" & gpid=$!; fi
out=$("$PSCTL" --coord "$COORD" job wait --wait 300); ok $? "the job of an ARM and an x86 client finishes ($out)"
hist=$("$PSCTL" --coord "$COORD" --json round history)
jq -e '[.[] | select(.round > 0) | .answered] == [2, 2, 2]' <<<"$hist" >/dev/null
ok $? "each of its 3 rounds counts both clients ($(jq -c '[.[] | select(.round > 0) | .answered]' <<<"$hist"))"
psnet_wait_for 30 grep -q 'Maximum resident set size' "$RUN/e-arm.log"
n=$(grep -c 'msg="update counted"' "$RUN/e-arm.log")
[ "$n" -eq 3 ]; ok $? "the ARM client's three updates were counted ($n)"
kib=$(sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$RUN/e-arm.log")
[ -z "$gpid" ] || wait "$gpid"
gkib=$(cat "$RUN/guest.kib" 2>/dev/null)
role="did not evaluate the final model"
grep -q 'msg="evaluating the final model"' "$RUN/e-arm.log" && role="evaluated the final model"
mib() { awk -v k="${1:-0}" 'BEGIN { printf "%.1f", k / 1024 }'; }
echo "# aarch64 edge client under qemu-user ($role): peak $(mib "$gkib") MiB for the ARM process itself (sampled), $(mib "$kib") MiB with the emulator"
