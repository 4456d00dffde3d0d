#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Renders deploy/k8s, what `kubectl apply -k deploy/k8s` applies, for
`podman kube play`, which runs Pods (not StatefulSets, Jobs or Services):

  kube-play.py K8S KEYS OUT NET

K8S is deploy/k8s or one of its overlays (rendered by kustomize.py), KEYS a
directory of psctl keys gen output (what kustomize's generators read from
K8S/keys), OUT a directory to write, NET the first three octets of the podman
network's /24 (10.89.77). Writes
OUT/pods.yaml (a Pod for each StatefulSet replica, named NAME-ORDINAL as
Kubernetes names them, and each of a Job's parallel pods), OUT/configmaps.yaml
(for --configmap), OUT/ips (each pod's address, in the file's order, for
--ip), OUT/claims (the persistent volume claims, one a line, each once: podman
makes a named volume of each, which the pods naming it share) and OUT/keys/POD/
VOLUME (each projected volume's files, as kubelet lays them out: mode
defaultMode, owned by the pod's runAsUser).

What podman lacks is stood in for, the manifests otherwise untouched:
Services become hostAliases, containerPorts are dropped (podman 4.3
publishes each on the host, where two pods' collide; the probes name the
ports by number) (a Service's name the address of its pod, a
headless one's POD.SERVICE each pod's), the projected volumes host paths,
kustomization's images and labels are applied, a $(POD_NAME) from the
downward API is the pod's name and $(VAR)s in the arguments are expanded
(kubelet's work), and a StatefulSet's volumeClaimTemplates
claims named CLAIM-POD.
"""
import copy
import os
import re
import shutil
import sys

import yaml

import kustomize

K8S, KEYS, OUT, NET = sys.argv[1:5]
kust = kustomize.load(K8S)
docs, labels = kust.docs, kust.labels
generated = {name: [os.path.join(KEYS, f) for f in files] for _, name, files in kust.generators}
os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, "configmaps.yaml"), "w") as f:
    yaml.safe_dump_all([d for d in docs if d["kind"] == "ConfigMap"], f)

# The pods, in order, with their addresses.
pods = []
for w in docs:
    if w["kind"] not in ("StatefulSet", "Job", "Deployment"):
        continue
    spec, name = w["spec"], w["metadata"]["name"]
    n = spec.get("parallelism", spec.get("replicas", 1))
    for i in range(n):
        pname = f"{name}-{i}"
        tmpl = copy.deepcopy(spec["template"])
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pname, "labels": {**tmpl.get("metadata", {}).get("labels", {}), **labels}},
               "spec": tmpl["spec"]}
        pod["spec"]["hostname"] = pname
        if w["kind"] == "StatefulSet":
            pod["spec"]["restartPolicy"] = "Always"
            for c in spec.get("volumeClaimTemplates", []):
                claim = f"{c['metadata']['name']}-{pname}"
                pod["spec"].setdefault("volumes", []).append(
                    {"name": c["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
        pods.append({"pod": pod, "workload": w, "ip": f"{NET}.{10 + len(pods)}"})

# Services: names to addresses.
hosts = {}
for s in (d for d in docs if d["kind"] == "Service"):
    sel = s["spec"].get("selector", {})
    mine = [p for p in pods if all(p["pod"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
    if s["spec"].get("clusterIP") == "None":
        for p in mine:
            hosts[f"{p['pod']['metadata']['name']}.{s['metadata']['name']}"] = p["ip"]
    elif mine:
        hosts[s["metadata"]["name"]] = mine[0]["ip"]

claims = []
for p in pods:
    pod, pname = p["pod"], p["pod"]["metadata"]["name"]
    spec = pod["spec"]
    spec["hostAliases"] = [{"ip": ip, "hostnames": [h]} for h, ip in sorted(hosts.items())]
    uid = spec.get("securityContext", {}).get("runAsUser", 0)
    gid = spec.get("securityContext", {}).get("fsGroup", uid)
    for c in spec["containers"]:
        c["image"] = kustomize.image(kust, c["image"])
        # podman 4.3 publishes every containerPort on the host: two pods
        # naming one port collide. Ports by number in the probes instead.
        named = {q["name"]: q["containerPort"] for q in c.pop("ports", []) if "name" in q}
        for probe in ("readinessProbe", "livenessProbe"):
            g = c.get(probe, {}).get("httpGet")
            if g and g["port"] in named:
                g["port"] = named[g["port"]]
        for e in c.get("env", []):
            if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                e.pop("valueFrom")
                e["value"] = pname
        # $(VAR) in command and args, from the container's env, as kubelet expands them.
        env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
        for k in ("command", "args"):
            if k in c:
                c[k] = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in c[k]]
    for v in spec.get("volumes", []):
        if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in claims:
            claims.append(v["persistentVolumeClaim"]["claimName"])
        if "projected" not in v:
            continue
        d = os.path.join(OUT, "keys", pname, v["name"])
        os.makedirs(d, exist_ok=True)
        mode = v["projected"].get("defaultMode", 0o644)
        for src in v["projected"]["sources"]:
            for path in generated[(src.get("secret") or src.get("configMap"))["name"]]:
                dst = os.path.join(d, os.path.basename(path))
                shutil.copyfile(path, dst)
                os.chmod(dst, mode)
                os.chown(dst, uid, gid)
        os.chmod(d, 0o755)
        v.pop("projected")
        v["hostPath"] = {"path": os.path.abspath(d), "type": "Directory"}

with open(os.path.join(OUT, "pods.yaml"), "w") as f:
    yaml.safe_dump_all([p["pod"] for p in pods], f)
with open(os.path.join(OUT, "ips"), "w") as f:
    f.writelines(p["ip"] + "\n" for p in pods)
with open(os.path.join(OUT, "claims"), "w") as f:
    f.writelines(c + "\n" for c in claims)
print(" ".join(p["pod"]["metadata"]["name"] for p in pods))
