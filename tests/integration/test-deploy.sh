#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The deployment files against the build: deploy-check.py parses the Kubernetes
# manifests, compose.yaml, the example configs and the systemd units, and
# checks the images, programs, flags, ports, probes, config files and keys they
# name. The container image installs every library the programs link. Then the
# Kubernetes pods run as a runtime would start them: each pod in its own
# network namespace on one bridge, its hostname the pod's name, Service and pod
# names in its /etc/hosts, its ConfigMap and Secret volumes laid out as kubelet
# does (mode 0440 files behind ..data links), argv as the manifests say. The
# job trains to the end; the probes answer on the ports the manifests name.
source "$(dirname "$0")/lib.sh"

K=$RUN/keys
for kr in pscoord:server psd:server worker:worker admin:admin; do
  "$PSCTL" keys gen "${kr%%:*}" --role "${kr##*:}" --dir "$K" >/dev/null || echo "keys gen ${kr%%:*} failed"
done
PLAN=$RUN/k8s/plan.json
/usr/bin/python3 "$PSNET_SRC/tests/integration/deploy-check.py" "$PSNET_SRC" "$PSNET_BUILD" "$K" "$PLAN" \
  >"$RUN/checks" 2>"$RUN/checks.err"
ok $? "deploy-check.py runs ($(tail -1 "$RUN/checks.err"))"
while IFS=$'\t' read -r res what; do
  ok $([ "$res" = ok ]; echo $?) "$what"
done <"$RUN/checks"
[ "$(wc -l <"$RUN/checks")" -gt 100 ]; ok $? "deploy-check.py made its checks ($(wc -l <"$RUN/checks"))"

# The runtime stage of the Containerfile installs the package of every library
# the programs link directly (CUDA aside: the image is built without it).
runtime=$(sed -n '/^FROM docker.io\/library\/debian:12 AS runtime$/,/^FROM runtime AS python$/p' "$PSNET_SRC/deploy/container/Containerfile" |
  sed -n '/apt-get install/,/rm -rf/p')
