#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What a new user meets in deploy/local/demo: pscoord's own reason when it
# refuses the flags (not a timeout); the build shown and limited to the four
# programs; a live progress bar on a terminal and a line per epoch elsewhere,
# with the daemons' log lines kept in files; one log directory per run, the
# finished runs' removed by the next; the last line's format.
source "$(dirname "$0")/lib.sh"

DEMO=$PSNET_SRC/deploy/local/demo
export PSNET_DEMO_LOGS=$RUN/demo-logs
small=(--train-limit 6000 --test-limit 1000)
# Long enough (a few seconds) for the workers' progress to reach pscoord.
longer=(--train-limit 30000 --test-limit 1000)

t0=$SECONDS
out=$("$DEMO" --no-build --build "$PSNET_BUILD" --no-http --model resnet 2>&1); rc=$?
[ $rc = 2 ]; ok $? "--model resnet: the demo exits 2 (got $rc)"
grep -q "bad --model: model 'resnet': not mlp:D0-...-Dn, cnn, vit, lr:D or dlrm:F:BOT:TOP" <<<"$out"; ok $? "with pscoord's own reason ($(grep -m1 bad <<<"$out"))"
grep -q "did not answer" <<<"$out"; ok $(( $? == 0 )) "not a timeout"
out=$("$DEMO" --no-build --build "$PSNET_BUILD" --no-http --mode ssp:2x 2>&1); rc=$?
[ $rc = 2 ] && grep -q "bad --mode 'ssp:2x'" <<<"$out"; ok $? "--mode ssp:2x: pscoord's reason too"
[ $((SECONDS - t0)) -lt 20 ]; ok $? "both refusals come at once ($((SECONDS - t0)) s)"
out=$("$DEMO" --workers 0 2>&1); ok $(( $? != 2 )) "--workers 0 is the demo's own refusal"

# The build: ninja is asked for the four programs only, and shown.
mkdir -p "$RUN/bin"
real_ninja=$(command -v ninja)
printf '#!/bin/sh\necho "$*" >>"%s/ninja-args"\nexec "%s" "$@"\n' "$RUN" "$real_ninja" >"$RUN/bin/ninja"
chmod +x "$RUN/bin/ninja"
PATH="$RUN/bin:$PATH" "$DEMO" --no-install --build "$PSNET_BUILD" --no-http --backend cpu --epochs 2 \
  -- "${longer[@]}" >"$RUN/demo.out" 2>"$RUN/demo.err"; rc=$?
