#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# PyTorch in: a model trained in Debian's python3-torch, its state_dict saved
# as safetensors (python/psnet/models.py), starts a psnet job (--init). With a
# learning rate too small to move a float32 (1e-30) the job ends with the
# values it started from: psnet's accuracy is PyTorch's (within 0.002) and
# its export is the file, bit for bit. With the usual rate it trains on from
# there, ahead of the same job from random values. A file that does not fit
# the model (float64, a tensor missing or more, another shape, a NaN, none)
# is refused when the job is submitted, with the file, tensor and reason,
# while pscoord serves on; a file changed after the check fails the job at
# the shards instead of training from values nobody checked.
source "$(dirname "$0")/lib.sh"

FM=/usr/share/datasets/fashion-mnist
TC=$PSNET_SRC/tests/integration/torch-check.py
torch_check() { /usr/bin/python3 "$TC" "$@"; }
MODEL=$RUN/small-cnn.json INIT=$RUN/torch.safetensors
cat >"$MODEL" <<'JSON'
{"name": "small-cnn", "input": [1, 28, 28], "layers": [
  {"type": "conv2d", "out": 8, "kernel": 5, "padding": 2}, {"type": "relu"}, {"type": "maxpool", "kernel": 2},
  {"type": "flatten"}, {"type": "linear", "out": 32}, {"type": "relu"}, {"type": "linear", "out": 10}]}
JSON

tacc=$(torch_check pretrain "$MODEL" "$FM" 3000 2000 "$INIT"); ok $? "PyTorch trains the model and saves its state_dict ($tacc)"

# Unchanged values: psnet's accuracy and export are PyTorch's.
train_job same 1 --model "$MODEL" --init "$INIT" --epochs 1 --train-limit 256 --test-limit 2000 --lr 1e-30
acc=$(acc_of "$out")
within "$acc" "$tacc" 0.0026; ok $? "started from the file, psnet's accuracy is PyTorch's: $acc vs $tacc"
"$PSCTL" --coord "$COORD" status | grep -q "init=$INIT"; ok $? "psctl status names the init file"
[ "$("$PSCTL" --coord "$COORD" --json status | jq -r .job.init)" = "$INIT" ]; ok $? "and so does --json status"
n=$(cat "$RUN"/psd-same-*.log | grep -c "initial values loaded\" file=$INIT ")
[ "$n" -eq 2 ]; ok $? "both shards built their chunks from the file ($n)"
logs_match "shard loaded the initial values\" shard=1 " "pscoord-same.log" &&
  logs_match "shard loaded the initial values\" shard=2 " "pscoord-same.log"; ok $? "and told pscoord"
"$PSCTL" --coord "$COORD" export "$RUN/back.safetensors" >/dev/null; ok $? "psctl export"
d=$(torch_check diff "$INIT" "$RUN/back.safetensors"); [ "$d" = "0.0" ]; ok $? "the export is the init file's values ($d)"
psnet_stop_all

# Training on from the file, against the same job from random values.
train_job warm 1 --model "$MODEL" --init "$INIT" --epochs 1 --train-limit 640 --test-limit 2000
wacc=$(acc_of "$out")
train_job cold 1 --model "$MODEL" --epochs 1 --train-limit 640 --test-limit 2000
cacc=$(acc_of "$out")
awk -v w="$wacc" -v c="$cacc" -v t="$tacc" 'BEGIN { exit !(w > c && w >= t - 0.03) }'
ok $? "from the file it trains on: $wacc (PyTorch's $tacc; from random values $cacc)"
psnet_stop_all

# Refused at submit, pscoord serving on.
COORD="ipc://$RUN/bad.sock"
psnet_start pscoord-bad "$PSCOORD" --listen "$COORD" --workers 1 --shards 1
torch_check variant "$INIT" "$RUN" f64 drop extra reshape nan other
refused() {  # refused KIND WANT: a variant of the file ($RUN/KIND.safetensors) is refused with WANT in the reason
  local f=$RUN/$1.safetensors err rc
  err=$("$PSCTL" --coord "$COORD" job submit --model "$MODEL" --init "$f" 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -qF -- "$2" <<<"$err"; ok $? "$1: refused ($err)"
}
refused f64 "tensor '0.weight': dtype F64; psnet reads F32"
refused drop "has no tensor '6.bias' (the model's [10])"
refused extra "holds tensor 'head.weight', which the model (small-cnn) has not"
refused reshape "tensor '0.weight' is [25, 8] in $RUN/reshape.safetensors; the model's is [8, 1, 5, 5]"
refused nan "tensor '0.weight' of $RUN/nan.safetensors holds NaN at index 7"
refused none "$RUN/none.safetensors: No such file or directory"
err=$(cd "$RUN" && "$PSCTL" --coord "$COORD" job submit --model "$MODEL" --init nothing.safetensors 2>&1)
grep -qF "$RUN/nothing.safetensors" <<<"$err"; ok $? "a relative path is taken from psctl's directory ($err)"
err=$("$PSCTL" --coord "$COORD" job submit --model mlp:784-32-10 --init "$INIT" 2>&1)
grep -qF "tensor '0.weight' is [8, 1, 5, 5] in $INIT; the model's is [32, 784]" <<<"$err"; ok $? "another model: refused ($err)"
[ "$(job_state)" = waiting ] && "$PSCTL" --coord "$COORD" status | grep -q "small-cnn\|mlp:784-256-10"
ok $? "pscoord serves on with its job"

# Changed after the check: the shard refuses it and the job fails, naming the file.
cp "$INIT" "$RUN/moving.safetensors"
"$PSCTL" --coord "$COORD" job submit --model "$MODEL" --init "$RUN/moving.safetensors" >/dev/null
ok $? "a job waits with a checked file"
mv "$RUN/other.safetensors" "$RUN/moving.safetensors"
start_shards bad 1
psnet_start w1-bad "$WORKERD" --coord "$COORD" --backend cpu
out=$("$PSCTL" --coord "$COORD" job wait --wait 60 2>&1)
reason=$("$PSCTL" --coord "$COORD" --json status | jq -r .job.reason)
[ "$(job_state)" = failed ] && grep -qF "shard 1 cannot start from the init file: $RUN/moving.safetensors is not the file pscoord checked" <<<"$reason"
ok $? "a file changed since the check fails the job ($reason)"
! logs_match "initial values built" "psd-bad-1.log"; ok $? "the shard built no random values instead"
