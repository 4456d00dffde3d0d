#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A user's own data as NumPy arrays (x_train.npy, y_train.npy, x_test.npy,
# y_test.npy written by numpy.save): Fashion-MNIST as standardised float32
# [N, 1, 28, 28] with int64 labels trains the cnn-shaped MLP like the IDX
# files do; data that is not images (three classes of 20 values, int32
# labels) trains a 20-32-3 MLP. Every epoch's test accuracy is recorded by
# pscoord (psctl status), in order, the last one the job's. Bad arrays (a
# label beyond the model's classes, float64 features, a NaN) stop the worker
# with the file and the reason, and pscoord keeps serving; the failed job's
# state (psctl status) carries the worker's reason, as it does for a data
# directory that is not there. And psnet-clicklog's synthetic click logs, read by NumPy.
source "$(dirname "$0")/lib.sh"

FM=/usr/share/datasets/fashion-mnist
mk() { /usr/bin/python3 "$PSNET_SRC/tests/integration/make-npy.py" "$@"; }


# The accuracy by epoch of the job at $COORD: "epoch accuracy" lines.
epochs_of() { "$PSCTL" --coord "$COORD" --json status | jq -r '.history.epochs[] | "\(.epoch) \(.accuracy)"'; }

mk fmnist "$FM" "$RUN/fm" 6000 2000; ok $? "numpy writes Fashion-MNIST as float32 [N, 1, 28, 28] and int64 labels"
train_job fm 2 --data "$RUN/fm" --model mlp:784-128-10 --epochs 3
accuracy_at_least "$out" 0.75; ok $? "the NumPy copy of Fashion-MNIST trains: accuracy >= 0.75 ($out)"
grep -q 'data loaded.*format=npy train=6000 test=2000 sample="\[1, 28, 28\]" classes=10' "$RUN/w1-fm.log"; ok $? "the worker read the arrays: format, sizes, sample shape, classes"
ep=$(epochs_of)
[ "$(awk '{ print $1 }' <<<"$ep" | tr '\n' ' ')" = "1 2 3 " ]; ok $? "pscoord recorded the test accuracy of epochs 1, 2, 3 ($(tr '\n' ' ' <<<"$ep"))"
last=$(tail -1 <<<"$ep" | awk '{ print $2 }')
job_acc=$("$PSCTL" --coord "$COORD" --json status | jq -r .job.accuracy)
within "$last" "$job_acc" 0.0001; ok $? "the last epoch's is the job's accuracy ($last, $job_acc)"
awk '$2 < 0.5 || $2 > 1 { exit 1 }' <<<"$ep"; ok $? "each epoch's accuracy is a learned model's (>= 0.5)"
"$PSCTL" --coord "$COORD" status | grep -q "^EPOCH *ACCURACY"; ok $? "psctl status shows the accuracy by epoch"
grep -q 'msg="evaluated epoch end" epoch=1 ' "$RUN"/w[12]-fm.log; ok $? "a worker evaluated at the end of epoch 1"
[ "$(grep -h 'msg="evaluated epoch end" epoch=' "$RUN"/w[12]-fm.log | wc -l)" = 2 ]; ok $? "once per epoch before the last, by one worker"
psnet_stop_all

mk blobs "$RUN/blobs" 3000 600; ok $? "numpy writes 3 classes of 20 values, int32 labels"
train_job blobs 2 --data "$RUN/blobs" --model mlp:20-32-3 --epochs 2 --lr 0.05
accuracy_at_least "$out" 0.9; ok $? "data that is not images trains a 20-32-3 MLP: accuracy >= 0.9 ($out)"
psnet_stop_all

