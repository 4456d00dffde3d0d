#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Training curves: pscoord samples the workers' heartbeats (loss, samples/s,
# the spread of the members' clocks at the shards, the shards' learning rate,
# here under --lr-schedule cosine) and psctl report draws
# them with the epochs' accuracy through gnuplot: PNG and SVG files that are
# what they say, an index.html showing them, CSV files with the numbers. The
# numbers are checked against what they measure: each worker's clocks rise,
# the loss falls, the rate rises over the warm-up and falls to almost nothing,
# BSP keeps members within a clock of each other, ssp:3 lets
# a slow worker fall behind but never past the bound (a pull of clock c waits
# for the slowest to complete c - 3: completed clocks differ by 4 at most),
# and the epochs are the status's. Refusals: no --out, --out a file, no
# gnuplot; the demo's --report, and a federated job's loss and accuracy by
# round.
source "$(dirname "$0")/lib.sh"

# report_job NAME MODE [WORKER-2 OPTIONS...]: two workers, three epochs,
# heartbeats every 250 ms, the job options in JOB_EXTRA too, both workers'
# in WORKERS_EXTRA; job wait's answer in $out.
JOB_EXTRA=() WORKERS_EXTRA=()
report_job() {
  local name=$1 mode=$2; shift 2
  COORD="ipc://$RUN/$name.sock"
  psnet_start "pscoord-$name" "$PSCOORD" --listen "$COORD" --workers 2 --shards 2 --mode "$mode" --epochs 3 \
    --lease-ms 1000 "${SUBSET[@]}" "${JOB_EXTRA[@]}"
  start_shards "$name" 2 "$COORD"
  psnet_start "w1-$name" "$WORKERD" --coord "$COORD" --backend cpu "${WORKERS_EXTRA[@]}"
  psnet_start "w2-$name" "$WORKERD" --coord "$COORD" --backend cpu "${WORKERS_EXTRA[@]}" "$@"
  out=$("$PSCTL" --coord "$COORD" job wait --wait 300)
}

