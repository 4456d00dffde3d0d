#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that docs/ARCHITECTURE.md's folder table is true:

  layout-check.py SRC

For every folder of the table (between the <!-- layout --> markers), every
source file in it (and in subfolders that have no row of their own) may
include, in quotes, only headers of its own folder, of the folders its row
lists under "may use", or generated ones (psnet.pb-c.h belongs to proto/,
psnet-config.h to the build, psnet-revision.h to common/); it must include nothing its row lists under
"never includes"; and every .c/.cu file must be named in a meson.build of
its folder or above (a unit test tests/unit/test-NAME.c by its 'NAME': entry).

Then, from the code itself (comments and strings left out): protobuf's
generated names (Psnet__..., psnet__..., PSNET__...) appear only in the
folders the <!-- protobuf: ... --> line names; no two files anywhere call
each other, directly or round a loop (a file calls another when it names a
function the other defines and does not keep static); and pscoord's files
call only the ones before them in the <!-- pscoord order: ... --> line.
Prints one TAP line per folder and rule."""
import graphlib
import os
import re
import sys

src = sys.argv[1]
doc = open(os.path.join(src, "docs/ARCHITECTURE.md")).read()
m = re.search(r"<!-- layout[^>]*-->\n(.*?)<!-- /layout -->", doc, re.S)
rows = {}
for line in (m.group(1) if m else "").splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 4 or not cells[0].startswith("`"):
        continue
    folder = cells[0].strip("`").rstrip("/")
    uses = [u.rstrip("/") for u in re.findall(r"`([^`]+)`", cells[2])]
    everything = cells[2].strip() == "everything"
    never = re.findall(r"`([^`]+)`", cells[3])
    rows[folder] = (uses, everything, never)

n = 0
failed = 0


def tap(ok, what):
    global n, failed
    n += 1
    failed += not ok
    print(f"{'ok' if ok else 'not ok'} {n} - {what}")


tap(len(rows) >= 10, f"docs/ARCHITECTURE.md has the folder table ({len(rows)} rows)")
GENERATED = {"psnet.pb-c.h": "proto", "psnet-config.h": None, "psnet-revision.h": "common"}


def owner(path):
    """The row a file belongs to: its folder, or the nearest listed parent."""
    d = os.path.dirname(path)
    while d and d not in rows:
        d = os.path.dirname(d)
    return d or None


headers = {}  # header name -> folders that have it
files = {}    # folder -> source files
for folder in rows:
    for root, dirs, names in os.walk(os.path.join(src, folder)):
        rel = os.path.relpath(root, src)
        for name in names:
            path = os.path.join(rel, name)
            if owner(path) != folder:
                continue
            if name.endswith((".c", ".h", ".cu")):
                files.setdefault(folder, []).append(path)
            if name.endswith(".h"):
                headers.setdefault(name, set()).add(folder)

for folder, (uses, everything, never) in sorted(rows.items()):
    bad, forbidden, unlisted = [], [], []
    for path in files.get(folder, []):
        text = open(os.path.join(src, path), errors="replace").read()
        for inc in re.findall(r'^\s*#\s*include\s+("[^"]+"|<[^>]+>)', text, re.M):
            if inc in never:
                forbidden.append(f"{path}: {inc}")
            if not inc.startswith('"') or everything:
                continue
            name = os.path.basename(inc.strip('"'))
            if name in GENERATED:
                home = GENERATED[name]
                if home and home != folder and home not in uses:
                    bad.append(f"{path}: {inc} ({home}/)")
                continue
            homes = headers.get(name, set())
            if folder in homes:
                continue
            if not homes:
                bad.append(f"{path}: {inc} (no folder of the table has it)")
            elif not homes & set(uses):
                bad.append(f"{path}: {inc} ({', '.join(sorted(h + '/' for h in homes))})")
        if path.endswith((".c", ".cu")):
            d, listed = os.path.dirname(path), False
            base = os.path.basename(path)
            while d and not listed:
                mb = os.path.join(src, d, "meson.build")
                if os.path.exists(mb):
                    rel = os.path.relpath(os.path.join(src, path), os.path.join(src, d))
                    text = open(mb).read()
                    listed = f"'{rel}'" in text or f"'{base}'" in text
                    # tests/meson.build names unit tests by module: 'NAME': dep -> unit/test-NAME.c
                    t = re.fullmatch(r"test-(.+)\.c", base)
                    listed |= bool(t) and rel.startswith("unit/") and f"'{t.group(1)}':" in text
                d = os.path.dirname(d)
            if not listed:
                unlisted.append(path)
    tap(not bad, f"{folder}/ includes only its own and {', '.join(u + '/' for u in uses) or 'no other'} headers"
        + (" (everything)" if everything else "") + (f": {bad}" if bad else ""))
    if never:
        tap(not forbidden, f"{folder}/ never includes {' '.join(never)}" + (f": {forbidden}" if forbidden else ""))
    tap(not unlisted, f"{folder}/: every .c file is in a meson.build" + (f": {unlisted}" if unlisted else ""))


# --- from the code: protobuf names, calls ---------------------------------------------

def strip(text):
    """C source without comments, strings, char literals and preprocessor
    lines (a #define's body kept: macros call functions too)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        elif c == "#" and (i == 0 or text[i - 1] == "\n"):
            j = i
            while True:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                    break
                if text[k - 1] == "\\":
                    j = k + 1
                    continue
                break
            line = text[i:k]
            out.append(" " + line[1:] if re.match(r"#\s*define", line) else "\n" * line.count("\n"))
            i = k
        else:
            out.append(c)
            i += 1
    return "".join(out)


TOKENS = re.compile(r"[A-Za-z_]\w*|[{}();=]|\S")
KEYWORDS = {"if", "while", "for", "switch", "return", "sizeof", "do", "else"}


def definitions(code):
    """(name, static) of every function defined at file level."""
    defs, depth, stmt = [], 0, []
    for t in TOKENS.findall(code):
        if t == "{":
            if depth == 0 and stmt and stmt[-1] == ")" and "=" not in stmt:
                d = 0
                for k in range(len(stmt) - 1, -1, -1):
                    d += stmt[k] == ")"
                    d -= stmt[k] == "("
                    if d == 0:
                        break
                if k > 0 and re.match(r"[A-Za-z_]\w*$", stmt[k - 1]) and stmt[k - 1] not in KEYWORDS:
                    defs.append((stmt[k - 1], "static" in stmt[:k - 1]))
            depth += 1
            stmt = []
        elif t == "}":
            depth -= 1
            stmt = []
        elif depth == 0:
            stmt = [] if t == ";" else stmt + [t]
    return defs


code_of = {}
for folder in ("common", "kernels", "ps", "worker"):
    for root, _, names in os.walk(os.path.join(src, folder)):
        for name in sorted(names):
            if name.endswith((".c", ".cu", ".h")):
                path = os.path.relpath(os.path.join(root, name), src)
                code_of[path] = strip(open(os.path.join(src, path), errors="replace").read())

m = re.search(r"<!-- protobuf: ([^>]*) -->", doc)
allowed = [a.rstrip("/") for a in m.group(1).split()] if m else []
tap(bool(allowed), "docs/ARCHITECTURE.md names the folders that may use protobuf's names")
outside = sorted(p for p, code in code_of.items()
                 if not any(p.startswith(a + "/") for a in allowed) and re.search(r"\b(Psnet__|psnet__|PSNET__)\w", code))
tap(not outside, "protobuf's names only in " + " ".join(a + "/" for a in allowed) + (f": {outside}" if outside else ""))

owner_of = {}
for path, code in code_of.items():
    if path.endswith((".c", ".cu")):
        for name, static in definitions(code):
            if not static and name != "main":
                owner_of.setdefault(name, path)
calls = {}
for path, code in code_of.items():
    if path.endswith((".c", ".cu")):
        calls[path] = {owner_of[t] for t in re.findall(r"[A-Za-z_]\w*", code)
                       if t in owner_of and owner_of[t] != path}

try:
    graphlib.TopologicalSorter(calls).prepare()
    loop = None
except graphlib.CycleError as e:
    loop = e.args[1]
tap(not loop, f"no files call each other in a loop ({len(calls)} files)" + (f": {' -> '.join(loop)}" if loop else ""))

m = re.search(r"<!-- pscoord order: ([^>]*) -->", doc)
order = m.group(1).split() if m else []
coord = sorted(p for p in calls if p.startswith("ps/pscoord/"))
rank = {"ps/pscoord/" + f: i for i, f in enumerate(order)}
differ = sorted(set(coord) ^ set(rank)) + sorted({f for f in order if order.count(f) > 1})
tap(bool(order) and not differ, "docs/ARCHITECTURE.md orders every file of ps/pscoord/ once" +
    (f": {differ}" if differ else ""))
upward = sorted(f"{a} -> {b}" for a in coord for b in calls[a] if b in rank and rank.get(a, -1) < rank[b])
tap(not upward, "pscoord's files call only the ones before them" + (f": {upward}" if upward else ""))

# Every source file says its licence (the LICENSE file's) on its first line,
# after a #! line.
unmarked = []
for folder in ("proto", "common", "kernels", "ps", "worker", "python", "tests"):
    for root, dirs, names in os.walk(os.path.join(src, folder)):
        dirs[:] = [d for d in dirs if d not in ("corpus", "__pycache__")]
        for name in names:
            if not name.endswith((".c", ".h", ".cu", ".proto", ".py", ".sh")) and name != "meson.build":
                continue
            path = os.path.join(root, name)
            lines = open(path, errors="replace").read().split("\n", 2)
            first = lines[1] if lines[0].startswith("#!") and len(lines) > 1 else lines[0]
            if "SPDX-License-Identifier: Apache-2.0" not in first:
                unmarked.append(os.path.relpath(path, src))
tap(not unmarked and os.path.exists(os.path.join(src, "LICENSE")),
    "LICENSE, and an SPDX line atop every source file" + (f": {sorted(unmarked)}" if unmarked else ""))

# Every module of the Python package is installed with it (python/meson.build:
# pip install and the image's python target).
listed = set(re.findall(r"'psnet/([a-z_]+\.py)'", open(os.path.join(src, "python/meson.build")).read()))
modules = {f for f in os.listdir(os.path.join(src, "python/psnet")) if f.endswith(".py")}
tap(modules <= listed, "python/meson.build installs every module of python/psnet" +
    (f": not {sorted(modules - listed)}" if modules - listed else ""))

print(f"1..{n}")
sys.exit(1 if failed else 0)
