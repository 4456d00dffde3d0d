# SPDX-License-Identifier: Apache-2.0
# This machine's container engine, for test-container.sh and the image
# benchmarks: podman_setup DIR writes DIR/containers.conf (containers limited
# to the open-files and process limits the sandbox grants, cgroups by
# cgroupfs as there is no systemd, netavark with aardvark-dns so that
# compose's services find each other by name) and exports CONTAINERS_CONF;
# makes the debian:12 base image once from Debian's archive (debootstrap; no
# registry is reachable) into podman's storage; sets ULIMITS (podman build's
# flags) and BASE, and PODMAN_WHY to why podman cannot run a container here
# (empty when it can).
podman_setup() {
  local dir=$1 t out
  export CONTAINERS_CONF=$dir/containers.conf
  cat >"$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_backend = "netavark"
CONF
  ULIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
  BASE=docker.io/library/debian:12
  PODMAN_WHY=
  for t in podman podman-compose debootstrap; do
    command -v $t >/dev/null || PODMAN_WHY="${PODMAN_WHY:-$t is not installed}"
  done
  [ -z "$PODMAN_WHY" ] && [ ! -x /usr/lib/podman/netavark ] && [ ! -x /usr/libexec/podman/netavark ] &&
    PODMAN_WHY="netavark is not installed"
  if [ -z "$PODMAN_WHY" ] && ! podman image exists "$BASE"; then
    # debian:12 from Debian's archive, without apt's caches.
    if debootstrap --variant=minbase bookworm "$dir/rootfs" http://deb.debian.org/debian >"$dir/debootstrap.log" 2>&1; then
      rm -rf "$dir"/rootfs/var/cache/apt/archives/*.deb "$dir"/rootfs/var/lib/apt/lists/*
      tar -C "$dir/rootfs" -c . | podman import --change 'CMD ["bash"]' - "$BASE" >"$dir/import.log" 2>&1 ||
        PODMAN_WHY="podman import failed ($(tail -n 1 "$dir/import.log"))"
      rm -rf "$dir/rootfs"
    else
      PODMAN_WHY="debootstrap could not make a debian:12 base image ($(tail -n 1 "$dir/debootstrap.log"))"
    fi
  fi
  if [ -z "$PODMAN_WHY" ] && ! out=$(podman run --rm "$BASE" true 2>&1); then
    PODMAN_WHY="podman cannot run a container here ($out)"
  fi
}
