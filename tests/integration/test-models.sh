#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Models besides the MLP, as a user brings them: a JSON description file
# trains end to end on the real daemons (CPU backend), the built-in cnn and
# vit learn (well above the 0.1 of guessing on a small subset, one epoch); a
# bad file is refused at submission with the file, layer and field named,
# and pscoord goes on serving; the job's status shows the model's name.
source "$(dirname "$0")/lib.sh"

small=(--train-limit 4000 --test-limit 1000)

cat >"$RUN/small.json" <<'JSON'
{
  "name": "small-cnn",
  "input": [1, 28, 28],
  "layers": [
    {"type": "conv2d", "out": 8, "kernel": 5, "stride": 2, "padding": 2},
    {"type": "relu"},
    {"type": "avgpool", "kernel": 2},
    {"type": "flatten"},
    {"type": "dropout", "p": 0.1},
    {"type": "linear", "out": 32},
    {"type": "gelu"},
    {"type": "linear", "out": 10}
  ]
}
JSON


run_job() { train_job "$1" 1 --model "$2" --epochs 1 "${small[@]}" "${@:3}"; } # name model [job options...]

run_job file "$RUN/small.json"
accuracy_at_least "$out" 0.55; ok $? "a JSON model file trains: accuracy >= 0.55 ($out)"
st=$("$PSCTL" --coord "$COORD" status)
grep -q "small-cnn" <<<"$st"; ok $? "status names the model (small-cnn)"
"$PSCTL" --coord "$COORD" --json status | jq -e '.job.model | startswith("{\"name\":\"small-cnn\"")' >/dev/null
ok $? "and --json status carries its canonical description"

# A bad file: the submission is refused with the reason; pscoord still answers.
sed 's/"kernel": 5/"kernel": 50/' "$RUN/small.json" >"$RUN/bad.json"
err=$("$PSCTL" --coord "$COORD" job submit --model "$RUN/bad.json" 2>&1); rc=$?
ok $(( rc == 0 )) "a bad file is refused (exit $rc)"
grep -q "bad.json: layer 0 (conv2d): field 'kernel'" <<<"$err"; ok $? "naming the file, the layer and the field ($err)"
printf '{"input": [784], "layers": [{"type": "linear", "out": 10}' >"$RUN/cut.json"
err=$("$PSCTL" --coord "$COORD" job submit --model "$RUN/cut.json" 2>&1)
grep -q "cut.json: not valid JSON: line 1" <<<"$err"; ok $? "a cut file: where the JSON ends ($err)"
"$PSCTL" --coord "$COORD" status >/dev/null; ok $? "pscoord goes on serving"
psnet_stop_all

# A model whose input does not fit the data: the worker says so.
printf '{"input": [3, 32, 32], "layers": [{"type": "flatten"}, {"type": "linear", "out": 10}]}' >"$RUN/cifar.json"
COORD="ipc://$RUN/fit.sock"
psnet_start pscoord-fit "$PSCOORD" --listen "$COORD" --workers 1 --shards 1 --model "$RUN/cifar.json" "${small[@]}"
start_shards fit 1 "$COORD"
psnet_start w-fit "$WORKERD" --coord "$COORD" --backend cpu
psnet_wait_exit "$PID_w_fit" 60; ok $? "the worker exits"
grep -q "does not fit the data in .*: it takes 3072 values" "$RUN/w-fit.log"; ok $? "a model for other data: the worker says why"
psnet_stop_all

run_job cnn cnn
accuracy_at_least "$out" 0.65; ok $? "cnn learns: accuracy >= 0.65 after 4000 images ($out)"
psnet_stop_all
run_job vit vit --optim adam --lr 0.001
accuracy_at_least "$out" 0.45; ok $? "vit learns: accuracy >= 0.45 after 4000 images, adam ($out)"
psnet_stop_all
