#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the deployment files against the programs that were built:

  deploy-check.py SRC BUILD KEYS PLAN

SRC is the repository, BUILD the meson build directory (each program's --help
says which options exist), KEYS a directory of psctl keys gen output, PLAN a
file to write. Prints one line per check, "ok<TAB>what" or "fail<TAB>what",
for test-deploy.sh to count:

* deploy/k8s: every manifest parses and is listed in kustomization.yaml; every
  container runs the image the Containerfile builds and one of the programs,
  with options that program has; ports named by probes and Services exist and
  are the ports the flags listen on; config files and keys come from ConfigMaps
  and Secrets that exist and hold what the program reads; the job's shards and
  workers match the replicas; security contexts drop privileges.
* deploy/container/compose.yaml: the same for its services, secure defaults.
* deploy/config/*.conf: every key, commented or not, is an option.
* deploy/systemd/*.service: Type=notify with a watchdog, options that exist.

PLAN receives the Kubernetes pods as a runtime would start them (argv with
$(VAR) expanded and mount paths under PLAN's directory, whose files it writes
the way kubelet lays out a projected volume) for the live part of the test.
"""
import configparser
import json
import os
import re
import shlex
import subprocess
import sys

import yaml

SRC, BUILD, KEYS, PLAN = sys.argv[1:5]
PROGRAMS = {
    "pscoord": "ps/pscoord/pscoord", "psd": "ps/psd/psd",
    "workerd": "worker/workerd/workerd", "psctl": "ps/psctl/psctl", "psgate": "ps/psgate/psgate",
}
# The key each program loads from --keys by default (--key), and whether it
# listens (and so reads the allow-list).
KEY_OF = {"pscoord": "pscoord", "psd": "psd", "workerd": "worker", "psctl": "admin", "psgate": "psgate"}
LISTENS = {"pscoord", "psd", "psgate"}
results = []


def check(cond, what):
    results.append(("ok" if cond else "fail", what))
    return cond


def options_of(prog):
    """{option: takes_value} from PROG --help."""
    out = subprocess.run([os.path.join(BUILD, PROGRAMS[prog]), "--help"], capture_output=True,
                         text=True, check=False).stdout
    opts = {}
    for m in re.finditer(r"^  --([a-z0-9-]+)( [A-Z:|]+)?", out, re.M):
        opts[m.group(1)] = m.group(2) is not None
    return opts


OPTIONS = {p: options_of(p) for p in PROGRAMS}
check(all(len(o) > 5 for o in OPTIONS.values()), "every program's --help lists its options")


def check_argv(where, argv):
    """The program exists and every --option is one of its options; returns
    {option: value} (value None for a switch)."""
    prog = argv[0] if argv else ""
    if not check(prog in PROGRAMS, f"{where}: runs a psnet program ({prog})"):
        return prog, {}
    opts, flags, i = OPTIONS[prog], {}, 1
    bad = []
    while i < len(argv):
        a = argv[i]
        name = a[2:].split("=", 1)[0] if a.startswith("--") else None
        if name is None or name not in opts:
            bad.append(a)
            i += 1
            continue
        if opts[name] and "=" not in a:
            flags[name] = argv[i + 1] if i + 1 < len(argv) else None
            i += 2
        else:
            flags[name] = a.split("=", 1)[1] if "=" in a else None
            i += 1
    check(not bad, f"{where}: {prog} has every option it is given {bad or ''}")
    check("insecure" not in flags, f"{where}: no --insecure")
    return prog, flags


def port_of(endpoint):
    m = re.search(r":(\d+)$", endpoint or "")
    return int(m.group(1)) if m else None


def ini_keys(text):
    cp = configparser.ConfigParser(interpolation=None)
    cp.read_string(text)
    return {s: dict(cp[s]) for s in cp.sections()}


# --- the image -----------------------------------------------------------------
containerfile = open(os.path.join(SRC, "deploy/container/Containerfile")).read()
m = re.search(r"-t (\S+)", containerfile)
IMAGE = m.group(1) if m else None
check(IMAGE is not None, f"the Containerfile says the image it builds ({IMAGE})")

# --- Kubernetes ----------------------------------------------------------------
K8S = os.path.join(SRC, "deploy/k8s")
kust = yaml.safe_load(open(os.path.join(K8S, "kustomization.yaml")))
files = sorted(f for f in os.listdir(K8S) if f.endswith(".yaml") and f != "kustomization.yaml")
check(sorted(kust.get("resources", [])) == files, f"kustomization.yaml lists every manifest ({files})")
docs = []
for f in files:
    try:
        for d in yaml.safe_load_all(open(os.path.join(K8S, f))):
            if d:
                docs.append(d)
        check(True, f"{f} parses")
    except yaml.YAMLError as e:
        check(False, f"{f} parses ({e})")
for d in docs:
    check(d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"),
          f"{d.get('kind')}/{d.get('metadata', {}).get('name')} has apiVersion, kind and name")
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
configmaps = {n: d.get("data", {}) for n, d in by_kind.get("ConfigMap", {}).items()}
# Generated by kustomize from KEYS: name -> {file name: path}.
generated = {}
for g in kust.get("secretGenerator", []) + kust.get("configMapGenerator", []):
    generated[g["name"]] = {os.path.basename(p): os.path.join(KEYS, os.path.basename(p)) for p in g["files"]}
    check(all(p.startswith("keys/") for p in g["files"]), f"generator {g['name']} reads deploy/k8s/keys/")
images = {i["name"]: i for i in kust.get("images", [])}
check(not os.path.exists(os.path.join(SRC, ".git")) or
      "/deploy/k8s/keys/" in open(os.path.join(SRC, ".gitignore")).read(), "git ignores deploy/k8s/keys/")

workloads = [d for d in docs if d["kind"] in ("StatefulSet", "Deployment", "Job")]
services = by_kind.get("Service", {})
plan = {"pods": [], "hosts": {}}
pod_ports = {}
counts = {}
net = 10
for w in workloads:
    name, spec = w["metadata"]["name"], w["spec"]
    tmpl = spec["template"]
    pod = tmpl["spec"]
    labels = tmpl.get("metadata", {}).get("labels", {})
    sel = spec.get("selector", {}).get("matchLabels")
    if sel is not None:
        check(all(labels.get(k) == v for k, v in sel.items()), f"{name}: the selector matches its pods")
    sc = pod.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0,
          f"{name}: runs as a non-root user")
    check(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{name}: RuntimeDefault seccomp")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    # A StatefulSet's volume claims: each pod gets its own persistent volume.
    for c in spec.get("volumeClaimTemplates", []) if w["kind"] == "StatefulSet" else []:
        cname = c.get("metadata", {}).get("name")
        check(cname and cname not in volumes and c.get("spec", {}).get("resources", {}).get("requests", {}).get("storage"),
              f"{name}: volume claim {cname} has a name of its own and a storage request")
        volumes[cname] = {"name": cname, "claim": c}
    if w["kind"] == "StatefulSet":
        svc = services.get(spec.get("serviceName"))
        check(svc is not None, f"{name}: its serviceName names a Service ({spec.get('serviceName')})")
        replicas = spec.get("replicas", 1)
    else:
        replicas = spec.get("parallelism", spec.get("replicas", 1))
        if w["kind"] == "Job":
            check(spec.get("completions") == replicas, f"{name}: completions equal parallelism")
            check(pod.get("restartPolicy") in ("Never", "OnFailure"), f"{name}: a Job's restartPolicy")
    for c in pod["containers"]:
        where = f"{name}/{c['name']}"
        img = c.get("image", "")
        repo = img.rsplit(":", 1)[0]
        check(img == IMAGE or (repo in images and IMAGE and IMAGE.startswith(repo + ":")),
              f"{where}: runs the image the Containerfile builds ({img})")
        argv = list(c.get("command", [])) + list(c.get("args", []))
        env = {e["name"]: e for e in c.get("env", [])}
        refs = set(re.findall(r"\$\((\w+)\)", " ".join(argv)))
        check(refs <= set(env), f"{where}: every $(VAR) in its args is in its env {sorted(refs - set(env))}")
        prog, flags = check_argv(where, argv)
        if prog not in PROGRAMS:
            continue
        counts[prog] = replicas
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        pod_ports[name] = ports
        for flag in ("listen", "http"):
            if flag in flags:
                p = port_of(flags[flag])
                check(p in ports.values(), f"{where}: --{flag} {flags[flag]} is a declared containerPort")
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            pr = c.get(probe, {}).get("httpGet", {})
            port = pr.get("port")
            check(pr.get("path") == path and (port in ports or port in ports.values()),
                  f"{where}: {probe} GETs {path} on a declared port ({port})")
            check(ports.get(port, port) == port_of(flags.get("http")),
                  f"{where}: {probe} is on the --http port")
        csc = c.get("securityContext", {})
        check(csc.get("allowPrivilegeEscalation") is False and csc.get("readOnlyRootFilesystem") is True
              and csc.get("capabilities", {}).get("drop") == ["ALL"],
              f"{where}: no privilege escalation, read-only root, no capabilities")
        mounts = {m["mountPath"]: volumes.get(m["name"]) for m in c.get("volumeMounts", [])}
        check(all(mounts.values()), f"{where}: every volumeMount names a volume")
        # Where each mounted file comes from: {container path: host source}.
        mounted = {}
        for mp, v in mounts.items():
            if not v:
                continue
            if "configMap" in v:
                cm = v["configMap"]["name"]
                check(cm in configmaps, f"{where}: ConfigMap {cm} exists")
                mounted[mp] = {"files": {k: ("text", t) for k, t in configmaps.get(cm, {}).items()}, "mode": 0o644}
            elif "projected" in v:
                fs = {}
                for s in v["projected"]["sources"]:
                    kind = "secret" if "secret" in s else "configMap"
                    n = s[kind]["name"]
                    if check(n in generated or n in configmaps, f"{where}: {kind} {n} exists"):
                        for fn, path in generated.get(n, {}).items():
                            fs[fn] = ("path", path)
                        if kind == "secret":
                            check(all(f.endswith(".key") for f in generated.get(n, {})),
                                  f"{where}: Secret {n} holds secret keys only")
                            check(set(generated.get(n, {})) == {KEY_OF[prog] + ".key"},
                                  f"{where}: gets its own secret key and no other")
                        else:
                            check(not any(f.endswith(".key") for f in generated.get(n, {})),
                                  f"{where}: ConfigMap {n} holds no secret key")
                mounted[mp] = {"files": fs, "mode": v["projected"].get("defaultMode", 0o644)}
            elif "claim" in v:
                mounted[mp] = {"files": {}, "mode": 0o700, "writable": True}
        if "config" in flags:
            d, base = os.path.split(flags["config"])
            text = mounted.get(d, {}).get("files", {}).get(base)
            if check(text is not None and text[0] == "text", f"{where}: --config {flags['config']} is mounted"):
                try:
                    sections = ini_keys(text[1])
                    check(list(sections) == [prog], f"{where}: {base} has one section [{prog}]")
                    for k in sections.get(prog, {}):
                        check(k in OPTIONS[prog] and k != "config", f"{where}: {base}: {k} is an option of {prog}")
                except configparser.Error as e:
                    check(False, f"{where}: {base} parses ({e})")
        if "keys" in flags:
            fs = mounted.get(flags["keys"], {}).get("files", {})
            need = {KEY_OF[prog] + ".key"} | ({"allow"} if prog in LISTENS else set())
            if prog != "pscoord":
                need.add("pscoord.pub")
            check(need <= set(fs), f"{where}: --keys {flags['keys']} holds {sorted(need)}")
            mode = mounted.get(flags["keys"], {}).get("mode", 0o644)
            check(mode & 0o037 == 0, f"{where}: keys are mounted {oct(mode)} (not open to others)")
        elif prog in LISTENS:
            check(False, f"{where}: listens with --keys")
        # The pods, as a runtime starts them.
        for ordinal in range(replicas):
            pname = f"{name}-{ordinal}"
            envv = {}
            for k, e in env.items():
                if "value" in e:
                    envv[k] = e["value"]
                elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                    envv[k] = pname
            vols = {}
            for i, (mp, spec_) in enumerate(sorted(mounted.items())):
                vols[mp] = {"dir": os.path.join(os.path.dirname(PLAN), "pods", pname, f"vol{i}"),
                            "files": {fn: src for fn, src in spec_["files"].items()}, "mode": spec_["mode"],
                            "writable": spec_.get("writable", False)}

            def expand(a):
                a = re.sub(r"\$\((\w+)\)", lambda m_: envv.get(m_.group(1), m_.group(0)), a)
                for mp, v in vols.items():
                    if a == mp or a.startswith(mp + "/"):
                        a = v["dir"] + a[len(mp):]
                return a
            plan["pods"].append({
                "name": pname, "workload": name, "program": prog, "ip": f"10.213.0.{net}",
                "argv": [os.path.join(BUILD, PROGRAMS[prog])] + [expand(a) for a in argv[1:]],
                "http": port_of(flags.get("http")), "volumes": vols,
            })
            if w["kind"] == "StatefulSet":
                plan["hosts"][f"{pname}.{spec['serviceName']}"] = f"10.213.0.{net}"
            net += 1

for sname, s in services.items():
    sel = s["spec"].get("selector", {})
    match = [w for w in workloads if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v
                                         for k, v in sel.items())]
    if not check(len(match) == 1, f"Service {sname}: its selector picks one workload"):
        continue
    wname = match[0]["metadata"]["name"]
    ports = pod_ports.get(wname, {})
    for p in s["spec"]["ports"]:
        tp = p.get("targetPort", p["port"])
        check(tp in ports or tp in ports.values(), f"Service {sname}: targetPort {tp} is a port of {wname}")
    if s["spec"].get("clusterIP") != "None":
        for pod in plan["pods"]:
            if pod["workload"] == wname:
                plan["hosts"][sname] = pod["ip"]
    else:
        check(s["spec"].get("publishNotReadyAddresses") is True,
              f"Service {sname}: headless, publishes addresses before readiness")

# Endpoints named in args resolve to a Service or a StatefulSet pod name.
for pod in plan["pods"]:
    for a in pod["argv"]:
        m = re.match(r"tcp://([^:/]+):(\d+)$", a)
        if m and m.group(1) != "0.0.0.0":
            check(m.group(1) in plan["hosts"], f"{pod['name']}: {a} names a Service or a pod of one")
# The job pscoord starts: its shards and workers are the replicas.
coord_conf = ini_keys(configmaps.get("psnet-config", {}).get("pscoord.conf", "")).get("pscoord", {})
check(int(coord_conf.get("shards", 0)) == counts.get("psd"),
      f"pscoord.conf: shards = {coord_conf.get('shards')} = psd replicas ({counts.get('psd')})")
check(int(coord_conf.get("workers", 0)) == counts.get("workerd"),
      f"pscoord.conf: workers = {coord_conf.get('workers')} = workerd parallelism ({counts.get('workerd')})")
psd_pods = [p for p in plan["pods"] if p["program"] == "psd"]
check(psd_pods and all("--id-from-hostname" in p["argv"] for p in psd_pods),
      "psd: the shard id is the pod's ordinal (--id-from-hostname)")

# The image by the release's tag, loaded on the nodes or pulled once.
release = re.search(r"version: '([^']+)'", open(os.path.join(SRC, "meson.build")).read()).group(1)
check(IMAGE and IMAGE.endswith(":" + release) and images.get(IMAGE.rsplit(":", 1)[0], {}).get("newTag") == release,
      f"the image's tag is the release {release} (Containerfile {IMAGE}, kustomization newTag)")
for w in workloads:
    for c in w["spec"]["template"]["spec"]["containers"]:
        check(c.get("image", "").endswith(":" + release) and c.get("imagePullPolicy") == "IfNotPresent",
              f"{w['metadata']['name']}/{c['name']}: the release's image, imagePullPolicy IfNotPresent")
# The shards: spread over nodes, evicted one at a time.
psd_w = next((w for w in workloads if w["metadata"]["name"] == "psd"), None)
if check(psd_w is not None, "a psd workload"):
    plabels = psd_w["spec"]["template"]["metadata"]["labels"]
    terms = psd_w["spec"]["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution", [])
    check(any(t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname" and
              t["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= plabels.items() for t in terms),
          "psd: its pods prefer nodes without another shard (podAntiAffinity on kubernetes.io/hostname)")
    copies = int(coord_conf.get("replicas", 2) or 2)
    pdbs = [d for d in by_kind.get("PodDisruptionBudget", {}).values()
            if d["spec"]["selector"]["matchLabels"].items() <= plabels.items()]
    check(len(pdbs) == 1 and pdbs[0]["spec"].get("maxUnavailable") == max(copies - 1, 0) and copies <= counts.get("psd", 0),
          f"psd: a PodDisruptionBudget lets one shard fewer than the copies go at a time "
          f"(maxUnavailable {pdbs[0]['spec'].get('maxUnavailable') if pdbs else None}, {copies} copies)")
# A core requested for each thread a daemon's config file gives it (psd's
# update threads, workerd's compute threads).
def cores(q):
    q = str(q)
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)
for w in workloads:
    for c in w["spec"]["template"]["spec"]["containers"]:
        prog = c.get("command", [""])[0]
        conf = ini_keys(configmaps.get("psnet-config", {}).get(f"{prog}.conf", "")).get(prog, {})
        if prog in ("psd", "workerd"):
            threads = int(conf.get("threads", 1) or 1)
            req = cores(c.get("resources", {}).get("requests", {}).get("cpu", 0))
            check(req >= threads, f"{w['metadata']['name']}: requests {req:g} CPU for its {threads} thread(s)")
# Who may reach which port (NetworkPolicy): each workload's pods have one
# policy; psd's data port admits the workers and the shards, pscoord's control
# port everyone, and every /metrics port the namespace monitoring alone.
policies = list(by_kind.get("NetworkPolicy", {}).values())
def admits(rule, labels):
    for f in rule.get("from", [{}]):
        ps = f.get("podSelector")
        if ps is None or "namespaceSelector" in f:
            continue
        ok_ = all(labels.get(k) == v for k, v in ps.get("matchLabels", {}).items())
        for e in ps.get("matchExpressions", []):
            ok_ = ok_ and e["operator"] == "In" and labels.get(e["key"]) in e["values"]
        if ok_:
            return True
    return "from" not in rule
for w in workloads:
    wname, labels = w["metadata"]["name"], w["spec"]["template"]["metadata"]["labels"]
    mine = [pol for pol in policies if pol["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
    if not check(len(mine) == 1 and mine[0]["spec"]["policyTypes"] == ["Ingress"],
                 f"{wname}: one NetworkPolicy of Ingress selects its pods"):
        continue
    rules = mine[0]["spec"]["ingress"]
    ports = pod_ports.get(wname, {})
    for r in rules:
        for p in r["ports"]:
            check(p["port"] in ports, f"{wname}: NetworkPolicy port {p['port']} is a named port of its pods")
    http = [r for r in rules if any(p["port"] == "http" for p in r["ports"])]
    check(len(http) == 1 and http[0].get("from") == [{"namespaceSelector": {"matchLabels":
          {"kubernetes.io/metadata.name": "monitoring"}}}], f"{wname}: /metrics from the namespace monitoring alone")
    if wname == "psd":
        data = [r for r in rules if any(p["port"] == "data" for p in r["ports"])]
        peers = {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"] for o in workloads}
        check(len(data) == 1 and admits(data[0], peers["workerd"]) and admits(data[0], peers["psd"])
              and not admits(data[0], peers["pscoord"]) and "from" in data[0],
              "psd: its data port admits the workers and the shards, not every pod")
    if wname == "pscoord":
        check(any(any(p["port"] == "control" for p in r["ports"]) and "from" not in r for r in rules),
              "pscoord: its control port is open to everyone (CURVE decides)")

# --- compose ------------------------------------------------------------------
compose = yaml.safe_load(open(os.path.join(SRC, "deploy/container/compose.yaml")))
compose_default_volumes = compose.get("x-psnet", {}).get("volumes", [])
for sname, s in compose["services"].items():
    where = f"compose {sname}"
    argv = s.get("command", [])
    if isinstance(argv, str):
        argv = shlex.split(argv)
    check(s.get("image") == IMAGE, f"{where}: runs the image the Containerfile builds ({s.get('image')})")
    if argv[:2] == ["sh", "-c"]:  # the key maker
        made = set(re.findall(r"(\w+):(admin|server|worker|edge)", argv[2]))
        check("psctl keys gen" in argv[2] and {("pscoord", "server"), ("psd", "server"), ("worker", "worker")} <= made,
              f"{where}: makes the daemons' keys with psctl keys gen {sorted(made)}")
        continue
    prog, flags = check_argv(where, argv)
    if prog in LISTENS:
        check(flags.get("listen", "").startswith("tcp://") and "keys" in flags,
              f"{where}: listens on tcp with --keys")
    if prog == "workerd":
        check("keys" in flags, f"{where}: connects with --keys")
    if "keys" in flags:
        vols = [v if isinstance(v, str) else v.get("target") for v in s.get("volumes", compose_default_volumes)]
        check(any(re.match(r"[^:]+:" + re.escape(flags["keys"]) + r"(:ro)?$", v or "") for v in vols),
              f"{where}: --keys {flags['keys']} is a mounted volume")

# --- example configs and systemd units -------------------------------------------
for f in sorted(os.listdir(os.path.join(SRC, "deploy/config"))):
    prog = f.split(".")[0]
    text = open(os.path.join(SRC, "deploy/config", f)).read()
    m = re.search(r"^\[(\w+)\]", text, re.M)
    check(m and m.group(1) == prog, f"deploy/config/{f}: section [{prog}]")
    keys = re.findall(r"^[#;]?\s*([a-z][a-z0-9_-]*)\s*=", text, re.M)
    unknown = sorted({k for k in keys if k.replace("_", "-") not in OPTIONS.get(prog, {})})
    check(keys and not unknown, f"deploy/config/{f}: every key, set or commented, is an option {unknown or ''}")
    helped = {o for o in OPTIONS.get(prog, {}) if o not in ("help", "version", "config", "step-delay-ms")}
    missing = sorted(helped - {k.replace("_", "-") for k in keys})
    check(not missing, f"deploy/config/{f}: shows every option of {prog} {missing or ''}")
for f in sorted(os.listdir(os.path.join(SRC, "deploy/systemd"))):
    text = open(os.path.join(SRC, "deploy/systemd", f)).read()
    unit = dict(re.findall(r"^(\w+)=(.*)$", text, re.M))
    check(unit.get("Type") == "notify" and unit.get("NotifyAccess") == "main" and "WatchdogSec" in unit,
          f"deploy/systemd/{f}: Type=notify, NotifyAccess=main, WatchdogSec=")
    argv = shlex.split(re.sub(r"\$\{?\w+\}?", "X", unit.get("ExecStart", "")))
    argv[0:1] = [os.path.basename(argv[0])] if argv else []
    check_argv(f"deploy/systemd/{f}", argv)



def lay_out(vol):
    """A volume as kubelet writes one: the files in a timestamped directory,
    ..data a link to it, and each name a link through ..data. A persistent
    volume (a claim) is an empty directory the pod writes into."""
    if vol.get("writable"):
        os.makedirs(vol["dir"], mode=vol["mode"], exist_ok=True)
        return
    os.makedirs(os.path.join(vol["dir"], "..2026_01_01_00_00_00.000"), exist_ok=True)
    for fn, (kind, src) in vol["files"].items():
        path = os.path.join(vol["dir"], "..2026_01_01_00_00_00.000", fn)
        data = src.encode() if kind == "text" else open(src, "rb").read()
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, vol["mode"])
        os.symlink(os.path.join("..data", fn), os.path.join(vol["dir"], fn))
    os.symlink("..2026_01_01_00_00_00.000", os.path.join(vol["dir"], "..data"))


for pod in plan["pods"]:
    for vol in pod["volumes"].values():
        try:
            lay_out(vol)
        except OSError as e:
            check(False, f"{pod['name']}: volume {vol['dir']} ({e})")
# --- deploy/k8s/overlays: deploy/k8s changed for a kind of cluster -----------
# Each rendered as kubectl apply -k renders it (kustomize.py): the programs'
# options exist, every mount names a volume of its pod and every claim a
# PersistentVolumeClaim; pscoord's --checkpoint-dir is a volume every shard
# mounts read-write at the same path, shared across nodes (ReadWriteMany).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kustomize  # noqa: E402

OVERLAYS = os.path.join(K8S, "overlays")
for ov in sorted(os.listdir(OVERLAYS)) if os.path.isdir(OVERLAYS) else []:
    try:
        objs = kustomize.objects(kustomize.load(os.path.join(OVERLAYS, ov)), KEYS)
    except (ValueError, OSError, KeyError) as e:
        check(False, f"overlay {ov}: renders ({e})")
        continue
    check(True, f"overlay {ov}: renders ({len(objs)} objects)")
    claims = {d["metadata"]["name"]: d for d in objs if d["kind"] == "PersistentVolumeClaim"}
    mounts = {}  # workload -> {mountPath: (volume, readOnly)}
    ckdir = None
    for w in (d for d in objs if d["kind"] in ("StatefulSet", "Deployment", "Job")):
        name, pod = w["metadata"]["name"], w["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        vols.update({c["metadata"]["name"]: {"claimTemplate": c} for c in w["spec"].get("volumeClaimTemplates", [])})
        for v in vols.values():
            pvc = v.get("persistentVolumeClaim")
            if pvc:
                check(pvc["claimName"] in claims, f"overlay {ov}: {name}'s claim {pvc['claimName']} is a "
                      f"PersistentVolumeClaim of it")
        for c in pod["containers"]:
            prog, flags = check_argv(f"overlay {ov}: {name}/{c['name']}", list(c.get("command", [])) +
                                     list(c.get("args", [])))
            for m in c.get("volumeMounts", []):
                check(m["name"] in vols, f"overlay {ov}: {name} mounts {m['mountPath']} from a volume of its pod "
                      f"({m['name']})")
                v = vols.get(m["name"], {})
                mounts.setdefault(name, {})[m["mountPath"]] = (v, m.get("readOnly", False) or
                                                               v.get("persistentVolumeClaim", {}).get("readOnly", False))
            if prog == "pscoord" and "checkpoint-dir" in flags:
                ckdir = flags["checkpoint-dir"]
    # A GPU worker: the image the Containerfile's runtime-cuda target builds,
    # a GPU of its own, the CUDA backend.
    for w in (d for d in objs if d["kind"] == "Job"):
        c = w["spec"]["template"]["spec"]["containers"][0]
        if "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}):
            continue
        m = re.search(r"--target runtime-cuda -t (\S+)", containerfile)
        check(m and c["image"] == m.group(1), f"overlay {ov}: {w['metadata']['name']} runs the runtime-cuda "
              f"target's image ({c['image']})")
        conf = ini_keys(next(d for d in objs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "psnet-config")
                   ["data"]["workerd.conf"])
        check(conf.get("workerd", {}).get("backend") == "cuda", f"overlay {ov}: workerd.conf says backend = cuda")
    if ckdir is not None:
        own = mounts.get("pscoord", {}).get(ckdir, ({}, True))
        claim = own[0].get("persistentVolumeClaim", {}).get("claimName")
        shared = claim in claims and "ReadWriteMany" in claims[claim]["spec"].get("accessModes", [])
        check(shared and not own[1], f"overlay {ov}: pscoord's --checkpoint-dir {ckdir} is a ReadWriteMany claim it "
              f"writes ({claim})")
        at = mounts.get("psd", {}).get(ckdir, ({}, True))
        check(at[0].get("persistentVolumeClaim", {}).get("claimName") == claim and not at[1],
              f"overlay {ov}: every shard writes the same claim at {ckdir}")

os.makedirs(os.path.dirname(PLAN), exist_ok=True)
with open(PLAN, "w") as out:
    json.dump(plan, out, indent=1)
for r, what in results:
    print(f"{r}\t{what}")
