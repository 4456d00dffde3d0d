#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What `kubectl apply -k DIR` would apply, for the tests (kustomize is not
packaged in Debian 12): the part of kustomize deploy/k8s and its overlays
use, and nothing else (anything more is refused, not ignored).

  kustomize.py DIR KEYS      prints the rendered objects as YAML documents

A kustomization's resources are files of objects or directories of other
kustomizations (a base, rendered first); its patches are JSON 6902 patches
(RFC 6902, applied with python3-jsonpatch) each naming its target by kind and
name; its labels (pairs) are added to every object's metadata and to the
pod templates' labels; its images set a container image's name and tag; its
generators make Secrets and ConfigMaps of files, read from KEYS by file name
(deploy/k8s/keys in a checkout), named NAME as the manifests refer to them
(kustomize adds a hash of the contents, and rewrites the references).
"""
import base64
import copy
import os
import sys

import jsonpatch
import yaml

KNOWN = {"apiVersion", "kind", "labels", "resources", "patches", "images", "secretGenerator",
         "configMapGenerator"}


class Rendered:
    def __init__(self):
        self.docs = []          # the objects, bases' first
        self.labels = {}        # labels added to every object
        self.images = {}        # image name -> {newName, newTag}
        self.generators = []    # (kind, name, [file names])


def load(path):
    """The kustomization in directory path, rendered."""
    kust = yaml.safe_load(open(os.path.join(path, "kustomization.yaml")))
    unknown = set(kust) - KNOWN
    if unknown:
        raise ValueError(f"{path}/kustomization.yaml: fields this renderer does not apply: {sorted(unknown)}")
    out = Rendered()
    for r in kust.get("resources", []):
        p = os.path.join(path, r)
        if os.path.isdir(p):
            base = load(p)
            out.docs += base.docs
            out.labels.update(base.labels)
            out.images.update(base.images)
            out.generators += base.generators
        else:
            out.docs += [d for d in yaml.safe_load_all(open(p)) if d]
    for p in kust.get("patches", []):
        target = p.get("target", {})
        if set(target) - {"kind", "name"} or not target.get("kind") or not target.get("name"):
            raise ValueError(f"{path}: a patch's target is a kind and a name ({target})")
        ops = yaml.safe_load(p["patch"]) if "patch" in p else yaml.safe_load(open(os.path.join(path, p["path"])))
        if not isinstance(ops, list):
            raise ValueError(f"{path}: {p.get('path', 'a patch')} is not a JSON 6902 patch (a list of operations)")
        hits = [i for i, d in enumerate(out.docs)
                if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]]
        if not hits:
            raise ValueError(f"{path}: no {target['kind']}/{target['name']} to patch")
        for i in hits:
            out.docs[i] = jsonpatch.apply_patch(out.docs[i], ops)
    for l in kust.get("labels", []):
        out.labels.update(l["pairs"])
    for i in kust.get("images", []):
        out.images[i["name"]] = {**out.images.get(i["name"], {}), **i}
    for kind, key in (("Secret", "secretGenerator"), ("ConfigMap", "configMapGenerator")):
        for g in kust.get(key, []):
            out.generators.append((kind, g["name"], [os.path.basename(f) for f in g["files"]]))
    return out


def image(rendered, img):
    """img as the kustomization's images set it."""
    repo, _, tag = img.rpartition(":")
    if repo not in rendered.images:
        return img
    i = rendered.images[repo]
    return f"{i.get('newName', repo)}:{i.get('newTag', tag)}"


def objects(rendered, keys):
    """Every object as kustomize writes it: labels and images applied, the
    generators' Secrets and ConfigMaps made of the files in keys."""
    docs = []
    for d in rendered.docs:
        d = copy.deepcopy(d)
        d["metadata"].setdefault("labels", {}).update(rendered.labels)
        tmpl = d.get("spec", {}).get("template")
        if tmpl is not None:
            tmpl.setdefault("metadata", {}).setdefault("labels", {}).update(rendered.labels)
            pod = tmpl.get("spec", {})
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                c["image"] = image(rendered, c["image"])
        docs.append(d)
    for kind, name, files in rendered.generators:
        data = {f: open(os.path.join(keys, f)).read() for f in files}
        if kind == "Secret":
            data = {f: base64.b64encode(v.encode()).decode() for f, v in data.items()}
        docs.append({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "labels": dict(rendered.labels)},
                     "data": data})
    return docs


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: kustomize.py DIR KEYS")
    yaml.safe_dump_all(objects(load(sys.argv[1]), sys.argv[2]), sys.stdout)