ok $rc "the demo runs a job ($(tail -1 "$RUN/demo.out"))"
# (A build that regenerates itself also runs ninja's tools, "ninja -t ...": not the demo's call.)
args=$(grep -v -- '^-t \| -t ' "$RUN/ninja-args" 2>/dev/null | tr '\n' ' ' | sed 's/ $//')
[ "$args" = "-C $PSNET_BUILD ps/pscoord/pscoord ps/psd/psd ps/psctl/psctl worker/workerd/workerd" ]
ok $? "it builds only the four programs (ninja $args)"
grep -q "demo: building pscoord, psd, psctl and workerd" "$RUN/demo.err"; ok $? "and says so"
grep -qE '^demo: pscoord at (ipc|tcp)://[^ ]+; to watch it from another terminal: [^ ]*psctl --coord (ipc|tcp)://[^ ]+ watch$' "$RUN/demo.err"
ok $? "it says where pscoord listens and the psctl line to watch it ($(grep -m1 'demo: pscoord at' "$RUN/demo.err"))"
grep -q '^demo: mlp:784-256-10: SGD at lr 0.04, cosine schedule' "$RUN/demo.err"
ok $? "the MLP under BSP: lr 0.04 with a cosine schedule, and it says so"
grep -q 'msg="job started" .* optim=sgd lr=0.04 lr_schedule=cosine ' "$PSNET_DEMO_LOGS"/run-*/pscoord.log
ok $? "which is what pscoord runs"
grep -qE '^accuracy=0\.[0-9]{4} epochs=2 workers=2 shards=2 mode=bsp seconds=[0-9]+$' "$RUN/demo.out"
ok $? "the last line keeps its format"
grep -qE '^demo: epoch [12]/2 +[0-9]+%  loss [0-9.]+  [0-9]+ samples/s$' "$RUN/demo.err"; ok $? "not on a terminal: a line per epoch"
grep -q 'msg="progress"' "$RUN/demo.err"; ok $(( $? == 0 )) "and no raw log lines"
runs=("$PSNET_DEMO_LOGS"/run-*)
[ ${#runs[@]} = 1 ] && grep -q 'msg="progress"' "${runs[0]}"/workerd-1.log; ok $? "the log lines are in the run's files"
first=${runs[0]}

# --model lr: a click log written for the run, the built-in sparse logistic
# regression, the AUC by epoch, and the planted model's best beside the result.
"$DEMO" --no-build --build "$PSNET_BUILD" --no-http --model lr --clicks 20000 --epochs 2 \
  >"$RUN/demo-lr.out" 2>"$RUN/demo-lr.err"; ok $? "the demo runs --model lr ($(tail -1 "$RUN/demo-lr.out"))"
grep -qE '^demo: the planted model.s test AUC is 0\.[0-9]+' "$RUN/demo-lr.err"; ok $? "it says the best AUC there is"
grep -qE '^demo: epoch 2/2  test accuracy 0\.[0-9]{4}  test loss [0-9.]+  AUC 0\.[0-9]{4}  at ' "$RUN/demo-lr.err"
ok $? "a line per epoch with its AUC"
last=$(tail -1 "$RUN/demo-lr.out")
grep -qE '^auc=0\.[0-9]{4} logloss=0\.[0-9]{4} epochs=2 workers=2 shards=2 mode=bsp seconds=[0-9]+ best_auc=0\.[0-9]+$' \
  <<<"$last" && awk '{ split($0, f, /[ =]/); exit !(f[2] > 0.6 && f[2] > f[16] - 0.15) }' <<<"$last"
ok $? "its last line: AUC, log loss, the run, and the planted model's best AUC beside an AUC near it"
# --model dlrm: the same log's kind, one epoch of the built-in DLRM.
"$DEMO" --no-build --build "$PSNET_BUILD" --no-http --model dlrm --clicks 60000 \
  >"$RUN/demo-dlrm.out" 2>"$RUN/demo-dlrm.err"; ok $? "the demo runs --model dlrm ($(tail -1 "$RUN/demo-dlrm.out"))"
grep -q '^demo: dlrm: a row of 8 per id in table ids (Adagrad, lr 0.1), .* 1 epoch(s)' "$RUN/demo-dlrm.err" &&
  grep -q 'msg="job started" .*model=dlrm:8:4-16-8:16-1 ' "$PSNET_DEMO_LOGS"/run-*/pscoord.log
ok $? "it trains dlrm:8:4-16-8:16-1 for one epoch, and says so"
last=$(tail -1 "$RUN/demo-dlrm.out")
grep -qE '^auc=0\.[0-9]{4} logloss=0\.[0-9]{4} epochs=1 workers=2 shards=2 mode=bsp seconds=[0-9]+ best_auc=0\.[0-9]+$' \
  <<<"$last" && awk '{ split($0, f, /[ =]/); exit !(f[2] > 0.6 && f[2] > f[16] - 0.15) }' <<<"$last"
ok $? "its last line: an AUC near the planted model's best"

# On a terminal (script gives it one): the progress bar, redrawn in place.
script -qec "'$DEMO' --no-build --build '$PSNET_BUILD' --no-http --backend cpu --epochs 2 -- ${longer[*]}" \
  "$RUN/typescript" >/dev/null 2>&1; ok $? "the demo runs on a terminal"
tr '\r' '\n' <"$RUN/typescript" | grep -qE '^.*epoch [12]/2 \[[#-]{30}\] +[0-9]+%  loss [0-9.]+  [0-9]+ samples/s  time left'
ok $? "it draws a progress bar: epoch, percent, loss, samples/s, time left"
grep -qa $'\r' "$RUN/typescript"; ok $? "redrawn in place (carriage returns)"
grep -qaE '^accuracy=0\.[0-9]{4} epochs=2 ' "$RUN/typescript"; ok $? "and ends with the result line"
runs=("$PSNET_DEMO_LOGS"/run-*)
[ ${#runs[@]} = 1 ] && [ "${runs[0]}" != "$first" ]; ok $? "the previous run's logs are gone, this run's stay (${#runs[@]} dirs)"

# --federated: edge workers with their own Dirichlet shares train in rounds;
# the same result line plus rounds=<n>.
"$DEMO" --no-build --build "$PSNET_BUILD" --no-http --federated --clients 3 --alpha 0.5 --rounds 3 --fraction 1 \
  -- --train-limit 3000 --test-limit 500 >"$RUN/fed.out" 2>"$RUN/fed.err"; rc=$?
ok $rc "demo --federated runs a federated job ($(tail -1 "$RUN/fed.out"))"
grep -qE '^accuracy=0\.[0-9]{4} epochs=1 workers=3 shards=2 mode=fed seconds=[0-9]+ rounds=3$' "$RUN/fed.out"
ok $? "it ends with the demo's result line plus rounds=3"
grep -qE '^demo: round [1-3]/3  clients 3  loss [0-9.]+  [0-9.]+ s$' "$RUN/fed.err"; ok $? "a line per round"
runs=("$PSNET_DEMO_LOGS"/run-*)
grep -q 'msg="ready" partition=2/3 images=[0-9]* alpha=dirichlet' "${runs[0]}"/edge-2.log
ok $? "each edge worker trains on its own Dirichlet share"
out=$("$DEMO" --no-build --build "$PSNET_BUILD" --federated --clients 1 2>&1); [ $? = 2 ] && grep -q 'at least 2' <<<"$out"
ok $? "--federated --clients 1 is refused with a reason"
# The built-in vit gets the demo's settings for it, and says so.
"$DEMO" --no-build --build "$PSNET_BUILD" --no-http --backend cpu --model vit --epochs 1 -- --train-limit 1000 \
  --test-limit 500 >"$RUN/vit.out" 2>"$RUN/vit.err"; ok $? "demo --model vit runs ($(tail -1 "$RUN/vit.out"))"
grep -q '^demo: vit: Adam at lr 0.001, cosine schedule, 1 epochs' "$RUN/vit.err"; ok $? "with Adam at lr 0.001, and says so"
runs=("$PSNET_DEMO_LOGS"/run-*)
grep -q 'msg="job started" .* optim=adam lr=0.001 lr_schedule=cosine ' "${runs[0]}"/pscoord.log
ok $? "which is what pscoord runs"
