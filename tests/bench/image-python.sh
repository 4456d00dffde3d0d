#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Containerfile's python target (the runtime image, Debian's python3,
# numpy and torch, psnet's Python package) built with podman on this
# machine's engine settings (tests/integration/lib-podman.sh), then a user's
# PyTorch model trained in it: examples/quickstart.py on a LocalCluster of
# the image's own daemons. Prints the build's time, the image's size beside
# the runtime target's and the accuracy; too long for the suite (Debian's
# torch goes into the image), so tests/run --bench. Not pass/fail: a step
# that fails prints why and the script exits 1.
#
#   tests/bench/image-python.sh [--epochs 1] [--limit 12000] [--keep]
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
epochs=1 limit=12000 keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --epochs) epochs=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--epochs N] [--limit N] [--keep]" >&2; exit 2 ;;
  esac
done
dir=$(mktemp -d /tmp/psnet-image-python.XXXXXX)
[ $keep = 1 ] || trap 'rm -rf "$dir"' EXIT
source "$top/tests/integration/lib-podman.sh"
podman_setup "$dir"
if [ -n "$PODMAN_WHY" ]; then
  echo "image-python: skipped: $PODMAN_WHY"
  exit 0
fi
rev=$(git -C "$top" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
release=$(sed -n "s/^ *version: '\([^']*\)'.*/\1/p" "$top/meson.build" | head -n 1)
img=localhost/psnet-python:$release
t0=$SECONDS
if ! podman build --format docker --network host "${ULIMITS[@]}" -f "$top/deploy/container/Containerfile" \
       --target python --build-arg PSNET_REVISION="$rev" -t "$img" "$top" >"$dir/build.log" 2>&1; then
  echo "image-python: the python target does not build: $(tail -n 3 "$dir/build.log" | tr '\n' ' ')"
  exit 1
fi
secs=$((SECONDS - t0))
size=$(podman image inspect "$img" --format '{{.Size}}')
runtime=$(podman image inspect "localhost/psnet:$release" --format '{{.Size}}' 2>/dev/null || echo 0)
echo "image-python: $img built in $secs s ($(grep -c 'Using cache' "$dir/build.log") steps from the cache), $((size / 1048576)) MiB (the runtime target: $((runtime / 1048576)) MiB)"
out=$(podman run --rm "$img" 2>"$dir/run.err")
echo "image-python: its default command: $out"
t0=$SECONDS
if ! podman run --rm -v "$top/examples:/examples:ro" "$img" \
       python3 /examples/quickstart.py --epochs "$epochs" --limit "$limit" >"$dir/quickstart.log" 2>&1; then
  echo "image-python: examples/quickstart.py fails in the image: $(tail -n 3 "$dir/quickstart.log" | tr '\n' ' ')"
  exit 1
fi
echo "image-python: examples/quickstart.py --epochs $epochs --limit $limit in the image, $((SECONDS - t0)) s: $(grep -o 'epoch [0-9]*: test accuracy [0-9.]*' "$dir/quickstart.log" | tail -n 1)"
