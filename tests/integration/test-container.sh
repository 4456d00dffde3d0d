#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The image and compose.yaml run by a real container engine (Debian's podman,
# runc): the image builds from deploy/container/Containerfile, its programs
# run as the unprivileged user psnet and name the revision built; then
# podman-compose brings compose.yaml up as a user would (keys made by its
# one-shot service, CURVE everywhere, two shards keeping two copies of each
# key, two workers) and the job reaches state=done with its accuracy, with
# one shard's psd killed (-9) mid-job: its backups take over, podman starts
# its container again (restart: on-failure) and it takes its place. Then the
# Kubernetes manifests of deploy/k8s, rendered as pods (kube-play.py), run by
# podman kube play the same way, a shard's psd killed too. Prints how long
# the build took and the image's size. No registry is reachable here: the debian:12
# base image is made once from Debian's archive (debootstrap) and kept in
# podman's storage, as are the build's layers. Skipped, with the reason,
# where podman cannot run a container.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/lib-podman.sh"
podman_setup "$RUN"
why=$PODMAN_WHY
if [ -n "$why" ]; then
  trap - EXIT
  rm -rf "$RUN"
  echo "1..0 # SKIP $why"
  exit 0
fi

# The image, from the repository's tree (the build's context), named as the
# manifests and compose.yaml name it: the release's tag.
rev=$(git -C "$PSNET_SRC" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
release=$(sed -n "s/^ *version: '\([^']*\)'.*/\1/p" "$PSNET_SRC/meson.build" | head -n 1)
IMG=localhost/psnet:$release
t0=$SECONDS
# --format docker: an OCI image keeps no HEALTHCHECK.
podman build --format docker --network host "${ULIMITS[@]}" -f "$PSNET_SRC/deploy/container/Containerfile" --target runtime \
  --build-arg PSNET_REVISION="$rev" -t "$IMG" "$PSNET_SRC" >"$RUN/build.log" 2>&1
ok $? "the image builds from deploy/container/Containerfile ($((SECONDS - t0)) s; $(grep -o 'Using cache' "$RUN/build.log" | wc -l) steps from the cache)"
size=$(podman image inspect "$IMG" --format '{{.Size}}')
echo "# image $IMG: $((size / 1048576)) MiB (the debian:12 base: $(( $(podman image inspect "$BASE" --format '{{.Size}}') / 1048576 )) MiB)"
for p in pscoord psd workerd psctl psgate; do
  # (stderr apart: podman without systemd says it cannot schedule the image's health check)
  out=$(podman run --rm "$IMG" $p --version 2>"$RUN/run.err")
  [ "$out" = "$p $release (git $rev)" ]
  ok $? "$p --version in the image names the revision built ($out)"
done
# The runtime-cuda target (GPU workers, deploy/k8s/overlays/gpu), where
# NVIDIA's base images are in podman's storage: no registry is reachable here.
cuda=$(sed -n 's/^ARG CUDA_VERSION=//p' "$PSNET_SRC/deploy/container/Containerfile")
if podman image exists "docker.io/nvidia/cuda:$cuda-devel-ubuntu24.04" &&
   podman image exists "docker.io/nvidia/cuda:$cuda-runtime-ubuntu24.04"; then
  podman build --format docker --network host "${ULIMITS[@]}" -f "$PSNET_SRC/deploy/container/Containerfile" \
    --target runtime-cuda --build-arg PSNET_REVISION="$rev" -t "localhost/psnet-cuda:$release" "$PSNET_SRC" \
    >"$RUN/build-cuda.log" 2>&1
  ok $? "the runtime-cuda target builds ($(tail -n 1 "$RUN/build-cuda.log"))"
  out=$(podman run --rm "localhost/psnet-cuda:$release" workerd --version 2>"$RUN/run.err")
  [ "$out" = "workerd $release (git $rev)" ]; ok $? "workerd --version in the CUDA image ($out)"
else
  skip "the runtime-cuda target builds" "NVIDIA's docker.io/nvidia/cuda:$cuda-devel-ubuntu24.04 and -runtime-ubuntu24.04 are not in podman's storage, and no registry is reachable"
fi
out=$(podman run --rm "$IMG" id -u); [ "$out" = 10001 ]; ok $? "its programs run as the user psnet (uid $out)"
out=$(podman run --rm "$IMG" sh -c 'ls /usr/share/datasets/fashion-mnist | wc -l; ls /usr/local/share/bash-completion/completions | wc -l')
[ "$out" = "$(printf '4\n5')" ]; ok $? "it holds Fashion-MNIST and the programs' completion"

# save_mid CTL: psctl checkpoint save mid through CTL, asked again while an
# automatic save (--checkpoint-every) is being written, which refuses it
# saying so; $out and $save_rc say how the last one went.
save_mid() {
  out=$("$@" checkpoint save mid 2>&1); save_rc=$?
  [ $save_rc = 0 ] || ! grep -q 'is being written' <<<"$out"
}
# mid_on VOLUME: checkpoint mid is on the podman volume, pscoord's manifest
# and both shards' parts; $out lists its files.
mid_on() {
  out=$(podman run --rm -v "$1:/v" "$IMG" ls /v/mid | tr "\n" " ")
  grep -q 'MANIFEST' <<<"$out" && grep -q 'shard-1.ckpt' <<<"$out" && grep -q 'shard-2.ckpt' <<<"$out"
}

# compose.yaml as a user brings it up.
cd "$RUN" || exit 1
cp "$PSNET_SRC/deploy/container/compose.yaml" "$RUN/compose.yaml"
PC=(podman-compose -p psnet-test -f "$RUN/compose.yaml")
"${PC[@]}" down -v >/dev/null 2>&1 # what a run stopped midway left
"${PC[@]}" up -d >"$RUN/up.log" 2>&1; ok $? "podman-compose up -d"
ctl() { podman exec psnet-test_pscoord_1 psctl --keys /keys --coord tcp://127.0.0.1:7000 "$@"; }
evaluated() { podman logs psnet-test_pscoord_1 2>&1 | grep -q 'msg="epoch evaluated" job=1 epoch=1/'; }
psnet_wait_for 120 evaluated; ok $? "the job trains in the containers: epoch 1 evaluated"
# The image's health check (psctl probe, on the daemon's --http port), run
# as the engine runs it (podman runs none by itself without systemd).
for c in pscoord psd1 workerd1; do
  out=$(podman healthcheck run "psnet-test_${c}_1" 2>&1); ok $? "the health check of $c's container passes ${out:+($out)}"
done
out=$(curl -s -m 5 http://127.0.0.1:9100/metrics | grep -c '^psnet_pscoord_')
[ "${out:-0}" -gt 10 ]; ok $? "pscoord's /metrics on the host's loopback, as compose publishes it ($out psnet_pscoord_ lines)"
psnet_wait_for 60 save_mid ctl; [ "$save_rc" = 0 ]; ok $? "psctl checkpoint save mid ($out)"
mid_on psnet-test_checkpoints; ok $? "on the volume checkpoints: pscoord's manifest and both shards' parts ($out)"
out=$(podman run --rm -v psnet-test_state:/v "$IMG" ls /v/pscoord | tr "\n" " ")
grep -q 'pscoord.state' <<<"$out"; ok $? "pscoord keeps its job on the volume state ($out)"
# As a crash would: psd itself killed (podman kill would count as stopping
# the container on purpose, and podman restarts no container stopped so).
init=$(podman inspect psnet-test_psd2_1 --format '{{.State.Pid}}') psd=$(pgrep -P "$init" -x psd)
[ -n "$psd" ] && kill -9 "$psd"; ok $? "shard 2's psd killed (-9) in its container (pid $psd on this host)"
out=$(ctl job wait --wait 240 2>&1); rc=$?
[ $rc = 0 ] && grep -q 'state=done accuracy=0\.[5-9]' <<<"$out"; ok $? "the job reaches state=done with its accuracy ($out)"
podman logs psnet-test_pscoord_1 >"$RUN/pscoord.log" 2>&1
grep -q 'msg="fail-over" shard_id=2' "$RUN/pscoord.log" && grep -q 'msg="job done".* failovers=1' "$RUN/pscoord.log"
ok $? "pscoord failed shard 2 over to its backups ($(grep -m1 -o 'msg="fail-over" shard_id=2 reason="[^"]*"' "$RUN/pscoord.log"))"
grep -q "msg=\"shard takes a lost shard.s place\" shard_id=2 " "$RUN/pscoord.log"; ok $? "and the shard started again took its place"
out=$(podman inspect psnet-test_psd2_1 --format '{{.RestartCount}} {{.State.Status}}')
[ "${out%% *}" -ge 1 ]; ok $? "the killed shard's container was started again ($out)"
out=$(ctl --json status | jq -c '[.shards[].id] | sort')
[ "$out" = "[1,2]" ]; ok $? "both shards are registered at the end ($out)"
"${PC[@]}" down -v >"$RUN/down.log" 2>&1; ok $? "podman-compose down -v"
podman network rm -f psnet-test_psnet >/dev/null 2>&1 # podman-compose 1.0.3 leaves its network
[ -z "$(podman ps -a -q --filter label=io.podman.compose.project=psnet-test)" ]; ok $? "and nothing of it is left"

# deploy/k8s/overlays/production (deploy/k8s and the volumes shared across
# nodes), what kubectl apply -k applies, through podman kube play: its
# StatefulSets' and Job's pods (kube-play.py renders them; the keys as
# kustomize's generators would take them from deploy/k8s/keys), pscoord's
# state on its persistent volume, a checkpoint on the claim pscoord and both
# shards share (a named volume of podman's).
K=$RUN/k8s-keys
for kr in pscoord:server psd:server worker:worker admin:admin; do
  "$PSCTL" keys gen "${kr%%:*}" --role "${kr##*:}" --dir "$K" >/dev/null || echo "# keys gen ${kr%%:*} failed"
done
kube=$RUN/kube net=10.89.$((100 + $$ % 100))
pods=$(/usr/bin/python3 "$PSNET_SRC/tests/integration/kube-play.py" "$PSNET_SRC/deploy/k8s/overlays/production" "$K" "$kube" "$net")
ok $? "kube-play.py renders deploy/k8s/overlays/production as pods ($pods)"
podman network rm -f psnet-kube-test >/dev/null 2>&1
podman network create --subnet "$net.0/24" psnet-kube-test >/dev/null; ok $? "a network for the pods ($net.0/24)"
while read -r claim; do
  podman volume rm -f "$claim" >/dev/null 2>&1
  podman volume create "$claim" >/dev/null &&
    podman run --rm --user 0 -v "$claim:/v" "$IMG" chown 10001:10001 /v # as fsGroup would
done <"$kube/claims"
ips=(); while read -r ip; do ips+=(--ip "$ip"); done <"$kube/ips"
podman kube play --replace --network psnet-kube-test "${ips[@]}" --configmap "$kube/configmaps.yaml" "$kube/pods.yaml" \
  >"$RUN/kube-play.log" 2>&1; ok $? "podman kube play starts them ($(grep -c '^Pod:' "$RUN/kube-play.log") pods)"
# The operator's psctl, from this host (as through kubectl port-forward), with the admin key no pod has.
kctl() { "$PSCTL" --keys "$K" --coord "tcp://$(head -n 1 "$kube/ips"):7000" "$@"; }
kevaluated() { podman logs pscoord-0-pscoord 2>&1 | grep -q 'msg="epoch evaluated" job=1 epoch=1/'; }
psnet_wait_for 120 kevaluated; ok $? "the job trains in the pods: epoch 1 evaluated"
psnet_wait_for 60 save_mid kctl; [ "$save_rc" = 0 ]; ok $? "psctl checkpoint save mid, into the shared claim ($out)"
mid_on psnet-checkpoints; ok $? "pscoord's manifest and both shards' parts are on it ($out)"
init=$(podman inspect psd-1-psd --format '{{.State.Pid}}') psd=$(pgrep -P "$init" -x psd || echo "$init")
[ -n "$psd" ] && kill -9 "$psd"; ok $? "shard 2's psd (pod psd-1) killed (-9)"
out=$(kctl job wait --wait 240 2>&1); rc=$?
[ $rc = 0 ] && grep -q 'state=done accuracy=0\.[5-9]' <<<"$out"; ok $? "the job reaches state=done with its accuracy ($out)"
# psd's --memory-limit is its container's limit (cgroup v1 or v2), which pscoord checks jobs against.
limit=$(/usr/bin/python3 -c 'import sys, yaml; d = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x["metadata"]["name"] == "psd-0"][0]; q = d["spec"]["containers"][0]["resources"]["limits"]["memory"]; print(int(q[:-2]) * {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}[q[-2:]])' "$kube/pods.yaml")
podman logs psd-0-psd 2>&1 | grep -q "msg=\"listening\" .* memory_limit=$limit "
ok $? "psd's memory limit is its pod's ($limit bytes)"
podman logs pscoord-0-pscoord >"$RUN/kube-pscoord.log" 2>&1
grep -q 'msg="fail-over" shard_id=2' "$RUN/kube-pscoord.log" &&
  grep -q "msg=\"shard takes a lost shard.s place\" shard_id=2 " "$RUN/kube-pscoord.log"
ok $? "shard 2 failed over, its pod's container started again (restartPolicy Always) and took its place"
out=$(podman run --rm -v state-pscoord-0:/v "$IMG" ls /v/pscoord | tr "\n" " ")
grep -q 'pscoord.state' <<<"$out"; ok $? "pscoord kept its state on its volume ($out)"
podman kube down "$kube/pods.yaml" >"$RUN/kube-down.log" 2>&1; ok $? "podman kube down"
podman network rm psnet-kube-test >/dev/null; while read -r claim; do podman volume rm "$claim" >/dev/null; done <"$kube/claims"
podman volume rm -f psnet-config >/dev/null 2>&1 # kube play's volume of the ConfigMap
tap_done