for b in "$PSCOORD" "$PSD" "$WORKERD" "$PSCTL"; do
  missing=()
  for lib in $(objdump -p "$b" | awk '/NEEDED/ { print $2 }'); do
    path=$(ldd "$b" | awk -v l="$lib" '$1 == l { print $3 }')
    case $path in /usr/local/cuda*|"") continue ;; esac
    pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1)
    [ -z "$pkg" ] && pkg=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1)
    # The C runtime is in every image; a sanitizer build's runtimes are not the image's.
    case $pkg in libc6|libgcc-s1|libstdc++6|libasan*|libubsan*) continue ;; esac
    grep -qw -- "$pkg" <<<"$runtime" || missing+=("$lib($pkg)")
  done
  [ ${#missing[@]} -eq 0 ]; ok $? "the image installs what $(basename "$b") links ${missing[*]}"
done

# Debian's docker-compose (1.29, Compose file 3.x rules, no daemon needed to
# read a file) accepts compose.yaml as it is.
if command -v docker-compose >/dev/null; then
  out=$(docker-compose -f "$PSNET_SRC/deploy/container/compose.yaml" config 2>&1 >/dev/null)
  ok $? "Debian's docker-compose $(docker-compose version --short 2>/dev/null) accepts compose.yaml ${out:+($out)}"
else
  ok 1 "docker-compose is installed (deploy/local/install-deps)"
fi

# Every kustomization (deploy/k8s and its overlays) rendered as kubectl apply
# -k renders it (kustomize.py), against the Kubernetes API's schemas of 1.30
# to 1.34: kubernetes-validate --strict, from the package index into a fresh
# virtual environment (nothing packages it, nor kubeconform, in Debian 12);
# where the index cannot be reached, skipped, saying so.
rendered=()
for dir in "$PSNET_SRC/deploy/k8s" "$PSNET_SRC"/deploy/k8s/overlays/*/; do
  name=$(basename "$dir")
  out=$RUN/rendered-$name.yaml
  /usr/bin/python3 "$PSNET_SRC/tests/integration/kustomize.py" "$dir" "$K" >"$out" 2>"$RUN/kustomize.err"
  ok $? "kustomize.py renders $name ($(grep -c '^kind:' "$out") objects) $(tail -1 "$RUN/kustomize.err")"
  rendered+=("$out")
done
kv=$RUN/kv
if /usr/bin/python3 -m venv "$kv" >"$RUN/kv.log" 2>&1 &&
   timeout 180 "$kv/bin/pip" install -q --no-input --disable-pip-version-check --timeout 15 --retries 1 kubernetes-validate >>"$RUN/kv.log" 2>&1; then
  for v in 1.30.0 1.31.0 1.32.0 1.33.0 1.34.0; do
    out=$("$kv/bin/kubernetes-validate" --strict --quiet -k "$v" "${rendered[@]}" 2>&1)
    ok $? "kubernetes-validate --strict: every rendered manifest is valid Kubernetes $v $(head -c 400 <<<"$out")"
  done
else
  skip "kubernetes-validate on the rendered manifests" "the package index cannot be reached ($(tail -n 1 "$RUN/kv.log"))"
fi

# --- the pods, each in a network namespace -------------------------------------
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! unshare --net --mount --uts true 2>/dev/null; then
  echo "# skipped: running the Kubernetes pods needs root with network and mount namespaces (ip, unshare)"
  exit 0
fi
NS=psk$$
ip netns add "$NS-br" && ip -n "$NS-br" link add br0 type bridge && ip -n "$NS-br" link set br0 up &&
  ip -n "$NS-br" addr add 10.213.0.1/24 dev br0 && ip -n "$NS-br" link set lo up
ok $? "a bridge for the pods"
cleanup_ns() {
  psnet_stop_all
  for n in $(ip netns list | awk -v p="$NS-" 'index($1, p) == 1 { print $1 }'); do ip netns del "$n"; done
}
trap 'cleanup_ns; finish; exit $?' EXIT
printf '127.0.0.1 localhost\n' >"$RUN/hosts"
jq -r '.hosts | to_entries[] | "\(.value) \(.key)"' "$PLAN" >>"$RUN/hosts"
npods=$(jq '.pods | length' "$PLAN")
i=0
for ((p = 0; p < npods; p++)); do
  name=$(jq -r ".pods[$p].name" "$PLAN") ip_=$(jq -r ".pods[$p].ip" "$PLAN")
  ip netns add "$NS-$name" &&
    ip link add "v$NS$p" netns "$NS-br" type veth peer name eth0 netns "$NS-$name" &&
    ip -n "$NS-br" link set "v$NS$p" master br0 up &&
    ip -n "$NS-$name" addr add "$ip_/24" dev eth0 && ip -n "$NS-$name" link set eth0 up &&
    ip -n "$NS-$name" link set lo up || echo "# network of $name failed"
done
# pod NAME: runs the pod's argv in its namespace with its hostname and hosts.
pod() {
  local p=$1 name argv
  name=$(jq -r ".pods[$p].name" "$PLAN")
  mapfile -t argv < <(jq -r ".pods[$p].argv[]" "$PLAN")
  # The test's job is small: 2 epochs of a subset (flags after the manifest's override it).
  if [ "$(jq -r ".pods[$p].program" "$PLAN")" = pscoord ]; then argv+=(--epochs 2 "${SUBSET[@]}"); fi
  psnet_start "$name" ip netns exec "$NS-$name" unshare --mount --uts -- sh -c \
    'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' sh "$RUN/hosts" "$name" "${argv[@]}"
}
probe() {  # probe POD PATH: the HTTP status of GET http://POD-IP:HTTP-PORT/PATH from the bridge
  local p=$1
  ip netns exec "$NS-br" curl -s -m 3 -o "$RUN/probe" -w '%{http_code}' \
    "http://$(jq -r ".pods[$p].ip" "$PLAN"):$(jq -r ".pods[$p].http" "$PLAN")$2"
}
idx() { jq -r --arg n "$1" '.pods | map(.name) | index($n)' "$PLAN"; }
COORD_IP=$(jq -r '.hosts.pscoord' "$PLAN")
admin() { ip netns exec "$NS-br" "$PSCTL" --coord "tcp://$COORD_IP:7000" --keys "$K" "$@"; }

pc=$(idx pscoord-0) p0=$(idx psd-0) p1=$(idx psd-1) w0=$(idx workerd-0) w1=$(idx workerd-1)
pod "$pc"
psnet_wait_for 10 bash -c "[ \"\$(ip netns exec $NS-br curl -s -m 1 -o /dev/null -w '%{http_code}' http://$COORD_IP:9100/readyz)\" = 200 ]"
ok $? "pscoord-0 is ready (its readinessProbe)"
pod "$p0"; pod "$p1"
psnet_wait_for 20 bash -c "[ \"\$(ip netns exec $NS-br curl -s -m 1 -o /dev/null -w '%{http_code}' http://$(jq -r .pods[$p1].ip "$PLAN"):9101/readyz)\" = 200 ]"
ok $? "psd-1 is ready once registered"
[ "$(probe "$p0" /readyz)" = 200 ] && [ "$(probe "$p0" /healthz)" = 200 ]; ok $? "psd-0's probes answer 200"
out=$(admin --json status); ok $? "psctl with the admin key reaches pscoord across the bridge"
jq -e '[.shards[] | {id, endpoint}] | sort_by(.id) == [{"id":1,"endpoint":"tcp://psd-0.psd:7001"},{"id":2,"endpoint":"tcp://psd-1.psd:7001"}]' <<<"$out" >/dev/null
ok $? "psd-N is shard N+1 and advertises its pod name ($(jq -c '[.shards[] | {id, endpoint}]' <<<"$out"))"
pod "$w0"; pod "$w1"
out=$(admin job wait --wait 120 2>&1); rc=$?
ok $rc "the job trains to the end on the pods ($out)"
accuracy_at_least "$out" 0.70; ok $? "with a sane accuracy"
psnet_wait_exit "$(eval echo "\$PID_workerd_0")" 20 && psnet_wait_exit "$(eval echo "\$PID_workerd_1")" 20
ok $? "both workers exit (a Job's pods complete)"
wait "$PID_workerd_0"; r0=$?; wait "$PID_workerd_1"; r1=$?
[ $r0 = 0 ] && [ $r1 = 0 ]; ok $? "with status 0 ($r0, $r1)"
code=$(probe "$pc" /metrics); [ "$code" = 200 ] && promtool check metrics <"$RUN/probe" >/dev/null 2>&1
ok $? "pscoord's /metrics on the port the Service names"
grep -q '^psnet_pscoord_job_state{state="done"} 1' "$RUN/probe"; ok $? "and says the job is done"
sdir=$(jq -r '.pods[] | select(.program == "pscoord") | .volumes["/var/lib/psnet"].dir' "$PLAN")
[ -n "$sdir" ] && [ -f "$sdir/pscoord/pscoord.state" ] && grep -q 'msg="no state yet' "$RUN/pscoord-0.log"
ok $? "pscoord keeps its state on its persistent volume (--state-dir)"
grep -q 'security=curve' "$RUN/psd-0.log" && grep -q 'security=curve' "$RUN/pscoord-0.log"
ok $? "the daemons run with CURVE"