# Is FILE a PNG (its signature) or an SVG (XML whose root is svg)?
is_png() { [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }
is_svg() {
  /usr/bin/python3 -c 'import sys, xml.etree.ElementTree as E
sys.exit(0 if E.parse(sys.argv[1]).getroot().tag.endswith("svg") else 1)' "$1"
}
# awk over samples.csv's rows (header skipped, comma-separated).
samples() { tail -n +2 "$2/samples.csv" | awk -F, "$1"; }

# --- a BSP job ---------------------------------------------------------------------
# Its 282 steps take under a second on a fast machine: four heartbeats' worth
# of samples. 10 ms before each push makes it 3 s at least.
JOB_EXTRA=(--lr-schedule cosine) WORKERS_EXTRA=(--step-delay-ms 10)
report_job bsp bsp
JOB_EXTRA=() WORKERS_EXTRA=()
acc=$(acc_of "$out"); [ -n "$acc" ]; ok $? "a BSP job trains ($out)"
D=$RUN/bsp-report
msg=$("$PSCTL" --coord "$COORD" report --out "$D" 2>&1); ok $? "psctl report writes ($msg)"
for c in loss accuracy throughput staleness lr; do
  is_png "$D/$c.png" && is_svg "$D/$c.svg"; ok $? "$c: a PNG and an SVG"
  grep -q "src=\"$c.svg\"" "$D/index.html"; ok $? "index.html shows the $c chart"
done
is_svg "$D/loss.svg" && grep -q "worker 1" "$D/loss.svg" && grep -q "worker 2" "$D/loss.svg" &&
  grep -q "test set" "$D/loss.svg"
ok $? "the loss chart has a line per worker and the test set's"
n1=$(samples '$2 == 1 { n++ } END { print n + 0 }' "$D"); n2=$(samples '$2 == 2 { n++ } END { print n + 0 }' "$D")
[ "$n1" -ge 3 ] && [ "$n2" -ge 3 ]; ok $? "samples of both workers ($n1, $n2)"
samples '{ if (($2 in last) && $3 <= last[$2]) bad = 1; last[$2] = $3 } END { exit bad }' "$D"
ok $? "each worker's clocks rise from sample to sample"
samples '$4 != "" && $5 > 0 { n++ } END { exit !(NR > 0 && n == NR) }' "$D"
ok $? "every sample has a loss and a speed"
first_last=$(samples '$2 == 1 && $4 != "" { if (!f) f = $4; l = $4 } END { print f, l }' "$D")
awk 'NF == 2 { d = $2 < $1 * 0.8 } END { exit !d }' <<<"$first_last"; ok $? "the training loss falls (worker 1: $first_last)"
# lr 0.02 x 2 workers after the 100 clocks' warm-up, then the cosine down to
# ~0 at the job's last clock: the top past 0.02, the last sample's under half
# of it. (The samples come with the heartbeats, every 250 ms, and the shards'
# rate reaches pscoord with theirs: the last sample can be from the last
# quarter of a job that takes a few seconds, where the rate is still above a
# tenth; test-bsp checks the shards' last rate itself.)
lrs=$(samples '$7 != "" { if ($7 > m) m = $7; l = $7; n++ } END { print n + 0, m + 0, l + 0 }' "$D")
awk 'NF == 3 { ok = $1 >= 3 && $2 > 0.02 && $2 <= 0.0400001 && $3 < $2 / 2 } END { exit !ok }' <<<"$lrs"
ok $? "the shards' lr rises over the warm-up and falls to under half (samples, top, last: $lrs)"
spread=$(samples '$6 > m { m = $6 } END { print m + 0 }' "$D")
[ "$spread" -le 1 ]; ok $? "BSP: members are never more than a clock apart at the shards (at most $spread)"
want=$("$PSCTL" --coord "$COORD" --json status | jq -r '.history.epochs[] | "\(.epoch) \(.accuracy)"')
got=$(awk -F, 'NR > 1 { print $1, $4 }' "$D/epochs.csv")
[ -n "$want" ] && [ "$(awk '{ printf "%s %.4f\n", $1, $2 }' <<<"$want")" = "$(awk '{ printf "%s %.4f\n", $1, $2 }' <<<"$got")" ]
ok $? "epochs.csv is the status's epochs ($(tr '\n' ' ' <<<"$got"))"
grep -q "$acc" "$D/index.html"; ok $? "index.html says the final accuracy ($acc)"
j=$("$PSCTL" --coord "$COORD" --json report --out "$D"); ok $? "report --json"
[ "$(jq -r '.charts | join(" ")' <<<"$j")" = "loss accuracy throughput staleness lr" ] && [ "$(jq -r .dir <<<"$j")" = "$D" ]
ok $? "--json names the directory and the charts ($j)"

# The refusals: where to write is not optional, nor a file; without gnuplot the numbers still come.
err=$("$PSCTL" --coord "$COORD" report 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--out DIR" <<<"$err"; ok $? "no --out: exit 2 and why ($err)"
err=$("$PSCTL" --coord "$COORD" report --out "$D/index.html" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "Not a directory" <<<"$err"; ok $? "--out a file: refused ($err)"
err=$(PATH=/nonexistent "$PSCTL" --coord "$COORD" report --out "$RUN/nognuplot" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "gnuplot-nox" <<<"$err" && [ -s "$RUN/nognuplot/samples.csv" ] && [ ! -e "$RUN/nognuplot/loss.png" ]
ok $? "no gnuplot: says which package, the CSV files are written ($err)"
psnet_stop_all

# --- ssp:3 with a slow worker: staleness shows, bounded ------------------------------
report_job ssp ssp:3 --step-delay-ms 15
[ -n "$(acc_of "$out")" ]; ok $? "an ssp:3 job with a slow worker trains ($out)"
D=$RUN/ssp-report
"$PSCTL" --coord "$COORD" report --out "$D" >/dev/null; ok $? "psctl report"
spread=$(samples '$6 > m { m = $6 } END { print m + 0 }' "$D")
[ "$spread" -ge 2 ] && [ "$spread" -le 4 ]
ok $? "the fast worker runs ahead of the slow one, within the bound (at most $spread clocks apart)"
grep -q "first 4 to graph 1" "$D/report.gp"; ok $? "the staleness chart marks the bound (3 + 1 completed clocks)"
psnet_stop_all

# --- the demo ------------------------------------------------------------------------
out=$(PSNET_DEMO_LOGS="$RUN/demo" "$PSNET_SRC/deploy/local/demo" --no-build --build "$PSNET_BUILD" --no-http \
  --epochs 2 --report "$RUN/demo-report" -- "${SUBSET[@]}" 2>"$RUN/demo.err" | tail -1)
ok $? "the demo runs with --report ($out)"
is_png "$RUN/demo-report/accuracy.png" && grep -q 'src="accuracy.svg"' "$RUN/demo-report/index.html"
ok $? "and writes the report"

# A federated job: loss and accuracy by round.
out=$(PSNET_DEMO_LOGS="$RUN/fed" "$PSNET_SRC/deploy/local/demo" --no-build --build "$PSNET_BUILD" --no-http \
  --federated --clients 4 --rounds 4 --report "$RUN/fed-report" -- --eval-every 2 "${SUBSET[@]}" 2>"$RUN/fed.err" |
  tail -1)
ok $? "a federated demo with --report ($out)"
F=$RUN/fed-report
[ "$(awk -F, 'NR > 1 && $3 > 0 { n++ } END { print n + 0 }' "$F/rounds.csv")" = 4 ] &&
  [ "$(awk -F, 'NR > 1 && $4 != "" { n++ } END { print n + 0 }' "$F/rounds.csv")" = 2 ]
ok $? "rounds.csv: the four rounds' losses, the accuracy of every second ($(tail -n +2 "$F/rounds.csv" | tr '\n' ' '))"
is_png "$F/loss.png" && is_svg "$F/accuracy.svg" && grep -q 'src="loss.svg"' "$F/index.html" &&
  [ ! -e "$F/staleness.png" ]
ok $? "its charts are the loss and accuracy by round"
