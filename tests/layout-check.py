#!/usr/bin/env python3
"""Checks that docs/ARCHITECTURE.md's folder table is true:

  layout-check.py SRC

For every folder of the table (between the <!-- layout --> markers), every
source file in it (and in subfolders that have no row of their own) may
include, in quotes, only headers of its own folder, of the folders its row
lists under "may use", or generated ones (psnet.pb-c.h belongs to proto/,
psnet-config.h to the build); it must include nothing its row lists under
"never includes"; and every .c/.cu file must be named in a meson.build of
its folder or above (a unit test tests/unit/test-NAME.c by its 'NAME': entry).
Prints one TAP line per folder and rule."""
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
GENERATED = {"psnet.pb-c.h": "proto", "psnet-config.h": None}


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

print(f"1..{n}")
sys.exit(1 if failed else 0)
