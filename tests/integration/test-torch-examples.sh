#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# psnet.torch's examples run as they are against daemons started by hand:
# examples/resnet18_fashion.py (torchvision's ResNet-18, two workers of one
# BSP job), examples/custom_loss.py (an autoencoder with a loss of its own)
# and examples/dlrm_clicks.py (a DLRM-style model with a psnet table per
# field of a click log).
source "$(dirname "$0")/lib.sh"

py_env

if [ $sanitized = 1 ]; then
  # The same library calls as test-torch's; torch's own time dominates them.
  skip "examples/resnet18_fashion.py, custom_loss.py and dlrm_clicks.py against hand-started daemons" \
    "the examples run in the normal build's pass"
  exit 0
fi

# examples/resnet18_fashion.py as it is, two workers against daemons started
# by hand (one process each, --coord), on a few images.
start_cluster r18 2
ex=(--coord "$COORD" --rank-of 0 --workers 2 --limit 128 --test-limit 100 --epochs 1 --batch 32 --init-dir "$RUN" --quiet)
"${PY[@]}" "$PSNET_SRC/examples/resnet18_fashion.py" "${ex[@]}" >"$RUN/r18-1.out" 2>"$RUN/r18-1.log" & p1=$!
"${PY[@]}" "$PSNET_SRC/examples/resnet18_fashion.py" "${ex[@]}" >"$RUN/r18-2.out" 2>"$RUN/r18-2.log"; r2=$?
wait $p1; r1=$?
[ $r1 -eq 0 ] && [ $r2 -eq 0 ] && grep -q 'worker 0 of 2: final' "$RUN"/r18-*.out && grep -q 'worker 1 of 2: final' "$RUN"/r18-*.out
ok $? "examples/resnet18_fashion.py: torchvision's ResNet-18, two workers of one BSP job ($(cat "$RUN"/r18-*.out | grep final | tr '\n' ' '))"
"$PSCTL" --coord "$COORD" --json status | jq -e '(.job.model | fromjson | .tensors | length) == 122 and .job.state == "done"' >/dev/null
ok $? "its job held ResNet-18's 122 state_dict tensors and is done"
psnet_stop_all

# examples/custom_loss.py: an autoencoder with a loss of its own, no labels
# and no accuracy; the job ends done all the same.
start_cluster ae 1
"${PY[@]}" "$PSNET_SRC/examples/custom_loss.py" --coord "$COORD" --limit 2000 --epochs 2 >"$RUN/ae.out" 2>"$RUN/ae.log"; rc=$?
before=$(sed -n 's/^loss before training \([0-9.]*\)$/\1/p' "$RUN/ae.out")
after=$(sed -n 's/^epoch 2: loss \([0-9.]*\)$/\1/p' "$RUN/ae.out")
[ $rc -eq 0 ] && [ -n "$before" ] && [ -n "$after" ] && awk -v a="$after" -v b="$before" 'BEGIN { exit !(a < 0.5 * b) }'
ok $? "examples/custom_loss.py: its own loss falls by more than half in 2 epochs ($before to $after)"
out=$("$PSCTL" --coord "$COORD" job wait --wait 30)
[ "$out" = "state=done" ]; ok $? "a job of a model without an accuracy ends done ($out)"
psnet_stop_all

# examples/dlrm_clicks.py: a table per field of a click log (6 of them), the
# MLPs and dot interactions in torch; its test AUC near the planted model's.
"$PSNET_BUILD/worker/data/psnet-clicklog" --out "$RUN/clicks" --train-rows 30000 --test-rows 5000 --fields 6 \
  --vocab 2000 --dense 4 --seed 5 >"$RUN/clicklog.out" 2>&1
start_cluster dlrm 2
"${PY[@]}" "$PSNET_SRC/examples/dlrm_clicks.py" --coord "$COORD" --data "$RUN/clicks" --epochs 2 \
  >"$RUN/dlrm.out" 2>"$RUN/dlrm.log"; rc=$?
best=$(sed -n 's/.*best_auc=\([0-9.]*\).*/\1/p' "$RUN/clicklog.out")
auc=$(sed -n 's/^epoch 2: test AUC \([0-9.]*\)$/\1/p' "$RUN/dlrm.out")
[ $rc -eq 0 ] && [ -n "$auc" ] && awk -v a="$auc" -v b="${best:-1}" 'BEGIN { exit !(a > 0.5 && a > b - 0.1) }'
ok $? "examples/dlrm_clicks.py: its test AUC $auc within 0.1 of the planted model's $best ($(tail -1 "$RUN/dlrm.log"))"
"$PSCTL" --coord "$COORD" --json status | jq -e '.job.state == "done" and (.job.tables | split(",") | length) == 6 and
  (.job.tables | startswith("field0:8:adagrad"))' >/dev/null
ok $? "its job held a table per field and is done ($("$PSCTL" --coord "$COORD" --json status | jq -r .job.tables | cut -c1-60)...)"
psnet_stop_all
