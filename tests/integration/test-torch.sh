#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# psnet.torch: any PyTorch model (Debian's python3-torch) trained on the
# shards. A model psnet cannot describe as layers (BatchNorm, a residual
# connection, a custom loss) trains to a stated accuracy against real
# daemons, starting from its own values, and the export loads into a fresh
# model with the accuracy psnet reported; two BSP workers end with
# torch.optim.SGD's weights on the combined batch; a worker joins a running
# job; psnet.LocalCluster starts and stops cleanly (after an exception, and
# when its Python process is killed); a model too large, one whose tensors
# differ from the job's, and a non-float parameter are refused with clear
# errors; a dead shard makes step raise in bounded time. (The examples:
# test-torch-examples.)
source "$(dirname "$0")/lib.sh"

py_env
ANY=$PSNET_SRC/tests/integration/torch-any.py
PYCHECK_SCRIPT=$ANY

# Any model against daemons started by hand (as deploy/local's).
start_cluster any 2
pycheck anymodel anymodel "$COORD" "$RUN/any.json" "$RUN"
out=$("$PSCTL" --coord "$COORD" job wait --wait 30)
acc=$(jq -r .accuracy "$RUN/any.json" 2>/dev/null)
[ -n "$acc" ] && within "$(acc_of "$out")" "$acc" 0.000001
ok $? "pscoord's job is done with the accuracy the worker measured ($out; $acc)"
"$PSCTL" --coord "$COORD" report --out "$RUN/report" >/dev/null 2>&1
rows=$(awk -F, 'NR > 1 && $4 > 0 && $5 > 0' "$RUN/report/samples.csv" 2>/dev/null | wc -l)
[ "$rows" -ge 2 ]; ok $? "psctl report has the worker's loss and samples/s over time ($rows rows)"
"$PSCTL" --coord "$COORD" --json status | jq -e '.job.model | fromjson | .tensors | map(select(.buffer)) | length == 9' >/dev/null
ok $? "the job holds the 9 buffers of the model's 3 BatchNorm layers as buffers"
psnet_stop_all

# Two BSP workers against torch.optim.SGD on the combined batch.
start_cluster bsp 2
"${PY[@]}" "$ANY" bsp-worker "$COORD" "$RUN/bsp-a.pt" "$RUN" >"$RUN/bsp-a.out" 2>"$RUN/bsp-a.log" & pa=$!
"${PY[@]}" "$ANY" bsp-worker "$COORD" "$RUN/bsp-b.pt" "$RUN" >"$RUN/bsp-b.out" 2>"$RUN/bsp-b.log" & pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
[ $ra -eq 0 ] && [ $rb -eq 0 ]; ok $? "two Python workers train one BSP job (exit $ra $rb)"
pycheck bsp-compare bsp-compare "$RUN/bsp-a.pt" "$RUN/bsp-b.pt"
grep -q 'msg="job submitted"' "$RUN/pscoord-bsp.log" && [ "$(grep -c 'msg="job submitted"' "$RUN/pscoord-bsp.log")" -le 2 ]
ok $? "the workers registered the job (one submit, or two for the same model)"
psnet_stop_all

# A worker joins a running job.
start_cluster join 1
"${PY[@]}" "$ANY" join "$COORD" first "$RUN/join-1.json" >"$RUN/join-1.out" 2>"$RUN/join-1.log" & p1=$!
psnet_wait_for 60 test -f "$RUN/join-1.json.ready"
"${PY[@]}" "$ANY" join "$COORD" second "$RUN/join-2.json" >"$RUN/join-2.out" 2>"$RUN/join-2.log"; r2=$?
wait $p1; r1=$?
[ $r1 -eq 0 ] && [ $r2 -eq 0 ] && jq -e '.sizes == [1, 2]' "$RUN/join-1.json" >/dev/null &&
  jq -e '.sizes | index(2) != null' "$RUN/join-2.json" >/dev/null
ok $? "a second worker joins the running job: both see world_size 2 ($(cat "$RUN/join-1.json" "$RUN/join-2.json" 2>/dev/null | tr '\n' ' '))"
psnet_stop_all

# Ctrl-C during a step (a BSP step waiting for a worker that holds back).
start_cluster int 1
"${PY[@]}" "$ANY" interrupt "$COORD" a "$RUN" >"$RUN/int-a.out" 2>"$RUN/int-a.log" & pa=$!
"${PY[@]}" "$ANY" interrupt "$COORD" b "$RUN" >"$RUN/int-b.out" 2>"$RUN/int-b.log" & pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
[ $ra -eq 0 ] && [ $rb -eq 0 ]; ok $? "both workers end (exit $ra $rb)"
pycheck interrupt-compare interrupt-compare "$RUN"
psnet_stop_all

# LocalCluster: a clean stop, also after an exception, and when Python is killed.
cat >"$RUN/lc.py" <<'EOF'
import signal, sys, psnet
mode = sys.argv[1]
c = psnet.LocalCluster(shards=2)
with c:
    print(c.dir, " ".join(str(p.pid) for p in c.procs.values()), flush=True)
    if mode == "raise":
        raise RuntimeError("the user's code failed")
    if mode == "hang":
        signal.pause()  # until the test kills it
EOF
gone() { for p in $1; do alive "$p" && return 1; done; return 0; }
"${PY[@]}" "$RUN/lc.py" clean >"$RUN/lc-clean.out" 2>"$RUN/lc-clean.log"
read -r dir pids <"$RUN/lc-clean.out"
[ -n "$pids" ] && gone "$pids" && [ ! -e "$dir" ]
ok $? "LocalCluster: pscoord and 2 shards ($pids) stopped and its directory removed on exit"
"${PY[@]}" "$RUN/lc.py" raise >"$RUN/lc-raise.out" 2>"$RUN/lc-raise.log"
read -r dir pids <"$RUN/lc-raise.out"
[ -n "$pids" ] && gone "$pids" && [ ! -e "$dir" ] && grep -q "the user's code failed" "$RUN/lc-raise.log"
ok $? "LocalCluster: the same after an exception in the with block"
"${PY[@]}" "$RUN/lc.py" hang >"$RUN/lc-hang.out" 2>"$RUN/lc-hang.log" & ph=$!
psnet_wait_for 30 test -s "$RUN/lc-hang.out"
read -r dir pids <"$RUN/lc-hang.out"
kill -KILL $ph; wait $ph 2>/dev/null
psnet_wait_for 10 gone "$pids"
ok $? "LocalCluster: the daemons ($pids) end when the Python process that started them is killed"
rm -rf "$dir"

pycheck errors errors
pycheck schedule schedule
pycheck gone gone "$RUN/gone"
if "${PY[@]}" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  pycheck cuda cuda
else
  skip "a model on CUDA (gradients through page-locked memory)" \
    "no CUDA device here: tests/gpu/device-run checks it where a GPU is lent"
fi
