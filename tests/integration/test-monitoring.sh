#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The monitoring shipped in deploy/monitoring/, run as an operator runs it:
# promtool checks the alert rules and their unit tests; then Debian's
# Prometheus scrapes a live cluster (pscoord, three shards keeping two copies
# of each key, a worker) with those rules loaded: every rule evaluates, every
# query of the Grafana dashboard runs and the main panels get data, and a
# shard killed (-9) mid-job makes PsnetFailover fire and PsnetDaemonDown
# pending, while no rule fires on the healthy cluster before.
source "$(dirname "$0")/lib.sh"
MON=$PSNET_SRC/deploy/monitoring

out=$(promtool check rules "$MON/psnet-alerts.yml" 2>&1); ok $? "promtool check rules passes on psnet-alerts.yml ($(tail -n 1 <<<"$out"))"
out=$(cd "$MON" && promtool test rules psnet-alerts-test.yml 2>&1); ok $? "promtool test rules passes ($(tail -n 1 <<<"$out"))"
"$MON/render-prometheusrule" >"$RUN/rule.yaml"
/usr/bin/python3 - "$RUN/rule.yaml" "$MON/psnet-alerts.yml" <<'PY'
import sys, yaml
rule, plain = (yaml.safe_load(open(p)) for p in sys.argv[1:])
assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1", rule.get("kind")
assert rule["spec"]["groups"] == plain["groups"], "the PrometheusRule's groups differ from the rules file's"
PY
ok $? "render-prometheusrule writes the same rules as a PrometheusRule"
jq -e '.panels | length > 10 and all(.[] | select(.type != "row"); (.targets | length) > 0 and
  all(.targets[]; .datasource.uid == "${datasource}"))' "$MON/psnet-dashboard.json" >/dev/null
ok $? "the Grafana dashboard is JSON whose panels query the datasource chosen on import"

out=$(promtool check config "$MON/prometheus.yml" 2>&1); ok $? "promtool check config passes on the example prometheus.yml"
# The PodMonitor selects the label every pod of deploy/k8s gets, on the port they all name http.
/usr/bin/python3 - "$MON/podmonitor.yaml" "$PSNET_SRC/deploy/k8s" <<'PY'
import os, sys, yaml
pm = yaml.safe_load(open(sys.argv[1]))
k8s = sys.argv[2]
kust = yaml.safe_load(open(os.path.join(k8s, "kustomization.yaml")))
common = {k: v for l in kust.get("labels", []) for k, v in l["pairs"].items()}
sel = pm["spec"]["selector"]["matchLabels"]
assert sel.items() <= common.items(), f"selector {sel} is not among the labels every object gets {common}"
port = pm["spec"]["podMetricsEndpoints"][0]["port"]
pods = 0
for r in kust["resources"]:
    for d in yaml.safe_load_all(open(os.path.join(k8s, r))):
        spec = (d or {}).get("spec", {})
        tpl = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        if not tpl:
            continue
        pods += 1
        names = [p.get("name") for c in tpl["spec"]["containers"] for p in c.get("ports", [])]
        assert port in names, f"{d['metadata']['name']} has no port named {port}: {names}"
assert pods >= 3, pods
PY
ok $? "the PodMonitor selects every psnet pod of deploy/k8s on its http port"

# Every metric the dashboard and the rules name is one a daemon writes.
names=$( (jq -r '.. | .expr? // empty' "$MON/psnet-dashboard.json"; grep 'expr:' -A3 "$MON/psnet-alerts.yml") |
  grep -o '\b\(psnet\|process\)_[a-z_]*' | sed 's/_bucket$//' | sort -u)