# Bad arrays: the worker stops and says which file and why.
bad() { # defect pattern description
  mk bad "$RUN/bad-$1" "$1"
  COORD="ipc://$RUN/bad-$1.sock"
  psnet_start "pscoord-bad-$1" "$PSCOORD" --listen "$COORD" --workers 1 --shards 1 --data "$RUN/bad-$1"
  start_shards "bad-$1" 1 "$COORD"
  psnet_start "w-bad-$1" "$WORKERD" --coord "$COORD" --backend cpu
  local pid_var="PID_w_bad_$1"
  psnet_wait_exit "${!pid_var}" 60; ok $? "$3: the worker exits"
  grep -q -- "$2" "$RUN/w-bad-$1.log"; ok $? "$3: it says why ($(grep -o 'level=error.*' "$RUN/w-bad-$1.log" | head -1))"
  "$PSCTL" --coord "$COORD" status >/dev/null; ok $? "$3: pscoord goes on serving"
  local why
  why=$("$PSCTL" --coord "$COORD" --json status | jq -r .job.reason)
  grep -q -- "^every worker left without finishing; the last to fail said: worker 1: .*\($2\)" <<<"$why"; ok $? "$3: the failed job's state says why ($why)"
  psnet_stop_all
}
bad labels11 "labels 0..11" "a label of 11 for a model of 10 classes"
bad float64 "x_train.npy.*float64\|x_train.npy.*<f8" "float64 features"
bad nan "x_train.npy: value 3 of sample 7 is NaN" "a NaN feature"

# A data directory that is not there: the job fails with the worker's reason,
# not only "every worker left".
COORD="ipc://$RUN/nodata.sock"
psnet_start pscoord-nodata "$PSCOORD" --listen "$COORD" --workers 1 --shards 1 --data "$RUN/no-such-dir"
start_shards nodata 1 "$COORD"
psnet_start w-nodata "$WORKERD" --coord "$COORD" --backend cpu
psnet_wait_exit "$PID_w_nodata" 60; ok $? "a missing data directory: the worker exits"
why=$("$PSCTL" --coord "$COORD" --json status | jq -r '.job.state + ": " + .job.reason')
grep -q "^failed: every worker left without finishing; the last to fail said: worker 1: cannot load the data from $RUN/no-such-dir: " <<<"$why"
ok $? "the job failed and says why ($why)"
psnet_stop_all

# A synthetic click log (issue 34's data): psnet-clicklog writes it, NumPy
# reads every file back with the stated types and shapes, and its own AUC of
# the planted logits is the one printed.
CL=$PSNET_BUILD/worker/data/psnet-clicklog
out=$("$CL" --out "$RUN/clicks" --train-rows 20000 --test-rows 5000 --fields 4 --vocab 1e3,1e4,1e5,1e8 --dense 3 --seed 5)
ok $? "psnet-clicklog writes a click log ($out)"
best=$(sed -n 's/.* best_auc=\([0-9.]*\) .*/\1/p' <<<"$out")
check=$(/usr/bin/python3 - "$RUN/clicks" <<'PY'
import sys
import numpy as np
d = sys.argv[1]
tr = {k: np.load(f"{d}/train/{k}.npy") for k in ("sparse", "dense", "label")}
te = {k: np.load(f"{d}/test/{k}.npy") for k in ("sparse", "dense", "label", "logit")}
assert tr["sparse"].dtype == np.int64 and tr["sparse"].shape == (20000, 4), tr["sparse"].shape
assert tr["dense"].dtype == np.float32 and tr["dense"].shape == (20000, 3)
assert tr["label"].dtype == np.uint8 and set(np.unique(tr["label"])) <= {0, 1}
assert te["logit"].shape == (5000,) and te["sparse"].shape == (5000, 4)
assert ((tr["sparse"] >= 0) | (tr["sparse"] == -1)).all()
s, y = te["logit"].astype(np.float64), te["label"].astype(bool)
_, inv, cnt = np.unique(s, return_inverse=True, return_counts=True)
order = np.argsort(s, kind="mergesort")
ranks = np.empty(len(s))
ranks[order] = np.arange(1, len(s) + 1)
ranks = (np.bincount(inv, weights=ranks) / cnt)[inv]
p, n = y.sum(), (~y).sum()
print(f"{(ranks[y].sum() - p * (p + 1) / 2) / (p * n):.8f}")
PY
)
ok $? "NumPy reads every file with the stated types and shapes"
awk -v a="${check:-x}" -v b="${best:-y}" 'BEGIN { d = a - b; exit !(b > 0.5 && d < 0.00006 && d > -0.00006) }'
ok $? "NumPy's AUC of the planted logits is the one printed, to its 4 decimals ($check, $best)"
"$CL" --out "$RUN/clicks2" --fields 2 --vocab 1,2,3 >/dev/null 2>"$RUN/cl.err"; rc=$?
[ $rc -eq 2 ] && grep -q "one per field" "$RUN/cl.err"; ok $? "a --vocab that does not match --fields: exit 2 with the reason"
