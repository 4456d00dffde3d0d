#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A trained model leaves psnet for PyTorch: psctl export writes the job's
# values as safetensors with state_dict names; Debian's python3-torch loads
# the file into the torch.nn model built from the description in its
# metadata (python/psnet/models.py) and gets, on the same test images, the
# accuracy psnet reported (within 0.002), for the cnn and the vit (convs,
# pooling, tokens, position embedding, transformer blocks, layer norm) and,
# through ./deploy/local/demo --export, the demo's MLP. Export refuses other
# formats and says when there is no job.
source "$(dirname "$0")/lib.sh"

FM=/usr/share/datasets/fashion-mnist
small=(--train-limit 3000 --test-limit 2000)
torch_acc() { /usr/bin/python3 "$PSNET_SRC/tests/integration/torch-check.py" eval "$1" "$FM" 2000; }


# No job yet: export says so.
COORD="ipc://$RUN/none.sock"
psnet_start pscoord-none "$PSCOORD" --listen "$COORD" --workers 1 --shards 1
err=$("$PSCTL" --coord "$COORD" export "$RUN/none.safetensors" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "no job is running or done" <<<"$err" && [ ! -e "$RUN/none.safetensors" ]
ok $? "no job: export refuses and writes nothing ($err)"
err=$("$PSCTL" --coord "$COORD" export --format onnx "$RUN/x.onnx" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "the format is safetensors" <<<"$err"; ok $? "another format is refused ($err)"
psnet_stop_all

for m in cnn vit; do
  train_job "$m" 2 --model "$m" --epochs 1 "${small[@]}" --optim adam --lr 0.001
  acc=$(acc_of "$out")
  [ -n "$acc" ]; ok $? "$m trains ($out)"
  msg=$("$PSCTL" --coord "$COORD" export "$RUN/$m.safetensors"); ok $? "psctl export writes the $m ($msg)"
  t=$(torch_acc "$RUN/$m.safetensors"); ok $? "PyTorch loads the $m export into its torch.nn model (strict)"
  within "$t" "$acc" 0.0026; ok $? "and its accuracy is psnet's: $t vs $acc"
  psnet_stop_all
done

# The demo's --export, and the clock and accuracy in the file's metadata.
out=$(PSNET_DEMO_LOGS="$RUN/demo" "$PSNET_SRC/deploy/local/demo" --no-build --build "$PSNET_BUILD" --no-http \
  --epochs 1 --export "$RUN/mlp.safetensors" -- "${small[@]}" 2>"$RUN/demo.err" | tail -1)
ok $? "the demo runs with --export ($out)"
acc=$(acc_of "$out")
t=$(torch_acc "$RUN/mlp.safetensors"); within "$t" "$acc" 0.0026; ok $? "the demo's MLP in PyTorch: $t vs $acc"
grep -q "exported $RUN/mlp.safetensors: 4 tensors" "$RUN/demo.err"; ok $? "the demo says what it exported"