missing=()
for n in $names; do grep -rqF "\"$n\"" "$PSNET_SRC/ps" "$PSNET_SRC/worker" "$PSNET_SRC/common" || missing+=("$n"); done
[ ${#missing[@]} = 0 ]; ok $? "every metric the dashboard and the rules name is written by a daemon ($(wc -w <<<"$names") names${missing:+; missing: ${missing[*]}})"

# A live cluster, and Prometheus scraping it every second with the rules.
COORD="ipc://$RUN/coord.sock"
psnet_start pscoord "$PSCOORD" --listen "$COORD" --workers 1 --shards 3 --replicas 2 --epochs 40 "${SUBSET[@]}" \
  --http 127.0.0.1:0
for i in 1 2 3; do
  psnet_start "psd-$i" "$PSD" --id "$i" --listen "ipc://$RUN/psd-$i.sock" --coord "$COORD" --http 127.0.0.1:0
done
psnet_start workerd "$WORKERD" --coord "$COORD" --http 127.0.0.1:0 --progress-ms 200
psnet_wait_for 60 logs_match 'msg="progress"' workerd.log; ok $? "the job trains"
has_port() { [ -n "$(http_port "$1")" ]; }
for d in pscoord psd-1 psd-2 psd-3 workerd; do psnet_wait_for 10 has_port $d; done
target() { printf '"127.0.0.1:%s"' "$(http_port "$1")"; }
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$RUN/prometheus.yml" <<CONF
global: {scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 1s}
rule_files: ["$MON/psnet-alerts.yml"]
scrape_configs:
  - job_name: psnet-pscoord
    static_configs: [{targets: [$(target pscoord)]}]
  - job_name: psnet-psd
    static_configs: [{targets: [$(target psd-1), $(target psd-2), $(target psd-3)]}]
  - job_name: psnet-workerd
    static_configs: [{targets: [$(target workerd)]}]
CONF
out=$(promtool check config "$RUN/prometheus.yml" 2>&1); ok $? "promtool check config passes on the scrape configuration"
psnet_start prometheus prometheus --config.file="$RUN/prometheus.yml" --storage.tsdb.path="$RUN/tsdb" \
  --web.listen-address="127.0.0.1:$port" --log.level=warn
api() { curl -sf -m 5 "http://127.0.0.1:$port/api/v1/$1" "${@:2}"; }
query() { api query --data-urlencode "query=$1"; }
all_up() { [ "$(query 'sum(up{job=~"psnet-.*"})' | jq -r '.data.result[0].value[1]')" = 5 ]; }
psnet_wait_for 60 all_up; ok $? "Prometheus scrapes all five daemons (up)"
# Enough samples for the rates of 1m windows.
steps_rate() { query 'sum(rate(psnet_pscoord_worker_steps_total[1m])) > 0' | jq -e '.data.result | length == 1'; }
psnet_wait_for 60 steps_rate; ok $? "rate(psnet_pscoord_worker_steps_total[1m]) has the worker's steps"

rules_ok() { api rules | jq -e '[.data.groups[].rules[]] | length == 7 and all(.[]; .health == "ok" and .lastEvaluation != "0001-01-01T00:00:00Z")'; }
psnet_wait_for 30 rules_ok; ok $? "Prometheus loaded the seven rules and evaluates each without an error ($(api rules | jq -c '[.data.groups[].rules[] | .health]'))"
# Right after the job starts, PsnetJobNoProgress may be pending for a
# moment (one sample of the steps, no increase yet); its for: 5m keeps that
# from firing. Once the rates have their samples nothing is active.
no_alerts() { api alerts | jq -e '.data.alerts | length == 0'; }
psnet_wait_for 30 no_alerts; active=$(api alerts | jq -c '[.data.alerts[] | [.labels.alertname, .state]]')
[ "$active" = "[]" ]; ok $? "no alert on the healthy cluster, firing or pending ($active)"

# Each query of the dashboard runs; the panels an operator watches first have data.
bad=() empty=()
while IFS= read -r e; do
  e=${e//\$__range/5m}; e=${e//\$__rate_interval/1m}
  r=$(query "$e") || { bad+=("$e"); continue; }
  [ "$(jq -r .status <<<"$r")" = success ] || bad+=("$e")
  case $e in
    *worker_clock*|*worker_steps_total*|*worker_samples_total*|*received_bytes_total*|*sent_bytes_total*|\
    *memory_used_bytes*|*memory_limit_bytes*|process_resident*|*process_cpu*|*pushes_total*|*push_latency*|*job_state*)
      jq -e '.data.result | length > 0' <<<"$r" >/dev/null || empty+=("$e") ;;
  esac
done < <(jq -r '.. | .expr? // empty' "$MON/psnet-dashboard.json")
[ ${#bad[@]} = 0 ]; ok $? "every query of the dashboard runs (${bad[*]:-all $(jq '[.. | .expr? // empty] | length' "$MON/psnet-dashboard.json")})"
[ ${#empty[@]} = 0 ]; ok $? "the job, training, shard and process panels have data (${empty[*]:-all})"
mem=$(query 'psnet_psd_memory_used_bytes / psnet_psd_memory_limit_bytes' | jq -c '[.data.result[].value[1] | tonumber | . * 1e6 | round / 1e6]')
jq -e 'length == 3 and all(.[]; . > 0 and . < 0.9)' <<<"$mem" >/dev/null; ok $? "each shard's memory against its limit is known and far from it ($mem)"

# A shard killed: the fail-over alert fires, the daemon-down one is pending (for: 2m).
kill -9 "$PID_psd_2"
failovers() { [ "$(query 'psnet_pscoord_failovers_total' | jq -r '.data.result[0].value[1]')" = 1 ]; }
psnet_wait_for 30 failovers; ok $? "pscoord counts the fail-over"
alert_is() { api alerts | jq -e --arg a "$1" --arg s "$2" 'any(.data.alerts[]; .labels.alertname == $a and .state == $s)'; }
psnet_wait_for 30 alert_is PsnetFailover firing; ok $? "PsnetFailover fires"
psnet_wait_for 30 alert_is PsnetDaemonDown pending; ok $? "PsnetDaemonDown is pending for the shard that does not answer"
api alerts | jq -e '[.data.alerts[] | select(.labels.alertname == "PsnetDaemonDown")] | length == 1 and
  .[0].labels.job == "psnet-psd"' >/dev/null; ok $? "for that shard alone"
psnet_wait_for 60 logs_match 'msg="progress"' workerd.log; ok $? "and the job goes on"
psnet_stop_all
tap_done
